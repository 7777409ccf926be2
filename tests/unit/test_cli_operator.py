"""What the operator commands build before they call AWS: what AWS would refuse is never sent."""

import json
from datetime import UTC, datetime
from unittest import mock

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from nodemedic import operations
from nodemedic.operations import OperatorError
from nodemedic_cli.operator import _await_detect, execution_name, remediate


def test_a_hand_started_execution_is_named_within_step_functions_limit_whatever_the_node_name() -> None:
    """A Kubernetes node's name may be 253 characters; Step Functions refuses an execution name
    over 80, and `nodemedic remediate --action replace` on such a node failed with AWS's
    validation error. Now the name is cut with a digest of the whole: Step Functions (moto checks
    the length and the characters as the API does) starts it, and two long names sharing a start
    stay apart."""
    at = datetime(2026, 11, 27, 23, 1, 2, tzinfo=UTC)
    assert execution_name("replace", "gpu-7", at) == "replace-gpu-7-20261127T230102"  # a short name is whole
    long = "ip-10-0-1-17." + "a" * 200 + ".compute.internal"
    twin = "ip-10-0-1-17." + "a" * 200 + ".compute.external"
    names = [execution_name(action, node, at) for action in ("reboot", "replace") for node in (long, twin)]
    assert all(len(n) == 80 and n.endswith("-20261127T230102") and n.startswith(("reboot-ip-10-0-1-17.aaa",
                                                                                 "replace-ip-10-0-1-17.aaa"))
               for n in names)
    assert len(set(names)) == 4
    with mock_aws():
        sfn = boto3.client("stepfunctions", region_name="us-east-1")
        machine = sfn.create_state_machine(name="m", roleArn="arn:aws:iam::123456789012:role/r", definition=json.dumps(
            {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}))["stateMachineArn"]
        for name in names:
            sfn.start_execution(stateMachineArn=machine, name=name, input="{}")


@pytest.mark.parametrize(("by", "reason", "refused"), [
    ("alice", "x" * 201, "at most 200 characters"),
    ("alice", "it's fine", "without quotes"),
    ("alice", "line one\nline two", "control characters"),
    ("a" * 129, "storm over", "--by is 129 characters"),
    ("alice", "ok", "at least 3 characters"),
    (" ", "storm over", "say who you are")])
def test_an_operators_reason_is_held_to_one_rule_whatever_the_command(by: str, reason: str, refused: str) -> None:
    """A runbook start refuses a reason over 200 characters or with a quote or a control character
    (it may become a Slurm drain reason). pause, resume, breaker reset, approve and deny took any:
    a denial's cause over Step Functions' 32,768 characters failed after its answer was recorded.
    Now each refuses what a runbook refuses, before it reads or writes anything."""
    untouched = mock.Mock(side_effect=AssertionError("nothing may be read or written"))
    calls = [lambda: operations.pause(untouched, by, reason),
             lambda: operations.reset_breaker(untouched, untouched, by, reason),
             lambda: operations.resume_automation(untouched, untouched, by, reason),
             lambda: operations.answer_approval(untouched, untouched, "inc-1", approve=False, by=by, reason=reason)]
    for call in calls:
        with pytest.raises(operations.OperatorError, match=refused):
            call()


class _Following:
    """What the CLI reads while it waits for Detect: the ledger's statuses and the execution, in turn."""

    def __init__(self, answers: list) -> None:
        self.answers = answers
        self.ledger = mock.Mock(statuses=lambda ids: {})

    def client(self, service: str) -> mock.Mock:
        def describe_execution(**request: str) -> dict:
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
            if isinstance(answer, Exception):
                raise answer
            return answer
        return mock.Mock(describe_execution=describe_execution)


def _refused(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "no"}}, "DescribeExecution")


def test_a_request_detect_refused_says_why_and_that_nothing_was_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("nodemedic_cli.operator.time.sleep", lambda s: None)
    cause = json.dumps({"errorMessage": "gpu-1 is in incident inc-1, still open", "errorType": "InvalidEventError"})
    target = _Following([_refused("ThrottlingException"), {"status": "RUNNING"},
                         {"status": "FAILED", "error": "InvalidEventError", "cause": cause}])
    with pytest.raises(OperatorError, match="the reboot of gpu-1 opened no incident, nothing was done: gpu-1 is in incident "
                                            "inc-1, still open$"):
        _await_detect(target, "reboot-gpu-1-x", "arn", "gpu-1", "reboot")  # type: ignore[arg-type]


def test_a_request_whose_execution_aws_will_not_describe_is_started_not_refused() -> None:
    """The operator may start executions and not describe them (AccessDenied): the execution runs
    all the same, so the command says it started and that it could not see Detect's decision."""
    opened, unseen = _await_detect(_Following([_refused("AccessDeniedException")]),  # type: ignore[arg-type]
                                   "reboot-gpu-1-x", "arn", "gpu-1", "reboot")
    assert not opened and unseen == "AWS refused DescribeExecution: AccessDeniedException: no"


@pytest.mark.parametrize("action", ["reboot", "replace"])
def test_a_request_for_a_node_no_instance_backs_is_refused_before_anything_starts(action: str) -> None:
    """Its instance ended (scaled in, interrupted): Detect would refuse the request, and page the
    on-call about a node it does not know, while the command waited. Refused here, saying what
    gives the node an instance; no execution is started."""
    target = mock.Mock(cluster="c1")
    target.provider.member_by_node.return_value = None
    with pytest.raises(OperatorError, match="gpu-1 is not a member of cluster c1: no instance of it backs gpu-1 .*"
                                            "INSTANCE_LOST"):
        remediate(target, "gpu-1", action, "GPU 3 keeps failing", "alice")
    target.client.assert_not_called()
