"""Drain: stop new work on the node, let the jobs that can still run checkpoint (when the
checkpoint policy says so, stages.checkpoint), and requeue them so they restart elsewhere."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from pydantic import BaseModel, Field

from nodemedic.contracts.incident import NON_DISRUPTIVE, IncidentRef
from nodemedic.contracts.stages import CheckpointRecord, DrainOutput
from nodemedic.domain.checkpoint import CheckpointPolicy
from nodemedic.errors import EvictionPendingError, NodeBusyError, NodeGoneError
from nodemedic.orchestrators.base import EvacuationResult, Orchestrator
from nodemedic.safety.gate import HandsOff, refuse_if_held
from nodemedic.stages.checkpoint import checkpoint_jobs, hard_fault_reason
from nodemedic.store.ledger import Ledger

MARKING_WRITERS = 16


def drain_reason(prefix: str, incident: IncidentRef) -> str:
    """The reason the pipeline writes; its prefix marks the drain as the pipeline's own. A slow
    node's says DEGRADED (Slurm shows it DRAINING while its job runs on)."""
    marked = "DEGRADED " if incident.action == "degrade" else ""
    return f"{prefix}:{incident.incident_id} {marked}{incident.fault_code}"


def owner_tag(prefix: str, incident: IncidentRef) -> str:
    return f"{prefix}:{incident.incident_id}"


class _Evacuated(BaseModel):
    """What the drain's invocations have moved so far: the requeued jobs and how many nodes each
    had (their names are recorded on those nodes, never carried: a job of ~6,000 EKS nodes named
    ``ip-….compute.internal`` would put its drain result over Step Functions' 256 KiB state quota,
    which ends the execution whatever its Catch, and over DynamoDB's 400 KB item)."""

    requeued: list[str] = Field(default_factory=list)
    not_requeued: list[str] = Field(default_factory=list)
    job_sizes: dict[str, int] = Field(default_factory=dict)
    job_members: dict[str, int] = Field(default_factory=dict)


def _mark_interrupted(incident: IncidentRef, ledger: Ledger, job_nodes: dict[str, list[str]], now: datetime) -> None:
    """Record on each other node of each requeued job that this incident requeued it: one of them
    failing too finds its job requeued already, and still takes a spare for it (stages.spares).
    One write per node, ``MARKING_WRITERS`` at a time: a 2,000-node job is 2,000 writes."""
    marks = [(job, node) for job, nodes in job_nodes.items() for node in nodes if node != incident.slurm_node]
    if not marks:
        return
    with ThreadPoolExecutor(min(MARKING_WRITERS, len(marks))) as pool:
        for _ in pool.map(lambda m: ledger.mark_interrupted(incident.cluster, m[1], m[0], incident.incident_id, now),
                          marks):
            pass


def refuse_if_returned(incident: IncidentRef, moved: EvacuationResult) -> None:
    """:class:`NodeBusyError` when the requeue found the node no longer drained (cordoned) and so
    requeued nothing: someone returned it to service since the drain (during a checkpoint wait),
    and a requeue now would cut its jobs short (the state machine escalates)."""
    if moved.not_drained:
        raise NodeBusyError(f"not requeueing the jobs on {incident.slurm_node} ({incident.instance_id}): it is no "
                            f"longer drained ({moved.not_drained}): someone returned it to service")


def _gone_since_drain(incident: IncidentRef, ledger: Ledger, progress: dict[str, object]) -> None:
    """The node was deleted after this drain held it: recorded as gone, and its hold dropped, as
    for a node gone before the drain (no hold is kept on a name a later instance may register
    under)."""
    progress["node_gone"] = True
    ledger.record_progress(incident, "drain", {"node_gone": True})
    ledger.drop_hold(incident.cluster, incident.slurm_node, incident.incident_id)


def _evacuate(incident: IncidentRef, orchestrator: Orchestrator, ledger: Ledger, started_at: float,
              now: datetime, progress: dict[str, object]) -> _Evacuated:
    """Evacuate, adding up what earlier invocations moved; while pods are still leaving (a
    Kubernetes PodDisruptionBudget, a namespace that waits for completion) record the progress
    and raise :class:`EvictionPendingError`: the state machine calls again."""
    saved = progress.get("evacuated")
    before = _Evacuated.model_validate(saved) if isinstance(saved, dict) else _Evacuated()
    if progress.get("node_gone") is True:
        # its pods are deleted at once, and no node is left to record them on: the jobs bound there
        # are recorded first, so a retry after a lost answer still reports them (and they get a spare)
        bound = [job for job in orchestrator.jobs_on(incident.slurm_node) if job not in before.requeued]
        if bound:
            before = before.model_copy(update={"requeued": before.requeued + bound})
            ledger.record_progress(incident, "drain", {"evacuated": before.model_dump()})
    try:
        this = orchestrator.evacuate(incident.slurm_node, started_at)
    except NodeGoneError:
        if progress.get("node_gone") is True:
            raise
        # deleted while this pass held it (its instance ended meanwhile): evacuated as a gone node
        _gone_since_drain(incident, ledger, progress)
        return _evacuate(incident, orchestrator, ledger, started_at, now, progress)
    refuse_if_returned(incident, this)
    total = _Evacuated(
        requeued=list(dict.fromkeys(before.requeued + this.requeued)),
        not_requeued=list(dict.fromkeys(before.not_requeued + this.not_requeued)),
        job_sizes={**before.job_sizes, **{job: len(nodes) for job, nodes in this.job_nodes.items()}},
        job_members={**before.job_members, **this.job_members})
    if total != before:
        # recorded at once, before the marks and the completion: a retried invocation finds the node
        # empty (its jobs are pending now) and learns from this what it moved, so a spare still goes to them
        ledger.record_progress(incident, "drain", {"evacuated": total.model_dump()})
    _mark_interrupted(incident, ledger, this.job_nodes, now)
    if this.pending:
        raise EvictionPendingError(f"{incident.slurm_node}: still leaving: {'; '.join(this.pending)[:800]}")
    return total


def _drain_node(incident: IncidentRef, orchestrator: Orchestrator, ledger: Ledger, prefix: str,
                clock: Callable[[], datetime], progress: dict[str, object]) -> bool:
    """Drain the node (once: a retried invocation reads what the first one did). True when the
    drain is the pipeline's own, or when the node is gone (Kubernetes: its instance ended and the
    cloud controller deleted it): no work lands there, and a replacement is NodeMedic's to return.
    No hold is kept on a name that a later instance may register under."""
    if isinstance(done := progress.get("drained_by_pipeline"), bool):
        return done
    reason = drain_reason(prefix, incident)
    # an operator's drain stays theirs; a drain an ended NodeMedic incident holds is taken over
    # (checked and acted on in one scheduler command), that of another incident still open is not
    hold = ledger.hold_of(incident.cluster, incident.slurm_node)
    other_open = hold is not None and hold.incident_id != incident.incident_id \
        and ledger.statuses([hold.incident_id]).get(hold.incident_id) == "open"
    try:
        ours = orchestrator.drain(incident.slurm_node, reason, takeover="-" if other_open else f"{prefix}:")
    except NodeGoneError:
        progress["node_gone"] = True
        ledger.record_progress(incident, "drain", {"drained_by_pipeline": True, "node_gone": True})
        return True
    if ours:
        ledger.hold_drain(incident, reason, clock())
    ledger.record_progress(incident, "drain", {"drained_by_pipeline": ours})
    return ours


def _before_requeue(incident: IncidentRef, orchestrator: Orchestrator, ledger: Ledger, policy: CheckpointPolicy,
                    clock: Callable[[], datetime], progress: dict[str, object]) -> tuple[CheckpointRecord | None, bool]:
    """What the checkpoint policy does before the requeue, and whether the jobs are requeued.

    A burn-in never requeues (a joined node runs no work yet). A slow node's job is requeued only
    once it has checkpointed; without a rule, or when no marker came in time, it runs on to its
    end (Slurm: DRAINING) and the check rung waits for it: it is never killed mid-step. A hard
    fault is requeued at once, and so is a slow node's job once a hard fault came to its node too
    (the job cannot run on there)."""
    disruptive = incident.action not in NON_DISRUPTIVE
    if incident.action == "burn_in":
        return None, False
    if progress.get("node_gone") is True:  # no job checkpoints on a node that is gone
        return CheckpointRecord(policy=f"requeued at once: {incident.slurm_node} is gone"), True
    current = ledger.get(incident.incident_id)  # read once a call
    hard = hard_fault_reason(current.folded_faults, policy)
    if not disruptive and hard:
        return CheckpointRecord(policy=f"requeued at once: {hard}"), True
    if not policy.enabled:
        return None, disruptive
    if incident.fault_class not in policy.fault_classes:
        if not disruptive:
            return None, False
        return CheckpointRecord(policy=f"requeued at once: {incident.fault_code} ({incident.fault_class}) "
                                       "is a hard fault"), True
    acts = current.aws_acts()  # a planned notice's deadline: the wait ends before AWS acts
    record = checkpoint_jobs(incident, orchestrator=orchestrator, ledger=ledger, policy=policy, clock=clock,
                             progress=progress, hard=hard, deadline=acts[0] if acts else None)
    if disruptive or hard:  # a hard fault that came while the jobs checkpoint ended the wait
        return record, True
    return record, bool(record.jobs) and all(j.outcome != "grace_expired" for j in record.jobs)


def _guard(incident: IncidentRef, hands_off: HandsOff) -> None:
    """Nothing done to the node while automation is paused or the node is excluded: asked right
    before the drain and right before the requeue (a checkpoint wait may have taken minutes)."""
    refuse_if_held(hands_off, incident.slurm_node, incident.instance_id)


def drain(
    incident: IncidentRef, *, orchestrator: Orchestrator, ledger: Ledger, prefix: str, clock: Callable[[], datetime],
    checkpoints: CheckpointPolicy | None = None, hands_off: HandsOff = lambda node, instance: None,
) -> DrainOutput:
    record = ledger.start_stage(incident, "drain", clock())
    if record.completed_at:  # a retried invocation: the work is done
        return DrainOutput.model_validate(record.result)
    progress = record.result
    _guard(incident, hands_off)
    ours = _drain_node(incident, orchestrator, ledger, prefix, clock, progress)
    checkpoint, requeue = _before_requeue(incident, orchestrator, ledger, checkpoints or CheckpointPolicy(), clock,
                                          progress)
    if requeue:
        _guard(incident, hands_off)
    evacuated = _evacuate(incident, orchestrator, ledger, record.started_at.timestamp(), clock(), progress) \
        if requeue else _Evacuated()
    out = DrainOutput(
        slurm_node=incident.slurm_node,
        drained_by_pipeline=ours,
        requeued_jobs=evacuated.requeued,
        jobs_not_requeued=evacuated.not_requeued,
        job_sizes=evacuated.job_sizes,
        job_members=evacuated.job_members,
        checkpoint=checkpoint,
        node_gone=progress.get("node_gone") is True,
    )
    ledger.complete_stage(incident, "drain", clock(), out.model_dump(mode="json"))
    return out
