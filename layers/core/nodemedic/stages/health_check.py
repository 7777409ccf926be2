"""Deep health check: run the check on the instance through SSM; unhealthy never returns.

The same check also *verifies* an ambiguous fault before anything destructive happens: a
healthy node ends the incident (not corroborated, node untouched); an unhealthy one is the
second signal, and remediation goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from nodemedic.contracts.incident import IncidentRef
from nodemedic.contracts.stages import HealthCheckOutput
from nodemedic.errors import HealthCheckFailedError
from nodemedic.providers.run_command import CommandResult, RunCommand
from nodemedic.safety.gate import lineage_keys
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger


def parse_report(result: CommandResult) -> tuple[bool, list[dict[str, Any]]]:
    """The check prints one JSON object ``{"healthy": bool, "checks": [...]}`` as its last line.

    The node is healthy only if the command succeeded *and* the report says so.
    """
    lines = [line for line in result.stdout.strip().splitlines() if line.strip()]
    try:
        report = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        report = {}
    if not isinstance(report, dict) or "healthy" not in report:
        checks = [{"name": "report", "ok": False,
                   "detail": f"no health report in the output ({result.status}, exit {result.exit_code}): "
                             f"{(result.stderr or result.stdout).strip()[-300:]}"}]
        return False, checks
    checks = report["checks"] if isinstance(report.get("checks"), list) else []
    return bool(report["healthy"]) and result.ok, checks


def health_check(
    incident: IncidentRef,
    instance_id: str,
    *,
    runner: RunCommand,
    ledger: Ledger,
    command: str,
    timeout_s: int,
    clock: Callable[[], datetime],
) -> HealthCheckOutput:
    record = ledger.start_stage(incident, "health_check", clock())
    if record.completed_at:
        return HealthCheckOutput.model_validate(record.result)
    result = runner.run(instance_id, command, timeout_s, f"deep health check {instance_id}")
    healthy, checks = parse_report(result)
    out = HealthCheckOutput(instance_id=instance_id, healthy=healthy, checks=checks)
    if not healthy:
        ledger.record_progress(incident, "health_check", out.model_dump(mode="json"))
        failed = ", ".join(
            f"{c.get('name')}: {c.get('detail', 'failed')}" for c in checks if not c.get("ok")
        )
        raise HealthCheckFailedError(
            f"{instance_id} failed its deep health check ({failed or result.status}); "
            f"{incident.slurm_node} stays drained"
        )
    ledger.complete_stage(incident, "health_check", clock(), out.model_dump(mode="json"))
    return out


def verify(
    incident: IncidentRef,
    *,
    runner: RunCommand,
    ledger: Ledger,
    control: ControlStore,
    command: str,
    timeout_s: int,
    clock: Callable[[], datetime],
) -> HealthCheckOutput:
    record = ledger.start_stage(incident, "verify", clock())
    if record.completed_at:
        return HealthCheckOutput.model_validate(record.result)
    result = runner.run(incident.instance_id, command, timeout_s, f"verify {incident.slurm_node}")
    healthy, checks = parse_report(result)
    out = HealthCheckOutput(instance_id=incident.instance_id, healthy=healthy, checks=checks)
    done = clock()
    ledger.complete_stage(incident, "verify", done, out.model_dump(mode="json"))
    if healthy:  # not a remediation after all: it no longer counts toward the breaker
        control.change(lambda state: state.admissions.pop(incident.incident_id, None))
        ledger.close(incident, done, f"not corroborated: {incident.fault_code} from {incident.source} alone, "
                                     f"and the deep health check passed; node untouched")
    else:
        control.append_lineage(lineage_keys(incident), incident.incident_id, done)
    return out
