"""Failed: where every stage's error ends, the same way whatever failed.

The incident is marked ``failed`` with the stage and the error; its node lock is released, so the
next fault or a runbook opens a new incident; a spare it had claimed but not taken is released;
and a node the gate had allowed NodeMedic to act on is left drained and *held* drained (the
reconciler drains it again if the drain is lost, or if the scheduler could not be reached now).
A node returned to service before the failure is not drained again; a node the gate never let
NodeMedic act on (gate, verify, dry run) is not touched. Its fault is not lost when what failed
was passing (AWS throttling past the retries, the cluster at its limit of concurrent remediations
for longer than the gate waits, Lambda's own errors): the reconciler offers it again at its next
run, as it does a fault the cooldown held, ``RETRIES`` times in a row at most.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from nodemedic.contracts.incident import SPARE_CLAIM, STAGES, Incident, IncidentRef
from nodemedic.contracts.stages import EndOutput
from nodemedic.errors import IncidentStateError, NodeGoneError, RetryableError
from nodemedic.orchestrators.base import Orchestrator
from nodemedic.safety.gate import decided_again
from nodemedic.stages.drain import drain_reason
from nodemedic.stages.resume import lambda_error_message
from nodemedic.store.ledger import Ledger


def failed_stage(incident: Incident) -> str:
    """The stage that failed: the last one started and not completed; else the step after the
    last completed one (the error came before the next stage recorded its start)."""
    started = sorted(incident.stages.items(), key=lambda kv: kv[1].started_at)
    unfinished = [name for name, record in started if record.completed_at is None]
    if unfinished:
        return unfinished[-1]
    done = [name for name in STAGES if name in incident.stages]
    return f"after {done[-1]}" if done else "gate"


def error_message(error: dict[str, str | None] | None) -> tuple[str, str]:
    """(error name, message) from a Catch's ``{"Error", "Cause"}``; a Lambda's Cause is a JSON
    document whose ``errorMessage`` is the message."""
    name = (error or {}).get("Error") or "unknown"
    return name, lambda_error_message((error or {}).get("Cause") or "")[:1000]


RETRIES = 3  # a fault whose gate failed on a passing error is offered again this often in a row
# Lambda's own errors that AWS says to retry (Step Functions developer guide, "Handling errors":
# Lambda.ServiceException, Lambda.AWSLambdaException, Lambda.SdkClientException), its throttling,
# and a task's timeout
_PASSING = frozenset({"Lambda.ServiceException", "Lambda.AWSLambdaException", "Lambda.SdkClientException",
                      "Lambda.TooManyRequestsException", "States.Timeout"})


def _retryable(cls: type[Exception]) -> set[str]:
    subclasses: list[type[Exception]] = cls.__subclasses__()
    return {name for sub in subclasses for name in (sub.__name__, *_retryable(sub))}


def passing(error: str) -> bool:
    """The error is expected to clear by itself: the state machine retried it until its budget ran out."""
    return error in _PASSING or error in _retryable(RetryableError)


def failed_in_a_row(incident: Incident, ledger: Ledger) -> int:
    """How many incidents before this one failed on the same fault, each offering it to the next."""
    count, current = 0, incident
    while count < RETRIES and isinstance(before := current.evidence("recheck_of"), str):
        try:
            current = ledger.get(before)
        except IncidentStateError:  # not in the ledger (expired, a restored backup): the chain ends there
            break
        if current.status != "failed":
            break
        count += 1
    return count


def allowed_to_act(incident: Incident) -> bool:
    """The gate let NodeMedic act on the node (or its verify check found the node unhealthy);
    Drain may not even have recorded its start (DynamoDB throttled)."""
    gate, verify = incident.stages.get("gate"), incident.stages.get("verify")
    return ("drain" in incident.stages
            or bool(gate and gate.completed_at and gate.result.get("verdict") in ("proceed", "quarantine"))
            or bool(verify and verify.completed_at and verify.result.get("healthy") is False))


def fail(incident: IncidentRef, error: dict[str, str | None] | None, *, orchestrator: Orchestrator,
         ledger: Ledger, prefix: str, clock: Callable[[], datetime]) -> EndOutput:
    current = ledger.get(incident.incident_id)
    if current.status != "open":  # a retried invocation, or another path ended it first
        return EndOutput(status=current.status,
                         message=current.outcome or f"incident {incident.incident_id} is {current.status} already")
    stage = failed_stage(current)
    name, cause = error_message(error)
    spare = current.stages.get("spare")
    if spare and not spare.completed_at and spare.result.get("spare"):
        ledger.release(SPARE_CLAIM, str(spare.result["spare"]))  # claimed, maybe not taken: never lost to the pool
    node = incident.slurm_node
    acted, resume = allowed_to_act(current), current.stages.get("resume")
    if acted and not (resume and resume.result.get("resumed")):  # NodeMedic keeps the node drained
        reason = drain_reason(prefix, incident)
        hold: str | None = reason
        try:
            if orchestrator.drain(node, reason, takeover=f"{prefix}:"):
                drained = f"{node} stays drained; NodeMedic holds the drain (it is drained again if lost)"
            else:
                hold, drained = None, f"{node} stays drained by someone else's drain, which is left alone"
        except NodeGoneError:  # no hold on a name a later instance may register under
            hold, drained = None, f"{node} is gone (the cluster deleted its node): nothing is left to keep drained"
        except Exception as exc:  # noqa: BLE001 - the scheduler may be what failed: hold it all the same
            drained = (f"{node} could not be drained now ({exc}); NodeMedic holds it: the reconciler drains "
                       f"it as soon as the scheduler answers")
    else:
        hold = None
        drained = (f"{node} was returned to service before the failure and is left so (should the scheduler "
                   f"have lost that return, the reconciler makes it again)" if acted
                   else f"{node} was not touched (the failure came before the gate let NodeMedic act)")
    now = clock()
    again = not acted and passing(name) and decided_again(incident) and failed_in_a_row(current, ledger) < RETRIES
    if again:
        drained += (f"; the error passes, so NodeMedic decides its {incident.fault_code} again at the reconciler's "
                    "next run")
    message = (f"NodeMedic incident {incident.incident_id} on {node} ({incident.instance_id}) failed in stage "
               f"{stage}: {name}: {cause}. {drained}. The node's lock is released: its next fault, or a runbook "
               f"(nodemedic remediate {node} --action replace|reboot), opens a new incident; "
               f"`nodemedic remediate {node} --action resume` returns it to service.")
    ledger.fail(incident, now, {"stage": stage, "error": name, "cause": cause}, message, hold,
                recheck_due=now if again else None)
    return EndOutput(status="failed", message=message)
