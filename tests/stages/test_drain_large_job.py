"""A drain's result does not grow with the size of the job it requeues.

The drain result travels in the execution's state (Step Functions: 256 KiB per state, and a
result over it ends the execution whatever its Catch) and in the incident's ledger item
(DynamoDB: 400 KB). It once carried every node of every requeued job: a job of ~6,000 EKS nodes,
named ``ip-10-…us-west-2.compute.internal``, filled the state alone. The names are recorded on
the nodes themselves (each learns its job was requeued) and the result keeps a count.

Fast tier: the real Drain stage, the ledger in DynamoDB (embedded), the scheduler in memory.
"""

from __future__ import annotations

import json

from nodemedic.errors import EvictionPendingError
from nodemedic.orchestrators.base import EvacuationResult
from nodemedic.stages.drain import drain
from nodemedic.store.ledger import Ledger

from tests.stages.conftest import PREFIX, clock, opened
from tests.stages.memory_slurm import MemorySlurm

JOB = "job-1"


def _eks_names(count: int, subnet: int = 0) -> list[str]:
    return [f"ip-10-{subnet}-{i // 256}-{i % 256}.us-west-2.compute.internal" for i in range(count)]


def _one_job_on(names: list[str]) -> MemorySlurm:
    scheduler = MemorySlurm(names)
    for node in scheduler.n.values():
        node.jobs = [JOB]
    return scheduler


def _drained_result(ledger: Ledger, scheduler: MemorySlurm, node: str) -> tuple[str, dict]:
    incident = opened(ledger, node)
    out = drain(incident, orchestrator=scheduler, ledger=ledger, prefix=PREFIX, clock=clock)
    return out.model_dump_json(), ledger.get(incident.incident_id).stages["drain"].result


def test_the_result_of_draining_a_job_of_400_nodes_is_as_small_as_of_a_job_of_2(ledger: Ledger) -> None:
    few = _eks_names(2, subnet=9)
    small, _ = _drained_result(ledger, _one_job_on(few), few[0])
    names = _eks_names(400)
    big, recorded = _drained_result(ledger, _one_job_on(names), names[0])

    assert len(big) <= len(small) + 2  # the count's digits, nothing per node
    assert json.loads(big)["requeued_jobs"] == [JOB] and json.loads(big)["job_sizes"] == {JOB: 400}
    assert len(json.dumps(recorded)) < 1_000
    # every other node of the job knows its job was requeued (it takes a spare if it fails too)
    assert {node: ledger.interrupted_on("c1", node, clock()) for node in names[1:]} == {n: [JOB] for n in names[1:]}
    assert ledger.interrupted_on("c1", names[0], clock()) == []


class _SlowToLeave(MemorySlurm):
    """Kubernetes-like: the job's pods leave over two calls (a PodDisruptionBudget)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(names)
        self.names = names
        self.calls_left = 2

    def evacuate(self, node: str, started_at: float | None = None) -> EvacuationResult:
        self.calls_left -= 1
        pending = [f"{JOB}/worker-0"] if self.calls_left else []
        return EvacuationResult(requeued=[JOB], not_requeued=[], job_nodes={JOB: self.names}, pending=pending)


def test_a_drain_waiting_for_pods_to_leave_records_counts_not_names_and_marks_the_nodes_at_once(
        ledger: Ledger) -> None:
    names = _eks_names(50)
    scheduler = _SlowToLeave(names)
    incident = opened(ledger, names[0])
    try:
        drain(incident, orchestrator=scheduler, ledger=ledger, prefix=PREFIX, clock=clock)
        raise AssertionError("the pods had not left")
    except EvictionPendingError:
        pass
    progress = ledger.get(incident.incident_id).stages["drain"].result
    assert "compute.internal" not in json.dumps(progress)
    assert ledger.interrupted_on("c1", names[7], clock()) == [JOB]

    out = drain(incident, orchestrator=scheduler, ledger=ledger, prefix=PREFIX, clock=clock)
    assert out.requeued_jobs == [JOB] and out.job_sizes == {JOB: 50}
