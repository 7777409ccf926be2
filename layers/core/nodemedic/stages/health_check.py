"""Deep health check: run the check on the instance through SSM; unhealthy never returns.

After each rung of the repair ladder the check is a *callback*: :func:`start_check` sends the
SSM command and returns; the state machine waits on its task token; SSM's "EC2 Command
Invocation Status-change Notification" event invokes :func:`complete_check`, which reads the
report and answers the token. No Lambda waits and no state polls.

The same check also *verifies* an ambiguous fault before anything destructive happens
(:func:`verify`, a short synchronous run): a healthy node ends the incident (not corroborated,
node untouched); an unhealthy one is the second signal, and remediation goes on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from nodemedic.contracts.incident import IncidentRef
from nodemedic.contracts.stages import CheckLevel, HealthCheckOutput
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


def start_check(
    incident: IncidentRef,
    instance_id: str,
    level: CheckLevel,
    task_token: str,
    *,
    ssm: Any,
    ledger: Ledger,
    document: str,
    command: str,
    timeout_s: int,
    clock: Callable[[], datetime],
) -> str:
    """Send the deep health check to the instance and return at once: the state machine waits on
    ``task_token``, which :func:`complete_check` answers when SSM reports the command ended."""
    record = ledger.start_stage(incident, "repair", clock())
    rungs: list[dict[str, Any]] = list(record.result.get("rungs", []))  # type: ignore[call-overload]
    token_id = hashlib.sha256(task_token.encode()).hexdigest()[:16]
    sent_before = rungs[-1].get("check", {}) if rungs else {}
    if sent_before.get("token") == token_id:  # a retried invocation for the same wait: sent already
        return str(sent_before["command_id"])
    sent = ssm.send_command(
        InstanceIds=[instance_id], DocumentName=document, Comment=f"nodemedic {level} check {incident.slurm_node}"[:100],
        TimeoutSeconds=max(30, timeout_s), Parameters={"commands": [command], "executionTimeout": [str(timeout_s)]},
    )
    command_id = str(sent["Command"]["CommandId"])
    ledger.save_check(command_id, incident.incident_id, task_token,
                      {"instance_id": instance_id, "level": level, "incident": incident.model_dump(mode="json")})
    if rungs:
        rungs[-1]["check"] = {"level": level, "command_id": command_id, "instance_id": instance_id,
                              "started_at": clock().isoformat(), "token": token_id}
        ledger.record_progress(incident, "repair", {"rungs": rungs})
    return command_id


def complete_check(
    command_id: str, *, ssm: Any, stepfunctions: Any, ledger: Ledger, clock: Callable[[], datetime]
) -> HealthCheckOutput | None:
    """SSM says the check's command ended: read its report, record it, answer the waiting task.
    None when no check waits on this command (another command, or answered already)."""
    taken = ledger.take_check(command_id)
    if taken is None:
        return None
    _, token, detail = taken
    incident = IncidentRef.model_validate(detail["incident"])
    inv = ssm.get_command_invocation(CommandId=command_id, InstanceId=detail["instance_id"])
    result = CommandResult(detail["instance_id"], command_id, inv["Status"], int(inv.get("ResponseCode", -1)),
                           inv.get("StandardOutputContent", ""), inv.get("StandardErrorContent", ""))
    healthy, checks = parse_report(result)
    out = HealthCheckOutput(instance_id=result.instance_id, healthy=healthy, checks=checks, level=detail["level"])
    record = ledger.get(incident.incident_id).stages.get("repair")
    rungs: list[dict[str, Any]] = list(record.result.get("rungs", [])) if record else []  # type: ignore[call-overload]
    if rungs and rungs[-1].get("check", {}).get("command_id") == command_id:
        rungs[-1]["check"].update(healthy=healthy, checks=checks, ended_at=clock().isoformat())
        ledger.record_progress(incident, "repair", {"rungs": rungs})
        if healthy:  # the ladder ends here
            ledger.complete_stage(incident, "repair", clock(), {**record.result, "rungs": rungs})  # type: ignore[union-attr]
    try:
        stepfunctions.send_task_success(taskToken=token, output=out.model_dump_json())
    except (stepfunctions.exceptions.TaskTimedOut, stepfunctions.exceptions.TaskDoesNotExist,
            stepfunctions.exceptions.InvalidToken):
        return out  # the state machine stopped waiting (the rung timed out) and has moved on
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
