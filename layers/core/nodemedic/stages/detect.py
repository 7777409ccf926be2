"""Detect: validate the trigger, classify the fault, resolve the node, open the incident."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from botocore.exceptions import ClientError
from pydantic import TypeAdapter, ValidationError

from nodemedic.contracts.events import (
    INSTANCE_ID,
    INSTANCE_LOST,
    RECONCILER_SOURCE,
    AlarmEnvelope,
    HealthEventEnvelope,
    HyperPodNodeHealthEnvelope,
    RunbookEnvelope,
    TriggerEvent,
)
from nodemedic.contracts.incident import (
    Action,
    Confidence,
    FoldedFault,
    Incident,
    IncidentRef,
    NodeLock,
    Recheck,
    StageRecord,
    deadline_in,
    default_ladder,
)
from nodemedic.contracts.problems import describe, not_unicode
from nodemedic.contracts.stages import DetectInput, DetectOutput
from nodemedic.domain.classification import alarm_fault_code, classify, hyperpod_fault_code, parse_overrides
from nodemedic.domain.freshness import fault_origin, staleness
from nodemedic.errors import IncidentStateError, InvalidEventError, UnknownNodeError, UnknownNodeQuietError
from nodemedic.operations import no_instance_backs, request_would_fold
from nodemedic.planned_events import back_from_interruption, ended_by_interruption
from nodemedic.providers.base import ENDED, Member, Provider
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger

_TRIGGER: TypeAdapter[TriggerEvent] = TypeAdapter(TriggerEvent)
EMPTYING_ACTIONS = frozenset({"reboot", "replace", "retire"})  # a fault remediated so takes the jobs off the node


@dataclass(frozen=True)
class Fault:
    """A trigger reduced to what the pipeline needs, whatever its source."""

    source: str
    cluster: str
    instance_id: str | None
    slurm_node: str | None
    fault_code: str
    observed_at: datetime
    requested_action: Action | None = None
    requested_reason: str = ""
    sent_at: datetime | None = None  # the node's clock, for an agent's event
    event_key: str | None = None  # what a redelivery of the same event repeats
    evidence: dict[str, object] | None = None  # the health event's raw facts (flat values)


@dataclass(frozen=True)
class Limits:
    """How old an event may be, and how often events naming unknown nodes may page."""

    max_event_age: timedelta = timedelta(hours=1)
    page_window: timedelta = timedelta(minutes=15)


def parse_trigger(event: dict[str, object]) -> TriggerEvent:
    if where := not_unicode(event, "event"):
        raise InvalidEventError(f"rejected event: {where}: not Unicode text (a lone surrogate)")
    try:
        return _TRIGGER.validate_python(event)
    except ValidationError as exc:
        raise InvalidEventError(f"rejected event: {describe(exc, 'event')}") from exc


def to_fault(trigger: TriggerEvent, cluster: str, now: datetime) -> Fault:
    if isinstance(trigger, HealthEventEnvelope):
        d = trigger.detail
        # the sweeper's, the planned-events function's and the reconciler's clock is ours, not a node's
        sent_at = None if trigger.source in ("nodemedic.sweeper", "nodemedic.planned", "nodemedic.reconciler") \
            else d.sent_at
        return Fault(trigger.source, d.cluster, d.node.instance_id, d.node.slurm_node or d.node.k8s_node,
                     d.fault_code, d.observed_at, sent_at=sent_at, event_key=f"{trigger.source}/{d.event_id}",
                     evidence=dict(d.evidence))
    if isinstance(trigger, AlarmEnvelope):
        a = trigger.detail
        if a.state.value != "ALARM":
            raise InvalidEventError(f"alarm {a.alarmName} is {a.state.value}, not ALARM")
        instances = a.dimension_values("InstanceId")
        if not instances:
            raise InvalidEventError(f"alarm {a.alarmName} has no InstanceId dimension")
        if len(instances) > 1:  # metric math over several: the alarm does not say which one is sick
            raise InvalidEventError(f"alarm {a.alarmName} watches {len(instances)} instances; NodeMedic acts on "
                                    "an alarm of one instance")
        [instance] = instances
        if not re.match(INSTANCE_ID, instance):
            raise InvalidEventError(f"alarm {a.alarmName}: InstanceId {instance[:40]!r} is no EC2 instance id")
        return Fault(trigger.source, a.metric_dimension("Cluster") or cluster, instance, None,
                     alarm_fault_code(a.metric_name()), a.state.timestamp,
                     event_key=f"{trigger.source}/{trigger.id}" if trigger.id else None)
    if isinstance(trigger, HyperPodNodeHealthEnvelope):
        return _hyperpod_fault(trigger, cluster)
    assert isinstance(trigger, RunbookEnvelope)
    r = trigger.detail
    return Fault(trigger.source, r.cluster, r.instance_id, r.slurm_node, "MANUAL",
                 r.observed_at or now, r.action, f"runbook by {r.requested_by}: {r.reason}")


def _hyperpod_fault(trigger: HyperPodNodeHealthEnvelope, cluster: str) -> Fault:
    """HyperPod's verdict on one of its instances. The rule matches only the stack's HyperPod
    cluster (HyperPodClusterName), whose nodes the provider's membership names; a node HyperPod
    finds healthy again needs nothing."""
    h = trigger.detail.HealthSummary
    if h.HealthStatus != "Unhealthy":
        raise InvalidEventError(f"HyperPod reports {trigger.detail.InstanceId} {h.HealthStatus}: nothing to remediate")
    fault_type = re.search(r"fault type (\w+)", h.HealthStatusReason)
    evidence: dict[str, object] = {"hyperpod_cluster": trigger.detail.ClusterName, "reason": h.HealthStatusReason,
                                   "repair_action": h.RepairAction, "recommendation": h.Recommendation,
                                   **({"hma_fault": fault_type.group(1)} if fault_type else {})}
    return Fault(trigger.source, cluster, trigger.detail.InstanceId, None,
                 hyperpod_fault_code(h.RepairAction, h.Recommendation), trigger.time,
                 event_key=f"{trigger.source}/{trigger.id}" if trigger.id else None, evidence=evidence)


def resolve_member(fault: Fault, provider: Provider, cluster: str) -> Member:
    """The cluster member the fault is about; anything else is an unknown node."""
    member = (
        provider.member(fault.instance_id) if fault.instance_id
        else provider.member_by_node(fault.slurm_node or "")
    )
    who = fault.instance_id or fault.slurm_node
    if member is None and not fault.instance_id:  # an operator's request names the node: it has no instance
        raise UnknownNodeError(no_instance_backs(who or "", cluster))
    if member is None:
        raise UnknownNodeError(f"{who} is not a member of cluster {cluster}; nothing was drained")
    if member.slurm_node is None:
        raise UnknownNodeError(f"instance {member.instance_id} backs no node of the cluster's scheduler (not joined, "
                               "or already gone); nothing was drained")
    if fault.slurm_node and fault.slurm_node != member.slurm_node:
        raise UnknownNodeError(
            f"identity mismatch: the event names node {fault.slurm_node} but instance "
            f"{member.instance_id} backs {member.slurm_node}; nothing was drained"
        )
    return member


def _note_capacity_end(existing_id: str, fault: Fault, reason: str, ledger: Ledger, now: datetime) -> bool:
    """The node's capacity ends (a Capacity Block) while an incident of its own is open: that
    incident retires the node (keeps it drained) instead of returning it. False when the incident
    is no longer open (it may have returned the node: the end then opens an incident of its own)."""
    try:
        current = ledger.get(existing_id)
        record = ledger.start_stage(current, "capacity_end", now)
    except IncidentStateError:
        return False
    if not record.completed_at:
        ledger.complete_stage(current, "capacity_end", now, {"fault_code": fault.fault_code, "event": fault.event_key,
                                                             "instance_id": fault.instance_id, "reason": reason})
    return True


def _note_folded(existing_id: str, fault: FoldedFault, received: datetime, now: datetime, limits: Limits,
                 ledger: Ledger) -> None:
    """Note on the node's open incident a folded fault whose own remediation would take the node's
    jobs off it (:class:`FoldedFault`): an incident that lets the jobs run on (a slow node's, a
    checkpoint wait) stops waiting for them. A fault from before the node's last repair, or older
    than events may be (a replay), is no reason to requeue anything. An incident that ended
    meanwhile is not noted (nothing waits for its jobs)."""
    try:
        current = ledger.get(existing_id)
    except IncidentStateError:
        return
    if current.status != "open" or staleness(received, now, limits.max_event_age, fault.observed_at,
                                             ledger.repaired_at(current.cluster, current.slurm_node)):
        return
    ledger.note_folded(existing_id, fault)


def _release_retirement(fault: Fault, cluster: str, ledger: Ledger, over: Callable[[Incident, str], bool]) -> None:
    """Release the lock a retirement holds on the fault's instance once ``over(retired, instance)``,
    so the event opens an incident of its own instead of folding into the retired incident. A
    lock that changed meanwhile is left as it is."""
    instance = fault.instance_id
    retired = ledger.lock_holder(cluster, instance) if instance else None
    if instance is not None and retired is not None and over(retired, instance):
        ledger.release_lock(NodeLock(instance_id=instance, incident_id=retired.incident_id,
                                     slurm_node=retired.slurm_node), cluster)


def _end_retirement(fault: Fault, at: datetime, cluster: str, provider: Provider, ledger: Ledger) -> None:
    """A node NodeMedic retired for a Spot stop or hibernation joins again: EC2 started its instance
    after the interruption. The retirement's lock is released, so this join opens the burn-in
    that checks the node and returns it. Only for that instance, running now, after the moment
    EC2 stopped it."""
    def back(retired: Incident, instance: str) -> bool:
        if not back_from_interruption(retired, instance, at):
            return False
        member = provider.member(instance)
        return member is not None and member.state == "running"

    _release_retirement(fault, cluster, ledger, back)


def _gone(member: Member | None) -> bool:
    return member is None or member.state in ENDED


def _lost_member(fault: Fault, provider: Provider) -> Member:
    """The node of an ``INSTANCE_LOST`` event and the instance it lost, checked, not believed: the
    instance is gone and no other backs the node. Only the reconciler sends it."""
    instance, node = fault.instance_id, fault.slurm_node
    if fault.source != RECONCILER_SOURCE or not instance or not node:
        raise InvalidEventError(f"{INSTANCE_LOST} is the reconciler's, naming a node and the instance it lost")
    if not _gone(known := provider.member(instance)):
        raise InvalidEventError(f"{instance} still runs ({known.state if known else ''}): {node} lost nothing")
    if (other := provider.member_by_node(node)) is not None and not _gone(other):
        raise InvalidEventError(f"{other.instance_id} backs {node} already: nothing to replace")
    return Member(instance, node, "terminated")


def _fold_into_active(fault: Fault, incident_id: str, cluster: str, ledger: Ledger,
                      control: ControlStore, now: datetime, action: Action, reason: str) -> DetectOutput | None:
    """Fast path under a storm: an event for an instance that already has an active incident (and
    names the same Slurm node) is folded into it without asking EC2 and Auto Scaling again; the
    lock exists only for a resolved member, so the event's node is known. A capacity end is
    noted on that incident, unless it ended meanwhile (then it is not folded)."""
    lock = ledger.node_lock(cluster, fault.instance_id) if fault.instance_id else None
    if lock is None or lock[0] == incident_id or (fault.slurm_node and fault.slurm_node != lock[1]):
        return None
    assert fault.instance_id
    if action == "retire" and not _note_capacity_end(lock[0], fault, reason, ledger, now):
        return None
    control.record_signal(fault.instance_id, fault.source, fault.fault_code, now)
    ledger.count_duplicate(lock[0], incident_id)
    return DetectOutput(decision="deduplicated", reason=f"incident {lock[0]} is already active for {lock[1]}",
                        existing_incident_id=lock[0])


def _make_way_for(requested: str, member: Member, incident_id: str, cluster: str, ledger: Ledger) -> None:
    """An operator's reboot or replace (the CLI's, or a runbook started by hand): an incident that
    ended but holds the node on purpose (quarantined, escalated, failed, held) is waiting for
    exactly this act, so its lock is released and the request opens an incident of its own; one
    still open refuses it (:class:`InvalidEventError`, nothing done), since the request would fold
    into it and change nothing while the execution said it ran."""
    holder = ledger.lock_holder(cluster, member.instance_id)
    if holder is None or holder.incident_id == incident_id:
        return
    if holder.status == "open":
        raise InvalidEventError(request_would_fold(holder, member.slurm_node or holder.slurm_node, requested))
    ledger.release_holder(cluster, member.instance_id, holder)


def _taken_meanwhile(holder: Incident, node: str, requested: str) -> str:
    """Why an operator's request is refused when another incident took the node's lock between
    :func:`_make_way_for`'s look and this request's own write (two requests for one node at once, or
    a fault's incident): folded, it would change nothing while its execution said it ran."""
    if holder.status == "open":
        return request_would_fold(holder, node, requested)
    return (f"{node} was taken by incident {holder.incident_id} ({holder.status}) while this {requested} request "
            f"was decided: nothing was done. Follow it with `nodemedic show {holder.incident_id}`, then ask again.")


def _resolve_or_page(fault: Fault, provider: Provider, cluster: str, control: ControlStore, now: datetime,
                     limits: Limits) -> Member:
    """The member; an unknown node pages the on-call at most once per ``page_window`` (whoever
    can put events on the bus cannot page at will): later ones are counted, not paged."""
    try:
        return resolve_member(fault, provider, cluster)
    except UnknownNodeError as exc:
        if control.allow_page("unknown_node", now, limits.page_window):
            raise UnknownNodeError(f"{exc} (further events naming unknown nodes in the next "
                                   f"{limits.page_window.total_seconds() / 60:.0f} min are counted, not paged)") from exc
        raise UnknownNodeQuietError(str(exc)) from exc


def detect(
    request: DetectInput,
    *,
    cluster: str,
    overrides_json: str,
    provider: Provider,
    ledger: Ledger,
    control: ControlStore,
    now: datetime,
    limits: Limits = Limits(),
) -> DetectOutput:
    """Decide on the trigger, and record the decision on an event that has an id (the agent that
    sent it reads that record as the acknowledgement that stops it sending the event again). An
    event naming an unknown node is not acknowledged: it may be the cluster's once the node joins."""
    trigger = parse_trigger(request.event)
    recheck = None
    if isinstance(trigger, HealthEventEnvelope) and trigger.source == RECONCILER_SOURCE and trigger.detail.check == "recheck":
        fault, recheck = _recheck_fault(trigger, cluster, provider, ledger, now)
    else:
        fault = to_fault(trigger, cluster, now)
    try:
        out = _decide(request, trigger, fault, cluster=cluster, overrides_json=overrides_json, provider=provider,
                      ledger=ledger, control=control, now=now, limits=limits)
    except InvalidEventError:
        if fault.event_key:
            try:
                ledger.acknowledge_event(fault.event_key, "rejected", None, now)
            except ClientError:
                pass  # the rejection stands whatever happens to its record: a re-send is rejected the same way
        if recheck:  # decided: a fault older than the node's last repair, say
            _drop(recheck, ledger)
        raise
    if fault.event_key and out.decision != "remediate":  # an incident it opened is recorded as it opens
        ledger.acknowledge_event(fault.event_key, out.decision, out.existing_incident_id, now)
    if recheck:
        _drop(recheck, ledger)
        out = out.model_copy(update={"recheck_of": recheck.incident_id})
    return out


def _drop(recheck: Recheck, ledger: Ledger) -> None:
    """The recheck was decided. Kept where it cannot be dropped now: the reconciler finds the
    decision (its event acknowledged) and drops it then; failing here would fail an incident
    already opened."""
    try:
        ledger.drop_recheck(recheck)
    except ClientError:
        pass


def _recheck_fault(trigger: HealthEventEnvelope, cluster: str, provider: Provider, ledger: Ledger,
                   now: datetime) -> tuple[Fault, Recheck | None]:
    """A fault put off, offered again by the reconciler: the cooldown held it and has ended, or its
    gate failed on a passing error (AWS throttling past the retries). The event
    only names the held incident (evidence ``recheck_of``): the fault is read from the ledger, so an
    offer cannot change it, and it keeps its own source and origin. Offered again under the
    reconciler's name, a lone ambiguous fault would corroborate itself (a second "source"), and
    each offer would restart its clock. Refused, and the recheck kept, before it is due (an
    offer put on the bus early by someone else); refused, and dropped, when the node's instance
    has left the cluster since (there is nothing to decide, and nobody to page)."""
    d = trigger.detail
    held_id = d.evidence.get("recheck_of")
    node = d.node.slurm_node or d.node.k8s_node or ""
    if d.cluster != cluster or not isinstance(held_id, str):
        raise InvalidEventError("a recheck names a held incident of this cluster (evidence recheck_of)")
    key = f"{trigger.source}/{d.event_id}"
    recheck: Recheck | None = ledger.recheck(cluster, node, d.fault_code)
    if recheck is None or recheck.incident_id != held_id:
        if not ledger.event_handled_by(key):
            raise InvalidEventError(f"no recheck of incident {held_id[:80]} waits for {node}, {d.fault_code}: "
                                    "decided already, or its fault was never put off")
        recheck = None  # decided already: this is a redelivery, deduplicated as any other
    elif recheck.due > now:
        raise InvalidEventError(f"the recheck of incident {held_id} is due at {recheck.due.isoformat()}, not before")
    held = ledger.get(held_id)
    member = provider.member(held.instance_id)
    if recheck and (member is None or member.slurm_node != held.slurm_node):
        ledger.drop_recheck(recheck)
        raise InvalidEventError(f"the fault held by incident {held_id}: instance {held.instance_id} no longer backs "
                                f"{held.slurm_node}; nothing to decide")
    return Fault(held.source, cluster, held.instance_id, held.slurm_node, held.fault_code, held.observed_at,
                 event_key=key, evidence={**held.evidence_recorded(), "recheck_of": held_id}), recheck


def _decide(request: DetectInput, trigger: TriggerEvent, fault: Fault, *, cluster: str, overrides_json: str,
            provider: Provider, ledger: Ledger, control: ControlStore, now: datetime, limits: Limits) -> DetectOutput:
    # EventBridge's clock; a runbook is started by hand (start-execution), its envelope is the operator's
    bus_time = None if isinstance(trigger, RunbookEnvelope) else trigger.time
    # EventBridge's time has whole seconds: the event arrived within the second after it
    received = min(bus_time + timedelta(seconds=1), now) if bus_time else now
    origin = fault_origin(fault.observed_at, fault.sent_at, received)
    if fault.cluster != cluster:
        raise InvalidEventError(f"event is for cluster {fault.cluster}; this pipeline serves {cluster}")
    confidence: Confidence = "high"  # an operator's request is a signal of its own
    if fault.requested_action:
        fault_class, action, reason = "manual", fault.requested_action, fault.requested_reason
        ladder = default_ladder(action)
    else:
        c = classify(fault.fault_code, parse_overrides(overrides_json))
        fault_class, action, reason, confidence, ladder = c.fault_class, c.action, c.reason, c.confidence, c.ladder
    if action == "monitor":
        return DetectOutput(decision="monitor", reason=reason, fault_class=fault_class)
    if action == "burn_in":
        _end_retirement(fault, origin.at, cluster, provider, ledger)
    lost = _lost_member(fault, provider) if fault.fault_code == INSTANCE_LOST else None  # checked before anything changes
    if lost:  # EC2 ended the node's instance (after its Spot retirement, or outside any incident): its own incident
        _release_retirement(fault, cluster, ledger, ended_by_interruption)
    # an operator's request is never folded: it is refused, or released the node (_make_way_for)
    folded = None if fault.requested_action else _fold_into_active(fault, request.incident_id, cluster, ledger,
                                                                   control, now, action, reason)
    if folded:
        if folded.existing_incident_id and action in EMPTYING_ACTIONS:
            _note_folded(folded.existing_incident_id, FoldedFault(
                fault_code=fault.fault_code, fault_class=fault_class, action=action, observed_at=origin.at,
                deadline=deadline_in(fault.evidence or {}) if fault_class == "planned" else None,
                event=fault.event_key or ""), received, now, limits, ledger)
        return folded

    handled_by = ledger.event_handled_by(fault.event_key) if fault.event_key else None
    if handled_by and handled_by != request.incident_id:  # its node may be another instance by now
        return DetectOutput(decision="deduplicated", existing_incident_id=handled_by,
                            reason=f"event {fault.event_key} was handled already, by incident {handled_by}")
    member = lost or _resolve_or_page(fault, provider, cluster, control, now, limits)
    why_stale = staleness(received, now, limits.max_event_age, origin.at,
                          ledger.repaired_at(cluster, member.slurm_node or ""))
    if why_stale:
        raise InvalidEventError(why_stale)
    if fault.requested_action:
        _make_way_for(fault.requested_action, member, request.incident_id, cluster, ledger)
    control.record_signal(member.instance_id, fault.source, fault.fault_code, now)  # the server's clock
    ref = IncidentRef(
        incident_id=request.incident_id,
        cluster=cluster,
        instance_id=member.instance_id,
        slurm_node=member.slurm_node or "",
        fault_code=fault.fault_code,
        fault_class=fault_class,
        action=action,
        source=fault.source,
        observed_at=origin.at,
        confidence=confidence,
        ladder=ladder,
    )
    incident = Incident(
        **ref.model_dump(),
        status="open",
        detected_at=now,
        reason=reason,
        stages={"detect": StageRecord(started_at=now, completed_at=now, result={
            "reason": reason, "event": fault.event_key, "reported_observed_at": fault.observed_at.isoformat(),
            "node_clock_skew_s": round(origin.clock_skew_s, 3), "origin_corrected": origin.corrected,
            **({"evidence": fault.evidence} if fault.evidence else {})})},
    )
    existing = ledger.open_incident(incident)
    if existing is not None and fault.requested_action:
        raise InvalidEventError(_taken_meanwhile(ledger.get(existing), member.slurm_node or "", fault.requested_action))
    if existing is not None:
        ledger.count_duplicate(existing, request.incident_id)
        if action == "retire":
            _note_capacity_end(existing, fault, reason, ledger, now)
        return DetectOutput(
            decision="deduplicated",
            reason=f"incident {existing} is already active for {member.slurm_node}",
            existing_incident_id=existing,
        )
    if fault.event_key:
        ledger.acknowledge_event(fault.event_key, "remediate", request.incident_id, now)
    return DetectOutput(decision="remediate", reason=reason, incident=ref)
