"""Gate: apply the cluster's safety policy before anything touches the node.

Reads the facts (policy, control state, signals, lineage), lets
:func:`nodemedic.safety.gate.decide` decide, then writes the outcome: an admission (with
the node's lineage) for verdicts that act, a tripped breaker, or the end of a held incident.
The control-state write is conditional on the version read; a concurrent gate makes this one
raise :class:`ControlConflictError`, which the state machine retries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from nodemedic.contracts.incident import IncidentRef
from nodemedic.contracts.stages import GateOutput
from nodemedic.errors import NodeGoneError, PolicyError, ThrottledError, UnknownNodeError
from nodemedic.providers.base import Member, Provider
from nodemedic.safety.gate import (
    INSTANCE_LOST_JOIN,
    RETIRE,
    Decision,
    Facts,
    admission_of,
    decide,
    lineage_keys,
    software_of,
    uncounted,
)
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.store.control import Admission, ControlState, ControlStore, Switch
from nodemedic.store.ledger import Ledger

STORM_RULES = frozenset({"paused", "breaker", "breaker_limit"})


def gate(
    incident: IncidentRef,
    *,
    load_policy: Callable[[], SafetyPolicy],
    provider: Provider,
    control: ControlStore,
    ledger: Ledger,
    clock: Callable[[], datetime],
    ended: Callable[[str], str | None] = lambda _instance: None,
) -> GateOutput:
    """``ended``: EC2's state of an instance that is shutting down or terminated, else None
    (:func:`nodemedic.providers.base.ended_state`)."""
    now = clock()
    record = ledger.start_stage(incident, "gate", now)
    if record.completed_at:
        return GateOutput.model_validate(record.result)
    try:
        policy = load_policy()
    except PolicyError as exc:
        return _hold(incident, ledger, clock, Decision(
            "hold", f"policy: {exc}", [{"rule": "policy", "result": "hold", "detail": str(exc)}],
            notify=f"NodeMedic held incident {incident.incident_id} on {incident.slurm_node}: {exc}. "
                   f"Nothing was done to the node; fix the policy parameter."))
    state = control.read()
    if incident.incident_id in state.admissions and record.result:  # retried after admitting
        return _complete(incident, ledger, clock, GateOutput.model_validate(record.result))
    if state.paused or state.breaker.state == "open":
        # a storm: every gate holds. Decide from the control state alone (exclusions by node name),
        # without asking Auto Scaling and EC2 once per event while the cluster is in trouble
        bare = Member(incident.instance_id, incident.slurm_node, "unknown")
        d = decide(Facts(incident, bare, policy, state, set(), 0, {}, {}, now))
        return _hold(incident, ledger, clock, d)
    member = provider.member(incident.instance_id)
    if member is None and uncounted(incident) in (INSTANCE_LOST_JOIN, RETIRE):
        # a lost instance: Detect checked that it is gone and the node bare. A retire whose
        # capacity AWS took before its gate ran (EC2 acted on its Spot warning while the gate
        # waited out throttling, as a reclaim of many nodes brings): its drain still moves the
        # node's jobs to a spare and keeps the node out, rather than failing and paging
        member = Member(incident.instance_id, incident.slurm_node, "terminated")
    if member is None:
        if state_of := ended(incident.instance_id):
            # someone ended it between Detect and here (its group's health check, a scale-in, an
            # operator): nothing of it is left to remediate, and nothing was done to the node; the
            # reconciler gives the node the group's next instance, or pages it (Provider=ec2)
            gone = (f"EC2 ended {incident.instance_id} ({state_of}) outside NodeMedic before the gate: nothing was "
                    "done to the node, and nothing of it is left to remediate")
            ledger.record_progress(incident, "gate", {"gone": gone})
            raise NodeGoneError(gone)
        raise UnknownNodeError(f"{incident.instance_id} left cluster {incident.cluster}; nothing was drained")
    active = ledger.still_open([*state.admissions, *state.waiting])
    keys = lineage_keys(incident, member.topology.get("host_id", ""))
    software = software_of(ledger.get(incident.incident_id).evidence_recorded())
    facts = Facts(incident, member, policy, state, active, provider.size(),
                  control.signals(incident.instance_id), {k: control.lineage(k) for k in keys}, now, software)
    d = decide(facts)
    if d.trips_breaker:  # its page says how much of the cluster shares what the failing nodes share
        d = decide(replace(facts, cluster=provider.members()))
    if d.verdict == "throttled":
        _wait(state, incident.incident_id, admission_of(incident, member, now, software), active, now, policy, control)
        raise ThrottledError(d.reason)
    if d.trips_breaker:
        state.breaker.state = "open"
        state.breaker.trips += 1
        state.breaker.tripped = Switch(by="nodemedic", reason=d.reason, at=now)
        control.save(state)  # conflict -> retried: only one gate ever trips it
    if d.verdict in ("hold", "dry_run"):
        return _hold(incident, ledger, clock, d)
    out = GateOutput(verdict=d.verdict, reason=d.reason, rules=d.rules,
                     needs_approval=d.needs_approval, approve_repairs=d.approve_repairs, notify=d.notify)
    ledger.record_progress(incident, "gate", out.model_dump(mode="json"))
    state.waiting.pop(incident.incident_id, None)
    _prune(state, active, now, policy)
    admission = state.admissions[incident.incident_id] = admission_of(incident, member, now, software)
    # an unverified ambiguous fault is not yet a remediation of the slot: Verify records it
    # (nor is what the breaker does not count: a burn-in, nothing remediated; a retire, nothing repaired)
    lineage = {} if d.verdict == "verify" or not admission.counted else \
        {k: (incident.incident_id, now) for k in keys}
    control.save(state, lineage, facts.lineage)
    return _complete(incident, ledger, clock, out)


def _wait(state: ControlState, incident_id: str, waiting: Admission, active: set[str], now: datetime,
          policy: SafetyPolicy, control: ControlStore) -> None:
    """The incident waits for a remediation slot: from now on the breaker counts its node, so many
    faults at once trip the breaker instead of taking the slots one by one as they free up. Written
    once per incident (again after a breaker reset); a concurrent write raises ControlConflictError,
    which the state machine retries."""
    if incident_id in state.waiting_for_slot({incident_id}):
        return
    _prune(state, active, now, policy)
    state.waiting[incident_id] = waiting
    control.save(state)


def _prune(state: ControlState, active: set[str], now: datetime, policy: SafetyPolicy) -> None:
    """Forget ended admissions older than the breaker window, and ended incidents that waited
    (keeps the item small)."""
    window = timedelta(minutes=policy.breaker.window_minutes)
    for iid in [i for i, a in state.admissions.items() if i not in active and now - a.at > window]:
        del state.admissions[iid]
    for iid in [i for i in state.waiting if i not in active]:
        del state.waiting[iid]


def _hold(incident: IncidentRef, ledger: Ledger, clock: Callable[[], datetime], d: Decision) -> GateOutput:
    out = GateOutput(verdict=d.verdict, reason=d.reason, rules=d.rules, notify=d.notify,
                     would=d.would)
    out = _complete(incident, ledger, clock, out)
    if d.verdict == "hold":
        # a storm hold (breaker, pause) keeps the node lock: later events for the node are folded
        # into this incident until an operator resets the breaker or resumes automation
        storm = d.rules[-1]["rule"] in STORM_RULES
        if d.recheck_at is not None:  # the cooldown: the fault is decided again when it ends
            ledger.hold_for_recheck(incident, clock(), d.reason, d.recheck_at)
        else:
            ledger.end(incident, "held", clock(), d.reason, release_node=not storm)
    return out


def _complete(incident: IncidentRef, ledger: Ledger, clock: Callable[[], datetime], out: GateOutput) -> GateOutput:
    ledger.complete_stage(incident, "gate", clock(), out.model_dump(mode="json"))
    return out
