"""Replace (or reboot): put a healthy instance behind the Slurm node again.

Each step is recorded in the ledger before the next one starts, so an invocation retried by
the state machine continues where the last one stopped: one termination, one replacement.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from nodemedic.contracts.incident import IncidentRef
from nodemedic.contracts.stages import ReplaceOutput
from nodemedic.errors import ReplacementPendingError
from nodemedic.providers.base import Provider
from nodemedic.providers.run_command import RunCommand
from nodemedic.store.ledger import Ledger


def replace(
    incident: IncidentRef,
    *,
    provider: Provider,
    runner: RunCommand,
    ledger: Ledger,
    join_command: str,
    timeout_s: int,
    clock: Callable[[], datetime],
) -> ReplaceOutput:
    record = ledger.start_stage(incident, "replace", clock())
    if record.completed_at:
        return ReplaceOutput.model_validate(record.result)
    done = dict(record.result)
    old = incident.instance_id

    if incident.action == "reboot":
        if not done.get("rebooted"):
            provider.reboot(old)
            ledger.record_progress(incident, "replace", {"rebooted": True})
        out = ReplaceOutput(action="reboot", old_instance_id=old, instance_id=old)
    else:
        if not done.get("replacement_requested"):
            provider.start_replacement(old)
            ledger.record_progress(incident, "replace", {"replacement_requested": True})
        new = done.get("new_instance_id")
        if not new:
            new = _claim_replacement(incident, provider, ledger)
            provider.assign_node(new, incident.slurm_node)
            ledger.record_progress(incident, "replace", {"new_instance_id": new})
        if not done.get("joined"):
            script = join_command.replace("{slurm_node}", incident.slurm_node)
            runner.run_checked(str(new), script, timeout_s, f"join {incident.slurm_node}")
            ledger.record_progress(incident, "replace", {"joined": True})
        out = ReplaceOutput(action="replace", old_instance_id=old, instance_id=str(new))

    ledger.complete_stage(incident, "replace", clock(), out.model_dump(mode="json"))
    return out


def _claim_replacement(incident: IncidentRef, provider: Provider, ledger: Ledger) -> str:
    for candidate in provider.replacement_candidates(exclude=incident.instance_id):
        if ledger.claim_instance(candidate, incident.incident_id):
            return candidate
    raise ReplacementPendingError(f"no replacement for {incident.instance_id} is in service yet")
