"""A node whose capacity ends (a Capacity Block): drained, its job moved to a spare that outlives
the block, the incident ended retired with the node left drained and its lock held."""

from __future__ import annotations

from datetime import UTC, datetime

from nodemedic.contracts.incident import Incident
from nodemedic.providers.base import Member
from nodemedic.reconciler import reconcile
from nodemedic.stages.drain import drain
from nodemedic.stages.resume import resume, retire
from nodemedic.stages.spares import swap_in
from nodemedic.store.ledger import Ledger

from tests.stages.conftest import PREFIX, clock, opened
from tests.stages.memory_provider import MemoryProvider
from tests.stages.memory_slurm import MemorySlurm

BLOCK = "cr-0a1b2c3d4e5f60718"


def _retiring(ledger: Ledger, node: str) -> Incident:
    at = datetime.now(UTC)
    incident = Incident(incident_id=f"inc-retire-{node}", cluster="c1", instance_id=f"i-{node}", slurm_node=node,
                        fault_code="PLANNED_CAPACITY_END", fault_class="planned", action="retire",
                        source="nodemedic.planned", observed_at=at, status="open", detected_at=at, reason="test")
    assert ledger.open_incident(incident) is None
    return incident


def _in(node: str, block: str = "") -> Member:
    return Member(f"i-{node}", node, "running", topology={"capacity_reservation": block} if block else {})


def test_a_retiring_node_takes_a_spare_outside_its_block_and_stays_drained(ledger: Ledger) -> None:
    slurm = MemorySlurm(["gpu-1", "gpu-2", "spare-1", "spare-2"], spares=("spare-1", "spare-2"))
    provider = MemoryProvider(_in("gpu-1", BLOCK), _in("gpu-2"), _in("spare-1", BLOCK), _in("spare-2"))
    slurm.n["gpu-1"].jobs = ["41"]
    incident = _retiring(ledger, "gpu-1")
    drained = drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    assert drained.requeued_jobs == ["41"]
    spared = swap_in(incident, orchestrator=slurm, provider=provider, ledger=ledger, pool_size=2, clock=clock)
    assert spared.spare == "spare-2", "spare-1 ends with the block"
    assert slurm.n["spare-1"].reserved and not slurm.n["spare-2"].reserved

    ended = retire(incident, ledger=ledger, clock=clock)
    assert ended.status == "retired" and "its jobs moved to spare-2" in ended.message
    assert ledger.get(incident.incident_id).status == "retired"
    assert slurm.n["gpu-1"].drained, "left drained until AWS takes it back"
    assert retire(incident, ledger=ledger, clock=clock).status == "retired", "a retried step changes nothing"
    report = reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "SUCCEEDED",
                       prefix=PREFIX, now=clock(), publish=lambda _: None)
    assert not report.locks_released and not report.drains_reasserted
    assert ledger.open_incident(_later_event(incident)) is not None, "later events fold into the retired incident"


def test_with_only_spares_in_the_block_the_job_waits_and_says_why(ledger: Ledger) -> None:
    slurm = MemorySlurm(["gpu-1", "spare-1"], spares=("spare-1",))
    provider = MemoryProvider(_in("gpu-1", BLOCK), _in("spare-1", BLOCK))
    slurm.n["gpu-1"].jobs = ["41"]
    incident = _retiring(ledger, "gpu-1")
    drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    spared = swap_in(incident, orchestrator=slurm, provider=provider, ledger=ledger, pool_size=1, clock=clock)
    assert spared.spare is None and "spare-1 (its capacity ends too)" in spared.reason
    assert spared.reason.endswith("the node stays drained (its capacity ends)")
    assert slurm.n["spare-1"].reserved


def test_a_fault_elsewhere_may_take_a_spare_in_a_block(ledger: Ledger) -> None:
    slurm = MemorySlurm(["gpu-1", "spare-1"], spares=("spare-1",))
    provider = MemoryProvider(_in("gpu-1", BLOCK), _in("spare-1", BLOCK))
    slurm.n["gpu-1"].jobs = ["41"]
    at = datetime.now(UTC)
    fault = Incident(incident_id="inc-xid", cluster="c1", instance_id="i-gpu-1", slurm_node="gpu-1",
                     fault_code="XID 79", fault_class="gpu_lost", action="replace", source="test", observed_at=at,
                     status="open", detected_at=at, reason="test")
    assert ledger.open_incident(fault) is None
    drain(fault, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    assert swap_in(fault, orchestrator=slurm, provider=provider, ledger=ledger, pool_size=1,
                   clock=clock).spare == "spare-1"


def _later_event(incident: Incident) -> Incident:
    return incident.model_copy(update={"incident_id": "inc-later", "fault_code": "NODE_SILENT"})


def _capacity_ends(ledger: Ledger, incident: Incident, instance: str) -> None:
    """What Detect notes when a Capacity Block's end for ``instance`` folds into the open incident."""
    ledger.start_stage(incident, "capacity_end", clock())
    ledger.complete_stage(incident, "capacity_end", clock(), {"fault_code": "PLANNED_CAPACITY_END",
                                                              "instance_id": instance})


def _repaired(ledger: Ledger, incident: Incident, rung: str, instance: str) -> None:
    ledger.start_stage(incident, "repair", clock())
    ledger.record_progress(incident, "repair", {"rungs": [
        {"rung": rung, "instance_id": instance, "done_at": clock().isoformat(), "check": {"healthy": True}}]})


def test_a_node_repaired_while_its_block_ends_is_retired_not_returned(slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = opened(ledger, ladder=("gpu_reset",))
    drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    _repaired(ledger, incident, "gpu_reset", "i-gpu-1")
    _capacity_ends(ledger, incident, "i-gpu-1")  # noted while its check ran
    out = resume(incident, "service", orchestrator=slurm, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=0,
                 clock=clock)
    assert out.retired and not out.resumed
    stored = ledger.get(incident.incident_id)
    assert stored.status == "retired" and "repaired but not returned: its capacity ends" in stored.outcome
    assert slurm.n["gpu-1"].drained and ledger.hold_of("c1", "gpu-1") is not None
    assert ledger.active_incident_id("c1", "i-gpu-1") == incident.incident_id, "the lock is kept"
    report = reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "SUCCEEDED",
                       prefix=PREFIX, now=clock(), publish=lambda _: None)
    assert not report.locks_released and not report.drains_reasserted


def test_a_replacement_is_returned_when_the_end_named_the_instance_it_replaced(slurm: MemorySlurm,
                                                                               ledger: Ledger) -> None:
    incident = opened(ledger, ladder=("replace",))
    drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    _capacity_ends(ledger, incident, "i-gpu-1")
    _repaired(ledger, incident, "replace", "i-new")  # a new instance backs gpu-1 now
    out = resume(incident, "service", orchestrator=slurm, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=0,
                 clock=clock)
    assert out.resumed and not out.retired and not slurm.n["gpu-1"].drained
    assert ledger.get(incident.incident_id).status == "closed"
