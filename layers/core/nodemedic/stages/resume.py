"""Resume: return the node to service (only if the pipeline drained it) and close the incident."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from nodemedic.contracts.incident import IncidentRef
from nodemedic.contracts.stages import ResumeOutput
from nodemedic.orchestrators.base import Orchestrator
from nodemedic.stages.drain import owner_tag
from nodemedic.store.ledger import Ledger


def resume(
    incident: IncidentRef, *, orchestrator: Orchestrator, ledger: Ledger, prefix: str, clock: Callable[[], datetime]
) -> ResumeOutput:
    record = ledger.start_stage(incident, "resume", clock())
    if record.completed_at:
        return ResumeOutput.model_validate(record.result)
    status = orchestrator.node_status(incident.slurm_node)
    resumed = status.drained_by(owner_tag(prefix, incident))
    if resumed:
        orchestrator.resume(incident.slurm_node)
        status = orchestrator.node_status(incident.slurm_node)
    done = clock()
    out = ResumeOutput(
        slurm_node=incident.slurm_node,
        resumed=resumed,
        node_state=status.state,
        time_to_recover_s=(done - incident.observed_at).total_seconds(),
    )
    ledger.complete_stage(incident, "resume", done, out.model_dump(mode="json"))
    ledger.close(incident, done)
    return out
