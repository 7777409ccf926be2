"""Shadow (dry run): record what every stage would have done, and change nothing.

It reads what the real stages would read (the node's state, its jobs) and writes the plan to
the incident; the incident ends ``dry_run``. Slurm and EC2 see only read commands.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from nodemedic.contracts.incident import IncidentRef
from nodemedic.contracts.stages import GateOutput, ShadowOutput
from nodemedic.errors import NodeGoneError
from nodemedic.orchestrators.base import Orchestrator
from nodemedic.stages.drain import drain_reason, owner_tag
from nodemedic.store.ledger import Ledger


def plan(incident: IncidentRef, gate: GateOutput, orchestrator: Orchestrator, prefix: str,
         health_check_command: str) -> list[str]:
    node, instance = incident.slurm_node, incident.instance_id
    if gate.would == "hold":
        return [f"hold: take no action ({gate.reason.removeprefix('dry run: ')})"]
    steps = []
    if gate.would == "verify":
        steps.append(f"verify: run the deep health check on {instance} first; act only if it fails")
    try:
        status = orchestrator.node_status(node)
    except NodeGoneError as exc:  # its instance ended meanwhile: nothing is left to act on
        return [*steps, f"retire: {exc}; nothing to drain, repair or resume"]
    if status.drained:
        steps.append(f"drain: {node} is already {status.state} ({status.reason or 'no reason'}); leave the drain")
    else:
        steps.append(f"drain: scontrol update nodename={node} state=drain reason='{drain_reason(prefix, incident)}'")
    jobs = orchestrator.jobs_on(node)
    steps.append(f"requeue: jobs {', '.join(jobs)} and release them at once" if jobs else "requeue: no jobs on the node")
    if gate.would == "quarantine":
        return [*steps, f"quarantine: keep {node} drained, page an operator; no replace"]
    if incident.action == "retire":
        return [*steps, f"retire: keep {node} drained until its capacity ends; nothing repaired or replaced"]
    steps.append(f"repair: {' -> '.join(incident.rungs)} on {instance}, each rung followed by the deep health "
                 f"check ({health_check_command}); the next rung only if the check fails")
    if status.drained and not status.drained_by(owner_tag(prefix, incident)):
        steps.append(f"resume: no, {node} was drained by someone else")
    else:
        steps.append(f"resume: scontrol update nodename={node} state=resume")
    return steps


def shadow(incident: IncidentRef, gate: GateOutput, *, orchestrator: Orchestrator, ledger: Ledger,
           prefix: str, health_check_command: str, clock: Callable[[], datetime]) -> ShadowOutput:
    record = ledger.start_stage(incident, "shadow", clock())
    if record.completed_at:
        return ShadowOutput.model_validate(record.result)
    out = ShadowOutput(would=gate.would, actions=plan(incident, gate, orchestrator, prefix, health_check_command))
    done = clock()
    ledger.complete_stage(incident, "shadow", done, out.model_dump(mode="json"))
    ledger.end(incident, "dry_run", done, f"dry run, nothing changed; would {gate.would}: "
                                          + "; ".join(out.actions), release_node=True)
    return out
