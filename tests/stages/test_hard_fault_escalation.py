"""A hard fault that comes to a node whose incident lets its jobs run on ends the wait for them.

A DEGRADED (slow) node is drained after its jobs: the check rung waits for them, for days if they
run that long. A node's planned retirement or soft fault waits for its jobs' checkpoints. Before,
a lost GPU on such a node (Xid 79) was folded into its incident as a duplicate and nothing
changed: a job hung on the dead GPU held the node until it was killed by hand. Now Detect notes
the hard fault on the incident; the wait ends, the jobs are requeued, the node is repaired. A
replayed or stale fault, a soft one, or an operator's request, changes nothing.

Fast tier: the real Detect, Drain and Repair stages, the ledger in DynamoDB (embedded), Slurm in
memory.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nodemedic.contracts.incident import Incident
from nodemedic.contracts.stages import DetectInput, DetectOutput
from nodemedic.domain.checkpoint import CheckpointPolicy, CheckpointRule
from nodemedic.errors import CheckpointPendingError, NodeDrainingError
from nodemedic.providers.base import Member
from nodemedic.providers.run_command import Documents, RunCommand
from nodemedic.stages.detect import detect
from nodemedic.stages.drain import drain
from nodemedic.stages.repair import repair
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger

from tests.stages.conftest import PREFIX
from tests.stages.memory_provider import MemoryProvider
from tests.stages.memory_slurm import MemorySlurm

INSTANCE = "i-0000000000000000a"
POLICY = CheckpointPolicy(default=CheckpointRule(signal="USR1", scope="batch", grace_seconds=600))


class Node:
    """gpu-1 running job 42, its incident opened, and a clock the test moves."""

    def __init__(self, ledger: Ledger, slurm: MemorySlurm, fault_code: str, fault_class: str, action: str) -> None:
        self.ledger, self.slurm = ledger, slurm
        self.provider = MemoryProvider(Member(INSTANCE, "gpu-1", "running"))
        self.control = ControlStore(ledger._db, ledger._table, "c1")
        self.now = datetime.now(UTC)
        slurm.n["gpu-1"].jobs = ["42"]
        self.incident = Incident(incident_id=f"inc-{uuid.uuid4().hex[:8]}", cluster="c1", instance_id=INSTANCE,
                                 slurm_node="gpu-1", fault_code=fault_code, fault_class=fault_class,
                                 action=action, source="nodemedic.sweeper", observed_at=self.now, status="open",
                                 detected_at=self.now, reason="test")
        assert ledger.open_incident(self.incident) is None

    def clock(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def report(self, fault_code: str = "XID 79", sent_ago: float = 0, source: str = "nodemedic.agent",
               check: str = "kernel_log", **evidence: str) -> DetectOutput:
        """The node's agent reports ``fault_code``; sent ``sent_ago`` seconds ago (an archive
        replayed delivers an event with the time it first entered the bus)."""
        sent = self.now - timedelta(seconds=sent_ago)
        event = {"source": source, "detail-type": "Node Health Event", "time": sent.isoformat(),
                 "detail": {"schema_version": "1", "event_id": str(uuid.uuid4()), "cluster": "c1",
                            "node": {"instance_id": INSTANCE, "hostname": "gpu-1", "slurm_node": "gpu-1"},
                            "check": check, "fault_code": fault_code, "severity": "critical", "evidence": evidence,
                            "observed_at": (sent - timedelta(seconds=3)).isoformat(), "sent_at": sent.isoformat()}}
        return detect(DetectInput(event=event, incident_id=f"inc-{uuid.uuid4().hex[:8]}"), cluster="c1",
                      overrides_json="", provider=self.provider, ledger=self.ledger, control=self.control,
                      now=self.now)

    def aws_announces(self, fault_code: str, check: str, in_seconds: float,
                      source: str = "nodemedic.planned") -> DetectOutput:
        """The planned-events function (or the node's agent, reading instance metadata) relays AWS's
        notice for the node: AWS acts in ``in_seconds``."""
        deadline = (self.now + timedelta(seconds=in_seconds)).isoformat()
        return self.report(fault_code, source=source, check=check, deadline=deadline)

    def drain(self) -> Any:
        return drain(self.incident, orchestrator=self.slurm, ledger=self.ledger, prefix=PREFIX, clock=self.clock,
                     checkpoints=POLICY)

    def repair(self) -> Any:
        return repair(self.incident, "service", provider=self.provider, orchestrator=self.slurm,
                      runner=RunCommand(None, poll_interval=0), ledger=self.ledger, documents=Documents("c1"),
                      timeout_s=30, check_timeout_s=600, prefix=PREFIX, clock=self.clock, checkpoints=POLICY)


@pytest.fixture
def degraded(ledger: Ledger, slurm: MemorySlurm) -> Node:
    """A slow node drained after its job, which never checkpoints: the check rung waits for it."""
    node = Node(ledger, slurm, "FAIL_SLOW", "fail_slow", "degrade")
    with pytest.raises(CheckpointPendingError):
        node.drain()
    node.advance(601)
    assert node.drain().requeued_jobs == []  # no marker within the grace: the job runs on
    with pytest.raises(NodeDrainingError):
        node.repair()
    return node


def test_a_lost_gpu_on_a_degraded_node_requeues_its_job_and_the_node_is_checked(degraded: Node) -> None:
    out = degraded.report("XID 79")
    assert out.decision == "deduplicated" and out.existing_incident_id == degraded.incident.incident_id
    assert degraded.slurm.n["gpu-1"].jobs == ["42"]  # Detect acts on no node

    done = degraded.repair()

    assert (done.rung, done.level) == ("check", "full")  # the node's check follows at once
    assert degraded.slurm.n["gpu-1"].jobs == []
    [rung] = degraded.ledger.get(degraded.incident.incident_id).repair_rungs
    assert rung.requeued == ["42"] and "XID 79" in rung.requeued_because and "hard fault" in rung.requeued_because
    assert [f.fault_code for f in degraded.ledger.get(degraded.incident.incident_id).folded_faults] == ["XID 79"]


@pytest.mark.parametrize(("fault_code", "why"), [
    ("XID 13", "an application's own fault: monitored"),
    ("FAIL_SLOW", "the same slowness again: a soft fault"),
])
def test_what_is_no_hard_fault_leaves_the_degraded_node_to_its_job(degraded: Node, fault_code: str, why: str) -> None:
    degraded.report(fault_code)
    with pytest.raises(NodeDrainingError):
        degraded.repair()
    assert degraded.slurm.n["gpu-1"].jobs == ["42"], why
    assert degraded.ledger.get(degraded.incident.incident_id).folded_faults == []


def test_a_replayed_hard_fault_older_than_events_may_be_is_no_reason_to_requeue(degraded: Node) -> None:
    degraded.report("XID 79", sent_ago=7 * 24 * 3600)  # an archive replayed: a week old
    with pytest.raises(NodeDrainingError):
        degraded.repair()
    assert degraded.slurm.n["gpu-1"].jobs == ["42"]
    assert degraded.ledger.get(degraded.incident.incident_id).folded_faults == []


def test_a_hard_fault_ends_the_wait_for_a_planned_drains_checkpoint(ledger: Ledger, slurm: MemorySlurm) -> None:
    node = Node(ledger, slurm, "PLANNED_RETIREMENT", "planned", "replace")
    with pytest.raises(CheckpointPendingError, match="asked job"):
        node.drain()
    node.advance(10)
    node.report("XID 79")
    out = node.drain()  # no marker, 590 s of grace left: the wait ends all the same
    assert out.requeued_jobs == ["42"] and slurm.n["gpu-1"].jobs == []
    assert out.checkpoint is not None and "the wait ended: XID 79" in out.checkpoint.policy
    assert out.checkpoint.jobs[0].outcome == "grace_expired"


def test_a_hard_fault_before_the_drain_requeues_a_slow_nodes_job_at_once(ledger: Ledger, slurm: MemorySlurm) -> None:
    node = Node(ledger, slurm, "FAIL_SLOW", "fail_slow", "degrade")
    node.report("ECC_DBE")  # an uncorrectable memory error, before the drain ran
    out = node.drain()
    assert out.requeued_jobs == ["42"] and slurm.signalled == []  # nothing to checkpoint for
    assert out.checkpoint is not None and out.checkpoint.policy.startswith("requeued at once: ECC_DBE")


def test_a_retirement_weeks_away_leaves_the_job_and_a_lost_gpu_after_it_still_ends_the_wait(degraded: Node) -> None:
    """AWS often schedules a degraded host's retirement: its notice (two weeks ahead) is folded
    into the slow node's incident. The job runs on; a GPU lost later ends the wait all the same."""
    degraded.aws_announces("PLANNED_RETIREMENT", "aws_health", in_seconds=14 * 86400)
    with pytest.raises(NodeDrainingError):
        degraded.repair()
    assert degraded.slurm.n["gpu-1"].jobs == ["42"]
    degraded.report("XID 79", deadline=degraded.now.isoformat())  # a fault's "deadline" is not AWS's
    degraded.repair()
    assert degraded.slurm.n["gpu-1"].jobs == []
    folded = degraded.ledger.get(degraded.incident.incident_id).folded_faults
    assert [f.fault_code for f in folded] == ["PLANNED_RETIREMENT", "XID 79"]
    assert folded[0].deadline is not None and folded[1].deadline is None


@pytest.mark.parametrize(("fault_code", "check", "in_seconds", "source"), [
    ("PLANNED_SPOT_INTERRUPTION", "spot_interruption", 120, "nodemedic.planned"),  # two minutes
    ("PLANNED_SPOT_INTERRUPTION", "spot_interruption", 120, "nodemedic.agent"),  # read from instance metadata
    ("PLANNED_CAPACITY_END", "capacity_block", 40 * 60 - 601, "nodemedic.planned"),  # the block's warning, read late
])
def test_aws_acting_on_the_node_within_half_an_hour_checkpoints_then_requeues_the_slow_nodes_job(
        degraded: Node, fault_code: str, check: str, in_seconds: float, source: str) -> None:
    degraded.aws_announces(fault_code, check, in_seconds, source)
    degraded.slurm.signalled.clear()
    with pytest.raises(CheckpointPendingError, match="asked job"):
        degraded.repair()
    assert degraded.slurm.signalled == [("42", "USR1", "batch")] and degraded.slurm.n["gpu-1"].jobs == ["42"]
    degraded.advance(20)
    degraded.slurm.markers["42"] = degraded.slurm.now + 5  # the job wrote its checkpoint
    degraded.repair()
    assert degraded.slurm.n["gpu-1"].jobs == [] and degraded.slurm.signalled == [("42", "USR1", "batch")]
    [rung] = degraded.ledger.get(degraded.incident.incident_id).repair_rungs
    assert rung.requeued == ["42"] and rung.requeued_because.startswith(f"{fault_code}: AWS acts on the node at")


def test_a_job_that_never_checkpoints_is_requeued_after_its_grace_before_aws_acts_on_its_slow_node(
        degraded: Node) -> None:
    degraded.aws_announces("PLANNED_RETIREMENT", "aws_health", in_seconds=3600)
    with pytest.raises(NodeDrainingError):  # an hour away: the job runs on
        degraded.repair()
    degraded.advance(31 * 60)  # the check rung reads the job again: 29 min left
    asked_at = degraded.now
    for _ in range(200):
        try:
            degraded.repair()
            break
        except CheckpointPendingError:
            degraded.advance(20)
    assert degraded.slurm.n["gpu-1"].jobs == []
    assert asked_at + timedelta(seconds=600) <= degraded.now < asked_at + timedelta(seconds=640)  # its grace, then
    [rung] = degraded.ledger.get(degraded.incident.incident_id).repair_rungs
    assert rung.requeued == ["42"] and "SIGUSR1 to the batch step(s), up to 600s" in rung.requeued_because


@pytest.mark.parametrize(("folded", "corroborated"), [
    (None, False),  # the check passed and nothing else came: not corroborated, node untouched
    ("XID 79", True),  # a lost GPU while the silent node was checked: the second signal
    ("HEARTBEAT_MISSING", False),  # the same signal again is no second one
])
def test_a_fault_folded_while_an_ambiguous_one_is_verified_is_its_second_signal(
        ledger: Ledger, slurm: MemorySlurm, folded: str | None, corroborated: bool) -> None:
    """A silent node is checked before anything is done to it. An Xid 79 that came meanwhile was
    folded into that incident, and a passing check closed it: the Xid was lost with it."""
    from nodemedic.contracts.stages import HealthCheckOutput
    from nodemedic.stages.health_check import verified

    node = Node(ledger, slurm, "HEARTBEAT_MISSING", "heartbeat", "reboot")
    ledger.start_stage(node.incident, "verify", node.now)
    if folded:
        node.report(folded)
    passed = HealthCheckOutput(instance_id=INSTANCE, healthy=True, checks=[{"name": "gpu", "ok": True}])
    answer = verified(node.incident, passed, ledger=ledger, control=node.control, now=node.now)
    assert answer.healthy is not corroborated
    assert ledger.get(node.incident.incident_id).status == ("open" if corroborated else "closed")
    if corroborated:
        assert answer.checks[-1]["name"] == "second_signal" and "XID 79" in str(answer.checks[-1]["detail"])
        again = verified(node.incident, passed, ledger=ledger, control=node.control, now=node.now)
        assert again.healthy is False  # a retried answer says the same
