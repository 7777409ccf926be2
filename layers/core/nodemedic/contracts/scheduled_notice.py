"""A node's own reading of its EC2 scheduled events, as its agent sends it to NodeMedic's bus
(source ``nodemedic.agent``, detail-type ``EC2 Scheduled Events``): what instance metadata's
``events/maintenance/scheduled`` holds, one entry per event, its dates as ISO 8601.

EC2 writes every active scheduled event of the instance there (EC2 User Guide, "Instance metadata
categories": "If there are active maintenance events for the instance, contains a JSON string with
information about the events"): ``Code`` (``instance-reboot``, ``system-reboot``,
``system-maintenance``, ``instance-retirement``, ``instance-stop``: the codes of
``DescribeInstanceStatus``), ``Description``, ``EventId``, ``NotBefore``, ``NotAfter`` (dates such
as ``21 Jan 2019 09:00:43 GMT``) and ``State`` (``active``). It is the one source of a node's
scheduled events that reaches the node itself: a HyperPod node's instance is in the service's
account, so neither ``DescribeInstanceStatus`` nor AWS Health of the cluster's account names it.
The planned-events function takes the notice like a sweep's find (the same event ids, so the two
deduplicate) and keeps it until its lead time.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from nodemedic.contracts.ec2_event import UtcTime
from nodemedic.contracts.events import CLUSTER_NAME, NodeIdentity, clip

SCHEDULED_DETAIL_TYPE = "EC2 Scheduled Events"
MAX_EVENTS = 20  # an instance has a few scheduled events at most; more is not EC2's answer


class ScheduledEvent(BaseModel):
    """One event as instance metadata shows it (its dates read by the agent)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    code: str = Field(min_length=1, max_length=64)
    event_id: str = Field(pattern=r"^instance-event-[0-9a-z]{1,40}$")
    description: Annotated[str, clip(1024)] = ""  # EC2's free text, only shown: a longer one is cut
    not_before: UtcTime
    not_after: UtcTime | None = None
    state: str = Field(min_length=1, max_length=32)


class ScheduledEventsNotice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: Literal["1"]
    cluster: str = Field(pattern=CLUSTER_NAME)
    node: NodeIdentity
    events: list[ScheduledEvent] = Field(max_length=MAX_EVENTS)


class ScheduledEventsEnvelope(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    id: str = Field(min_length=1, max_length=128)
    source: Literal["nodemedic.agent"]
    detail_type: Literal["EC2 Scheduled Events"] = Field(validation_alias=AliasChoices("detail-type", "detail_type"))
    time: UtcTime  # EventBridge's clock
    detail: ScheduledEventsNotice
