"""Drain: stop new work on the node and requeue its jobs so they restart elsewhere at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime

from nodemedic.contracts.incident import NON_DISRUPTIVE, IncidentRef
from nodemedic.contracts.stages import DrainOutput
from nodemedic.errors import EvictionPendingError
from nodemedic.orchestrators.base import EvacuationResult, Orchestrator
from nodemedic.store.ledger import Ledger


def drain_reason(prefix: str, incident: IncidentRef) -> str:
    """The reason the pipeline writes; its prefix marks the drain as the pipeline's own. A slow
    node's says DEGRADED (Slurm shows it DRAINING while its job runs on)."""
    marked = "DEGRADED " if incident.action == "degrade" else ""
    return f"{prefix}:{incident.incident_id} {marked}{incident.fault_code}"


def owner_tag(prefix: str, incident: IncidentRef) -> str:
    return f"{prefix}:{incident.incident_id}"


def _evacuate(incident: IncidentRef, orchestrator: Orchestrator, ledger: Ledger, started_at: float,
              progress: dict[str, object]) -> EvacuationResult:
    """Evacuate, adding up what earlier invocations moved; while pods are still leaving (a
    Kubernetes PodDisruptionBudget, a namespace that waits for completion) record the progress
    and raise :class:`EvictionPendingError`: the state machine calls again."""
    this = orchestrator.evacuate(incident.slurm_node, started_at)
    saved = progress.get("evacuated")
    before = EvacuationResult(**saved) if isinstance(saved, dict) else EvacuationResult([], [])
    total = EvacuationResult(
        requeued=list(dict.fromkeys(before.requeued + this.requeued)),
        not_requeued=list(dict.fromkeys(before.not_requeued + this.not_requeued)),
        job_nodes={**before.job_nodes, **this.job_nodes}, pending=this.pending)
    if total.pending:
        ledger.record_progress(incident, "drain", {"evacuated": {**asdict(total), "pending": []}})
        raise EvictionPendingError(f"{incident.slurm_node}: still leaving: {'; '.join(total.pending)[:800]}")
    return total


def drain(
    incident: IncidentRef, *, orchestrator: Orchestrator, ledger: Ledger, prefix: str, clock: Callable[[], datetime]
) -> DrainOutput:
    record = ledger.start_stage(incident, "drain", clock())
    if record.completed_at:  # a retried invocation: the work is done
        return DrainOutput.model_validate(record.result)
    reason = drain_reason(prefix, incident)
    # an operator's drain stays theirs; a drain an ended NodeMedic incident holds is taken over
    # (checked and acted on in one scheduler command), that of another incident still open is not
    hold = ledger.hold_of(incident.cluster, incident.slurm_node)
    other_open = hold is not None and hold.incident_id != incident.incident_id \
        and ledger.statuses([hold.incident_id]).get(hold.incident_id) == "open"
    ours = orchestrator.drain(incident.slurm_node, reason, takeover="-" if other_open else f"{prefix}:")
    if ours:
        ledger.hold_drain(incident, reason, clock())
    # a burn-in never requeues (a joined node runs no work yet), nor does a slow node's drain: its
    # job runs on to its end (Slurm: DRAINING) and the check rung waits for it
    evacuated = EvacuationResult([], []) if incident.action in NON_DISRUPTIVE \
        else _evacuate(incident, orchestrator, ledger, record.started_at.timestamp(), record.result)
    # the job's other nodes: one of them failing too finds its job requeued already, and still
    # takes a spare for it (stages.spares)
    for job, nodes in evacuated.job_nodes.items():
        for other in nodes:
            if other != incident.slurm_node:
                ledger.mark_interrupted(incident.cluster, other, job, incident.incident_id, clock())
    out = DrainOutput(
        slurm_node=incident.slurm_node,
        drained_by_pipeline=ours,
        requeued_jobs=evacuated.requeued,
        jobs_not_requeued=evacuated.not_requeued,
        job_nodes=evacuated.job_nodes,
    )
    ledger.complete_stage(incident, "drain", clock(), out.model_dump(mode="json"))
    return out
