"""Checkpoint-aware drain: the jobs that can still run checkpoint before they are requeued.

Fast tier: the real Drain stage, the ledger in DynamoDB (embedded), Slurm in memory. The real
documents on a real Slurm: tests/e2e/test_checkpoint_drain.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from nodemedic.contracts.events import AGENT_SOURCE, PLANNED_SOURCE
from nodemedic.contracts.incident import FoldedFault, Incident, StageRecord
from nodemedic.domain.checkpoint import CheckpointPolicy, CheckpointRule, parse_checkpoint_policy
from nodemedic.errors import CheckpointPendingError, CommandPendingError, PolicyError
from nodemedic.stages.drain import drain
from nodemedic.store.ledger import Ledger

from tests.stages.conftest import PREFIX, opened
from tests.stages.memory_slurm import MemorySlurm

POLICY = CheckpointPolicy(default=CheckpointRule(signal="USR1", scope="batch", grace_seconds=300))


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _incident(ledger: Ledger, fault_code: str, fault_class: str, action: str) -> Incident:
    incident = opened(ledger)
    return incident.model_copy(update={"fault_code": fault_code, "fault_class": fault_class, "action": action})


def _drain(incident: Incident, slurm: MemorySlurm, ledger: Ledger, clock: Clock, policy: CheckpointPolicy = POLICY):
    return drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock, checkpoints=policy)


def _until_done(incident: Incident, slurm: MemorySlurm, ledger: Ledger, clock: Clock, step: float = 10,
                policy: CheckpointPolicy = POLICY):
    """Call the stage as the state machine does: again after each CheckpointPendingError."""
    for _ in range(100):
        try:
            return _drain(incident, slurm, ledger, clock, policy)
        except CheckpointPendingError:
            clock.advance(step)
    raise AssertionError("the drain never finished")


def test_a_planned_drain_signals_the_job_once_waits_for_its_marker_then_requeues(slurm: MemorySlurm,
                                                                                  ledger: Ledger) -> None:
    incident = _incident(ledger, "PLANNED_RETIREMENT", "planned", "replace")
    slurm.n["gpu-1"].jobs = ["42"]
    slurm.markers["42"] = 9_000.0  # its last checkpoint before the request
    clock = Clock()
    with pytest.raises(CheckpointPendingError, match="asked job"):
        _drain(incident, slurm, ledger, clock)
    assert slurm.n["gpu-1"].drained and slurm.n["gpu-1"].jobs == ["42"]  # drained, not requeued yet
    clock.advance(10)
    with pytest.raises(CheckpointPendingError, match="waiting 10s"):  # no marker yet: still waiting
        _drain(incident, slurm, ledger, clock)
    slurm.markers["42"] = 9_950.0  # the job wrote its checkpoint
    out = _drain(incident, slurm, ledger, clock)
    assert slurm.signalled == [("42", "USR1", "batch")]  # once, across three invocations
    assert out.requeued_jobs == ["42"] and slurm.n["gpu-1"].jobs == []
    assert out.checkpoint is not None
    job = out.checkpoint.jobs[0]
    assert (job.outcome, job.work_saved_s, job.work_lost_s) == ("checkpointed", 950.0, 50.0)
    assert out.checkpoint.waited_s == 10 and "SIGUSR1" in out.checkpoint.policy
    stored = ledger.get(incident.incident_id).stages["drain"].result
    assert stored["checkpoint"]["jobs"][0]["outcome"] == "checkpointed"  # the ledger says what was done
    assert slurm.calls.count("drain gpu-1") == 1  # the node was drained once, not on every retry


class _SignalAnswerLost(MemorySlurm):
    """The signal reaches the job, but its answer never comes back: the wait for a slow
    controller runs out (SSM: CommandPendingError) and Step Functions retries the stage."""

    def request_checkpoint(self, node: str, job_ids: list[str], signal: str, scope: str) -> list[str]:
        super().request_checkpoint(node, job_ids, signal, scope)
        raise CommandPendingError("command on i-0ctl still running after 60s")


def test_a_retry_after_the_signals_answer_was_lost_does_not_signal_the_job_again(ledger: Ledger) -> None:
    slurm = _SignalAnswerLost(["gpu-1"])
    incident = _incident(ledger, "PLANNED_RETIREMENT", "planned", "replace")
    slurm.n["gpu-1"].jobs = ["42"]
    slurm.markers["42"] = 9_000.0
    clock = Clock()
    with pytest.raises(CommandPendingError):
        _drain(incident, slurm, ledger, clock)
    slurm.markers["42"] = 9_950.0  # the signal reached it: it checkpointed
    clock.advance(10)
    out = _drain(incident, slurm, ledger, clock)  # the retry
    assert slurm.signalled == [("42", "USR1", "batch")]
    assert out.requeued_jobs == ["42"] and out.checkpoint is not None
    assert out.checkpoint.jobs[0].outcome == "checkpointed"


def test_no_marker_within_the_grace_requeues_with_the_work_since_the_last_checkpoint_lost(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = _incident(ledger, "PLANNED_STOP", "planned", "replace")
    slurm.n["gpu-1"].jobs = ["42"]
    clock = Clock()
    out = _until_done(incident, slurm, ledger, clock, step=60)
    assert out.requeued_jobs == ["42"]
    job = out.checkpoint.jobs[0]
    assert (job.outcome, job.work_saved_s, job.work_lost_s) == ("grace_expired", 0, 6_000.0)
    assert 300 <= out.checkpoint.waited_s < 360  # it waited the grace, no longer


def _planned(ledger: Ledger, deadline: datetime | None, source: str = PLANNED_SOURCE,
             fault: tuple[str, str, str] = ("PLANNED_SPOT_INTERRUPTION", "planned", "retire")) -> Incident:
    """A planned incident as Detect opens it: its event's deadline in the detect stage's evidence."""
    at = datetime.now(UTC)
    evidence = {"deadline": deadline.isoformat()} if deadline else {}
    code, fault_class, action = fault
    incident = Incident(incident_id=f"inc-planned-{at.timestamp()}", cluster="c1", instance_id="i-gpu-1",
                        slurm_node="gpu-1", fault_code=code, fault_class=fault_class, action=action, source=source,
                        observed_at=at, status="open", detected_at=at, reason="test",
                        stages={"detect": StageRecord(started_at=at, completed_at=at, result={"evidence": evidence})})
    assert ledger.open_incident(incident) is None
    return incident


def test_the_wait_for_a_checkpoint_ends_before_aws_acts_on_the_node(slurm: MemorySlurm, ledger: Ledger) -> None:
    """A Spot interruption: AWS stops the node two minutes after its warning. A 300 s grace would
    leave the job waiting on a node that is gone; the wait ends 15 s before, and the job is requeued."""
    clock = Clock()
    incident = _planned(ledger, deadline=clock.now + timedelta(minutes=2))
    slurm.n["gpu-1"].jobs = ["42"]
    slurm.markers["42"] = 9_000.0
    out = _until_done(incident, slurm, ledger, clock, step=10)
    assert slurm.signalled == [("42", "USR1", "batch")]
    assert out.requeued_jobs == ["42"] and out.checkpoint is not None
    assert out.checkpoint.jobs[0].outcome == "grace_expired"
    assert 100 <= out.checkpoint.waited_s <= 110, out.checkpoint.waited_s  # at most 2 min - 15 s, not 300 s
    assert "the wait ended 15s before AWS acts on the node" in out.checkpoint.policy


def test_a_checkpoint_within_the_deadline_is_waited_for_and_saved(slurm: MemorySlurm, ledger: Ledger) -> None:
    clock = Clock()
    incident = _planned(ledger, deadline=clock.now + timedelta(minutes=2))
    slurm.n["gpu-1"].jobs = ["42"]
    slurm.markers["42"] = 9_000.0
    with pytest.raises(CheckpointPendingError):
        _drain(incident, slurm, ledger, clock)
    clock.advance(40)
    slurm.markers["42"] = 9_950.0
    out = _drain(incident, slurm, ledger, clock)
    assert out.checkpoint is not None and out.checkpoint.jobs[0].outcome == "checkpointed"
    assert "the wait ended" not in out.checkpoint.policy


def test_a_deadline_too_near_to_checkpoint_requeues_at_once_without_signalling(slurm: MemorySlurm,
                                                                                 ledger: Ledger) -> None:
    clock = Clock()
    incident = _planned(ledger, deadline=clock.now + timedelta(seconds=5))
    slurm.n["gpu-1"].jobs = ["42"]
    out = _drain(incident, slurm, ledger, clock)
    assert slurm.signalled == [] and out.requeued_jobs == ["42"]
    assert out.checkpoint is not None and out.checkpoint.policy.startswith("requeued at once: AWS acts on the node")


@pytest.mark.parametrize("source", [PLANNED_SOURCE, AGENT_SOURCE])
def test_a_spot_notice_ends_the_wait_before_aws_acts_whoever_relayed_it(slurm: MemorySlurm, ledger: Ledger,
                                                                          source: str) -> None:
    """The node's agent reads EC2's Spot notice from instance metadata, often before EventBridge
    delivers it: the incident it opens carries the same two-minute deadline."""
    clock = Clock()
    incident = _planned(ledger, deadline=clock.now + timedelta(minutes=2), source=source)
    slurm.n["gpu-1"].jobs = ["42"]
    out = _until_done(incident, slurm, ledger, clock, step=10)
    assert out.checkpoint is not None and 100 <= out.checkpoint.waited_s <= 110, out.checkpoint


@pytest.mark.parametrize(("deadline_in", "fault"), [
    (timedelta(hours=1), ("PLANNED_RETIREMENT", "planned", "replace")),
    (timedelta(minutes=2), ("FAIL_SLOW", "fail_slow", "degrade")),
])
def test_a_far_deadline_or_one_in_a_faults_evidence_leaves_the_grace_as_it_is(
        slurm: MemorySlurm, ledger: Ledger, deadline_in: timedelta, fault: tuple[str, str, str]) -> None:
    """A deadline an hour away leaves the grace as it is; so does a "deadline" in the evidence of a
    fault that is no planned notice (it is not AWS's)."""
    clock = Clock()
    incident = _planned(ledger, deadline=clock.now + deadline_in, source=AGENT_SOURCE, fault=fault)
    slurm.n["gpu-1"].jobs = ["42"]
    out = _until_done(incident, slurm, ledger, clock, step=60)
    assert out.checkpoint is not None and 300 <= out.checkpoint.waited_s < 360


def test_a_spot_notice_folded_in_while_the_jobs_checkpoint_ends_the_wait_before_aws_acts(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    """A retirement drain waits up to 300 s for the job's checkpoint; EC2's two-minute Spot warning
    for the node comes 30 s in and is folded into the incident: the wait ends 15 s before EC2 acts,
    not at the end of the grace, when the node and the job on it are gone."""
    clock = Clock()
    incident = _planned(ledger, deadline=clock.now + timedelta(days=3), fault=("PLANNED_RETIREMENT", "planned", "replace"))
    slurm.n["gpu-1"].jobs = ["42"]
    with pytest.raises(CheckpointPendingError):
        _drain(incident, slurm, ledger, clock)
    clock.advance(30)
    notice = FoldedFault(fault_code="PLANNED_SPOT_INTERRUPTION", fault_class="planned", action="retire",
                         observed_at=clock.now, deadline=clock.now + timedelta(minutes=2))
    assert ledger.note_folded(incident.incident_id, notice)
    out = _until_done(incident, slurm, ledger, clock, step=10)
    assert out.requeued_jobs == ["42"] and out.checkpoint is not None
    assert 130 <= out.checkpoint.waited_s <= 140, out.checkpoint.waited_s  # 30 s + 2 min - 15 s, not 300 s
    assert f"before AWS acts on the node ({notice.deadline.isoformat()})" in out.checkpoint.policy


def test_a_hard_fault_requeues_at_once_without_signalling(slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = _incident(ledger, "XID 79", "gpu_lost", "replace")
    slurm.n["gpu-1"].jobs = ["42"]
    out = _drain(incident, slurm, ledger, Clock())
    assert out.requeued_jobs == ["42"] and slurm.signalled == []
    assert "hard fault" in out.checkpoint.policy and out.checkpoint.jobs == []


def test_without_a_policy_the_drain_requeues_at_once_and_records_nothing(slurm: MemorySlurm,
                                                                          ledger: Ledger) -> None:
    incident = _incident(ledger, "PLANNED_RETIREMENT", "planned", "replace")
    slurm.n["gpu-1"].jobs = ["42"]
    out = _drain(incident, slurm, ledger, Clock(), CheckpointPolicy())
    assert out.requeued_jobs == ["42"] and out.checkpoint is None and slurm.signalled == []


def test_a_degraded_node_is_requeued_only_after_its_job_checkpointed(slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = _incident(ledger, "FAIL_SLOW", "fail_slow", "degrade")
    slurm.n["gpu-1"].jobs = ["42"]
    slurm.checkpoint_takes = -5  # the job checkpoints as soon as it is asked
    out = _until_done(incident, slurm, ledger, Clock())
    assert out.requeued_jobs == ["42"] and out.checkpoint.jobs[0].outcome == "checkpointed"


def test_a_degraded_node_whose_job_never_checkpoints_keeps_running_it(slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = _incident(ledger, "FAIL_SLOW", "fail_slow", "degrade")
    slurm.n["gpu-1"].jobs = ["42"]
    out = _until_done(incident, slurm, ledger, Clock(), step=100)
    assert out.requeued_jobs == [] and slurm.n["gpu-1"].jobs == ["42"]  # never killed mid-step
    assert out.checkpoint.jobs[0].outcome == "grace_expired"
    assert slurm.n["gpu-1"].drained  # drained: it runs to its end and takes no new work


def test_each_partition_has_its_rule_and_a_job_that_ends_while_waiting_loses_nothing(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    policy = parse_checkpoint_policy('{"default": {"grace_seconds": 120}, "partitions": {"debug": null, '
                                     '"long": {"signal": "USR2", "scope": "full", "grace_seconds": 600}}}')
    incident = _incident(ledger, "PLANNED_RETIREMENT", "planned", "replace")
    slurm.n["gpu-1"].jobs = ["1", "2", "3"]
    slurm.partition.update({"1": "debug", "2": "long"})
    clock = Clock()
    with pytest.raises(CheckpointPendingError):
        _drain(incident, slurm, ledger, clock, policy)
    assert sorted(slurm.signalled) == [("2", "USR2", "full"), ("3", "USR1", "batch")]  # debug: not asked
    slurm.n["gpu-1"].jobs = ["1", "2"]  # job 3 ended
    slurm.markers["2"] = 9_990.0
    out = _drain(incident, slurm, ledger, clock, policy)
    assert {j.job_id: j.outcome for j in out.checkpoint.jobs} == {"2": "checkpointed", "3": "ended"}
    assert out.requeued_jobs == ["1", "2"]


@pytest.mark.parametrize("text, field", [
    ('{"default": {"signal": "KILL"}}', "default.signal"),
    ('{"default": {"grace_seconds": 7200}}', "default.grace_seconds"),
    ('{"partitions": {"gpu": {"scope": "node"}}}', "partitions.gpu.scope"),
    ('{"defualt": {}}', "defualt"),
    ("[", "policy"),
])
def test_a_bad_checkpoint_policy_names_the_field(text: str, field: str) -> None:
    with pytest.raises(PolicyError, match=field.replace(".", r"\.")):
        parse_checkpoint_policy(text)
