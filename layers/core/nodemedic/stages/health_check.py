"""Deep health check: run the check on the instance through SSM; unhealthy never returns.

After each rung of the repair ladder the check is a *callback*: :func:`start_check` sends the
SSM command and returns; the state machine waits on its task token; SSM's "EC2 Command
Invocation Status-change Notification" event invokes :func:`complete_check`, which reads the
report and answers the token. No Lambda waits and no state polls.

The same check, also a callback, *verifies* an ambiguous fault before anything destructive
happens (:func:`verified`): a healthy node ends the incident (not corroborated, node untouched);
an unhealthy one is the second signal, and remediation goes on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from nodemedic.contracts.incident import CheckRecord, IncidentRef, RungRecord, Stage, StageRecord, rungs_result
from nodemedic.contracts.problems import read_json
from nodemedic.contracts.stages import CheckLevel, HealthCheckOutput, Purpose
from nodemedic.errors import CommandPendingError, InstanceGoneError
from nodemedic.providers.run_command import SSM_STDOUT_LIMIT, TERMINAL, CommandResult, Documents, RunCommand
from nodemedic.safety.gate import HandsOff, lineage_keys, refuse_if_held
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger


def parse_report(result: CommandResult) -> tuple[bool, list[dict[str, Any]]]:
    """The check prints one JSON object ``{"healthy": bool, "checks": [...]}`` as its last line.

    The node is healthy only if the command succeeded *and* the report says so.
    """
    if result.cut:  # the report is the last line: SSM kept only the start of the output
        return False, [{"name": "report", "ok": False,
                        "detail": f"the check printed more than SSM returns ({SSM_STDOUT_LIMIT:,} characters): its "
                                  f"report, the last line, was cut off; the check must print only its report"}]
    lines = [line for line in result.stdout.strip().splitlines() if line.strip()]
    try:
        report = read_json(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        report = {}
    if not isinstance(report, dict) or "healthy" not in report:
        checks = [{"name": "report", "ok": False,
                   "detail": f"no health report in the output ({result.status}, exit {result.exit_code}): "
                             f"{(result.stderr or result.stdout).strip()[-300:]}"}]
        return False, checks
    checks = [c for c in report["checks"] if isinstance(c, dict)] if isinstance(report.get("checks"), list) else []
    # only JSON true is healthy: "false", 1 or a list from a broken check are not
    return report["healthy"] is True and result.ok, checks


GONE = "gone:"  # the command id recorded for a check no command could run: its instance is gone


def start_check(
    incident: IncidentRef,
    instance_id: str,
    level: CheckLevel,
    task_token: str,
    *,
    purpose: Purpose = "recovery",
    runner: RunCommand,
    ledger: Ledger,
    control: ControlStore,
    stepfunctions: Any,
    documents: Documents,
    timeout_s: int,
    clock: Callable[[], datetime],
    hands_off: HandsOff = lambda node, instance: None,
) -> str:
    """Send the deep health check to the instance and return at once: the state machine waits on
    ``task_token``, which :func:`complete_check` answers when SSM reports the command ended.
    ``recovery``: the check after a rung of the ladder (recorded on the rung). ``verify``: an
    ambiguous fault is checked before anything destructive (recorded in the ``verify`` stage).

    An instance that is gone (terminated by someone else while the incident ran) fails its check
    at once, answered here: SSM refuses it for good, and the ladder goes on (a replace rung finds
    the group's new instance) instead of retrying the send for a quarter of an hour."""
    record = ledger.start_stage(incident, stage_of(purpose), clock())
    rungs, sent_before = check_record(record, purpose)
    token_id = hashlib.sha256(task_token.encode()).hexdigest()[:16]
    # a retried invocation for the same wait: sent already (or verify answered already: a late
    # retry sends nothing); a check answered here may be the one whose answer was lost
    if sent_before.token == token_id or record.completed_at:
        if sent_before.token == token_id and sent_before.command_id.startswith(GONE):
            answer(stepfunctions, task_token, _gone_result(sent_before))
        return sent_before.command_id
    if purpose == "recovery":
        refuse_if_held(hands_off, incident.slurm_node, instance_id)
    try:
        command_id = runner.send(instance_id, documents.health_check, {"level": level}, timeout_s,
                                 f"nodemedic {purpose} {level} check {incident.slurm_node}")
    except InstanceGoneError as exc:
        now = clock()
        check = CheckRecord(level=level, command_id=f"{GONE}{instance_id}", instance_id=instance_id, started_at=now,
                            token=token_id, healthy=False, ended_at=now,
                            checks=[{"name": "instance", "ok": False, "detail": str(exc)}])
        save_check_record(incident, purpose, rungs, check, ledger)
        out = _gone_result(check)
        if purpose == "verify":
            out = verified(incident, out, ledger=ledger, control=control, now=now)
        else:
            record_on_rung(incident, check.command_id, out, ledger, now)
        answer(stepfunctions, task_token, out)
        return check.command_id
    ledger.save_check(command_id, incident.incident_id, task_token,
                      {"instance_id": instance_id, "level": level, "purpose": purpose,
                       "incident": incident.model_dump(mode="json")})
    check = CheckRecord(level=level, command_id=command_id, instance_id=instance_id, started_at=clock(), token=token_id)
    save_check_record(incident, purpose, rungs, check, ledger)
    return command_id


def _gone_result(check: CheckRecord) -> HealthCheckOutput:
    return HealthCheckOutput(instance_id=check.instance_id, healthy=False, level=check.level or "quick",
                             checks=list(check.checks))


def stage_of(purpose: Purpose) -> Stage:
    """Where a check is recorded: on the repair stage's rungs (after a rung) or as the verification."""
    return "repair" if purpose == "recovery" else "verify"


def check_record(record: StageRecord, purpose: Purpose) -> tuple[list[RungRecord], CheckRecord]:
    """The ladder's rungs so far, and the record of the check: the last rung's, or the verification's
    (an empty record where none was sent)."""
    rungs = record.repair_rungs
    if purpose == "verify":
        saved = record.result.get("check")
        return rungs, CheckRecord.model_validate(saved) if isinstance(saved, dict) else CheckRecord()
    return rungs, (rungs[-1].check if rungs and rungs[-1].check else CheckRecord())


def save_check_record(incident: IncidentRef, purpose: Purpose, rungs: list[RungRecord], check: CheckRecord,
                      ledger: Ledger) -> None:
    """Keep ``check`` where :func:`check_record` reads it."""
    if purpose == "verify":
        ledger.record_progress(incident, "verify", {"check": check.saved()})
    elif rungs:
        rungs[-1].check = check
        ledger.record_progress(incident, "repair", rungs_result(rungs))


def complete_check(
    command_id: str, *, ssm: Any, stepfunctions: Any, ledger: Ledger, control: ControlStore,
    clock: Callable[[], datetime],
) -> HealthCheckOutput | None:
    """SSM says the check's command ended: read its report, record it, answer the waiting task.
    None when no check waits on this command (another command, or answered already)."""
    waiting = ledger.waiting_check(command_id)
    if waiting is None:
        return None
    _, token, detail = waiting
    incident = IncidentRef.model_validate(detail["incident"])
    try:
        inv = ssm.get_command_invocation(CommandId=command_id, InstanceId=detail["instance_id"])
    except ssm.exceptions.InvocationDoesNotExist as exc:  # SSM has not registered it yet: retried
        raise CommandPendingError(f"command {command_id} has no invocation yet; the check stays waiting") from exc
    if inv["Status"] not in TERMINAL:  # the event ran ahead of the invocation's record: retried
        raise CommandPendingError(f"command {command_id} is {inv['Status']}, not ended; the check stays waiting")
    result = CommandResult(detail["instance_id"], command_id, inv["Status"], int(inv.get("ResponseCode", -1)),
                           inv.get("StandardOutputContent", ""), inv.get("StandardErrorContent", ""))
    healthy, checks = parse_report(result)
    out = HealthCheckOutput(instance_id=result.instance_id, healthy=healthy, checks=checks, level=detail["level"])
    if detail.get("purpose") == "verify":
        out = verified(incident, out, ledger=ledger, control=control, now=clock())
    else:
        record_on_rung(incident, command_id, out, ledger, clock())
    answer(stepfunctions, token, out)
    ledger.forget_check(command_id)  # only now: any error above leaves the check for the retry
    return out


def answer(stepfunctions: Any, token: str, out: HealthCheckOutput) -> None:
    """Give the waiting task the check's result."""
    try:
        stepfunctions.send_task_success(taskToken=token, output=out.model_dump_json())
    except (stepfunctions.exceptions.TaskTimedOut, stepfunctions.exceptions.TaskDoesNotExist,
            stepfunctions.exceptions.InvalidToken):
        pass  # the state machine stopped waiting (the rung timed out, or answered before) and moved on


def record_on_rung(incident: IncidentRef, command_id: str, out: HealthCheckOutput, ledger: Ledger,
                    now: datetime) -> None:
    record = ledger.get(incident.incident_id).stages.get("repair")
    rungs = record.repair_rungs if record else []
    check = rungs[-1].check if rungs else None
    if record is None or check is None or check.command_id != command_id:
        return
    rungs[-1].check = check.model_copy(update={"healthy": out.healthy, "checks": out.checks, "ended_at": now})
    ledger.record_progress(incident, "repair", rungs_result(rungs))
    if out.healthy:  # the ladder ends here
        ledger.complete_stage(incident, "repair", now, {**record.result, **rungs_result(rungs)})


def verified(incident: IncidentRef, out: HealthCheckOutput, *, ledger: Ledger, control: ControlStore,
             now: datetime) -> HealthCheckOutput:
    """The verification's answer, which the caller gives the waiting task: healthy ends the
    incident (not corroborated, node untouched); unhealthy is the second signal, and counts in the
    node's lineage. A fault of another kind folded into the incident while it was verified (an
    Xid 79 on the silent node) is a second signal too, whatever the check found: a passing check
    closed the incident, and that fault, folded into it, was lost."""
    current = ledger.get(incident.incident_id)
    record = current.stages.get("verify")
    if record is None:
        return out
    if record.completed_at:  # answered before: the same answer again
        answered = {k: record.result[k] for k in HealthCheckOutput.model_fields if k in record.result}
        return HealthCheckOutput.model_validate({**out.model_dump(), **answered})
    second = next((f for f in current.folded_faults
                   if f.fault_code != incident.fault_code and f.fault_class != "planned"), None)
    if out.healthy and second is not None:
        out = out.model_copy(update={"healthy": False, "checks": [*out.checks, {
            "name": "second_signal", "ok": False,
            "detail": f"{second.fault_code} ({second.fault_class}) came for the node while it was checked"}]})
    ledger.complete_stage(incident, "verify", now, {**record.result, **out.model_dump(mode="json")})
    if out.healthy:  # not a remediation after all: it no longer counts toward the breaker
        control.change(lambda state: state.admissions.pop(incident.incident_id, None))
        ledger.close(incident, now, f"not corroborated: {incident.fault_code} from {incident.source} alone, "
                                    f"and the deep health check passed; node untouched")
    else:
        control.append_lineage(lineage_keys(incident), incident.incident_id, now)
    return out
