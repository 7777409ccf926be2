"""Checkpoint-aware drain: before a drained node's jobs are requeued, ask those that can still
run to checkpoint, and wait for their markers within the policy's grace (domain.checkpoint).

The wait spans invocations of the Drain stage: the first asks and raises
:class:`CheckpointPendingError`, the state machine calls again, each later one reads the markers.
What will be asked is saved in the stage's progress before the signal goes out, so a retried
invocation never signals twice, even one whose answer was lost.

A planned event names when AWS acts (its ``deadline``: a Spot interruption two minutes after the
warning, a Capacity Block's termination, a retirement's date). The wait never runs past it: it ends
``REQUEUE_MARGIN`` before, so the jobs are requeued while the node still runs them, not minutes
after AWS stopped it with the jobs still waiting there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict

from nodemedic.contracts.incident import FoldedFault, IncidentRef, Stage
from nodemedic.contracts.stages import CheckpointRecord, JobCheckpoint
from nodemedic.domain.checkpoint import CheckpointPolicy, CheckpointRule, work_since
from nodemedic.errors import CheckpointPendingError
from nodemedic.orchestrators.base import Orchestrator, RunningJob
from nodemedic.store.ledger import Ledger

# the Drain state retries CheckpointPendingError every 10 s (statemachines/remediation.asl.json),
# and the requeue that follows takes a few seconds more
REQUEUE_MARGIN = timedelta(seconds=15)


class _Asked(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rule: CheckpointRule
    before: float | None  # its marker when it was asked
    started_at: float | None


class CheckpointProgress(BaseModel):
    """What the first invocation asked (the stage's progress, key ``checkpoint``)."""

    model_config = ConfigDict(extra="forbid")
    requested_at: AwareDatetime
    asked: dict[str, _Asked]
    not_asked: list[str]  # could not be signalled: requeued without waiting
    deadline: AwareDatetime | None = None  # when AWS acts on the node (a planned event's), if it says

    def cut_off(self, now: datetime) -> bool:
        return _too_near(self.deadline, now)


def _too_near(deadline: datetime | None, now: datetime) -> bool:
    """The wait must end now: AWS acts on the node within ``REQUEUE_MARGIN``."""
    return deadline is not None and now >= deadline - REQUEUE_MARGIN


def hard_fault_reason(folded: list[FoldedFault], policy: CheckpointPolicy) -> str:
    """Why the node's jobs cannot run on, if a hard fault came since the incident opened (of the
    faults Detect noted as ``folded`` into it: a lost GPU while the jobs were asked to
    checkpoint); "" otherwise."""
    fault = next((f for f in folded if f.hard(policy.fault_classes)), None)
    if fault is None:
        return ""
    return (f"{fault.fault_code} ({fault.fault_class}) came at {fault.observed_at.isoformat()}, a hard fault: "
            "the jobs cannot run on")


def _plan(incident: IncidentRef, orchestrator: Orchestrator, policy: CheckpointPolicy, now: datetime,
          deadline: datetime | None) -> CheckpointProgress:
    """The node's jobs that a rule asks to checkpoint, with their markers before the signal."""
    asked = {}
    for job in orchestrator.running_jobs(incident.slurm_node):
        rule = policy.rule(job.group)
        if rule is not None:
            asked[job.job_id] = _Asked(rule=rule, before=job.marker, started_at=job.started_at)
    return CheckpointProgress(requested_at=now, asked=asked, not_asked=[], deadline=deadline)


def _signal(incident: IncidentRef, orchestrator: Orchestrator, state: CheckpointProgress) -> list[str]:
    """Signal the planned jobs, one command per signal and scope; those that could not be."""
    by_signal: dict[tuple[str, str], list[str]] = defaultdict(list)
    for job_id, asked in state.asked.items():
        by_signal[(asked.rule.signal, asked.rule.scope)].append(job_id)
    failed: list[str] = []
    for (signal, scope), ids in sorted(by_signal.items()):
        failed += orchestrator.request_checkpoint(incident.slurm_node, ids, signal, scope)
    return failed


def _outcome(job_id: str, asked: _Asked, now_job: RunningJob | None) -> JobCheckpoint:
    if now_job is None:  # it ended (or left the node) while the drain waited: nothing to lose
        return JobCheckpoint(job_id=job_id, outcome="ended", work_saved_s=0, work_lost_s=0)
    lost = work_since(now_job.marker, now_job.started_at, now_job.now)
    if now_job.marker is not None and now_job.marker != asked.before:
        return JobCheckpoint(job_id=job_id, outcome="checkpointed", work_lost_s=lost,
                             work_saved_s=work_since(asked.before, asked.started_at, now_job.marker))
    return JobCheckpoint(job_id=job_id, outcome="grace_expired", work_saved_s=0, work_lost_s=lost)


def checkpoint_jobs(incident: IncidentRef, *, orchestrator: Orchestrator, ledger: Ledger, policy: CheckpointPolicy,
                    clock: Callable[[], datetime], progress: dict[str, Any], hard: str, stage: Stage = "drain",
                    deadline: datetime | None) -> CheckpointRecord:
    """Ask the node's jobs to checkpoint (first call), then read their markers; raise
    :class:`CheckpointPendingError` while one is missing within its grace, unless ``hard`` (why
    the jobs cannot run on: :func:`hard_fault_reason`) ends the wait. The record says what
    became of each job. What was asked is kept in ``stage``'s progress (``progress`` is it as
    read); ``deadline`` is when AWS acts on the node, if it does (:meth:`Incident.aws_acts`, read
    again at each call: a notice folded in while the jobs checkpoint cuts the wait too)."""
    now = clock()
    saved = progress.get("checkpoint")
    if saved is None:
        if hard:  # the node cannot run the jobs on: nothing to wait for
            return CheckpointRecord(policy=f"requeued at once: {hard}")
        if deadline is not None and _too_near(deadline, now):  # no time to checkpoint: requeue now
            return CheckpointRecord(policy=f"requeued at once: AWS acts on the node at {deadline.isoformat()}, "
                                           f"within {REQUEUE_MARGIN.total_seconds():.0f}s")
        state = _plan(incident, orchestrator, policy, now, deadline)
        # recorded before the signal: an invocation that never reads its answer (the controller
        # was slow, SSM throttled) is retried, and the retry must not signal the jobs again (a
        # second USR1 can mean a second checkpoint, or a requeue, to a training job)
        ledger.record_progress(incident, stage, {"checkpoint": state.model_dump(mode="json")})
        if failed := _signal(incident, orchestrator, state):
            state = state.model_copy(update={"not_asked": failed,
                                             "asked": {j: a for j, a in state.asked.items() if j not in failed}})
            ledger.record_progress(incident, stage, {"checkpoint": state.model_dump(mode="json")})
        if any(a.rule.grace_seconds > 0 for a in state.asked.values()):
            raise CheckpointPendingError(f"{incident.slurm_node}: asked job(s) {', '.join(state.asked)} to checkpoint")
    else:
        state = CheckpointProgress.model_validate(saved)
        if deadline is not None and (state.deadline is None or deadline < state.deadline):
            state = state.model_copy(update={"deadline": deadline})  # a notice that came since
    waited = max(0.0, (now - state.requested_at).total_seconds())
    running = {job.job_id: job for job in orchestrator.running_jobs(incident.slurm_node)} if state.asked else {}
    jobs = [_outcome(j, a, running.get(j)) for j, a in state.asked.items()]
    waiting = [j.job_id for j in jobs
               if j.outcome == "grace_expired" and waited < state.asked[j.job_id].rule.grace_seconds]
    if waiting and not state.cut_off(now) and not hard:
        raise CheckpointPendingError(f"{incident.slurm_node}: waiting {waited:.0f}s for the checkpoint of "
                                     f"{', '.join(waiting)}")
    rules = sorted({a.rule.describe() for a in state.asked.values()})
    described = "; ".join(rules) if rules else "no job on the node has a checkpoint rule"
    if state.not_asked:
        described += f"; could not signal {', '.join(state.not_asked)}"
    if waiting and hard:
        described += f"; the wait ended: {hard}"
    elif waiting:
        assert state.deadline is not None  # cut off: only a deadline ends a wait before its grace
        described += (f"; the wait ended {REQUEUE_MARGIN.total_seconds():.0f}s before AWS acts on the node "
                      f"({state.deadline.isoformat()})")
    return CheckpointRecord(policy=described, requested_at=state.requested_at if state.asked else None,
                            waited_s=waited if state.asked else 0, jobs=jobs)
