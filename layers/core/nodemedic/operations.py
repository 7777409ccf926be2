"""What an operator does to automation: pause/resume it, reset the breaker, approve or deny.

Each function validates, acts once, and returns the new state; an impossible request (approving
an incident that waits for nothing, resetting a closed breaker) raises :class:`OperatorError`
and changes nothing. The ``nodemedic`` CLI calls these; so can a script.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any, NamedTuple

from botocore.exceptions import ClientError

from nodemedic.contracts.events import OPERATOR_MAX, REASON, REASON_MAX
from nodemedic.contracts.incident import Incident, StageRecord
from nodemedic.errors import NodeMedicError
from nodemedic.store.control import ControlState, ControlStore, Switch
from nodemedic.store.ledger import Ledger

REASON_MIN = 3
# Step Functions' answers to a task token whose wait is over: its TimeoutSeconds passed, or the
# execution ended (SendTaskSuccess/SendTaskFailure, Step Functions API Reference, Errors)
LATE_ANSWER = frozenset({"TaskTimedOut", "TaskDoesNotExist", "InvalidToken"})


class OperatorError(NodeMedicError):
    """The operator's request cannot be carried out; nothing was changed."""


def no_instance_backs(node: str, cluster: str) -> str:
    """Why an operator's reboot or replace of ``node`` is refused when no instance of the cluster
    backs it, and what gives it one."""
    return (f"{node} is not a member of cluster {cluster}: no instance of it backs {node} (its instance ended, or it "
            f"never had one); nothing was drained. With Provider=autoscaling on Slurm the reconciler gives it the "
            f"instance its group launched in its place (INSTANCE_LOST); else give it an instance "
            f"tagged nodemedic:slurm-node={node}, joined as it")


def request_would_fold(holder: Incident, node: str, action: str) -> str:
    """Why an operator's reboot or replace of ``node`` is refused while ``holder``, still open,
    holds it: NodeMedic acts on a node through one incident at a time, so the request would fold
    into that incident and change nothing. Names the incident, where it stands, and what to do."""
    stage = holder.stage
    then = (f"it waits for approval: `nodemedic approve {holder.incident_id}` lets it repair the node, "
            f"`nodemedic deny {holder.incident_id}` ends it with the node drained" if stage == "approval" else
            f"follow it with `nodemedic show {holder.incident_id}`")
    return (f"{node} is in incident {holder.incident_id}, still open ({holder.fault_code}, {holder.action}; at "
            f"{stage}): a {action} request would fold into it and change nothing. {then[0].upper()}{then[1:]}. "
            "Once it has ended, ask again.")


class Reenabled(NamedTuple):
    """Automation on again: the new state, and the held incidents whose nodes were released. Their
    faults are not looked at again: a node's next event opens a new incident, and a fault that
    was reported once (an XID) must be remediated by hand."""

    state: ControlState
    released: list[Incident]


def _who(by: str, reason: str) -> None:
    """Refuse an action without who and why, or with a reason a runbook start would refuse (it
    would also overrun what Step Functions takes as a denial's cause)."""
    if not by.strip():
        raise OperatorError("say who you are (--by)")
    if len(by) > OPERATOR_MAX:
        raise OperatorError(f"--by is {len(by)} characters; at most {OPERATOR_MAX}")
    if len(reason.strip()) < REASON_MIN:
        raise OperatorError(f"give a reason of at least {REASON_MIN} characters (--reason)")
    if len(reason) > REASON_MAX or not re.fullmatch(REASON, reason):
        raise OperatorError(f"--reason must be at most {REASON_MAX} characters, without quotes, backquotes, $, "
                            f"backslashes or control characters (it may become a Slurm drain reason)")


def pause(control: ControlStore, by: str, reason: str) -> ControlState:
    """Stop all automation: new incidents are recorded and held, nothing is touched."""
    _who(by, reason)

    def edit(state: ControlState) -> None:
        if state.paused:
            raise OperatorError(f"automation is already paused by {state.paused.by}: {state.paused.reason}")
        state.paused = Switch(by=by, reason=reason, at=datetime.now(UTC))

    return control.change(edit)


def resume_automation(control: ControlStore, ledger: Ledger, by: str, reason: str) -> Reenabled:
    """Turn automation back on; nodes held while paused take new incidents again."""
    _who(by, reason)

    def edit(state: ControlState) -> None:
        if not state.paused:
            raise OperatorError("automation is not paused")
        state.paused = None

    state = control.change(edit)
    return Reenabled(state, ledger.release_held(control.cluster))


def reset_breaker(control: ControlStore, ledger: Ledger, by: str, reason: str) -> Reenabled:
    """Close a tripped breaker. Remediations admitted before the reset no longer count, and the
    nodes held while it was open take new incidents again."""
    _who(by, reason)

    def edit(state: ControlState) -> None:
        if state.breaker.state != "open":
            raise OperatorError("the circuit breaker is closed; nothing to reset")
        state.breaker.state = "closed"
        state.breaker.reset = Switch(by=by, reason=reason, at=datetime.now(UTC))

    state = control.change(edit)
    return Reenabled(state, ledger.release_held(control.cluster))


def answer_approval(ledger: Ledger, sfn: Any, incident_id: str, *, approve: bool, by: str,
                    reason: str) -> dict[str, str]:
    """Approve (the execution goes on to replace/reboot) or deny (it ends, node drained). The
    answer is recorded before the execution is told (it reads it), in a write conditional on no
    answer being there: of two operators answering at once, the first is told and the second is
    refused, naming it. If Step Functions cannot be told (throttled, unreachable), the answer is
    taken back, so the operator can answer again."""
    _who(by, reason)
    incident = ledger.get(incident_id)
    record = incident.stages.get("approval")
    token = str(record.result.get("task_token", "")) if record else ""
    if incident.status != "open" or not token or (record and record.result.get("decision")):
        raise OperatorError(f"incident {incident_id} is {incident.status} and waits for no approval")
    decision = "approved" if approve else "denied"
    now = datetime.now(UTC)
    answer = {"decision": decision, "by": by, "reason": reason, "decided_at": now.isoformat()}

    def answered(rec: StageRecord) -> StageRecord | None:
        if rec.result.get("decision") or rec.result.get("task_token") != token:
            return None  # answered meanwhile, or asked again (a new token): not this answer's to record
        return rec.model_copy(update={"result": {**rec.result, **answer},
                                      "completed_at": (rec.completed_at or now) if approve else rec.completed_at})

    if ledger.swap_stage(incident, "approval", answered) is None:
        now_answered = ledger.get(incident_id).stages["approval"].result
        raise OperatorError(f"incident {incident_id} was answered meanwhile: {now_answered.get('decision', 'asked again')} "
                            f"by {now_answered.get('by', 'nobody')} ({now_answered.get('reason', '')}); your answer "
                            f"was not sent")
    try:
        if approve:
            sfn.send_task_success(taskToken=token, output=json.dumps({"approved": True, "by": by, "reason": reason}))
        else:
            sfn.send_task_failure(taskToken=token, error="ApprovalDenied", cause=f"denied by {by}: {reason}")
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code not in LATE_ANSWER:
            ledger.swap_stage(incident, "approval", lambda rec: record if rec.result.get("decided_at") ==
                              answer["decided_at"] and rec.result.get("by") == by else None)
            raise
        # the wait ran out (or its execution ended) before the answer came: the execution ends the
        # incident denied, the node stays drained; the ledger says the answer came too late
        late = {"decision": "timed out", "late_answer": answer,
                "outcome": f"the approval wait had ended ({code}) when {by} answered"}
        ledger.complete_stage(incident, "approval", datetime.now(UTC), {**record.result, **late})  # type: ignore[union-attr]
        raise OperatorError(f"too late: incident {incident_id}'s approval wait had ended ({code}) before your "
                            f"answer; it ends denied and {incident.slurm_node} stays drained. Act on the node "
                            f"by hand: nodemedic remediate {incident.slurm_node} --action ACTION --reason TEXT") from exc
    return {"incident": incident_id, "decision": decision, "by": by, "reason": reason}
