"""Drain: stop new work on the node and requeue its jobs so they restart elsewhere at once."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from nodemedic.contracts.incident import IncidentRef
from nodemedic.contracts.stages import DrainOutput
from nodemedic.orchestrators.base import Orchestrator
from nodemedic.store.ledger import Ledger


def drain_reason(prefix: str, incident: IncidentRef) -> str:
    """The reason the pipeline writes; its prefix marks the drain as the pipeline's own."""
    return f"{prefix}:{incident.incident_id} {incident.fault_code}"


def owner_tag(prefix: str, incident: IncidentRef) -> str:
    return f"{prefix}:{incident.incident_id}"


def drain(
    incident: IncidentRef, *, orchestrator: Orchestrator, ledger: Ledger, prefix: str, clock: Callable[[], datetime]
) -> DrainOutput:
    record = ledger.start_stage(incident, "drain", clock())
    if record.completed_at:  # a retried invocation: the work is done
        return DrainOutput.model_validate(record.result)
    status = orchestrator.node_status(incident.slurm_node)
    ours = status.drained_by(owner_tag(prefix, incident))
    if not status.drained:
        orchestrator.drain(incident.slurm_node, drain_reason(prefix, incident))
        ours = True
    evacuated = orchestrator.evacuate(incident.slurm_node)
    out = DrainOutput(
        slurm_node=incident.slurm_node,
        drained_by_pipeline=ours,
        requeued_jobs=evacuated.requeued,
        jobs_not_requeued=evacuated.not_requeued,
    )
    ledger.complete_stage(incident, "drain", clock(), out.model_dump(mode="json"))
    return out
