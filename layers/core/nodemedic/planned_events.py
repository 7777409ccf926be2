"""AWS Health scheduled changes for the cluster's instances (an instance retirement, a stop, a
reboot maintenance...), the same changes found by a periodic sweep of EC2's scheduled events
(``DescribeInstanceStatus``: what AWS Health did not deliver) or by a node's agent in its instance
metadata (:func:`plan_node_scheduled`: the one source that reaches a HyperPod node), and EC2's
warning that a Capacity Block ends, turned into one Node Health Event per affected node of this
cluster, from source ``nodemedic.planned``, on NodeMedic's own
bus. The state machine then handles each like a fault: drain, spare, the rung the event needs
(fault_table.json: a retirement or stop is a replace, which on the ec2 provider is the stop/start
AWS recommends; an instance-reboot maintenance is a reboot, which applies it), check, resume, all
before AWS acts. A Capacity Block's end is a retire: every node in the block is drained (its job
checkpointed and moved to a spare outside the block) and left drained; nothing is repaired or
replaced into capacity that is going away. EC2's two-minute warning that it interrupts a Spot
Instance retires its node the same way; when EC2 starts a stopped or hibernated Spot Instance
again, its node gets a ``NODE_JOINED`` (:func:`plan_return`): the burn-in returns it.

With a lead time (``PlannedLeadTimeHours``), a notice whose deadline is further away waits in the
ledger (:mod:`nodemedic.store.deferred`) and the sweep (every ``PlannedSweepMinutes``) publishes it once its time has come:
the first sweep at least the lead time before the deadline (:func:`act_at`), or an earlier sweep
that finds the slack to act at no cost: the node idle, or its jobs just checkpointed (:func:`slack`).

Every affected entity that is not a node of this cluster is ignored with its reason. The event id
is derived from the Health event's ARN and the instance, so a redelivery, a later page or an
update of the same Health event is deduplicated by Detect like any repeated event. A version of a
notice older than one already seen (its ``lastUpdatedTime``) is ignored: EventBridge may deliver
it after the update (:func:`superseded`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from nodemedic.contracts.aws_health import HEALTH_SOURCE, AffectedEntity, AwsHealthEnvelope
from nodemedic.contracts.capacity_block import CapacityBlockEnvelope
from nodemedic.contracts.events import AGENT_SOURCE, INSTANCE_ID, Check, EvidenceValue, NodeHealthEvent, NodeIdentity
from nodemedic.contracts.incident import Incident
from nodemedic.contracts.instance_state import STATE_CHANGE_DETAIL_TYPE, InstanceRunningEnvelope
from nodemedic.contracts.problems import describe, not_unicode
from nodemedic.contracts.reservation_interruption import RESERVATION_DETAIL_TYPES, ReservationInterruptionEnvelope
from nodemedic.contracts.scheduled_notice import SCHEDULED_DETAIL_TYPE, ScheduledEventsEnvelope
from nodemedic.contracts.spot_interruption import (
    INTERRUPTION_LEAD,
    REBALANCE_DETAIL_TYPE,
    SPOT_DETAIL_TYPE,
    NodeRebalanceEnvelope,
    RebalanceEnvelope,
    SpotInterruptionEnvelope,
)
from nodemedic.errors import InvalidEventError
from nodemedic.orchestrators.base import RunningJob
from nodemedic.providers.base import Member, Provider
from nodemedic.store.ledger import EVENT_MEMORY

# AWS Health event type -> NodeMedic fault code (fault_table.json says what each one does).
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instances-status-check_sched.html
PLANNED: dict[str, str] = {
    "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED": "PLANNED_RETIREMENT",
    "AWS_EC2_INSTANCE_RETIREMENT_EXPEDITED": "PLANNED_RETIREMENT",
    "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED": "PLANNED_RETIREMENT",
    "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_EXPEDITED": "PLANNED_RETIREMENT",
    "AWS_EC2_INSTANCE_STOP_SCHEDULED": "PLANNED_STOP",
    "AWS_EC2_INSTANCE_TERMINATION_SCHEDULED": "PLANNED_TERMINATION",
    "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED": "PLANNED_REBOOT",
    "AWS_EC2_INSTANCE_REBOOT_FLEXIBLE_MAINTENANCE_SCHEDULED": "PLANNED_REBOOT",
    "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED": "PLANNED_SYSTEM_REBOOT",
    "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED": "PLANNED_NETWORK_MAINTENANCE",
    "AWS_EC2_INSTANCE_POWER_MAINTENANCE_SCHEDULED": "PLANNED_POWER_MAINTENANCE",
    "AWS_EC2_PERSISTENT_INSTANCE_POWER_MAINTENANCE_SCHEDULED": "PLANNED_POWER_MAINTENANCE",
}
# EC2 scheduled event code (DescribeInstanceStatus) -> the same fault codes: the sweep finds an
# event AWS Health did not deliver (a rule created after it, a delivery lost). system-maintenance
# is network or power maintenance; its description says which.
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_InstanceStatusEvent.html
SCHEDULED: dict[str, str] = {
    "instance-retirement": "PLANNED_RETIREMENT",
    "instance-stop": "PLANNED_STOP",
    "instance-reboot": "PLANNED_REBOOT",
    "system-reboot": "PLANNED_SYSTEM_REBOOT",
    "system-maintenance": "PLANNED_POWER_MAINTENANCE",
}
ENDED_EVENT = ("[Completed]", "[Canceled]")  # how EC2 marks a scheduled event that is over
_INSTANCE = re.compile(INSTANCE_ID)
# an EC2 instance named by its ARN, as an entity may be ("arn:aws:ec2:us-east-1:123456789012:instance/i-0abc...")
_INSTANCE_ARN = re.compile(r"^arn:aws[\w-]*:ec2:[a-z0-9-]*:\d{12}:instance/(i-[0-9a-f]{8,17})$")
_EVENT_IDS = uuid.UUID("5b0f3c1e-8a64-4f5e-9a59-0d7c4c1f2a10")  # namespace of the derived event ids


@dataclass(frozen=True)
class Plan:
    """What one AWS Health event means for this cluster."""

    events: list[NodeHealthEvent] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (entity, why)
    withdrawn: list[str] = field(default_factory=list)  # ids of events AWS closed or canceled since
    moot: list[str] = field(default_factory=list)  # ids of waiting events whose instance no longer backs their node

    def add(self, provider: Provider, cluster: str, instance: str, key: str, now: datetime, *, check: Check,
            fault_code: str, evidence: dict[str, EvidenceValue]) -> None:
        """The event of the node ``instance`` backs (its id derived from ``key``: the same for a
        redelivery), or the reason it is ignored."""
        member = provider.member(instance)
        if member is None or member.slurm_node is None:
            self.ignored.append((instance, f"not a member of cluster {cluster}" if member is None
                                 else "backs no node of the cluster's scheduler"))
            return
        self.events.append(NodeHealthEvent(
            schema_version="1", event_id=event_id(key), cluster=cluster,
            node=NodeIdentity(instance_id=instance, hostname=instance, slurm_node=member.slurm_node),
            check=check, fault_code=fault_code, severity="warning", observed_at=now, sent_at=now, evidence=evidence))


def event_id(key: str) -> str:
    """The id of the event for ``key`` (a notice and an instance): the same on every delivery."""
    return str(uuid.uuid5(_EVENT_IDS, key))


CAPACITY_END = "PLANNED_CAPACITY_END"
SPOT_INTERRUPTION = "PLANNED_SPOT_INTERRUPTION"
RESERVATION_INTERRUPTION = "PLANNED_RESERVATION_INTERRUPTION"
# the retirements for an interruption: EC2 stops, hibernates or terminates the instance at the deadline
INTERRUPTIONS = frozenset({SPOT_INTERRUPTION, RESERVATION_INTERRUPTION})
# a Spot warning read this long after EC2 acted is about a run that has ended (as long as the
# template's rule lets EventBridge retry a delivery: MaximumEventAgeInSeconds 120)
LATE_WARNING = INTERRUPTION_LEAD


def deadline_of(event: NodeHealthEvent) -> datetime | None:
    """When AWS acts on a planned event (the start of its window), if its notice says."""
    deadline = event.evidence.get("deadline")
    return datetime.fromisoformat(deadline) if isinstance(deadline, str) else None


def act_at(event: NodeHealthEvent, lead: timedelta, sweep: timedelta) -> datetime:
    """When to publish a planned event: at a sweep (every ``sweep``, the function's schedule) no
    later than ``lead`` before its deadline (so one sweep period earlier), or at once (its
    ``observed_at``) when ``lead`` is 0, it names no deadline, or that moment has passed."""
    deadline = deadline_of(event)
    if not lead or deadline is None:
        return event.observed_at
    return max(event.observed_at, deadline - lead - sweep)


def released(event: NodeHealthEvent, now: datetime, early: str | None = None) -> NodeHealthEvent:
    """A deferred event as it is published when its time has come (or ``early``, saying why:
    :func:`slack`): observed now, the notice's own time kept in the evidence."""
    evidence = {**event.evidence, "noticed_at": event.observed_at.isoformat(), **({"early": early} if early else {})}
    return event.model_copy(update={"observed_at": now, "sent_at": now, "evidence": evidence})


def moot(event: NodeHealthEvent, member: Member | None, now: datetime) -> str | None:
    """Why a notice that waited (for its lead time, or for room under the breaker) no longer
    concerns its node (None: it does): its window ended meanwhile (AWS has done what it announced:
    rebooting the node again would only cost its job), its instance left the cluster (replaced
    meanwhile for a fault, by an operator, by its Auto Scaling group) or backs another node now.
    Published, it would page the on-call about an instance that is not a member (Detect believes
    no event naming one), weeks after it stopped mattering. A notice with no window end (a
    retirement: "after" its date) stays while its instance is a member: AWS has not acted yet."""
    window_end = event.evidence.get("window_end")
    if isinstance(window_end, str) and datetime.fromisoformat(window_end) <= now:
        return f"its window ended at {window_end} while it waited: AWS has done what it announced"
    instance, node = event.node.instance_id, event.node.slurm_node or event.node.k8s_node
    if member is None:
        return f"{instance} is no longer a member of the cluster: the notice for {node} is moot"
    if member.slurm_node != node:
        return f"{instance} backs {member.slurm_node or 'no node'} now, not {node}: the notice is moot"
    return None


def slack(jobs: list[RunningJob], window: timedelta) -> str | None:
    """Why a notice still waiting for its lead time is best acted on now: the node runs no job
    (nothing is lost, and a job that starts there later would be), or every job on it wrote a
    checkpoint within ``window`` (the last sweep period: requeued now, it loses at most that,
    where at its lead time it could lose a whole checkpoint interval). None: wait. A marker is
    the job's own clock against the controller's; one further off than ``window`` either way
    does not count."""
    if not jobs:
        return "no job runs on the node"
    if all(j.marker is not None and abs(j.now - j.marker) <= window.total_seconds() for j in jobs):
        return f"every job on the node ({len(jobs)}) checkpointed within the last {window.total_seconds() / 60:.0f} min"
    return None


PlannedEnvelope = (AwsHealthEnvelope | CapacityBlockEnvelope | SpotInterruptionEnvelope | InstanceRunningEnvelope
                   | ScheduledEventsEnvelope | RebalanceEnvelope | NodeRebalanceEnvelope | ReservationInterruptionEnvelope)


def parse_planned_event(event: dict[str, object]) -> PlannedEnvelope:
    """An AWS Health event, a Spot interruption warning or rebalance recommendation, an
    interruptible Capacity Reservation's interruption warning, an instance's state change to
    running, a node's own reading of its scheduled events, or else a Capacity Block expiry
    warning; anything else is rejected."""
    model: type[PlannedEnvelope]
    detail_types = (event.get("detail-type"), event.get("detail_type"))
    if event.get("source") == HEALTH_SOURCE:
        model, kind = AwsHealthEnvelope, "AWS Health event"
    elif SPOT_DETAIL_TYPE in detail_types:
        model, kind = SpotInterruptionEnvelope, "Spot interruption warning"
    elif REBALANCE_DETAIL_TYPE in detail_types:
        model, kind = (NodeRebalanceEnvelope, "node's rebalance recommendation") if event.get("source") == AGENT_SOURCE \
            else (RebalanceEnvelope, "rebalance recommendation")
    elif any(t in detail_types for t in RESERVATION_DETAIL_TYPES):
        model, kind = ReservationInterruptionEnvelope, "Capacity Reservation interruption warning"
    elif STATE_CHANGE_DETAIL_TYPE in detail_types:
        model, kind = InstanceRunningEnvelope, "instance state change"
    elif SCHEDULED_DETAIL_TYPE in detail_types:
        model, kind = ScheduledEventsEnvelope, "node's scheduled events"
    else:
        model, kind = CapacityBlockEnvelope, "Capacity Block expiry warning"
    if where := not_unicode(event, "event"):
        raise InvalidEventError(f"rejected {kind}: {where}: not Unicode text (a lone surrogate)")
    try:
        return model.model_validate(event)
    except ValidationError as exc:
        raise InvalidEventError(f"rejected {kind}: {describe(exc, 'event')}") from exc


def reservation_instances(ec2: Any, capacity_reservation_id: str) -> list[str]:
    """The pending or running instances of this account in a Capacity Reservation (EC2
    ``DescribeInstances``, filter ``capacity-reservation-id``)."""
    pages = ec2.get_paginator("describe_instances").paginate(Filters=[
        {"Name": "capacity-reservation-id", "Values": [capacity_reservation_id]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return sorted(i["InstanceId"] for page in pages for r in page["Reservations"] for i in r["Instances"])


def notice_kept_until(envelope: AwsHealthEnvelope, now: datetime) -> datetime:
    """How long the newest version of a notice is remembered: ``EVENT_MEMORY`` past its window,
    or past now."""
    d = envelope.detail
    return max(now, d.startTime, d.endTime or d.startTime) + EVENT_MEMORY


def superseded(envelope: AwsHealthEnvelope) -> Plan:
    """A notice older than a version of it already seen plans nothing: acted on, a late
    ``upcoming`` would undo a ``closed`` (draining a node for maintenance AWS canceled), or put
    back a window AWS has moved."""
    d = envelope.detail
    why = f"an older version of {d.eventArn[-80:]} (updated {envelope.version.isoformat()}) than one already seen"
    return Plan(ignored=[(e.entityValue[:80], why) for e in d.affectedEntities])


def _instance_of(entity: str) -> str:
    """The instance id an affected entity names: the id itself, or the one its EC2 ARN ends in."""
    return m.group(1) if (m := _INSTANCE_ARN.match(entity)) else entity


def plan(envelope: AwsHealthEnvelope, *, cluster: str, provider: Provider, now: datetime) -> Plan:
    d = envelope.detail
    code = PLANNED.get(d.eventTypeCode)
    # the entities, else the envelope's resources (an id, or an ARN ending in one): AWS requires neither
    affected = d.affectedEntities or [AffectedEntity(entityValue=rid) for r in envelope.resources
                                      if (rid := r.rsplit("/", 1)[-1])]
    entities = [e.entityValue for e in affected]
    if not entities:  # neither list names anything: nothing to act on, and it says so
        return Plan(ignored=[(d.eventArn[:80], "names no affected resource")])
    if code is None:
        return Plan(ignored=[(e, f"{d.eventTypeCode} is not a scheduled change NodeMedic acts on") for e in entities])
    if d.statusCode == "closed":  # a notice still waiting for its lead time is withdrawn
        return Plan(ignored=[(e, f"{d.eventTypeCode} is closed") for e in entities],
                    withdrawn=[event_id(f"{d.eventArn}/{e}") for e in entities])
    if d.endTime and d.endTime <= now:
        return Plan(ignored=[(e, f"its window ended at {d.endTime.isoformat()}") for e in entities])
    if d.endTime is None and d.startTime <= now - EVENT_MEMORY:
        # a notice with no window end (a retirement: "after" its date) delivered again long after
        # it (an archive replayed): AWS has acted, and Detect no longer remembers the first delivery
        return Plan(ignored=[(e, f"its deadline {d.startTime.isoformat()} passed more than "
                                 f"{EVENT_MEMORY.days} days ago") for e in entities])
    result = Plan()
    for entity in affected:
        instance = _instance_of(entity.entityValue)
        if not _INSTANCE.match(instance):
            result.ignored.append((instance[:80], "not an EC2 instance id"))
            continue
        if entity.statusCode == "RESOLVED":
            result.ignored.append((instance, "AWS marks it resolved"))
            continue
        result.add(provider, cluster, instance, f"{d.eventArn}/{instance}", now, check="aws_health", fault_code=code,
                   evidence={"aws_event_type": d.eventTypeCode, "aws_event_arn": d.eventArn[:1024],
                             "deadline": d.startTime.isoformat(),
                             "window_end": d.endTime.isoformat() if d.endTime else None})
    return result


def plan_capacity_end(envelope: CapacityBlockEnvelope, *, cluster: str, provider: Provider,
                      instances: Callable[[str], Iterable[str]], now: datetime) -> Plan:
    """A Capacity Block ends: one retire event per node of this cluster running in it.
    ``instances`` lists the instances in a reservation (:func:`reservation_instances`)."""
    d = envelope.detail
    block = d.capacity_reservation_id
    if d.end_date <= now:
        return Plan(ignored=[(block, f"the Capacity Block ended at {d.end_date.isoformat()}")])
    result = Plan()
    for instance in instances(block):
        result.add(provider, cluster, instance, f"{block}/{d.end_date.isoformat()}/{instance}", now,
                   check="capacity_block", fault_code=CAPACITY_END,
                   evidence={"capacity_reservation_id": block, "deadline": d.termination_starts.isoformat(),
                             "block_end": d.end_date.isoformat()})
    if not result.events and not result.ignored:
        result.ignored.append((block, "no running instance of this account is in the Capacity Block"))
    return result


def plan_spot_interruption(envelope: SpotInterruptionEnvelope, *, cluster: str, provider: Provider,
                           now: datetime) -> Plan:
    """EC2 interrupts a Spot Instance: a retire event for its node (drained with its job
    checkpointed within the two minutes and moved to a spare; nothing repaired, nothing replaced:
    the instance's Auto Scaling group or fleet replaces it). The event id is derived from the
    warning's own id, so EventBridge's retry of the delivery is a redelivery. A warning read more
    than ``LATE_WARNING`` after EC2 acted (a dead-letter queue redriven, an archive replayed)
    plans nothing: the instance is stopped, hibernated or gone by then, and one that EC2 started
    again since runs a new run, which that warning is not about."""
    return _plan_interruption(envelope.id, envelope.detail.instance_id, envelope.detail.instance_action,
                              envelope.interrupted_at, envelope.time, "spot_interruption", SPOT_INTERRUPTION,
                              cluster=cluster, provider=provider, now=now)


def plan_reservation_interruption(envelope: ReservationInterruptionEnvelope, *, cluster: str, provider: Provider,
                                  now: datetime) -> Plan:
    """EC2 terminates an instance of an interruptible Capacity Reservation (its owner reclaims the
    capacity) at the warning's ``instance-termination-time``: retired as for a Spot interruption
    that terminates (:func:`plan_spot_interruption`), with that time as the deadline."""
    d = envelope.detail
    return _plan_interruption(envelope.id, d.instance_id, d.instance_action, d.termination_time, envelope.time,
                              "reservation_interruption", RESERVATION_INTERRUPTION,
                              cluster=cluster, provider=provider, now=now)


def _plan_interruption(warning_id: str, instance: str, action: str, deadline: datetime, warned_at: datetime,
                       check: Check, fault_code: str, *, cluster: str, provider: Provider, now: datetime) -> Plan:
    """The retire event of the node EC2 interrupts at ``deadline`` (its id from the warning's:
    the same for a redelivery); nothing for a warning read more than ``LATE_WARNING`` after it."""
    if now - deadline > LATE_WARNING:
        return Plan(ignored=[(instance, f"EC2 interrupted it at {deadline.isoformat()}, more than "
                                        f"{LATE_WARNING.total_seconds() / 60:.0f} min before this warning was "
                                        "read: nothing is left to plan")])
    result = Plan()
    result.add(provider, cluster, instance, f"{check.replace('_', '-')}/{warning_id}/{instance}", now,
               check=check, fault_code=fault_code,
               evidence={"instance_action": action, "deadline": deadline.isoformat(), "warned_at": warned_at.isoformat()})
    return result


RETURNS_AFTER = ("stop", "hibernate")  # the Spot interruptions after which EC2 starts the same instance again


def interrupted_at(incident: Incident, instance_id: str) -> datetime | None:
    """When EC2 stopped or hibernated ``instance_id`` for the Spot interruption ``incident`` retired
    its node for (the deadline its warning gave); None for any other incident. That instance
    running again after this moment is the node back."""
    if incident.status != "retired" or incident.fault_code != SPOT_INTERRUPTION or incident.instance_id != instance_id:
        return None
    return incident.deadline if incident.evidence("instance_action") in RETURNS_AFTER else None


def ended_by_interruption(incident: Incident, instance_id: str) -> bool:
    """Whether ``incident`` retired the node of ``instance_id`` for an interruption that terminates
    it (a Spot Instance's, an interruptible Capacity Reservation's): once EC2 has, the node has no
    instance until one is joined in its place."""
    return (incident.status == "retired" and incident.fault_code in INTERRUPTIONS
            and incident.instance_id == instance_id and incident.evidence("instance_action") == "terminate")


def back_from_interruption(incident: Incident, instance_id: str, at: datetime) -> bool:
    """Whether ``instance_id`` running at ``at`` is back from the Spot stop or hibernation that
    ``incident`` retired its node for."""
    stopped = interrupted_at(incident, instance_id)
    return stopped is not None and at > stopped


def plan_return(envelope: InstanceRunningEnvelope, *, cluster: str, provider: Provider,
                retired_by: Callable[[str], Incident | None], now: datetime) -> Plan:
    """An instance runs again. If it is one whose node NodeMedic retired for a Spot stop or
    hibernation (``retired_by(instance)``: the incident holding its lock), its node gets a
    ``NODE_JOINED`` event: the burn-in checks it and returns it to service. Every other instance
    that starts (most of the account's) is ignored. The event id is derived from the state
    change's own id, so EventBridge's retry of the delivery is deduplicated."""
    d = envelope.detail
    incident = retired_by(d.instance_id)
    if incident is None or not back_from_interruption(incident, d.instance_id, envelope.time):
        return Plan(ignored=[(d.instance_id, "not an instance NodeMedic retired for a Spot stop or hibernation "
                                             "that has run again since")])
    result = Plan()
    result.add(provider, cluster, d.instance_id, f"instance-running/{envelope.id}/{d.instance_id}", now,
               check="burn_in", fault_code="NODE_JOINED",
               evidence={"returned_from": incident.incident_id, "running_since": envelope.time.isoformat(),
                         "started_by": "EC2 started the instance again after its Spot interruption"})
    return result


def scheduled_events(ec2: Any) -> list[tuple[str, dict[str, Any]]]:
    """(instance, event) for each scheduled event of a running instance of this account that
    NodeMedic acts on (EC2 ``DescribeInstanceStatus``, filter ``event.code``)."""
    pages = ec2.get_paginator("describe_instance_status").paginate(
        Filters=[{"Name": "event.code", "Values": sorted(SCHEDULED)}])
    return [(status["InstanceId"], event) for page in pages for status in page["InstanceStatuses"]
            for event in status.get("Events", [])]


def plan_scheduled(events: Iterable[tuple[str, dict[str, Any]]], *, cluster: str, provider: Provider,
                   now: datetime) -> Plan:
    """One event per node of this cluster with an EC2 scheduled event still to come. The event id
    is derived from EC2's event id, so every later sweep that sees the same scheduled event is a
    redelivery Detect deduplicates: one incident per scheduled event."""
    result = Plan()
    for instance, event in events:
        code, description = str(event.get("Code", "")), str(event.get("Description", ""))
        fault = SCHEDULED.get(code)
        not_before, not_after = event.get("NotBefore"), event.get("NotAfter")
        if fault is None:
            result.ignored.append((instance, f"{code or 'an event without a code'} is not one NodeMedic acts on"))
        elif description.startswith(ENDED_EVENT):
            result.ignored.append((instance, f"{code} is over: {description[:120]}"))
            if event.get("InstanceEventId"):
                result.withdrawn.append(event_id(f"ec2-scheduled/{event['InstanceEventId']}/{instance}"))
        elif isinstance(not_after, datetime) and not_after <= now:
            result.ignored.append((instance, f"{code}: its window ended at {not_after.isoformat()}"))
        elif not event.get("InstanceEventId"):
            result.ignored.append((instance, f"{code} has no event id"))
        else:
            if code == "system-maintenance" and "network" in description.lower():
                fault = "PLANNED_NETWORK_MAINTENANCE"
            result.add(provider, cluster, instance, f"ec2-scheduled/{event['InstanceEventId']}/{instance}", now,
                       check="ec2_scheduled_event", fault_code=fault,
                       evidence={"ec2_event_code": code, "ec2_event_id": str(event["InstanceEventId"])[:64],
                                 "deadline": not_before.isoformat() if isinstance(not_before, datetime) else None,
                                 "window_end": not_after.isoformat() if isinstance(not_after, datetime) else None,
                                 "description": description[:256]})
    return result


def plan_node_scheduled(envelope: ScheduledEventsEnvelope, *, cluster: str, provider: Provider,
                        now: datetime) -> Plan:
    """A node's agent read its instance's scheduled events from instance metadata: planned as the
    sweep plans what ``DescribeInstanceStatus`` shows (:func:`plan_scheduled`: the same event ids,
    so an event both find opens one incident). A notice that names the instance of another node
    than the one the provider maps it to is not believed, as Detect believes no such health event:
    one node cannot get another drained."""
    d = envelope.detail
    instance = d.node.instance_id
    if d.cluster != cluster:
        return Plan(ignored=[(instance, f"the notice is for cluster {d.cluster[:64]}; this pipeline serves {cluster}")])
    if envelope.time < now - EVENT_MEMORY:
        # an archive of the bus replayed (a dead-letter queue keeps 14 days at most): what it acted
        # on has left Detect's memory, and an event it calls active may be long over (AWS rebooted
        # the node, or retired it and it was started again). A current notice comes anyway: the
        # agent sends its active events again every hour
        return Plan(ignored=[(instance, f"the notice was sent at {envelope.time.isoformat()}, more than "
                                        f"{EVENT_MEMORY.days} days ago: a replay, not believed")])
    member = provider.member(instance)
    named = d.node.slurm_node or d.node.k8s_node
    if member is not None and member.slurm_node is not None and named is not None and named != member.slurm_node:
        return Plan(ignored=[(instance, f"the notice names node {named}, but {instance} backs {member.slurm_node}: "
                                        "not believed")])
    active = [e for e in d.events if e.state == "active"]
    result = plan_scheduled([(instance, {"Code": e.code, "Description": e.description, "InstanceEventId": e.event_id,
                                         "NotBefore": e.not_before, "NotAfter": e.not_after}) for e in active],
                            cluster=cluster, provider=provider, now=now)
    for e in d.events:  # completed or canceled (instance metadata's history): a copy waiting for its time is dropped
        if e.state != "active":
            result.ignored.append((instance, f"{e.code} {e.event_id} is {e.state}, not active"))
            result.withdrawn.append(event_id(f"ec2-scheduled/{e.event_id}/{instance}"))
    # the incident says where its notice came from (the sweep's copy, the same event id, says nothing)
    return Plan(events=[e.model_copy(update={"evidence": {**e.evidence, "read_from": "instance metadata"}})
                        for e in result.events], ignored=result.ignored, withdrawn=result.withdrawn)
