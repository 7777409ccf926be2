"""The deep health check's callback (HealthCheckResult) answers its task exactly when it can:
a transient error leaves the check waiting for the retry; it is never lost."""

from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError
from nodemedic.contracts.incident import IncidentRef
from nodemedic.errors import CommandPendingError
from nodemedic.stages.health_check import complete_check
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger

from tests.component.test_ledger import incident, ledger  # noqa: F401 - the fixture

REPORT = '{"healthy": true, "checks": [{"name": "gpus", "ok": true}]}'


class FakeSSM:
    class exceptions:  # noqa: N801 - the shape of a boto3 client's exceptions
        class InvocationDoesNotExist(Exception): ...  # noqa: N818

    def __init__(self, status: str, missing: int = 0) -> None:
        self.status = status
        self.missing = missing  # SSM has no invocation for the command for this many reads
        self.reads = 0

    def get_command_invocation(self, **_: Any) -> dict[str, Any]:
        self.reads += 1
        if self.reads <= self.missing:
            raise self.exceptions.InvocationDoesNotExist()
        return {"Status": self.status, "ResponseCode": 0, "StandardOutputContent": REPORT}


class FakeStepFunctions:
    class exceptions:  # noqa: N801 - the shape of a boto3 client's exceptions
        class TaskTimedOut(Exception): ...  # noqa: N818
        class TaskDoesNotExist(Exception): ...  # noqa: N818
        class InvalidToken(Exception): ...  # noqa: N818

    def __init__(self, throttled: int) -> None:
        self.throttled = throttled
        self.answers: list[str] = []

    def send_task_success(self, taskToken: str, output: str) -> None:  # noqa: N803 - boto3's names
        if self.throttled:
            self.throttled -= 1
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}},
                              "SendTaskSuccess")
        self.answers.append(taskToken)


def _waiting(ledger: Ledger) -> IncidentRef:  # noqa: F811
    opened = incident("inc-1")
    assert ledger.open_incident(opened) is None
    ref = IncidentRef(**{name: getattr(opened, name) for name in IncidentRef.model_fields})
    ledger.start_stage(ref, "verify", datetime.now(UTC))
    ledger.save_check("cmd-1", ref.incident_id, "token-1", {"instance_id": ref.instance_id, "level": "quick",
                                                            "purpose": "verify", "incident": ref.model_dump(mode="json")})
    return ref


def test_a_throttled_answer_leaves_the_check_for_the_retry(ledger: Ledger) -> None:  # noqa: F811
    _waiting(ledger)
    sfn = FakeStepFunctions(throttled=1)
    control = ControlStore(ledger._db, "incidents", "c")
    with pytest.raises(ClientError):
        complete_check("cmd-1", ssm=FakeSSM("Success"), stepfunctions=sfn, ledger=ledger, control=control,
                       clock=lambda: datetime.now(UTC))
    assert ledger.waiting_check("cmd-1") is not None, "the check was lost with the failed answer"
    out = complete_check("cmd-1", ssm=FakeSSM("Success"), stepfunctions=sfn, ledger=ledger, control=control,
                         clock=lambda: datetime.now(UTC))
    assert out is not None and out.healthy
    assert sfn.answers == ["token-1"]
    assert ledger.waiting_check("cmd-1") is None
    assert complete_check("cmd-1", ssm=FakeSSM("Success"), stepfunctions=sfn, ledger=ledger, control=control,
                          clock=lambda: datetime.now(UTC)) is None, "a late duplicate event answered again"


@pytest.mark.parametrize(("status", "missing"), [("Cancelling", 0), ("Success", 1)])
def test_a_command_not_ended_or_not_yet_known_to_ssm_is_not_judged(ledger: Ledger, status: str,  # noqa: F811
                                                                   missing: int) -> None:
    _waiting(ledger)
    sfn = FakeStepFunctions(throttled=0)
    with pytest.raises(CommandPendingError):
        complete_check("cmd-1", ssm=FakeSSM(status, missing), stepfunctions=sfn, ledger=ledger,
                       control=ControlStore(ledger._db, "incidents", "c"), clock=lambda: datetime.now(UTC))
    assert sfn.answers == [] and ledger.waiting_check("cmd-1") is not None


def test_a_command_ssm_registers_late_is_read_as_soon_as_it_is_there_not_a_poll_later() -> None:
    from nodemedic.providers.run_command import REGISTRATION_POLL_S, RunCommand

    slept: list[float] = []
    ssm = FakeSSM("Success", missing=2)
    result = RunCommand(ssm, poll_interval=5.0, sleep=slept.append).wait("i-1", "cmd-1", 60)
    assert result.status == "Success" and ssm.reads == 3
    assert slept == [REGISTRATION_POLL_S, REGISTRATION_POLL_S]  # not the 5 s poll
    never = FakeSSM("Success", missing=10_000)  # never registered: the wait runs out as for a command still running
    ticks = iter(range(10_000))
    with pytest.raises(CommandPendingError):
        RunCommand(never, poll_interval=1.0, sleep=lambda _: None, clock=lambda: float(next(ticks))).wait("i-1", "c", 5)


class GoneRunner:
    """SSM refuses the instance for good: EC2 shows it terminated."""

    def __init__(self) -> None:
        self.sends = 0

    def send(self, instance_id: str, *_: Any) -> str:
        from nodemedic.errors import InstanceGoneError

        self.sends += 1
        raise InstanceGoneError(f"{instance_id} is terminated: someone else ended it")


def test_a_check_of_an_instance_that_is_gone_fails_at_once_and_a_lost_answer_is_given_again(
        ledger: Ledger) -> None:  # noqa: F811
    """The verification of a node whose instance was terminated meanwhile: unhealthy at once (the
    second signal), answered by the starter itself; a throttled answer is given again by the
    state machine's retry, which sends nothing."""
    from nodemedic.providers.run_command import Documents
    from nodemedic.stages.health_check import start_check

    opened = incident("inc-2")
    assert ledger.open_incident(opened) is None
    ref = IncidentRef(**{name: getattr(opened, name) for name in IncidentRef.model_fields})
    control = ControlStore(ledger._db, "incidents", "c")
    sfn, runner = FakeStepFunctions(throttled=1), GoneRunner()

    def start() -> str:
        return start_check(ref, ref.instance_id, "quick", "token-2", purpose="verify", runner=runner,  # type: ignore[arg-type]
                           ledger=ledger, control=control, stepfunctions=sfn, documents=Documents("c"), timeout_s=60,
                           clock=lambda: datetime.now(UTC))

    with pytest.raises(ClientError):
        start()
    assert start() == f"gone:{ref.instance_id}" and sfn.answers == ["token-2"] and runner.sends == 1
    verify = ledger.get("inc-2").stages["verify"]
    assert verify.completed_at is not None and verify.result["healthy"] is False
    assert "is terminated" in verify.result["checks"][0]["detail"]
    assert ledger.get("inc-2").status == "open"  # the second signal: remediation goes on
