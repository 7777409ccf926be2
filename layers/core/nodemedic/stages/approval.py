"""Approval gate: the execution waits on a task token until an operator approves or denies.

``request_approval`` stores the token in the incident and notifies; ``nodemedic approve`` /
``deny`` (:mod:`nodemedic.operations`) answer it. A denial, or no answer before the state's
timeout, ends the incident ``denied`` with the reason; the node stays drained.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from nodemedic.contracts.incident import IncidentRef
from nodemedic.store.ledger import Ledger


class Notifier:
    """Publishes to the escalation topic (SNS)."""

    def __init__(self, sns: object, topic_arn: str) -> None:
        self._sns = sns
        self._topic = topic_arn

    def publish(self, subject: str, message: str) -> None:
        self._sns.publish(TopicArn=self._topic, Subject=subject[:100], Message=message)  # type: ignore[attr-defined]


def request_approval(incident: IncidentRef, task_token: str, *, ledger: Ledger, notifier: Notifier,
                     clock: Callable[[], datetime]) -> None:
    record = ledger.start_stage(incident, "approval", clock())
    if record.result.get("task_token") == task_token:
        return  # a retried invocation: already asked
    ledger.record_progress(incident, "approval", {"task_token": task_token, "requested_at": clock().isoformat()})
    if incident.action == "burn_in":
        what = "repair"
        rest = " -> ".join(r for r in incident.rungs if r != "check")
        state = ("The node joined and failed its full health check; it is drained and runs no job. Its repair "
                 f"({rest}) waits for you.")
    else:
        what = incident.action
        state = f"The node is drained and its jobs requeued; the {incident.action} waits for you."
    notifier.publish(
        f"NodeMedic: approve {what} of {incident.slurm_node}?",
        f"Incident {incident.incident_id}: {incident.fault_code} ({incident.fault_class}) on {incident.slurm_node} "
        f"({incident.instance_id}). {state}\n"
        f"Approve: nodemedic approve {incident.incident_id} --reason TEXT\n"
        f"Deny (the node stays drained): nodemedic deny {incident.incident_id} --reason TEXT",
    )


def record_denial(incident: IncidentRef, error: dict[str, str | None], *, ledger: Ledger,
                  clock: Callable[[], datetime]) -> dict[str, str]:
    now = clock()
    record = ledger.start_stage(incident, "approval", now)
    answer = record.result  # the operator's answer is recorded before the execution is told
    if error.get("Error") == "States.Timeout":
        why = f"no answer before the approval deadline; {incident.action} not done"
    elif answer.get("decision") == "denied":
        why = f"denied by {answer.get('by')}: {answer.get('reason')}"
    else:
        why = error.get("Cause") or error.get("Error") or "denied"
    if not record.completed_at:
        ledger.complete_stage(incident, "approval", now, {**answer, "decision": "denied", "outcome": why})
    ledger.end(incident, "denied", now, f"{why}; {incident.slurm_node} stays drained", release_node=True)
    return {"decision": "denied", "reason": why}
