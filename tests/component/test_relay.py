"""The relay against the embedded SQS, DynamoDB and SSM, with two documents of its own: commands
run side by side, as SSM's agent runs them, so one slow command does not make the others late (a
late request is refused: its sender stopped waiting), and one still running is not failed as cut
off when its message comes back."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError
from nodemedic.contracts.relay import RelayRequest, relay_key
from nodemedic.providers.relay_command import RelayCommand
from nodemedic_agent.relay import Relay
from nodemedic_sandbox.deploy import create_table_as_declared
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

CONTROLLER = "i-0c0c0c0c0c0c0c0c0"


def _document(script: str) -> str:
    return json.dumps({"schemaVersion": "2.2", "description": "test", "parameters": {
        "seconds": {"type": "String", "default": "0", "allowedPattern": "^[0-9]{1,2}$"}},
        "mainSteps": [{"action": "aws:runShellScript", "name": "run", "inputs": {"runCommand": [script]}}]})


@pytest.fixture
def relay() -> Iterator[SimpleNamespace]:
    with EmbeddedAWS() as aws:
        db, sqs, ssm = aws.client("dynamodb"), aws.client("sqs"), aws.client("ssm")
        table = create_table_as_declared(db, "incidents")
        queue = sqs.create_queue(QueueName="relay")["QueueUrl"]
        ssm.create_document(Name="nodemedic-c1-slow", DocumentType="Command", DocumentFormat="JSON",
                            Content=_document("sleep {{ seconds }}; echo slow"))
        ssm.create_document(Name="nodemedic-c1-fast", DocumentType="Command", DocumentFormat="JSON",
                            Content=_document("echo fast"))
        runner = Relay(cluster="c1", instance_id=CONTROLLER, queue_url=queue, table=table, sqs=sqs, ssm=ssm,
                       dynamodb=db, receive_wait_s=1, workers=4)
        thread = threading.Thread(target=runner.serve, daemon=True)
        thread.start()
        try:
            yield SimpleNamespace(runner=runner, relayed=RelayCommand(sqs, queue, db, table, poll_interval=0.1),
                                  db=db, sqs=sqs, ssm=ssm)
        finally:
            runner.stop_event.set()
            thread.join(timeout=30)


def test_a_slow_command_does_not_make_the_next_one_late(relay: SimpleNamespace) -> None:
    runner, relayed = relay.runner, relay.relayed
    slow = relayed.send(CONTROLLER, "nodemedic-c1-slow", {"seconds": "9"}, 30)
    time.sleep(0.5)  # taken first
    # answered within its own 6 s, which a relay running one command at a time could not do: the
    # slow one still had 8.5 s to run (6 s, not less: a loaded machine is slow to start a command)
    fast = relayed.wait(CONTROLLER, relayed.send(CONTROLLER, "nodemedic-c1-fast", {}, 6), 6)
    assert fast.ok and fast.stdout.strip() == "fast", fast
    assert relayed.wait(CONTROLLER, slow, 30).stdout.strip() == "slow"  # one after the other, fast was refused
    assert runner.ran == 2 and runner.refused == 0


def test_a_request_still_running_is_not_failed_when_its_message_comes_back(
        relay: SimpleNamespace) -> None:
    runner, relayed, db, sqs = relay.runner, relay.relayed, relay.db, relay.sqs
    command_id = relayed.send(CONTROLLER, "nodemedic-c1-slow", {"seconds": "3"}, 30)
    time.sleep(1)  # running now
    sqs.send_message(QueueUrl=runner.queue_url, MessageBody=json.dumps({"command_id": command_id}))
    result = relayed.wait(CONTROLLER, command_id, 30)
    assert (result.status, result.stdout.strip()) == ("Success", "slow")

    # one InProgress for longer than its timeout: its relay stopped while it ran; failed, not run again
    cut = RelayRequest(command_id=uuid.uuid4().hex, instance_id=CONTROLLER, document="nodemedic-c1-fast",
                       parameters={}, timeout_s=5, sent_at=datetime.now(UTC))
    db.put_item(TableName="incidents", Item={
        "pk": {"S": relay_key(cut.command_id)}, "status": {"S": "InProgress"}, "request": {"S": cut.model_dump_json()},
        "started_at": {"S": (datetime.now(UTC) - timedelta(minutes=5)).isoformat()}})
    sqs.send_message(QueueUrl=runner.queue_url, MessageBody=json.dumps({"command_id": cut.command_id}))
    failed = relayed.wait(CONTROLLER, cut.command_id, 10)
    assert failed.status == "Failed" and "stopped while the command ran" in failed.stderr
    assert runner.ran == 1


def test_a_document_the_stack_updated_is_run_as_it_is_now(relay: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stack update gives a document a new version; the relay reads it again (every
    DOCUMENT_CACHE_S) rather than running the content it read first for as long as it runs."""
    import nodemedic_agent.relay as relay_module

    relayed, ssm = relay.relayed, relay.ssm
    assert relayed.run_checked(CONTROLLER, "nodemedic-c1-fast", {}, 10).strip() == "fast"
    version = ssm.update_document(Name="nodemedic-c1-fast", Content=_document("echo faster"),
                                  DocumentVersion="$LATEST")["DocumentDescription"]["DocumentVersion"]
    ssm.update_document_default_version(Name="nodemedic-c1-fast", DocumentVersion=version)
    assert relayed.run_checked(CONTROLLER, "nodemedic-c1-fast", {}, 10).strip() == "fast"  # read 0 s ago
    monkeypatch.setattr(relay_module, "DOCUMENT_CACHE_S", 0)
    assert relayed.run_checked(CONTROLLER, "nodemedic-c1-fast", {}, 10).strip() == "faster"


class _Throttled:
    """One of the relay's clients, whose next ``times`` calls of ``operation`` are throttled (after
    the SDK's own retries), as an account's other callers can make them; ``when`` picks the calls."""

    def __init__(self, client: object, operation: str, times: int,
                 when: Callable[[dict[str, Any]], bool] = lambda _: True) -> None:
        self._client, self._operation, self.times, self._when, self.calls = client, operation, times, when, 0

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._client, name)
        if name != self._operation:
            return call

        def throttled(**kwargs: Any) -> Any:
            if self._when(kwargs):
                self.calls += 1
                if self.calls <= self.times:
                    code = "ProvisionedThroughputExceededException" if "Table" in str(kwargs) else "ThrottlingException"
                    raise ClientError({"Error": {"Code": code, "Message": "Rate exceeded"},
                                       "ResponseMetadata": {"HTTPStatusCode": 400}}, self._operation)
            return call(**kwargs)
        return throttled


def test_a_document_ssm_throttles_is_not_a_refusal(relay: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """SSM throttles the relay's GetDocument. A document never read yet: the request waits (its
    message comes back seconds later) and then runs, once; it is not failed. A document read
    before: the copy read last runs. A document SSM says does not exist is refused at once."""
    import nodemedic_agent.relay as relay_module

    runner, relayed = relay.runner, relay.relayed
    runner._retry_after_s = 1
    throttled = _Throttled(relay.ssm, "get_document", times=2)
    runner._ssm = throttled
    result = relayed.wait(CONTROLLER, relayed.send(CONTROLLER, "nodemedic-c1-fast", {}, 30), 30)
    assert (result.status, result.stdout.strip()) == ("Success", "fast")
    assert throttled.calls == 3 and runner.ran == 1 and runner.refused == 0

    monkeypatch.setattr(relay_module, "DOCUMENT_CACHE_S", 0)  # read again each time; throttled now
    throttled.times += 1
    assert relayed.run_checked(CONTROLLER, "nodemedic-c1-fast", {}, 10).strip() == "fast"
    assert throttled.calls == 4 and runner.ran == 2

    gone = relayed.wait(CONTROLLER, relayed.send(CONTROLLER, "nodemedic-c1-missing", {}, 30), 10)
    assert gone.status == "Failed" and "nodemedic-c1-missing cannot be read from SSM" in gone.stderr
    assert runner.refused == 1


def test_a_request_whose_record_dynamodb_throttles_runs_seconds_later_with_its_outcome_written(
        relay: SimpleNamespace) -> None:
    """DynamoDB throttles the relay past its SDK's retries: reading a request's record, then
    writing a command's outcome. Before, the first left the request until the queue's visibility
    timeout (15 min: its sender had long stopped waiting; a drain failed), the second lost what
    the command did. Now the request is taken again seconds later, and the outcome written again."""
    runner, relayed = relay.runner, relay.relayed
    runner._retry_after_s = 1
    reads = _Throttled(relay.db, "get_item", times=2)
    runner._db = reads
    result = relayed.wait(CONTROLLER, relayed.send(CONTROLLER, "nodemedic-c1-fast", {}, 30), 30)
    assert (result.status, result.stdout.strip()) == ("Success", "fast") and reads.calls == 3

    outcomes = _Throttled(relay.db, "update_item", times=2, when=lambda call: ":out" in str(call))
    runner._db = outcomes
    result = relayed.wait(CONTROLLER, relayed.send(CONTROLLER, "nodemedic-c1-fast", {}, 30), 30)
    assert (result.status, result.stdout.strip()) == ("Success", "fast") and outcomes.calls == 3
    assert runner.ran == 2 and runner.refused == 0
