"""What the operator commands do, apart from printing: each returns plain data (what ``--json``
prints) and raises :class:`~nodemedic.operations.OperatorError` or
:class:`~nodemedic_cli.target.TargetError` with a clear message when it cannot act.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from botocore.exceptions import BotoCoreError, ClientError
from nodemedic import operations
from nodemedic.aws_retries import retryable
from nodemedic.contracts.events import RemediationRequest
from nodemedic.contracts.incident import STAGES, Incident, StageRecord
from nodemedic.contracts.problems import describe
from nodemedic.errors import CommandFailedError, IncidentStateError, PolicyError
from nodemedic.operations import OperatorError
from nodemedic.providers.run_command import Documents, RunCommand
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.stages.health_check import parse_report
from nodemedic.store.deferred import DeferredPlans
from nodemedic.store.paced import PacedReleases
from pydantic import ValidationError

from nodemedic_cli.target import Target

Action = Literal["drain", "reboot", "replace", "health-check", "resume"]
ACTIONS: tuple[str, ...] = ("drain", "reboot", "replace", "health-check", "resume")
ANSWER = {True: "healthy", False: "unhealthy", None: "no answer"}  # a deep health check's verdict
OPERATOR_DRAIN_PREFIX = "operator"  # not the pipeline's prefix: automation never resumes such a drain


def runbook_input(cluster: str, node: str, action: str, reason: str, by: str) -> dict[str, Any]:
    """The state machine's input for a hand-started remediation: the Remediation Request v1
    envelope that ``events/runbooks/*.json`` holds (validated here, as Detect validates it)."""
    detail = {"schema_version": "1", "cluster": cluster, "slurm_node": node, "action": action,
              "reason": reason, "requested_by": by}
    try:
        RemediationRequest.model_validate(detail)
    except ValidationError as exc:
        raise OperatorError(f"invalid remediation request: {describe(exc, 'request')}") from None
    return {"version": "0", "id": str(uuid.uuid4()), "detail-type": "Remediation Request",
            "source": "nodemedic.operator", "account": "", "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": "", "resources": [], "detail": detail}


def _known_node(target: Target, node: str) -> Any:
    try:
        return target.orchestrator.node_status(node)
    except CommandFailedError as exc:
        raise OperatorError(f"node {node!r} is not in cluster {target.cluster}, or the cluster could not be read: "
                            f"{exc}") from None


EXECUTION_NAME_MAX = 80  # Step Functions StartExecution: "name ... Length Constraints: 1 to 80" (API reference)


def execution_name(action: str, node: str, at: datetime) -> str:
    """The name of a hand-started execution (its incident's id): the action, the node and when.
    A node's name may be 253 characters (a Kubernetes node's) and Step Functions refuses a name
    over 80, so a long one is cut, with a digest of the whole so two names that share a start stay
    apart."""
    stamp = f"{at:%Y%m%dT%H%M%S}"
    name = f"{action}-{node}-{stamp}"
    if len(name) <= EXECUTION_NAME_MAX:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:8]
    keep = EXECUTION_NAME_MAX - len(f"{action}--{digest}-{stamp}")
    return f"{action}-{node[:keep]}-{digest}-{stamp}"


def remediate(target: Target, node: str, action: str, reason: str, by: str, level: str = "quick") -> dict[str, Any]:
    if action not in ACTIONS:
        raise OperatorError(f"--action must be one of {', '.join(ACTIONS)}, not {action!r}")
    request = runbook_input(target.cluster, node, "replace" if action not in ("reboot", "replace") else action,
                            reason, by)  # validates the reason and the names for every action
    status = _known_node(target, node)
    if action in ("reboot", "replace"):
        released = _make_way_for(target, node, action)
        name = execution_name(action, node, datetime.now(UTC))
        try:
            started = target.client("stepfunctions").start_execution(
                stateMachineArn=target.output("StateMachineArn"), name=name, input=json.dumps(request))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ExecutionAlreadyExists":
                raise
            raise OperatorError(f"a {action} of {node} was started this second already, as incident {name}: follow "
                                f"it with `nodemedic show {name}`") from None
        opened, unseen = _await_detect(target, name, started["executionArn"], node, action)
        return {"action": action, "node": node, "incident": name, "execution_arn": started["executionArn"],
                "started": True, "opened": opened, **({"unseen": unseen} if unseen else {}), "released": released}
    if action == "drain":
        # NodeMedic's own drain is taken over (the node stays out, e.g. for an RMA: automation
        # never lifts an operator's drain), checked and acted on in one scheduler command
        prefix = target.parameters.get("DrainReasonPrefix") or "nodemedic"
        if not target.orchestrator.drain(node, f"{OPERATOR_DRAIN_PREFIX}:{by} {reason}", takeover=f"{prefix}:"):
            now = target.orchestrator.node_status(node)
            raise OperatorError(f"{node} is already drained by someone else ({now.state}: {now.reason or 'no reason'})")
        target.ledger.drop_hold(target.cluster, node)
        return {"action": action, "node": node, "state": target.orchestrator.node_status(node).state,
                "was": status.reason if status.drained else ""}
    if action == "resume":
        if not status.drained:
            raise OperatorError(f"{node} is not drained ({status.state}); nothing to resume")
        target.ledger.drop_hold(target.cluster, node)  # first: the reconciler never drains it again
        # an ended incident's lock goes with its drain: kept, the node's next fault would fold into
        # that incident, and nothing would drain the node
        released = _release_ended(target, node)
        target.orchestrator.resume(node)
        return {"action": action, "node": node, "state": target.orchestrator.node_status(node).state,
                "was": status.reason, "released": released}
    return health_check(target, node, level)


def aws_failure(exc: ClientError | BotoCoreError) -> str:
    """An AWS call that failed, for a person: which call AWS refused and why (AccessDenied,
    throttled...), or that AWS could not be reached (no credentials, no network)."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"AWS refused {exc.operation_name}: {error.get('Code', '?')}: {error.get('Message', '')}"
    return f"cannot reach AWS: {exc}"


DETECT_WAIT_S = 60.0  # Detect answers in seconds; AWS throttling retried may take it minutes


def _await_detect(target: Target, name: str, execution_arn: str, node: str, action: str) -> tuple[bool, str]:
    """Wait until Detect opened incident ``name`` (True), or ``DETECT_WAIT_S`` passed without a
    decision (False: it still may), or AWS refused to say (False, and why: the execution runs all
    the same). An execution that ended without opening it was refused (two requests for one node at
    once, an instance gone since the CLI looked) or failed (AWS throttled Detect past its retries):
    :class:`OperatorError` with Detect's reason, as the command must not say it started what
    changed nothing."""
    sfn = target.client("stepfunctions")
    deadline = time.monotonic() + DETECT_WAIT_S
    while True:
        try:
            if target.ledger.statuses([name]):
                return True, ""
            execution = sfn.describe_execution(executionArn=execution_arn)
            if execution["status"] != "RUNNING":
                if target.ledger.statuses([name]):  # opened, then ended at once (held by the gate, say)
                    return True, ""
                raise OperatorError(f"the {action} of {node} opened no incident, nothing was done: {_why_ended(execution)}")
        except ClientError as exc:
            if not retryable(exc) or time.monotonic() >= deadline:  # AccessDenied to DescribeExecution, say
                return False, aws_failure(exc)
        except BotoCoreError as exc:  # the network
            return False, aws_failure(exc)
        if time.monotonic() >= deadline:
            return False, ""
        time.sleep(0.5)


def _why_ended(execution: dict[str, Any]) -> str:
    """What ended an execution before its incident opened: Detect's error message, or its decision."""
    if execution["status"] == "SUCCEEDED":
        detect = json.loads(execution.get("output") or "{}").get("detect", {})
        return str(detect.get("reason") or f"Detect decided {detect.get('decision')!r}")
    cause = execution.get("cause") or ""
    try:
        message = json.loads(cause).get("errorMessage")
    except (ValueError, AttributeError):
        message = None
    return str(message or cause or f"{execution.get('error') or 'its execution'} {execution['status'].lower()}")


def _make_way_for(target: Target, node: str, action: str) -> list[str]:
    """An incident still open holds the node: the request would fold into it as a duplicate and
    change nothing (NodeMedic acts on a node through one incident at a time), while the command
    said it started. Refused, naming that incident and where it stands. An ended incident
    (escalated, quarantined) holds the node on purpose until someone acts: this request is that
    act, so its lock is released and the request opens an incident of its own. The ids of the
    incidents that no longer hold the node. A node no instance backs is refused as Detect refuses it."""
    member = target.provider.member_by_node(node)
    if member is None:  # Detect would refuse it, and page the on-call for a node it does not know
        raise OperatorError(operations.no_instance_backs(node, target.cluster))
    holder = target.ledger.lock_holder(target.cluster, member.instance_id)
    if holder is not None and holder.status == "open":
        raise OperatorError(operations.request_would_fold(holder, node, action))
    released = target.ledger.release_holder(target.cluster, member.instance_id, holder)
    return [released] if released else []


def _release_ended(target: Target, node: str) -> list[str]:
    """Release the lock an ended incident keeps on the instance backing ``node``: the ids of the
    incidents that no longer hold it (an open incident's lock is left alone)."""
    member = target.provider.member_by_node(node)
    released = target.ledger.release_ended(target.cluster, member.instance_id) if member else None
    return [released] if released else []


def instance_of(target: Target, node: str) -> str:
    member = target.provider.member_by_node(node)
    if member is None or member.state != "running":
        raise OperatorError(f"no running instance of cluster {target.cluster} backs {node}"
                            + (f" ({member.instance_id} is {member.state})" if member else ""))
    return member.instance_id


def health_check(target: Target, node: str, level: str) -> dict[str, Any]:
    instance = instance_of(target, node)
    runner = RunCommand(target.client("ssm"), poll_interval=1.0)
    result = runner.run(instance, Documents(target.cluster).health_check, {"level": level},
                        int(target.parameters.get("CommandTimeoutSeconds") or 300),
                        f"nodemedic operator {level} check {node}")
    healthy, checks = parse_report(result)
    return {"action": "health-check", "node": node, "instance_id": instance, "level": level, "healthy": healthy,
            "checks": checks}


# -- incidents ------------------------------------------------------------------------------
def incident_summary(i: Incident) -> dict[str, Any]:
    return {"incident": i.incident_id, "node": i.slurm_node, "instance_id": i.instance_id, "fault": i.fault_code,
            "fault_class": i.fault_class, "status": i.status, "observed_at": i.observed_at.isoformat(),
            "detected_at": i.detected_at.isoformat(), "closed_at": i.closed_at.isoformat() if i.closed_at else None,
            "stage": i.stage, "outcome": i.outcome}


def list_incidents(target: Target, open_only: bool, since: datetime | None,
                   progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    chosen = [i for i in target.ledger.list_incidents(progress)
              if (not open_only or i.status == "open") and (since is None or i.detected_at >= since)]
    return [incident_summary(i) for i in sorted(chosen, key=lambda i: i.observed_at, reverse=True)]


def get_incident(target: Target, incident_id: str) -> Incident:
    try:
        return target.ledger.get(incident_id)
    except IncidentStateError as exc:
        raise OperatorError(f"no incident {incident_id!r} in stack {target.stack} (list them: nodemedic incidents)"
                            ) from exc


def timeline(i: Incident) -> list[dict[str, Any]]:
    rows = []
    for stage in STAGES:
        record = i.stages.get(stage)
        if record is None:
            continue
        rows.append({"stage": stage, "started_at": record.started_at.isoformat(),
                     "completed_at": record.completed_at.isoformat() if record.completed_at else None,
                     "seconds": round((record.completed_at - record.started_at).total_seconds(), 3)
                     if record.completed_at else None,
                     "from_fault_s": round(((record.completed_at or record.started_at) - i.observed_at).total_seconds(), 3),
                     "decision": decision_of(stage, record)})
    return rows


def decision_of(stage: str, record: StageRecord) -> str:
    """The one line that says what a stage decided, from what it recorded."""
    result: dict[str, Any] = record.result
    if stage == "gate":
        return f"{result.get('verdict')}: {result.get('reason')}"
    if stage == "drain":
        return f"requeued {', '.join(result.get('requeued_jobs', [])) or 'no jobs'}"
    if stage == "spare":
        return str(result.get("reason", ""))
    if stage == "jobs":
        return f"running again: {result.get('running')}; pending: {result.get('pending')}"
    if stage == "repair":
        return " > ".join(f"{r.rung} skipped ({r.skipped})" if r.skipped else
                          f"{r.rung} on {r.instance_id}: {ANSWER[r.healthy]}"
                          for r in record.repair_rungs)
    if stage == "resume":
        return f"{'returned to ' + str(result.get('destination')) if result.get('resumed') else 'left drained'}"
    if stage in ("verify", "approval", "shadow", "detect"):
        return str(result.get("reason") or result.get("decision") or result.get("would") or
                   ("healthy" if result.get("healthy") else "unhealthy" if "healthy" in result else ""))
    return ""


def show(target: Target, incident_id: str) -> dict[str, Any]:
    i = get_incident(target, incident_id)
    return {**incident_summary(i), "reason": i.reason, "duplicate_events": i.duplicate_events,
            "failure": i.failure, "ladder": list(i.rungs), "timeline": timeline(i)}


# -- automation switches ----------------------------------------------------------------------
def control_status(target: Target) -> dict[str, Any]:
    state = target.control.read()
    admitted = sorted(state.admissions)
    open_ids = target.ledger.still_open([*admitted, *state.waiting])
    return {"paused": state.paused.model_dump(mode="json") if state.paused else None,
            "breaker": state.breaker.model_dump(mode="json"),
            "admitted_in_window": admitted,  # what the breaker counts (closed ones too, until the window ends)
            "in_progress": [i for i in admitted if i in open_ids],
            "waiting_for_a_slot": sorted(state.waiting_for_slot(open_ids))}  # the breaker counts them too


def reenabled(target: Target, change: operations.Reenabled) -> dict[str, Any]:
    """The status after a resume of automation or a breaker reset, with the held incidents it
    released."""
    return {**control_status(target), "released_held": [incident_summary(i) for i in change.released]}


def planned(target: Target) -> dict[str, Any]:
    """The planned notices waiting (for their lead time, or for room under the circuit breaker),
    the nearest first, and the planned work released within the breaker's window."""
    table, db, now = target.output("IncidentsTableName"), target.client("dynamodb"), datetime.now(UTC)
    try:
        policy_error, minutes = None, target.policy().breaker.window_minutes
    except PolicyError as exc:  # then nothing planned is released: what waits is what the operator needs to see
        policy_error = f"{exc}; no planned work is released until it is fixed"
        minutes = SafetyPolicy().breaker.window_minutes  # the default's window, for what was released before
    releases = PacedReleases(db, table, target.cluster).read()
    releases.prune(now, timedelta(minutes=minutes))  # what the breaker's window still counts
    return {
        "waiting": [{"node": str(d.event.node.slurm_node or d.event.node.k8s_node), "instance": d.event.node.instance_id,
                     "fault": d.event.fault_code, "deadline": d.event.evidence.get("deadline"),
                     "act_at": d.act_at.isoformat(),
                     "waits_for": "room under the circuit breaker" if d.act_at <= now else "its lead time"}
                    for d in DeferredPlans(db, table, target.cluster).waiting()],
        "released": [{"node": r.node, "event": event_id, "at": r.at.isoformat()}
                     for event_id, r in sorted(releases.releases.items(), key=lambda kv: kv[1].at)],
        "window_minutes": minutes, "policy_error": policy_error}


def spares(target: Target) -> dict[str, Any]:
    from nodemedic.stages.spares import ready

    pool = target.orchestrator.spares()
    if target.on_kubernetes:  # a taint holds the spares out
        from nodemedic.orchestrators.kubernetes import SPARE_TAINT

        reservation, held_by = None, f"taint {SPARE_TAINT}"
    else:
        reservation = target.parameters.get("SpareReservation") or "nodemedic_spares"
        held_by = f"reservation {reservation}"
    return {"target_size": int(target.parameters.get("HotSpares") or 0), "reservation": reservation, "held_by": held_by,
            "nodes": [{"node": s.name, "state": s.state, "ready": ready(s.state)} for s in pool],
            "ready": sum(ready(s.state) for s in pool)}


def approve(target: Target, incident_id: str, approve_it: bool, by: str, reason: str) -> dict[str, str]:
    """Answer an incident's approval wait. An approval while automation is paused is refused,
    changing nothing: the incident would stop before it touched its node (Repair reads the pause
    right before each step), while the command said it went on; a denial is answered."""
    get_incident(target, incident_id)
    paused = target.control.read().paused if approve_it else None
    if paused:
        raise OperatorError(f"automation is paused by {paused.by} ({paused.reason}): approved, {incident_id} would "
                            "stop before it touches its node. Resume automation first (nodemedic resume), or deny it; "
                            "it waits meanwhile")
    return operations.answer_approval(target.ledger, target.client("stepfunctions"), incident_id,
                                      approve=approve_it, by=by, reason=reason)
