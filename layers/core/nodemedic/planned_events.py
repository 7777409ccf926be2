"""AWS Health scheduled changes for the cluster's instances (an instance retirement, a stop, a
reboot maintenance...), turned into one Node Health Event per affected node of this cluster, from
source ``nodemedic.planned``, on NodeMedic's own bus. The state machine then handles each like a
fault: drain, spare, the rung the event needs (fault_table.json: a retirement or stop is a
replace, which on the ec2 provider is the stop/start AWS recommends; an instance-reboot
maintenance is a reboot, which applies it), check, resume, all before AWS acts.

Every affected entity that is not a node of this cluster is ignored with its reason. The event id
is derived from the Health event's ARN and the instance, so a redelivery, a later page or an
update of the same Health event is deduplicated by Detect like any repeated event.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import ValidationError

from nodemedic.contracts.aws_health import AwsHealthEnvelope
from nodemedic.contracts.events import INSTANCE_ID, NodeHealthEvent, NodeIdentity
from nodemedic.contracts.problems import describe
from nodemedic.errors import InvalidEventError
from nodemedic.providers.base import Provider

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
_INSTANCE = re.compile(INSTANCE_ID)
_EVENT_IDS = uuid.UUID("5b0f3c1e-8a64-4f5e-9a59-0d7c4c1f2a10")  # namespace of the derived event ids


@dataclass(frozen=True)
class Plan:
    """What one AWS Health event means for this cluster."""

    events: list[NodeHealthEvent] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (entity, why)


def parse_health_event(event: dict[str, object]) -> AwsHealthEnvelope:
    try:
        return AwsHealthEnvelope.model_validate(event)
    except ValidationError as exc:
        raise InvalidEventError(f"rejected AWS Health event: {describe(exc, 'event')}") from exc


def plan(envelope: AwsHealthEnvelope, *, cluster: str, provider: Provider, now: datetime) -> Plan:
    d = envelope.detail
    code = PLANNED.get(d.eventTypeCode)
    entities = [e.entityValue for e in d.affectedEntities]
    if code is None:
        return Plan(ignored=[(e, f"{d.eventTypeCode} is not a scheduled change NodeMedic acts on") for e in entities])
    if d.statusCode == "closed":
        return Plan(ignored=[(e, f"{d.eventTypeCode} is closed") for e in entities])
    if d.endTime and d.endTime <= now:
        return Plan(ignored=[(e, f"its window ended at {d.endTime.isoformat()}") for e in entities])
    result = Plan()
    for entity in d.affectedEntities:
        instance = entity.entityValue
        if not _INSTANCE.match(instance):
            result.ignored.append((instance[:80], "not an EC2 instance id"))
            continue
        if entity.statusCode == "RESOLVED":
            result.ignored.append((instance, "AWS marks it resolved"))
            continue
        member = provider.member(instance)
        if member is None:
            result.ignored.append((instance, f"not a member of cluster {cluster}"))
            continue
        if member.slurm_node is None:
            result.ignored.append((instance, "backs no node of the cluster's scheduler"))
            continue
        result.events.append(NodeHealthEvent(
            schema_version="1", event_id=str(uuid.uuid5(_EVENT_IDS, f"{d.eventArn}/{instance}")), cluster=cluster,
            node=NodeIdentity(instance_id=instance, hostname=instance, slurm_node=member.slurm_node),
            check="aws_health", fault_code=code, severity="warning", observed_at=now, sent_at=now,
            evidence={"aws_event_type": d.eventTypeCode, "aws_event_arn": d.eventArn[:1024],
                      "deadline": d.startTime.isoformat(),
                      "window_end": d.endTime.isoformat() if d.endTime else None}))
    return result
