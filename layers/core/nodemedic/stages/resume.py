"""Resume: put the repaired node back (in service, or in the spare pool), see the requeued jobs
RUNNING again, record job downtime, close the incident. Or end it unrecovered: quarantined
(the node failed its last check) or escalated (no capacity), the node drained, on-call paged.

The node is only touched if the pipeline drained it: an operator's drain is left alone, and when
an operator had drained the node before the incident, its replacement stays out too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import NoReturn

from nodemedic.contracts.incident import SPARE_CLAIM, Incident, IncidentRef, StageRecord
from nodemedic.contracts.stages import Destination, EndOutput, JobsOutput, ResumeOutput
from nodemedic.errors import HandsOffError, JobsPendingError, NodeGoneError, ReturnLostError
from nodemedic.orchestrators.base import JobState, NodeStatus, Orchestrator
from nodemedic.safety.gate import HandsOff
from nodemedic.stages.drain import owner_tag
from nodemedic.stages.repair import capacity_ends, serving
from nodemedic.store.ledger import Ledger

POLL_PER_CALL_S = 5.0  # then the state machine retries: no Lambda idles for long
# a requeued job's new start is after its drain began; its scheduler's clock (Kubernetes gives
# container starts in whole seconds) may read this much behind the function's
START_SLACK_S = 2.0


def _members_at_drain(drained: StageRecord | None) -> dict[str, int]:
    """Each requeued workload's live pods before its evictions, as the drain recorded them
    (Kubernetes); nothing for a drain recorded without them."""
    members = drained.result.get("job_members", {}) if drained else {}
    if not isinstance(members, dict):
        return {}
    return {str(j): n for j, n in members.items() if isinstance(n, int) and not isinstance(n, bool) and n > 0}


def _back(state: JobState, restarted_after: float, members: int | None) -> bool:
    """RUNNING on a run started after the drain, and (Kubernetes) with as many live pods as the
    drain saw: surviving pods started just before the drain, running while the evicted one is not
    made again yet, are not the workload back."""
    if state.state != "RUNNING" or state.started_at is None or state.started_at < restarted_after:
        return False
    return members is None or state.members is None or state.members >= members


def await_jobs(
    incident: IncidentRef, *, orchestrator: Orchestrator, ledger: Ledger, wait_s: float,
    clock: Callable[[], datetime], sleep: Callable[[float], None] = time.sleep,
) -> JobsOutput:
    """See the jobs the drain requeued RUNNING again; record each one's downtime = its new start
    - the fault (``observed_at``), by the scheduler's clock, never below 0. A job that reads
    RUNNING with a start from before its drain, or (Kubernetes) on fewer pods than the drain saw,
    has not restarted yet: its surviving pods run, and the evicted one has not been made again
    yet. Polls a few seconds per invocation,
    then raises :class:`JobsPendingError` (the state machine retries) until ``wait_s`` after the
    stage began; after that the jobs still pending are recorded as such."""
    record = ledger.start_stage(incident, "jobs", clock())
    if record.completed_at:
        return JobsOutput.model_validate(record.result)
    drained = ledger.get(incident.incident_id).stages.get("drain")
    jobs = drained.result.get("requeued_jobs", []) if drained else []
    requeued = [str(j) for j in jobs] if isinstance(jobs, list) else []
    members = _members_at_drain(drained)
    restarted_after = drained.started_at.timestamp() - START_SLACK_S if drained else float("-inf")
    give_up = record.started_at.timestamp() + wait_s
    this_call = time.monotonic() + POLL_PER_CALL_S
    origin = incident.observed_at.timestamp()
    while True:
        states = orchestrator.job_states(requeued)
        # a start read in whole seconds (Kubernetes), or on a scheduler's clock a little behind the
        # node's, may precede the fault by up to START_SLACK_S: that job was back at once
        running = {j: round(max(0.0, s.started_at - origin), 3) for j, s in states.items()
                   if s.started_at is not None and _back(s, restarted_after, members.get(j))}
        pending = [j for j, s in states.items() if s.state != "GONE" and j not in running]
        if not pending or clock().timestamp() >= give_up:
            break
        if time.monotonic() >= this_call:
            raise JobsPendingError(f"jobs {', '.join(pending)} of {incident.slurm_node} are not RUNNING yet")
        sleep(1.0)
    out = JobsOutput(running=running, pending=sorted(pending),
                     job_downtime_s=max(running.values()) if running else None)
    ledger.complete_stage(incident, "jobs", clock(), out.model_dump(mode="json"))
    return out


def resume(
    incident: IncidentRef, destination: Destination, *, orchestrator: Orchestrator, ledger: Ledger, prefix: str,
    job_wait_s: float, pool_size: int, clock: Callable[[], datetime],
    hands_off: HandsOff = lambda node, instance: None,
) -> ResumeOutput:
    """``destination`` pool: the node refills the spare pool, unless the pool already has
    ``pool_size`` nodes (an operator added some meanwhile): then it goes back into service.

    Returning the node changes it: not while automation is paused or the node is excluded (an
    operator works on it), asked right before each return (:class:`HandsOffError`: the incident
    is escalated, the node left drained)."""
    record = ledger.start_stage(incident, "resume", clock())
    if record.completed_at:
        return ResumeOutput.model_validate(record.result)
    current = ledger.get(incident.incident_id)
    rungs = current.repair_rungs
    incident = serving(incident, rungs)  # a replacement may serve under a name of its own
    drained = current.stages.get("drain")
    # an operator's drain was there first: on Slurm it stays on the node (and is never lifted); on
    # Kubernetes a replacement registers as a new node that NodeMedic cordoned, and it stays out too
    operators = drained is not None and drained.result.get("drained_by_pipeline") is False
    status = _status(orchestrator, incident, ledger, returned=bool(record.result.get("resumed")))
    owner = owner_tag(prefix, incident)
    if "resumed" in record.result:  # retried while waiting for the jobs: the node is back already
        resumed = bool(record.result["resumed"])
        destination = record.result.get("destination", destination)  # type: ignore[assignment]
        if resumed and status.drained_by(owner):  # unless the scheduler lost its return: returned again
            _refuse_return(incident, destination, hands_off)
            return_node(orchestrator, incident.slurm_node, destination, owner)
            status = _status(orchestrator, incident, ledger, returned=True)
    elif (returning := record.result.get("returning")) in ("service", "pool") and not status.drained:
        # retried after the command that returns it took effect and its answer was lost (a slow
        # controller outlasted the wait, SSM throttled): the node is back, not left to an operator
        resumed, destination = True, returning
        if destination == "pool":
            ledger.release(SPARE_CLAIM, incident.slurm_node)
        ledger.record_progress(incident, "resume", {"resumed": resumed, "destination": destination})
    elif capacity_ends(current, rungs[-1].instance_id if rungs else incident.instance_id):
        return _retire_repaired(incident, current, destination, status.state, ledger=ledger, clock=clock)
    else:
        resumed = not operators and status.drained_by(owner)
        if resumed:  # held by a pause or an exclusion: the node stays drained, and held
            _refuse_return(incident, destination, hands_off)
        # NodeMedic stops holding the node first, whoever's drain it carries: the reconciler never
        # drains again a node being returned (a failure from here on holds it again)
        ledger.drop_hold(incident.cluster, incident.slurm_node, incident.incident_id)
        if destination == "pool" and len(orchestrator.spares()) >= pool_size:
            destination = "service"
        if resumed:  # recorded before the command: a retry that finds the node back knows why
            ledger.record_progress(incident, "resume", {"returning": destination})
        # the read above only chooses; the drain is lifted inside the scheduler command that
        # checks it is still ours (an operator may have drained it again meanwhile)
        if resumed:
            try:
                resumed = return_node(orchestrator, incident.slurm_node, destination, owner)
            except NodeGoneError as exc:
                _gone(incident, ledger, exc)
            if destination == "pool":
                ledger.release(SPARE_CLAIM, incident.slurm_node)
        if resumed:
            status = _status(orchestrator, incident, ledger, returned=True)
        ledger.record_progress(incident, "resume", {"resumed": resumed, "destination": destination})
    jobs = await_jobs(incident, orchestrator=orchestrator, ledger=ledger, wait_s=job_wait_s, clock=clock)
    if resumed:  # read again before closing: the scheduler may have lost the return meanwhile
        status = _status(orchestrator, incident, ledger, returned=True)
        if status.drained_by(owner):
            _refuse_return(incident, destination, hands_off)
            return_node(orchestrator, incident.slurm_node, destination, owner)
            raise ReturnLostError(f"{incident.slurm_node} was returned, then read drained again by incident "
                                  f"{incident.incident_id} ({status.state}): the scheduler lost the change (a "
                                  f"controller restart from state saved before it); returned again")
    done = clock()
    out = ResumeOutput(
        slurm_node=incident.slurm_node, resumed=resumed, destination=destination, node_state=status.state,
        time_to_recover_s=(done - incident.observed_at).total_seconds(), jobs=jobs,
    )
    ledger.complete_stage(incident, "resume", done, out.model_dump(mode="json"))
    ledger.close(incident, done, f"node back in the spare pool ({status.state})" if destination == "pool" and resumed
                 else "" if resumed else _left_drained(current.slurm_node, incident.slurm_node))
    return out


def _status(orchestrator: Orchestrator, incident: IncidentRef, ledger: Ledger, *, returned: bool) -> NodeStatus:
    """The node as the scheduler has it now. One the cluster deleted (Kubernetes: its instance was
    ended outside NodeMedic) once it was returned reads ``GONE``: the incident closes, its return
    made. Gone before its return, nothing is left to return: :class:`NodeGoneError`, recorded,
    and the state machine retires the incident."""
    try:
        return orchestrator.node_status(incident.slurm_node)
    except NodeGoneError as exc:
        if returned:
            return NodeStatus(incident.slurm_node, "GONE", "")
        _gone(incident, ledger, exc)


def _refuse_return(incident: IncidentRef, destination: str, hands_off: HandsOff) -> None:
    """:class:`HandsOffError` when a pause or an exclusion an operator set since the gate holds
    the node: it stays drained, not returned to ``destination``."""
    if held := hands_off(incident.slurm_node, incident.instance_id):
        where = "the spare pool" if destination == "pool" else "service"
        raise HandsOffError(f"not returning {incident.slurm_node} ({incident.instance_id}) to {where}: {held}; "
                            "it passed its check and stays drained")


def _gone(incident: IncidentRef, ledger: Ledger, exc: NodeGoneError) -> NoReturn:
    ledger.record_progress(incident, "resume", {"gone": f"{exc}; it was gone before it could be returned"})
    raise exc


def return_node(orchestrator: Orchestrator, node: str, destination: Destination, owner: str) -> bool:
    """Return ``node`` to the spare pool or to service, lifting its drain only if ``owner`` set it
    (checked and acted on in one scheduler command). True when the drain was lifted."""
    if destination == "pool":
        return orchestrator.add_spare(node, owner)
    return orchestrator.resume(node, owner)


def _left_drained(node: str, serving_node: str) -> str:
    if serving_node == node:
        return f"{node} was drained by an operator: left drained"
    return (f"{node} was drained by an operator before the incident: its replacement {serving_node} is left "
            f"drained by NodeMedic (`nodemedic remediate {serving_node} --action resume` returns it)")


def _retire_repaired(incident: IncidentRef, current: Incident, destination: Destination, node_state: str, *,
                     ledger: Ledger, clock: Callable[[], datetime]) -> ResumeOutput:
    """The node's capacity ends (noted while it was repaired): it is not returned to service or to
    the pool but stays drained, NodeMedic's drain and lock kept, as a retirement would leave it."""
    ending = current.stages["capacity_end"].result
    done = clock()
    out = ResumeOutput(slurm_node=incident.slurm_node, resumed=False, destination=destination, node_state=node_state,
                       time_to_recover_s=(done - incident.observed_at).total_seconds(), retired=True)
    ledger.complete_stage(incident, "resume", done, out.model_dump(mode="json"))
    ledger.end(incident, "retired", done,
               f"{incident.slurm_node} ({incident.instance_id}) repaired but not returned: its capacity ends "
               f"({ending.get('fault_code')}, noted during the repair); it stays drained until AWS takes it back",
               release_node=False)
    return out


def lambda_error_message(cause: str) -> str:
    """A Lambda error's message from the state machine's Cause (a JSON document), or the cause."""
    try:
        return str(json.loads(cause).get("errorMessage", cause))
    except (ValueError, AttributeError):
        return cause


def retire(incident: IncidentRef, *, ledger: Ledger, clock: Callable[[], datetime]) -> EndOutput:
    """The node's capacity ends (its Capacity Block): it stays drained, and its lock held, so what
    its agent or the silence sweeper says while AWS takes it back folds into this incident. Or
    the node is gone, its instance ended outside NodeMedic (the gate, the repair or the resume
    said so): its lock is released, as nothing of it is left to send anything."""
    current = ledger.get(incident.incident_id)
    spare = current.stages.get("spare")
    moved = spare.result.get("spare") if spare else None
    rungs = [r.rung for r in current.repair_rungs]
    gone = next((str(s.result["gone"]) for s in (current.stages.get(n) for n in ("gate", "repair", "resume"))
                 if s is not None and s.result.get("gone")), "")
    if gone:
        message = (f"{incident.slurm_node} ({incident.instance_id}) retired: {gone}"
                   + (f"; its jobs moved to {moved}" if moved else "") + ".")
        if current.status == "open":
            ledger.end(incident, "retired", clock(), message, release_node=True)
        return EndOutput(status="retired", message=message)
    note = current.stages.get("capacity_end")
    code = note.result.get("fault_code") if note else incident.fault_code
    message = (f"{incident.slurm_node} ({incident.instance_id}) retired: its capacity ends "
               f"({code}); it stays drained until AWS takes it back"
               + (f"; its jobs moved to {moved}" if moved else "")
               + (f". Its repair stopped after {', '.join(rungs)}; nothing more was done to it." if rungs
                  else ". Nothing was repaired or replaced into it."))
    if current.status == "open":
        ledger.end(incident, "retired", clock(), message, release_node=False)
    return EndOutput(status="retired", message=message)


def end_unrecovered(
    incident: IncidentRef, status: str, *, ledger: Ledger, clock: Callable[[], datetime],
    error: dict[str, str | None] | None = None, reason: str = "",
) -> EndOutput:
    """The ladder could not bring the node back (or, with ``reason``, the lemon rule quarantined
    it before any rung): keep it drained (and its lock: later events fold into this incident),
    mark why, and say what the on-call must do."""
    current = ledger.get(incident.incident_id)
    if reason:
        if current.status == "open":
            ledger.end(incident, "quarantined", clock(), reason, release_node=False)
        return EndOutput(status="quarantined", message=reason)
    repair = current.stages.get("repair")
    rungs = current.repair_rungs
    tried = ", ".join(f"{r.rung} ({r.instance_id}: {'healthy' if r.healthy else 'unhealthy'})" for r in rungs) or "none"
    if status == "quarantined":
        last = rungs[-1] if rungs else None
        failed = "; ".join(f"{c.get('name')}: {c.get('detail', 'failed')}"
                           for c in (last.check.checks if last and last.check else []) if not c.get("ok"))
        message = (f"NodeMedic quarantined {incident.slurm_node} ({last.instance_id if last else incident.instance_id}) "
                   f"in incident {incident.incident_id}: it failed the deep health check after every rung of its "
                   f"ladder ({tried}); last failure: {failed or 'no answer'}. The node stays drained and is never "
                   f"returned to service by automation. Escalated: replace or investigate it by hand.")
    else:
        cause = (error or {}).get("Cause") or (error or {}).get("Error") or "unknown"
        if (error or {}).get("Error") in ("NodeBusyError", "HandsOffError"):
            if "resume" in current.stages:  # a pause or an exclusion stopped its return
                message = (f"NodeMedic escalated incident {incident.incident_id}: it stopped before returning the "
                           f"node. {lambda_error_message(cause)}. Rungs done: {tried}. Once the node may be used "
                           f"again, `nodemedic remediate {incident.slurm_node} --action resume` returns it.")
            else:
                message = (f"NodeMedic escalated incident {incident.incident_id}: it stopped before a destructive "
                           f"step. {lambda_error_message(cause)}. Rungs done: {tried}. Nothing more is done to the "
                           f"node; check it and start a runbook if it still needs repair.")
            if repair and not repair.completed_at:
                ledger.complete_stage(incident, "repair", clock(), repair.result)
            # stopped before its drain, it holds nothing: the node's next fault opens an incident
            # of its own (held by the gate while the pause or exclusion lasts), not folded into this
            drain = current.stages.get("drain")
            untouched = drain is None or drain.result.get("drained_by_pipeline") is not True
            if not untouched and rungs and rungs[-1].instance_id != incident.instance_id:
                ledger.lock(incident, rungs[-1].instance_id)  # stopped after a replace: held as the node is now
            if current.status == "open":
                ledger.end(incident, "escalated", clock(), message, release_node=untouched)
            return EndOutput(status="escalated", message=message)
        if (error or {}).get("Error") == "ProviderBusyError":
            message = (f"NodeMedic escalated incident {incident.incident_id} for {incident.slurm_node}: its provider "
                       f"was still working on it after an hour of retries ({lambda_error_message(cause)}), so NodeMedic "
                       f"did not act. Rungs done: {tried}. The node stays drained; once the provider's work ends, check "
                       f"it and start a runbook if it still needs repair.")
        else:
            message = (f"NodeMedic escalated incident {incident.incident_id} for {incident.slurm_node}: "
                       f"no capacity to repair it after retries ({cause}). Rungs tried: {tried}. The node stays "
                       f"drained; start a replace runbook for it (events/runbooks/replace-node.json) when capacity "
                       f"returns.")
    if repair and not repair.completed_at:
        ledger.complete_stage(incident, "repair", clock(), repair.result)
    if rungs and rungs[-1].instance_id != incident.instance_id:  # a replacement backs the node now
        ledger.lock(incident, rungs[-1].instance_id)
    if current.status == "open":  # a retried invocation finds it ended already
        ledger.end(incident, status, clock(), message, release_node=False)  # type: ignore[arg-type]
    return EndOutput(status=status, message=message)
