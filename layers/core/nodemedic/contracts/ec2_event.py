"""What every event EC2 delivers to EventBridge carries (source ``aws.ec2``): its id and its
time, validated. Each event's model (a Capacity Block's expiry, a Spot interruption warning, an
instance's state change) adds its ``detail-type`` and ``detail`` (one about an instance on
:class:`InstanceDetail`); the rest is ignored.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from nodemedic.contracts.events import INSTANCE_ID, Timestamp


def _utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc)


UtcTime = Annotated[Timestamp, AfterValidator(_utc)]  # text with a timezone, of a plausible year; in UTC


class Ec2Event(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    id: str = Field(min_length=1, max_length=128)
    source: Literal["aws.ec2"]
    time: UtcTime  # EventBridge's clock, whole seconds


class InstanceDetail(BaseModel):
    """The detail of an event about one instance (``instance-id``); each such event's model adds
    the rest it reads."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    instance_id: str = Field(alias="instance-id", pattern=INSTANCE_ID)
