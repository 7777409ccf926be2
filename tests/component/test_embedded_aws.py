"""One test per place where the local mode changes moto's behaviour.

If a moto upgrade moves a hooked internal or fixes/changes the behaviour, these fail loudly.
"""

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import moto
import pytest
from botocore.exceptions import ClientError
from nodemedic_sandbox.aws_rules import ssm_agent_timeout
from nodemedic_sandbox.embedded_aws import HOOKED, CommandOutcome, EmbeddedAWS, FunctionSource

ROOT = Path(__file__).resolve().parents[2]


def test_moto_is_the_pinned_version() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f"=={moto.__version__}\"" in pyproject


@pytest.mark.parametrize("name", sorted(HOOKED))
def test_every_hooked_internal_still_exists(name: str) -> None:
    owner, attribute = HOOKED[name]
    assert hasattr(owner, attribute), f"moto {moto.__version__} no longer has {owner}.{attribute}"


@pytest.fixture
def aws(tmp_path: Path):
    code = tmp_path / "fn"
    code.mkdir()
    (code / "app.py").write_text(
        "import json\n"
        "class BoomError(Exception):\n    pass\n"
        "def handler(event, context):\n"
        "    if event.get('boom'):\n        raise BoomError('it broke')\n"
        "    if event.get('sleep'):\n        __import__('time').sleep(event['sleep'])\n"
        "    if event.get('big'):\n        return {'blob': 'x' * event['big']}\n"
        "    if event.get('poll'):\n"
        "        started = __import__('time').monotonic()\n"
        "        got = __import__('boto3').client('sqs').receive_message(QueueUrl=event['poll'], WaitTimeSeconds=1)\n"
        "        return {'waited': __import__('time').monotonic() - started, 'got': len(got.get('Messages', []))}\n"
        "    print(json.dumps({'_aws': {'Timestamp': 1700000000000, 'CloudWatchMetrics': [{'Namespace': 'T',"
        " 'Dimensions': [['Cluster']], 'Metrics': [{'Name': 'TimeToRecover', 'Unit': 'Seconds'}]}]},"
        " 'Cluster': 'c1', 'TimeToRecover': 12.5}))\n"
        "    return {'echo': event}\n"
    )
    with EmbeddedAWS(retry_time_scale=0.01) as embedded:
        iam = embedded.client("iam")
        role = iam.create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        embedded.client("lambda").create_function(
            FunctionName="fn", Runtime="python3.12", Role=role, Handler="app.handler",
            Code={"ZipFile": b"PK"}, Environment={"Variables": {"X": "1"}})
        embedded.functions["fn"] = FunctionSource(code, "app.handler")
        yield embedded


def test_lambda_invoke_runs_the_real_handler(aws: EmbeddedAWS) -> None:
    resp = aws.client("lambda").invoke(FunctionName="fn", Payload=b'{"a": 1}')
    assert json.loads(resp["Payload"].read()) == {"echo": {"a": 1}}


def test_a_handler_exception_comes_back_shaped_as_aws_does(aws: EmbeddedAWS) -> None:
    resp = aws.client("lambda").invoke(FunctionName="fn", Payload=b'{"boom": true}')
    assert resp["FunctionError"] == "Unhandled"
    body = json.loads(resp["Payload"].read())
    assert (body["errorType"], body["errorMessage"]) == ("BoomError", "it broke")


def test_emf_output_becomes_cloudwatch_metrics_and_logs_are_kept(aws: EmbeddedAWS) -> None:
    aws.client("lambda").invoke(FunctionName="fn", Payload=b"{}")
    metrics = aws.client("cloudwatch").list_metrics(Namespace="T")["Metrics"]
    assert [(m["MetricName"], m["Dimensions"]) for m in metrics] == [
        ("TimeToRecover", [{"Name": "Cluster", "Value": "c1"}])]
    streams = aws.client("logs").describe_log_streams(logGroupName="/aws/lambda/fn")["logStreams"]
    assert len(streams) == 1


def test_a_handlers_output_reaches_its_log_while_another_thread_swaps_stdout(aws: EmbeddedAWS) -> None:
    """A CLI under test (CliRunner) or pytest swaps ``sys.stdout`` process-wide: what a handler
    prints meanwhile (its metrics' EMF line) still goes to its invocation's log, not to their
    stream (a doctor run once missed TimeToRecover that way)."""
    import contextlib
    import io
    import threading
    import time

    invoked = threading.Thread(target=lambda: aws.client("lambda").invoke(FunctionName="fn", Payload=b'{"sleep": 0.5}'))
    invoked.start()
    time.sleep(0.2)  # the handler sleeps, then prints
    elsewhere = io.StringIO()
    with contextlib.redirect_stdout(elsewhere):
        invoked.join(timeout=30)
    [invocation] = aws.invocations
    assert any('"TimeToRecover": 12.5' in line for line in invocation.logs), invocation.logs
    assert elsewhere.getvalue() == ""
    assert [m["MetricName"] for m in aws.client("cloudwatch").list_metrics(Namespace="T")["Metrics"]] == ["TimeToRecover"]


def _state_machine(aws: EmbeddedAWS, definition: dict) -> str:
    return aws.client("stepfunctions").create_state_machine(
        name=f"sm{time.monotonic_ns()}", definition=json.dumps(definition),
        roleArn="arn:aws:iam::123456789012:role/r")["stateMachineArn"]


def _rule_to(aws: EmbeddedAWS, arn: str, state: str = "ENABLED", dlq: str | None = None) -> None:
    events = aws.client("events")
    events.put_rule(Name="r", EventPattern=json.dumps({"source": ["t"]}), State=state)
    target = {"Id": "t", "Arn": arn, "RoleArn": "arn:aws:iam::123456789012:role/r"}
    if dlq:
        target["DeadLetterConfig"] = {"Arn": dlq}
    events.put_targets(Rule="r", Targets=[target])


def _executions(aws: EmbeddedAWS, arn: str) -> list:
    return aws.client("stepfunctions").list_executions(stateMachineArn=arn)["executions"]


def test_eventbridge_starts_a_step_functions_target_with_the_whole_event(aws: EmbeddedAWS) -> None:
    arn = _state_machine(aws, {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}})
    _rule_to(aws, arn)
    aws.client("events").put_events(Entries=[{"Source": "t", "DetailType": "d", "Detail": '{"k": 1}'}])
    [execution] = _executions(aws, arn)
    desc = aws.client("stepfunctions").describe_execution(executionArn=execution["executionArn"])
    delivered = json.loads(desc["input"])
    assert delivered["detail"] == {"k": 1} and delivered["source"] == "t"
    assert delivered["time"].endswith("Z")


def test_an_execution_listed_while_it_starts_is_running(aws: EmbeddedAWS) -> None:
    """moto lists an execution before it starts it: a ListExecutions from another thread in that
    window (the demo's, while EventBridge starts one) raised on its status of None. Step Functions
    has it RUNNING once StartExecution returns."""
    from moto.stepfunctions.parser.backend.execution import Execution

    arn = _state_machine(aws, {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}})
    seen: list[list[str]] = []
    start = Execution.start

    def listed_first(execution: Execution) -> None:  # the window: listed, not started yet
        seen.append([e["status"] for e in _executions(aws, arn)])
        start(execution)

    with mock.patch.object(Execution, "start", listed_first):
        aws.client("stepfunctions").start_execution(stateMachineArn=arn, input="{}")
    assert seen == [["RUNNING"]]


def test_a_scheduled_rule_is_not_fired_by_events(aws: EmbeddedAWS) -> None:
    events = aws.client("events")
    arn = events.put_rule(Name="every-minute", ScheduleExpression="rate(1 minute)")["RuleArn"]
    fn_arn = aws.client("lambda").get_function(FunctionName="fn")["Configuration"]["FunctionArn"]
    events.put_targets(Rule="every-minute", Targets=[{"Id": "fn", "Arn": fn_arn}])
    events.put_events(Entries=[{"Source": "t", "DetailType": "anything", "Detail": "{}"}])
    assert aws.invocations == []
    aws._fire(next(r for r in aws._scheduled_rules() if r.arn == arn))
    assert [i.function for i in aws.invocations] == ["fn"]


def test_a_disabled_rule_delivers_nothing(aws: EmbeddedAWS) -> None:
    arn = _state_machine(aws, {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}})
    _rule_to(aws, arn, state="DISABLED")
    aws.client("events").put_events(Entries=[{"Source": "t", "DetailType": "d", "Detail": "{}"}])
    assert _executions(aws, arn) == []


def test_a_failed_delivery_goes_to_the_dead_letter_queue(aws: EmbeddedAWS) -> None:
    sqs = aws.client("sqs")
    url = sqs.create_queue(QueueName="dlq")["QueueUrl"]
    dlq = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    _rule_to(aws, "arn:aws:states:us-east-1:123456789012:stateMachine:missing", dlq=dlq)
    aws.client("events").put_events(Entries=[{"Source": "t", "DetailType": "d", "Detail": "{}"}])
    [message] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], WaitTimeSeconds=1)["Messages"]
    assert json.loads(message["Body"])["source"] == "t"
    assert "ERROR_MESSAGE" in message["MessageAttributes"]


def test_eventbridge_takes_a_1_mb_request_but_an_event_over_256_kib_starts_no_execution(aws: EmbeddedAWS) -> None:
    """EventBridge takes up to 1 MB a request (since January 2026); Step Functions still starts no
    execution whose input is over 256 KiB, so such an event fails its delivery, to the DLQ."""
    sqs = aws.client("sqs")
    url = sqs.create_queue(QueueName="dlq-size")["QueueUrl"]
    dlq = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    arn = _state_machine(aws, {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}})
    _rule_to(aws, arn, dlq=dlq)
    events = aws.client("events")

    out = events.put_events(Entries=[{"Source": "t", "DetailType": "d", "Detail": json.dumps({"pad": "x" * 300_000})}])
    assert out["FailedEntryCount"] == 0  # taken: under 1 MB
    assert _executions(aws, arn) == []
    [message] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], WaitTimeSeconds=1)["Messages"]
    assert "ValidationException" in message["MessageAttributes"]["ERROR_MESSAGE"]["StringValue"]

    with pytest.raises(ClientError) as refused:  # five entries of ~200 KB: the request is over 1 MB
        events.put_events(Entries=[{"Source": "t", "DetailType": "d", "Detail": json.dumps({"pad": "x" * 210_000})}] * 5)
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert "over the limit" in refused.value.response["Error"]["Message"]
    assert len(_executions(aws, arn)) == 0

    sfn = aws.client("stepfunctions")
    at_quota = json.dumps({"pad": "é" * 131_060}, ensure_ascii=False)  # UTF-8 bytes count, not characters
    at_quota += " " * (262_144 - len(at_quota.encode()))
    sfn.start_execution(stateMachineArn=arn, input=at_quota)
    with pytest.raises(ClientError) as over:
        sfn.start_execution(stateMachineArn=arn, input=at_quota + " ")
    assert over.value.response["Error"]["Code"] == "ValidationException"
    assert len(_executions(aws, arn)) == 1


def test_retry_intervals_are_scaled(aws: EmbeddedAWS) -> None:
    arn = _state_machine(aws, {"StartAt": "F", "States": {"F": {
        "Type": "Task", "Resource": "arn:aws:lambda:us-east-1:123456789012:function:fn",
        "Parameters": {"boom": True},
        "Retry": [{"ErrorEquals": ["BoomError"], "IntervalSeconds": 30, "MaxAttempts": 2, "BackoffRate": 1}],
        "End": True}}})
    started = time.monotonic()
    aws.client("stepfunctions").start_execution(stateMachineArn=arn, name="x", input="{}")
    while (d := aws.client("stepfunctions").describe_execution(
            executionArn=arn.replace("stateMachine", "execution") + ":x"))["status"] == "RUNNING":
        time.sleep(0.05)
    assert d["status"] == "FAILED" and d["error"] == "BoomError"
    assert time.monotonic() - started < 10, "60 s of retry intervals ran at x0.01"
    assert sum(1 for inv in aws.invocations if inv.error_type == "BoomError") == 3


@pytest.mark.parametrize(("scale", "status"), [(1.0, "FAILED"), (3.0, "SUCCEEDED")])
def test_task_timeouts_can_be_lengthened(aws: EmbeddedAWS, scale: float, status: str) -> None:
    aws.task_timeout_scale = scale
    arn = _state_machine(aws, {"StartAt": "F", "States": {"F": {
        "Type": "Task", "Resource": "arn:aws:lambda:us-east-1:123456789012:function:fn",
        "Parameters": {"sleep": 1.5}, "TimeoutSeconds": 1, "End": True}}})
    aws.client("stepfunctions").start_execution(stateMachineArn=arn, name="t", input="{}")
    while (d := aws.client("stepfunctions").describe_execution(
            executionArn=arn.replace("stateMachine", "execution") + ":t"))["status"] == "RUNNING":
        time.sleep(0.05)
    assert d["status"] == status
    assert d.get("error", "States.Timeout") == "States.Timeout"


def _run(aws: EmbeddedAWS, arn: str, name: str) -> dict:
    aws.client("stepfunctions").start_execution(stateMachineArn=arn, name=name, input="{}")
    while (d := aws.client("stepfunctions").describe_execution(
            executionArn=arn.replace("stateMachine", "execution") + f":{name}"))["status"] == "RUNNING":
        time.sleep(0.05)
    return d


@pytest.mark.parametrize(("caught_by", "status"), [("States.ALL", "FAILED"), ("States.DataLimitExceeded", "SUCCEEDED")])
def test_a_result_over_the_payload_quota_ends_the_execution_whatever_catches_states_all(
        aws: EmbeddedAWS, caught_by: str, status: str) -> None:
    """A task result over 256 KiB is States.DataLimitExceeded, which States.ALL neither retries nor
    catches on AWS (it ends the execution); a Catch that names it does."""
    arn = _state_machine(aws, {"StartAt": "F", "States": {
        "F": {"Type": "Task", "Resource": "arn:aws:lambda:us-east-1:123456789012:function:fn",
              "Parameters": {"big": 300_000}, "End": True,
              "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": 2, "IntervalSeconds": 1}],
              "Catch": [{"ErrorEquals": [caught_by], "Next": "Caught"}]},
        "Caught": {"Type": "Pass", "End": True}}})
    d = _run(aws, arn, "big")
    assert d["status"] == status
    if status == "FAILED":
        assert d["error"] == "States.DataLimitExceeded"
    assert sum(1 for inv in aws.invocations if inv.function == "fn") == 1, "States.ALL retried it"


class _Host:
    def __init__(self) -> None:
        self.ran: list[tuple[str, str]] = []
        self.reboots: list[str] = []
        self.booting: set[str] = set()  # instances whose SSM agent has not registered them yet
        self.seconds = 0.0  # how long a command runs

    def run(self, instance_id: str, script: str, timeout_s: int) -> CommandOutcome:
        self.ran.append((instance_id, script))
        time.sleep(self.seconds)
        return CommandOutcome("Failed", 3, "out", "err")

    def rebooted(self, instance_ids: list[str]) -> None:
        self.reboots.extend(instance_ids)

    def registered(self, instance_id: str, launched: float) -> bool:
        return instance_id not in self.booting


def test_the_command_host_hears_of_ec2_reboots_and_starts(aws: EmbeddedAWS) -> None:
    ec2 = aws.client("ec2")
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12345678", MinCount=2, MaxCount=2)["Instances"]]
    aws.command_host = host = _Host()
    ec2.reboot_instances(InstanceIds=[ids[1]])
    ec2.stop_instances(InstanceIds=[ids[0]])
    ec2.start_instances(InstanceIds=[ids[0]])
    assert host.reboots == [ids[1], ids[0]]


def test_a_reboot_of_a_terminated_instance_is_ignored_as_ec2_does(aws: EmbeddedAWS) -> None:
    """EC2 API reference, RebootInstances: "Requests to reboot terminated instances are ignored";
    moto set the instance running again, so a node terminated under its incident came back."""
    ec2 = aws.client("ec2")
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12345678", MinCount=2, MaxCount=2)["Instances"]]
    aws.command_host = host = _Host()
    ec2.terminate_instances(InstanceIds=[ids[0]])
    ec2.reboot_instances(InstanceIds=ids)
    states = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
              for i in r["Instances"]}
    assert states == {ids[0]: "terminated", ids[1]: "running"} and host.reboots == [ids[1]]
    with pytest.raises(ClientError, match="InvalidInstanceID.NotFound"):
        ec2.reboot_instances(InstanceIds=["i-0123456789abcdef0"])
    ec2.stop_instances(InstanceIds=[ids[1]])  # a reboot is a running instance's: moto started it
    with pytest.raises(ClientError, match="IncorrectInstanceState"):
        ec2.reboot_instances(InstanceIds=[ids[1]])
    assert ec2.describe_instances(InstanceIds=[ids[1]])["Reservations"][0]["Instances"][0]["State"]["Name"] == "stopped"


def test_an_instance_started_from_stopped_has_that_start_as_its_launch_time(aws: EmbeddedAWS) -> None:
    """EC2's LaunchTime is the instance's most recent start; a reboot is no start."""
    ec2 = aws.client("ec2")
    [instance] = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12345678", MinCount=1,
                                                             MaxCount=1)["Instances"]]

    def launched() -> datetime:
        return ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]["LaunchTime"]

    first = launched()
    time.sleep(1.1)  # LaunchTime has whole seconds
    ec2.reboot_instances(InstanceIds=[instance])
    assert launched() == first
    ec2.stop_instances(InstanceIds=[instance])
    ec2.start_instances(InstanceIds=[instance])
    assert launched() > first


def test_ec2_can_run_out_of_capacity(aws: EmbeddedAWS) -> None:
    ec2 = aws.client("ec2")
    [instance] = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12345678", MinCount=1,
                                                             MaxCount=1)["Instances"]]
    ec2.stop_instances(InstanceIds=[instance])
    aws.ec2_capacity = False
    with pytest.raises(ec2.exceptions.ClientError, match="InsufficientInstanceCapacity"):
        ec2.start_instances(InstanceIds=[instance])


def test_instances_in_a_capacity_reservation_are_described_and_found_by_it(aws: EmbeddedAWS) -> None:
    from nodemedic.planned_events import reservation_instances

    ec2 = aws.client("ec2")
    ids = sorted(i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12345678", MinCount=3,
                                                            MaxCount=3)["Instances"])
    block = "cr-0a1b2c3d4e5f60718"
    aws.place_in_capacity_reservation(ids[:2], block)
    described = {i["InstanceId"]: i.get("CapacityReservationId")
                 for r in ec2.describe_instances(InstanceIds=ids)["Reservations"] for i in r["Instances"]}
    assert described == {ids[0]: block, ids[1]: block, ids[2]: None}
    assert reservation_instances(ec2, block) == ids[:2]
    ec2.terminate_instances(InstanceIds=[ids[0]])
    assert reservation_instances(ec2, block) == ids[1:2], "only pending or running instances"
    assert reservation_instances(ec2, "cr-0ffffffffffffffff") == []


def test_scheduled_events_are_described_and_the_event_code_filter_applies(aws: EmbeddedAWS) -> None:
    from nodemedic.planned_events import scheduled_events

    ec2 = aws.client("ec2")
    ids = sorted(i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12345678", MinCount=3,
                                                            MaxCount=3)["Instances"])
    when = datetime(2026, 12, 6, tzinfo=UTC)
    event_id = aws.schedule_instance_event(ids[1], "instance-retirement", when)
    [(instance, event)] = scheduled_events(ec2)  # moto alone returns every instance for the filter
    assert (instance, event["Code"], event["InstanceEventId"], event["NotBefore"]) == (
        ids[1], "instance-retirement", event_id, when)
    everyone = ec2.describe_instance_status(InstanceIds=ids)["InstanceStatuses"]
    assert len(everyone) == 3, "without the filter every running instance is described"


def test_ssm_runs_the_command_only_on_the_instance_it_names(aws: EmbeddedAWS) -> None:
    """Right after SendCommand, GetCommandInvocation answers InvocationDoesNotExist, as AWS does
    for a moment (unless SSM announced the command's end already); the pipeline's wait reads that
    as "not yet" and polls on."""
    from nodemedic.providers.run_command import RunCommand

    ec2 = aws.client("ec2")
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12345678", MinCount=3, MaxCount=3)["Instances"]]
    host = _Host()
    host.seconds = 1
    aws.command_host = host
    aws.invocation_lag_s = 0.5  # longer than AWS's moment, so that the first read below falls in it
    ssm = aws.client("ssm")
    cmd = ssm.send_command(InstanceIds=[ids[1]], DocumentName="AWS-RunShellScript",
                           Parameters={"commands": ["exit 3"]})["Command"]["CommandId"]
    with pytest.raises(ClientError, match="InvocationDoesNotExist"):
        ssm.get_command_invocation(CommandId=cmd, InstanceId=ids[1])
    result = RunCommand(ssm, poll_interval=0.1).wait(ids[1], cmd, 30)
    assert host.ran == [(ids[1], "exit 3")]
    assert (result.status, result.exit_code, result.stdout) == ("Failed", 3, "out")


def test_ssm_refuses_at_once_an_instance_its_agent_has_not_registered_as_aws_does(aws: EmbeddedAWS) -> None:
    """SendCommand answers InvalidInstanceId for an instance still booting (its agent not yet
    registered), shutting down or terminated, or no instance at all; moto accepted any id, so a
    command sent to a replacement before its agent came up passed here and failed on AWS. The
    pipeline reads that refusal as InstanceNotManagedError, which the state machine retries."""
    from nodemedic.errors import InstanceNotManagedError
    from nodemedic.providers.run_command import RunCommand

    ec2 = aws.client("ec2")
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12345678", MinCount=4, MaxCount=4)["Instances"]]
    aws.command_host = host = _Host()
    host.booting.add(ids[0])
    ec2.terminate_instances(InstanceIds=[ids[1]])
    ec2.stop_instances(InstanceIds=[ids[2]])
    ssm = aws.client("ssm")
    for instance in (ids[0], ids[1], "i-0123456789abcdef0"):
        with pytest.raises(ClientError, match=r"InvalidInstanceId.*not in a valid state"):
            ssm.send_command(InstanceIds=[instance], DocumentName="AWS-RunShellScript", Parameters={"commands": ["true"]})
        with pytest.raises(InstanceNotManagedError, match=f"SSM cannot send to {instance} yet"):
            RunCommand(ssm, 0).send(instance, "AWS-RunShellScript", {"commands": "true"}, 60)
    assert host.ran == []
    ec2.reboot_instances(InstanceIds=[ids[3]])  # registered: a reboot or a stop keeps it so, SSM waits for it
    for instance in (ids[2], ids[3]):
        ssm.send_command(InstanceIds=[instance], DocumentName="AWS-RunShellScript", Parameters={"commands": ["true"]})
    host.booting.clear()  # its agent came up
    RunCommand(ssm, 0).send(ids[0], "AWS-RunShellScript", {"commands": "true"}, 60)


def test_a_command_to_an_instance_that_is_gone_is_refused_for_good_not_retried(aws: EmbeddedAWS) -> None:
    """Where the caller may read EC2, a refusal is told apart: an instance still booting is
    InstanceNotManagedError (retried), a terminated one InstanceGoneError (not retried), and one
    EC2 does not know yet (eventual consistency after a launch) is not called gone."""
    from nodemedic.errors import InstanceGoneError, InstanceNotManagedError, RetryableError
    from nodemedic.providers.run_command import RunCommand

    ec2 = aws.client("ec2")
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12345678", MinCount=2, MaxCount=2)["Instances"]]
    aws.command_host = host = _Host()
    host.booting.add(ids[0])
    ec2.terminate_instances(InstanceIds=[ids[1]])
    runner = RunCommand(aws.client("ssm"), 0, ec2=ec2)
    with pytest.raises(InstanceNotManagedError):
        runner.send(ids[0], "AWS-RunShellScript", {"commands": "true"}, 60)
    with pytest.raises(InstanceNotManagedError):
        runner.send("i-0123456789abcdef0", "AWS-RunShellScript", {"commands": "true"}, 60)
    with pytest.raises(InstanceGoneError, match=f"{ids[1]} is terminated") as gone:
        runner.send(ids[1], "AWS-RunShellScript", {"commands": "true"}, 60)
    assert not isinstance(gone.value, RetryableError) and host.ran == []


def test_ssm_lists_commands_filtered_and_a_page_at_a_time_as_ssm_does(aws: EmbeddedAWS) -> None:
    """moto ignored ListCommands' Filters and MaxResults: a caller that did not page, or relied on
    a filter, passed here and failed on AWS."""
    from nodemedic.providers.run_command import RunCommand

    ec2 = aws.client("ec2")
    [instance] = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12345678", MinCount=1,
                                                             MaxCount=1)["Instances"]]
    aws.command_host = _Host()
    ssm = aws.client("ssm")
    before = time.time()
    for i in range(55):
        ssm.send_command(InstanceIds=[instance], DocumentName="AWS-RunShellScript",
                         Parameters={"commands": [f"echo {i}"]})
    one = ssm.list_commands(InstanceId=instance, Filters=[{"key": "DocumentName", "value": "AWS-RunShellScript"}])
    assert len(one["Commands"]) == 50 and "NextToken" in one
    assert ssm.list_commands(InstanceId=instance, Filters=[{"key": "DocumentName", "value": "other"}])["Commands"] == []
    later = datetime.fromtimestamp(time.time() + 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert ssm.list_commands(InstanceId=instance, Filters=[{"key": "InvokedAfter", "value": later}])["Commands"] == []
    sent = RunCommand(ssm, 0).sent_since(instance, "AWS-RunShellScript", {"commands": "echo 54"}, before)
    assert len(sent) == 1  # found on the second page


def test_an_ended_ssm_command_emits_aws_status_change_event(aws: EmbeddedAWS) -> None:
    ec2, sqs, events = aws.client("ec2"), aws.client("sqs"), aws.client("events")
    [instance] = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12345678", MinCount=1,
                                                             MaxCount=1)["Instances"]]
    aws.command_host = _Host()
    url = sqs.create_queue(QueueName="ssm-events")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name="ssm", EventPattern=json.dumps({
        "source": ["aws.ssm"], "detail-type": ["EC2 Command Invocation Status-change Notification"],
        "detail": {"document-name": ["MyCheck"]}}))
    events.put_targets(Rule="ssm", Targets=[{"Id": "q", "Arn": arn}])
    ssm = aws.client("ssm")
    cmd = ssm.send_command(InstanceIds=[instance], DocumentName="MyCheck",
                           Parameters={"commands": ["exit 3"]})["Command"]["CommandId"]
    deadline = time.monotonic() + 10
    while not (messages := sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages")) \
            and time.monotonic() < deadline:
        pass
    event = json.loads(messages[0]["Body"])
    assert event["detail"] == {**event["detail"], "command-id": cmd, "instance-id": instance,
                               "document-name": "MyCheck", "status": "Failed"}


def test_an_alarm_state_change_emits_the_event_aws_emits(aws: EmbeddedAWS) -> None:
    sqs = aws.client("sqs")
    url = sqs.create_queue(QueueName="alarms")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events = aws.client("events")
    events.put_rule(Name="a", EventPattern=json.dumps({"source": ["aws.cloudwatch"]}))
    events.put_targets(Rule="a", Targets=[{"Id": "q", "Arn": arn}])
    cw = aws.client("cloudwatch")
    cw.put_metric_alarm(AlarmName="nodemedic-x", Namespace="AWS/EC2", MetricName="StatusCheckFailed",
                        Dimensions=[{"Name": "InstanceId", "Value": "i-0123456789abcdef0"}],
                        Statistic="Maximum", Period=60, EvaluationPeriods=1, Threshold=1,
                        ComparisonOperator="GreaterThanOrEqualToThreshold")
    cw.set_alarm_state(AlarmName="nodemedic-x", StateValue="ALARM", StateReason="r")
    [message] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    event = json.loads(message["Body"])
    assert event["detail-type"] == "CloudWatch Alarm State Change"
    assert event["detail"]["state"]["value"] == "ALARM"
    dims = event["detail"]["configuration"]["metrics"][0]["metricStat"]["metric"]["dimensions"]
    assert dims == {"InstanceId": "i-0123456789abcdef0"}


def test_metric_statistics_match_the_exact_dimension_set_as_cloudwatch_does() -> None:
    """main's Powertools 'service' dimension made every {Cluster} query (the MTTR alarm) find
    nothing on AWS; moto matched the subset and hid it."""
    from datetime import UTC, datetime, timedelta

    with EmbeddedAWS() as embedded:
        cw = embedded.client("cloudwatch")
        now = datetime.now(UTC)
        cw.put_metric_data(Namespace="N", MetricData=[{
            "MetricName": "TimeToRecover", "Value": 5.0, "Timestamp": now,
            "Dimensions": [{"Name": "Cluster", "Value": "c1"}, {"Name": "service", "Value": "resume"}]}])

        def points(*dims: tuple[str, str]) -> list:
            return cw.get_metric_statistics(
                Namespace="N", MetricName="TimeToRecover", Dimensions=[{"Name": k, "Value": v} for k, v in dims],
                StartTime=now - timedelta(minutes=5), EndTime=now + timedelta(minutes=5), Period=60,
                Statistics=["Maximum"])["Datapoints"]

        assert points(("Cluster", "c1")) == []
        assert points() == []
        assert [p["Maximum"] for p in points(("service", "resume"), ("Cluster", "c1"))] == [5.0]


def test_injected_throttling_reaches_the_sdk_as_a_response_so_its_retries_apply(aws: EmbeddedAWS,
                                                                                 tmp_path: Path) -> None:
    """A function's DynamoDB call throttled twice succeeds on botocore's retries; throttled more
    times than the SDK retries, it fails with the service's own error code."""
    _function(aws, tmp_path, "dbfn", "boto3.client('dynamodb').describe_table(TableName='t')\n    return {'ok': True}",
              "dynamodb:DescribeTable")
    aws.client("dynamodb").create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                                        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                                        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])

    brief = aws.throttle("dynamodb", "DescribeTable", caller="dbfn", times=2)
    resp = aws.client("lambda").invoke(FunctionName="dbfn", Payload=b"{}")
    assert json.loads(resp["Payload"].read()) == {"ok": True} and len(brief.hits) == 2

    long = aws.throttle("dynamodb", "DescribeTable", caller="dbfn", times=50)
    resp = aws.client("lambda").invoke(FunctionName="dbfn", Payload=b"{}")
    error = json.loads(resp["Payload"].read())
    assert resp["FunctionError"] == "Unhandled" and "ProvisionedThroughputExceededException" in error["errorMessage"]
    assert 2 <= len(long.hits) < 50  # the SDK's attempts, then it gave up
    assert aws.client("dynamodb").describe_table(TableName="t")  # the harness itself is never throttled


def test_a_throttled_write_changes_nothing(aws: EmbeddedAWS, tmp_path: Path) -> None:
    """AWS refuses a throttled call before acting on it: moto must not execute it anyway (botocore
    hands before-send to every handler, moto's stubber too)."""
    _function(aws, tmp_path, "tagfn",
              "boto3.client('ec2').create_tags(Resources=[event['i']], Tags=[{'Key': 'k', 'Value': 'v'}])",
              "ec2:CreateTags")
    ec2 = aws.client("ec2")
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    throttled = aws.throttle("ec2", "CreateTags", caller="tagfn", times=100)
    resp = aws.client("lambda").invoke(FunctionName="tagfn", Payload=json.dumps({"i": instance}).encode())
    assert resp["FunctionError"] == "Unhandled" and len(throttled.hits) >= 2
    [found] = ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"]
    assert "Tags" not in found or not any(t["Key"] == "k" for t in found["Tags"])


def _function(aws: EmbeddedAWS, tmp_path: Path, name: str, body: str, action: str) -> None:
    """Deploy a one-line function ``name`` whose role allows ``action`` on everything."""
    code = tmp_path / name
    code.mkdir()
    (code / "app.py").write_text(f"import boto3\ndef handler(event, context):\n    {body}\n")
    iam = aws.client("iam")
    role = iam.create_role(RoleName=name, AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    iam.put_role_policy(RoleName=name, PolicyName="p", PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": action, "Resource": "*"}]}))
    aws.client("lambda").create_function(FunctionName=name, Runtime="python3.12", Role=role, Handler="app.handler",
                                         Code={"ZipFile": b"PK"})
    aws.functions[name] = FunctionSource(code, "app.handler")


def test_a_functions_worker_threads_are_authorized_as_the_function(aws: EmbeddedAWS, tmp_path: Path) -> None:
    _function(aws, tmp_path, "poolfn",
              "from concurrent.futures import ThreadPoolExecutor; "
              "list(ThreadPoolExecutor(2).map(lambda _: boto3.client('ec2').describe_instances(), [0]))",
              "dynamodb:DescribeTable")
    resp = aws.client("lambda").invoke(FunctionName="poolfn", Payload=b"{}")
    assert resp["FunctionError"] == "Unhandled"
    assert [(d.function, d.action) for d in aws.denials] == [("poolfn", "ec2:DescribeInstances")]
    aws.denials.clear()


def test_an_aws_source_is_refused_to_callers_as_eventbridge_refuses_it(aws: EmbeddedAWS) -> None:
    """Only AWS services emit ``aws.*`` events: a caller's entry fails, the others of the call go
    through; the embedded AWS's own emitters (SSM, CloudWatch, the AWS Health harness) may."""
    from nodemedic_sandbox.embedded_aws import as_aws_service

    events = aws.client("events")
    out = events.put_events(Entries=[
        {"Source": "aws.health", "DetailType": "AWS Health Event", "Detail": "{}"},
        {"Source": "t", "DetailType": "d", "Detail": "{}"},
        {"Source": "aws.ec2", "DetailType": "Capacity Block Expiration Warning", "Detail": "{}"}])
    assert out["FailedEntryCount"] == 2
    codes = [e.get("ErrorCode") for e in out["Entries"]]
    assert codes == ["NotAuthorizedForSourceException", None, "NotAuthorizedForSourceException"]
    assert "EventId" in out["Entries"][1]
    with as_aws_service():
        played = events.put_events(Entries=[{"Source": "aws.health", "DetailType": "AWS Health Event", "Detail": "{}"}])
    assert played["FailedEntryCount"] == 0


def test_an_entry_whose_detail_is_json_but_no_object_fails_and_the_others_go_through(aws: EmbeddedAWS) -> None:
    """EventBridge fails an entry whose Detail is an array, a string, a number or null, or holds
    NaN or Infinity, which JSON does not have (MalformedDetail); moto put it, so a sender that
    wrote one looked fine here."""
    events = aws.client("events")
    details = ["[]", '"NotJSON"', "5", "null", "{not json", '{"x": NaN}', '{"x": [-Infinity]}', "{}"]
    out = events.put_events(Entries=[{"Source": "t", "DetailType": "d", "Detail": d} for d in details])
    assert [e.get("ErrorCode") for e in out["Entries"]] == ["MalformedDetail"] * 7 + [None]
    assert out["FailedEntryCount"] == 7 and "EventId" in out["Entries"][-1]


def test_a_cli_call_removes_no_environment_key_under_moto_s_worker_threads(aws: EmbeddedAWS) -> None:
    """moto's execution workers iterate os.environ (boto3's proxy settings): a key that vanishes
    meanwhile fails the state machine's task with a KeyError. typer adds and deletes
    PYDANTIC_DISABLE_PLUGINS around each command; the embedded AWS seeds it so it is restored."""
    from nodemedic_cli.main import app
    from typer.testing import CliRunner

    deleted: list[str] = []
    delete = type(os.environ).__delitem__

    def spy(environ: Any, key: str) -> None:
        deleted.append(key)
        delete(environ, key)

    with mock.patch.object(type(os.environ), "__delitem__", spy):
        result = CliRunner().invoke(app, ["fleet", "mtbf", "--instances", "8", "--failure-rate", "0.05%"])
    assert result.exit_code == 0, result.output
    assert deleted == []


def test_a_cancelled_transaction_undoes_its_writes_and_only_its_items_are_backed_up(aws: EmbeddedAWS) -> None:
    db = aws.client("dynamodb")
    db.create_table(TableName="tx", BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    for k in ("a", "b", "other"):
        db.put_item(TableName="tx", Item={"pk": {"S": k}, "v": {"N": "1"}})
    cancel = [
        {"Put": {"TableName": "tx", "Item": {"pk": {"S": "new"}, "v": {"N": "9"}}}},
        {"Update": {"TableName": "tx", "Key": {"pk": {"S": "a"}}, "UpdateExpression": "SET v = :n",
                    "ExpressionAttributeValues": {":n": {"N": "9"}}}},
        {"Delete": {"TableName": "tx", "Key": {"pk": {"S": "b"}}}},
        {"ConditionCheck": {"TableName": "tx", "Key": {"pk": {"S": "other"}}, "ConditionExpression": "v = :two",
                            "ExpressionAttributeValues": {":two": {"N": "2"}}}},
    ]
    with mock.patch("copy.deepcopy", wraps=__import__("copy").deepcopy) as deepcopy:
        with pytest.raises(db.exceptions.TransactionCanceledException):
            db.transact_write_items(TransactItems=cancel)
    copied = [type(c.args[0]).__name__ for c in deepcopy.call_args_list]
    assert "Table" not in copied  # moto alone deep-copies the whole table on every transaction
    items = {i["pk"]["S"]: i["v"]["N"] for i in db.scan(TableName="tx")["Items"]}
    assert items == {"a": "1", "b": "1", "other": "1"}  # all or nothing, as on AWS
    db.transact_write_items(TransactItems=cancel[:3])
    assert {i["pk"]["S"]: i["v"]["N"] for i in db.scan(TableName="tx")["Items"]} == {"new": "9", "a": "9", "other": "1"}


def test_an_update_that_grows_an_item_past_400_kb_is_refused_and_changes_nothing(aws: EmbeddedAWS) -> None:
    """AWS refuses any write that makes an item larger than 400 KB. moto checked only an assigned
    attribute: ADD to a set grew an item without bound, so a ledger item that only grows passed
    here and would fail on AWS."""
    db = aws.client("dynamodb")
    db.create_table(TableName="big", BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    db.put_item(TableName="big", Item={"pk": {"S": "a"}, "n": {"N": "0"}})

    def add(member: str) -> None:
        db.update_item(TableName="big", Key={"pk": {"S": "a"}}, UpdateExpression="ADD ids :m, n :one",
                       ExpressionAttributeValues={":m": {"SS": [member]}, ":one": {"N": "1"}})

    add("x" * 150_000)
    add("y" * 150_000)
    with pytest.raises(ClientError, match="Item size to update has exceeded the maximum allowed size"):
        add("z" * 150_000)  # 450 KB
    item = db.get_item(TableName="big", Key={"pk": {"S": "a"}})["Item"]
    assert (len(item["ids"]["SS"]), item["n"]["N"]) == (2, "2")  # as it was before the refused update
    add("w" * 90_000)  # 390 KB: still allowed


def test_a_callback_task_retried_until_its_function_answers_its_own_token(aws: EmbeddedAWS, tmp_path: Path) -> None:
    """HyperPod's check (nodemedic.stages.hyperpod_check): the function raises until HyperPod has
    decided, the state retries it, and the attempt that sees the answer sends it to its own token
    before it returns; the state's result is that answer, as on AWS."""
    _function(aws, tmp_path, "selfanswer",
              "import json, pathlib\n"
              "    tries = pathlib.Path(event['tries']); tries.write_text(tries.read_text() + 'x')\n"
              "    class PendingError(Exception): pass\n"
              "    if len(tries.read_text()) < 3: raise PendingError('not decided yet')\n"
              "    boto3.client('stepfunctions').send_task_success(taskToken=event['token'], "
              "output=json.dumps({'healthy': True}))\n"
              "    return {'answered': True}",
              "states:SendTaskSuccess")
    tries = tmp_path / "tries"
    tries.write_text("")
    arn = _state_machine(aws, {"StartAt": "Check", "States": {"Check": {
        "Type": "Task", "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
        "Parameters": {"FunctionName": "arn:aws:lambda:us-east-1:123456789012:function:selfanswer",
                       "Payload": {"tries": str(tries), "token.$": "$$.Task.Token"}},
        "TimeoutSeconds": 60, "ResultPath": "$.check",
        "Retry": [{"ErrorEquals": ["PendingError"], "IntervalSeconds": 30, "MaxAttempts": 5, "BackoffRate": 1}],
        "End": True}}})
    done = _run(aws, arn, "self")
    assert done["status"] == "SUCCEEDED", done
    assert json.loads(done["output"])["check"] == {"healthy": True}
    assert tries.read_text() == "xxx"


@pytest.mark.parametrize("read", ["get_item", "batch_get_item", "delete_item"])
def test_a_key_over_2048_bytes_is_refused_by_reads_too(aws: EmbeddedAWS, read: str) -> None:
    """DynamoDB refuses a partition key over 2,048 bytes in every request that names one; moto
    refused it only where an item is written, and a read with such a key found nothing."""
    db = aws.client("dynamodb")
    db.create_table(TableName="keys", BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    key = {"pk": {"S": "é" * 1025}}  # 2,050 bytes in UTF-8, 1,025 characters
    call = ({"RequestItems": {"keys": {"Keys": [key]}}} if read == "batch_get_item" else {"TableName": "keys", "Key": key})
    with pytest.raises(ClientError, match="Size of hashkey has exceeded the maximum size limit"):
        getattr(db, read)(**call)
    assert db.get_item(TableName="keys", Key={"pk": {"S": "é" * 1024}}).get("Item") is None  # 2,048 bytes: a key


_UNUSED = {":v": {"S": "1"}, ":unused": {"S": "2"}}


@pytest.mark.parametrize("call", [
    "put_item", "delete_item", "query", "scan", "transact_put", "transact_update", "transact_delete", "transact_check"])
def test_an_expression_value_no_expression_uses_is_refused(aws: EmbeddedAWS, call: str) -> None:
    """DynamoDB refuses an ExpressionAttributeValues entry no expression of the request uses, in
    every request that takes expressions; moto refused it in UpdateItem only, so a condition whose
    value was left out of its expression (a check that silently checks less) passed here."""
    db = aws.client("dynamodb")
    table = f"values-{call}"
    db.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    db.put_item(TableName=table, Item={"pk": {"S": "k"}, "a": {"S": "1"}})
    key, condition = {"pk": {"S": "k"}}, {"ConditionExpression": "a = :v", "ExpressionAttributeValues": _UNUSED}
    calls = {
        "put_item": lambda: db.put_item(TableName=table, Item=key, **condition),
        "delete_item": lambda: db.delete_item(TableName=table, Key=key, **condition),
        "query": lambda: db.query(TableName=table, KeyConditionExpression="pk = :v", ExpressionAttributeValues=_UNUSED),
        "scan": lambda: db.scan(TableName=table, FilterExpression="a = :v", ExpressionAttributeValues=_UNUSED),
        "transact_put": lambda: db.transact_write_items(TransactItems=[
            {"Put": {"TableName": table, "Item": key, **condition}}]),
        "transact_update": lambda: db.transact_write_items(TransactItems=[{"Update": {
            "TableName": table, "Key": key, "UpdateExpression": "SET b = :v", "ExpressionAttributeValues": _UNUSED}}]),
        "transact_delete": lambda: db.transact_write_items(TransactItems=[
            {"Delete": {"TableName": table, "Key": key, **condition}}]),
        "transact_check": lambda: db.transact_write_items(TransactItems=[
            {"ConditionCheck": {"TableName": table, "Key": key, **condition}},
            {"Put": {"TableName": table, "Item": {"pk": {"S": "other"}}}}]),
    }
    with pytest.raises(ClientError, match=r"ExpressionAttributeValues unused in expressions: keys: \{:unused\}"):
        calls[call]()
    assert db.get_item(TableName=table, Key=key)["Item"] == {"pk": {"S": "k"}, "a": {"S": "1"}}  # nothing changed
    assert "Item" not in db.get_item(TableName=table, Key={"pk": {"S": "other"}})


@pytest.mark.parametrize(("subject", "message", "refused"), [
    ("", "a page", "Subject"), ("NodeMedic: node\nquarantined", "a page", "Subject"),
    ("NodeMedic:\tnode quarantined", "a page", "Subject"), ("x" * 101, "a page", "Subject"),
    (None, "", "Empty message")])
def test_a_publish_sns_refuses_is_refused_and_nothing_is_delivered(aws: EmbeddedAWS, subject: str | None, message: str,
                                                                   refused: str) -> None:
    """SNS refuses an empty subject, one with a line break or another control character, one over
    100 characters, and an empty message; moto refused only the long subject."""
    sns, sqs = aws.client("sns"), aws.client("sqs")
    topic = sns.create_topic(Name="pages")["TopicArn"]
    queue = sqs.create_queue(QueueName="pages")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    with pytest.raises(ClientError, match=f"Invalid parameter: {refused}|Subject must be less than 100"):
        sns.publish(TopicArn=topic, Message=message, **({"Subject": subject} if subject is not None else {}))
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)
    sns.publish(TopicArn=topic, Message="a page", Subject="NodeMedic: node quarantined (gpü-1, " + "x" * 64)  # 100 characters
    assert len(sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)["Messages"]) == 1


def test_a_short_poll_may_answer_empty_while_messages_wait_and_a_long_poll_reads_them(aws: EmbeddedAWS) -> None:
    """A short poll asks only some of SQS's servers and answers at once, empty or not; moto's read
    every message, so a reader that stopped at its first empty short poll read everything here and
    left messages behind on AWS. A long poll asks them all."""
    import zlib

    from nodemedic_sandbox.embedded_aws import SQS_SERVERS

    sqs = aws.client("sqs")
    url = sqs.create_queue(QueueName="sampled")["QueueUrl"]
    on: dict[int, set[str]] = {server: set() for server in range(SQS_SERVERS)}
    while not all(on.values()) or sum(map(len, on.values())) < 6:
        sent = sqs.send_message(QueueUrl=url, MessageBody="m")["MessageId"]
        on[zlib.crc32(sent.encode()) % SQS_SERVERS].add(sent)
    answers = [sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)["Messages"]
               for _ in range(SQS_SERVERS)]
    assert [{m["MessageId"] for m in a} for a in answers] == [on[s] for s in range(SQS_SERVERS)]  # a server each
    for m in answers[0]:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)  # the first: empty, the others wait
    read: set[str] = set()
    while batch := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages"):
        read |= {m["MessageId"] for m in batch}
    assert read == on[1] | on[2]


def test_a_functions_long_poll_of_an_empty_queue_waits_its_scaled_time(aws: EmbeddedAWS) -> None:
    """The local stack runs one function at a time: a function's long poll on an empty queue
    stalled every other function for its whole second (the silence sweeper's, at each sweep). Its
    wait is scaled as the run's other waits are; the harness's own long poll waits the second."""
    sqs = aws.client("sqs")
    url = sqs.create_queue(QueueName="empty")["QueueUrl"]
    aws.client("iam").put_role_policy(RoleName="r", PolicyName="poll", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sqs:ReceiveMessage", "Resource": "*"}]}))
    resp = aws.client("lambda").invoke(FunctionName="fn", Payload=json.dumps({"poll": url}).encode())
    answer = json.loads(resp["Payload"].read())
    assert answer.get("got") == 0 and answer["waited"] < 0.5, answer  # 1 s x retry_time_scale 0.01
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    assert time.monotonic() - started >= 0.9


@pytest.mark.parametrize(("given", "runs_for"), [("5", 5), ("600", 600), ("172800", 172_800), ("4", 3600),
                                                 ("0", 3600), ("172801", 3600), ("soon", 3600)])
def test_a_command_runs_for_the_time_ssms_agent_gives_it(given: str, runs_for: int) -> None:
    """The agent runs a step whose timeoutSeconds is under 5 s or over two days for its default
    hour: a 2 s timeout is no timeout at all on AWS."""
    assert ssm_agent_timeout(given) == runs_for


def test_an_execution_running_when_its_embedded_aws_stops_reaches_no_later_one(tmp_path: Path) -> None:
    """moto runs executions on threads that outlive the mocks: one still running when its stack
    stopped went on invoking that stack's functions inside the next test's embedded AWS, whose IAM
    then denied them (a CI failure in a test that had passed). Stopping ends them first."""
    code = tmp_path / "fn"
    code.mkdir()
    (code / "app.py").write_text("import time\ndef handler(event, context):\n    time.sleep(event['sleep'])\n    return {}\n")
    invoke = {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke"}
    definition = {"StartAt": "Slow", "States": {
        "Slow": {**invoke, "Parameters": {"FunctionName": "fn", "Payload": {"sleep": 1}}, "Next": "Then"},
        "Then": {**invoke, "Parameters": {"FunctionName": "fn", "Payload": {"sleep": 0}}, "End": True}}}
    with EmbeddedAWS(retry_time_scale=0.01) as first:
        iam = first.client("iam")
        role = iam.create_role(RoleName="sm", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        iam.put_role_policy(RoleName="sm", PolicyName="p", PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": "*"}]}))
        first.client("lambda").create_function(FunctionName="fn", Runtime="python3.12", Role=role, Handler="app.handler",
                                               Code={"ZipFile": b"PK"})
        first.functions["fn"] = FunctionSource(code, "app.handler")
        first.state_machine_roles.append(role)
        sfn = first.client("stepfunctions")
        arn = sfn.create_state_machine(name="m", definition=json.dumps(definition), roleArn=role)["stateMachineArn"]
        execution = sfn.start_execution(stateMachineArn=arn, input="{}")["executionArn"]
        time.sleep(0.5)
        assert first.invocations == []  # "Slow" is in flight: stop() comes now
    with EmbeddedAWS(retry_time_scale=0.01) as second:
        iam = second.client("iam")
        second.state_machine_roles.append(iam.create_role(RoleName="sm", AssumeRolePolicyDocument="{}")["Role"]["Arn"])
        time.sleep(2)  # "Then" would have been invoked by now
        assert (second.denials, second.invocations) == ([], [])
    assert [i.event for i in first.invocations] == [{"sleep": 1}]  # "Slow" ended; "Then" never ran
    assert execution
