"""Resume: return the node to service (only if the pipeline drained it) and close the incident."""

from __future__ import annotations

from datetime import datetime

from nodemedic.contracts.incident import IncidentRef
from nodemedic.contracts.stages import ResumeOutput
from nodemedic.orchestrators.base import Orchestrator
from nodemedic.stages.drain import owner_tag
from nodemedic.store.ledger import Ledger


def resume(
    incident: IncidentRef, *, orchestrator: Orchestrator, ledger: Ledger, prefix: str, now: datetime
) -> ResumeOutput:
    record = ledger.start_stage(incident, "resume", now)
    if record.completed_at:
        return ResumeOutput.model_validate(record.result)
    status = orchestrator.node_status(incident.slurm_node)
    resumed = status.drained_by(owner_tag(prefix, incident))
    if resumed:
        orchestrator.resume(incident.slurm_node)
        status = orchestrator.node_status(incident.slurm_node)
    out = ResumeOutput(
        slurm_node=incident.slurm_node,
        resumed=resumed,
        node_state=status.state,
        time_to_recover_s=(now - incident.observed_at).total_seconds(),
    )
    ledger.complete_stage(incident, "resume", now, out.model_dump(mode="json"))
    ledger.close(incident, now)
    return out
