"""Bad input opens no incident, touches no node and says why."""

import json

import pytest
from nodemedic_sandbox.local import LocalMode


def _assert_nothing_touched(local: LocalMode) -> None:
    assert local.incidents() == []
    assert local.cluster.commands == [], "no command may reach the controller or any node"
    assert all("DRAIN" not in local.scheduler.node(n)["State"] for n in local.node_names)


def _detect_logs(local: LocalMode) -> str:
    return "\n".join(line for inv in local.aws.invocations if "Detect" in inv.function for line in inv.logs)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        pytest.param(lambda d: d.pop("observed_at"), "observed_at", id="missing_field"),
        pytest.param(lambda d: d.update(count="many"), "count", id="wrong_type"),
        pytest.param(lambda d: d.update(schema_version="2"), "schema_version", id="unknown_schema_version"),
        pytest.param(lambda d: d.update(evidence={"kmsg": "x" * 10_000}), "evidence", id="oversized_evidence"),
    ],
)
def test_a_malformed_event_is_rejected_with_its_reason(local: LocalMode, mutate, field: str) -> None:
    detail = local.health_event("gpu-2", "XID 79")
    mutate(detail)
    local.put_event(detail)
    [execution] = local.wait_for_executions(1)

    assert execution["status"] == "FAILED"
    assert execution["error"] == "InvalidEventError"
    assert field in execution["cause"]
    assert "event rejected" in _detect_logs(local) and field in _detect_logs(local)
    _assert_nothing_touched(local)


def test_an_event_for_an_unknown_instance_escalates_without_draining(local: LocalMode) -> None:
    detail = local.health_event("gpu-2", "XID 79")
    detail["node"]["instance_id"] = "i-0badc0ffee0000000"
    local.put_event(detail)
    [execution] = local.wait_for_executions(1)

    assert (execution["status"], execution["error"]) == ("FAILED", "UnknownNodeError")
    _assert_nothing_touched(local)
    [message] = local.escalations()
    assert "i-0badc0ffee0000000 is not a member of cluster local" in message["Message"]


def test_an_event_naming_another_nodes_instance_is_not_believed(local: LocalMode) -> None:
    """A compromised node cannot get another node drained by naming it with its own instance."""
    detail = local.health_event("gpu-2", "XID 79")
    detail["node"]["slurm_node"] = "gpu-3"
    local.put_event(detail)
    [execution] = local.wait_for_executions(1)

    assert execution["error"] == "UnknownNodeError"
    assert "identity mismatch" in execution["cause"]
    _assert_nothing_touched(local)


def test_a_fault_that_needs_no_node_action_is_only_recorded(local: LocalMode) -> None:
    local.put_event(local.health_event("gpu-2", "XID 13"))
    [execution] = local.wait_for_executions(1)
    assert execution["status"] == "SUCCEEDED"
    assert local.detect_decision(execution) == "monitor"
    _assert_nothing_touched(local)


def test_an_event_too_large_to_start_an_execution_waits_in_its_rules_dead_letter_queue(local: LocalMode) -> None:
    """EventBridge takes an event of up to 1 MB; Step Functions starts no execution whose input is
    over 256 KiB. Such an event's delivery fails: it waits in the rule's DLQ, which the
    DeadLetterAlarm watches, and nothing is started or touched."""
    detail = local.health_event("gpu-2", "XID 79")
    detail["evidence"] = {f"k{i}": "x" * 1_000 for i in range(300)}
    assert local.put_event(detail)["FailedEntryCount"] == 0
    assert local.executions() == []
    sqs = local.aws.client("sqs")
    url = local.stack.resources["RemediationStateMachineAgentHealthEventQueue"]
    [message] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], WaitTimeSeconds=1)["Messages"]
    assert json.loads(message["Body"])["detail"]["event_id"] == detail["event_id"]
    assert "262144" in message["MessageAttributes"]["ERROR_MESSAGE"]["StringValue"]
    _assert_nothing_touched(local)
