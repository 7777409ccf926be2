"""The jobs stage counts a job as back only once it has restarted: a workload that reads RUNNING
with a start from before its drain (on Kubernetes, its surviving pods run while the evicted one
has not been made again yet) is still waiting, and no negative job downtime is recorded."""

from __future__ import annotations

from datetime import datetime

import pytest
from nodemedic.orchestrators.base import JobState
from nodemedic.stages.resume import await_jobs
from nodemedic.store.ledger import Ledger

from tests.stages.conftest import clock, opened
from tests.stages.memory_slurm import MemorySlurm

JOB = "training/PyTorchJob/llm"


class Survivors(MemorySlurm):
    """The job reads RUNNING from its surviving workers' old start, then from its new worker's."""

    def __init__(self, starts: list[float], members: list[int | None] | None = None) -> None:
        super().__init__(["gpu-1", "gpu-2"])
        self.starts = starts
        self.members = members or [None]

    def job_states(self, job_ids: list[str]) -> dict[str, JobState]:
        start = self.starts.pop(0) if len(self.starts) > 1 else self.starts[0]
        members = self.members.pop(0) if len(self.members) > 1 else self.members[0]
        return {j: JobState(j, "RUNNING", start, members) for j in job_ids}


def _drained(ledger: Ledger, result: dict[str, object] | None = None) -> tuple[object, datetime]:
    incident = opened(ledger, "gpu-1", minutes_ago=1)
    drained_at = clock()
    ledger.start_stage(incident, "drain", drained_at)
    ledger.complete_stage(incident, "drain", drained_at, result or {"requeued_jobs": [JOB]})
    return incident, drained_at


def test_a_job_running_on_its_survivors_only_is_not_back_until_its_new_worker_starts(ledger: Ledger) -> None:
    incident, drained_at = _drained(ledger)
    before, restarted = drained_at.timestamp() - 3600, drained_at.timestamp() + 4
    out = await_jobs(incident, orchestrator=Survivors([before, before, restarted]), ledger=ledger, wait_s=600,
                     clock=clock, sleep=lambda _: None)
    assert out.running == {JOB: round(restarted - incident.observed_at.timestamp(), 3)}
    assert out.job_downtime_s is not None and out.job_downtime_s > 0


def test_a_job_that_never_restarts_is_recorded_pending_not_running(ledger: Ledger) -> None:
    incident, drained_at = _drained(ledger)
    out = await_jobs(incident, orchestrator=Survivors([drained_at.timestamp() - 3600]), ledger=ledger, wait_s=0,
                     clock=clock, sleep=lambda _: None)
    assert out.running == {} and out.pending == [JOB] and out.job_downtime_s is None


def test_a_restart_read_in_whole_seconds_right_after_the_fault_is_no_negative_downtime(ledger: Ledger) -> None:
    """Kubernetes gives a container's start in whole seconds, and the scheduler's clock is not the
    node's: a job moved to a spare within a second of its fault read as back 0.7 s before it."""
    incident = opened(ledger, "gpu-1")
    ledger.start_stage(incident, "drain", incident.observed_at)
    ledger.complete_stage(incident, "drain", incident.observed_at, {"requeued_jobs": [JOB]})
    start = float(int(incident.observed_at.timestamp()))  # truncated: up to 1 s before the fault
    if start == incident.observed_at.timestamp():
        start -= 1
    out = await_jobs(incident, orchestrator=Survivors([start]), ledger=ledger, wait_s=600, clock=clock,
                     sleep=lambda _: None)
    assert out.running == {JOB: 0.0} and out.job_downtime_s == 0.0


def test_a_workload_on_fewer_pods_than_the_drain_saw_is_not_back_until_it_runs_as_many(ledger: Ledger) -> None:
    """Kubernetes: its survivors started within a second of the drain, so the start alone cannot
    tell them from a restart; the evicted pod not made again yet leaves the workload one pod short."""
    incident, drained_at = _drained(ledger, {"requeued_jobs": [JOB], "job_members": {JOB: 4}})
    started = drained_at.timestamp() - 1
    out = await_jobs(incident, orchestrator=Survivors([started, started, started + 9], [3, 3, 4]), ledger=ledger,
                     wait_s=600, clock=clock, sleep=lambda _: None)
    assert out.running == {JOB: round(started + 9 - incident.observed_at.timestamp(), 3)}


@pytest.mark.parametrize("recorded", [{}, {JOB: "4"}, {JOB: True}, {JOB: 0}, [4]], ids=str)
def test_a_drain_recorded_without_a_readable_pod_count_reads_the_start_alone(
        ledger: Ledger, recorded: object) -> None:
    incident, drained_at = _drained(ledger, {"requeued_jobs": [JOB], "job_members": recorded})
    started = drained_at.timestamp() + 1
    out = await_jobs(incident, orchestrator=Survivors([started], [1]), ledger=ledger, wait_s=600, clock=clock,
                     sleep=lambda _: None)
    assert out.running == {JOB: round(started - incident.observed_at.timestamp(), 3)}
