"""A stage retried after its command's answer was lost neither does the work again nor misreads it.

Fast tier: the real Repair stage and RunCommand, the ledger in DynamoDB (embedded), Slurm in
memory, SSM played as AWS answers (InProgress until the command ends).
"""

from __future__ import annotations

import itertools

import pytest
from nodemedic.contracts.incident import SPARE_CLAIM
from nodemedic.errors import CommandPendingError
from nodemedic.providers.run_command import Documents, RunCommand
from nodemedic.stages.drain import drain
from nodemedic.stages.repair import repair
from nodemedic.stages.resume import resume
from nodemedic.store.ledger import Ledger

from tests.component.test_requeue_retry import SlowCommandSSM
from tests.stages.conftest import PREFIX, clock, opened
from tests.stages.memory_provider import MemoryProvider
from tests.stages.memory_slurm import MemorySlurm


def test_a_gpu_reset_still_running_when_the_wait_ran_out_is_waited_for_not_sent_again(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = opened(ledger, "gpu-1", ladder=("gpu_reset", "reboot"))
    slurm.n["gpu-1"].drained = True
    ssm = SlowCommandSSM()
    ticks = itertools.count()
    runner = RunCommand(ssm, poll_interval=0, sleep=lambda _: None, clock=lambda: float(next(ticks)))

    def climb():
        return repair(incident, "service", provider=MemoryProvider(), orchestrator=slurm, runner=runner,
                      ledger=ledger, documents=Documents("c1"), timeout_s=30, check_timeout_s=600, prefix=PREFIX,
                      clock=clock)

    with pytest.raises(CommandPendingError):
        climb()
    ssm.done = True  # the reset ends while Step Functions waits to retry
    out = climb()
    assert (out.rung, out.attempt) == ("gpu_reset", 1)
    assert len(ssm.commands) == 1, "a second reset was started on GPUs the first was still resetting"
    rung = ledger.get(incident.incident_id).stages["repair"].result["rungs"][0]
    assert rung["reset"]["status"] == "Success"


class _AnswerLost(MemorySlurm):
    """The command that returns the node takes effect, but its answer never comes back."""

    lose = True

    def resume(self, node: str, owner: str = "*") -> bool:
        done = super().resume(node, owner)
        if self.lose:
            self.lose = False
            raise CommandPendingError("command on i-0ctl still running after 60s")
        return done


@pytest.mark.parametrize("destination", ["service", "pool"])
def test_a_resume_whose_answer_was_lost_is_recorded_as_nodemedic_returning_the_node(
        ledger: Ledger, destination: str) -> None:
    slurm = _AnswerLost(["gpu-1", "gpu-2"])
    incident = opened(ledger, "gpu-1")
    drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    if destination == "pool":
        assert ledger.claim(SPARE_CLAIM, "gpu-1", incident.incident_id)

    def back():
        return resume(incident, destination, orchestrator=slurm, ledger=ledger, prefix=PREFIX, job_wait_s=0,
                      pool_size=1, clock=clock)

    with pytest.raises(CommandPendingError):
        back()
    assert not slurm.n["gpu-1"].drained  # it took effect
    out = back()  # Step Functions retries the stage
    assert out.resumed is True and out.destination == destination
    closed = ledger.get(incident.incident_id)
    assert closed.status == "closed" and "operator" not in closed.outcome
    assert ledger.claim(SPARE_CLAIM, "gpu-1", "inc-other"), "the node's spare claim was left behind"
