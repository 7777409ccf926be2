"""AWS Health events as EventBridge delivers them (source ``aws.health``, detail-type
``AWS Health Event``): the fields NodeMedic reads, validated; the rest is ignored.

Shapes from the AWS Health User Guide, "Reference: AWS Health events Amazon EventBridge schema"
(https://docs.aws.amazon.com/health/latest/ug/aws-health-events-eventbridge-schema.html):
``startTime``/``endTime`` are RFC 1123 dates ("Fri, 27 Jan 2023 06:02:51 GMT"); an event with
many affected resources arrives as several pages (``page``/``totalPages``), each its own event
with a part of ``affectedEntities``; the same ``eventArn`` comes again when AWS updates it, with a
later ``lastUpdatedTime``.
"""

from __future__ import annotations

from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from nodemedic.contracts.ec2_event import UtcTime

HEALTH_SOURCE = "aws.health"
HEALTH_DETAIL_TYPE = "AWS Health Event"


def _rfc1123(value: object) -> object:
    """AWS Health writes RFC 1123 dates; an ISO 8601 one is left to :data:`UtcTime`, which checks
    every time the same way (text, a timezone, a plausible year) whichever way it was written."""
    if isinstance(value, str) and not value[:4].isdigit():
        try:
            return parsedate_to_datetime(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not an RFC 1123 date: {value[:64]!r}") from exc
    return value


HealthTime = Annotated[UtcTime, BeforeValidator(_rfc1123)]


class AffectedEntity(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    entityValue: str = Field(min_length=1, max_length=1600)  # noqa: N815 - AWS's field names
    statusCode: str | None = Field(default=None, max_length=32)  # noqa: N815


class AwsHealthDetail(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    eventArn: str = Field(pattern=r"^arn:aws(-[a-z]+)*:health:[^:]*:[^:]*:event/", max_length=1600)  # noqa: N815
    service: str = Field(max_length=64)
    eventTypeCode: str = Field(pattern=r"^[A-Z0-9_]{1,100}$")  # noqa: N815
    eventTypeCategory: str = Field(max_length=64)  # noqa: N815
    startTime: HealthTime  # noqa: N815 - when AWS acts: NodeMedic's deadline
    endTime: HealthTime | None = None  # noqa: N815
    statusCode: str = Field(default="upcoming", max_length=32)  # noqa: N815 - upcoming, open, closed
    lastUpdatedTime: HealthTime | None = None  # noqa: N815 - the version of an updated notice
    affectedEntities: list[AffectedEntity] = Field(default_factory=list, max_length=10_000)  # noqa: N815


class AwsHealthEnvelope(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    id: str = Field(min_length=1, max_length=128)
    source: Literal["aws.health"]
    detail_type: Literal["AWS Health Event"] = Field(alias="detail-type")
    time: HealthTime
    resources: list[Annotated[str, Field(max_length=1600)]] = Field(default_factory=list, max_length=10_000)  # "if any"
    detail: AwsHealthDetail

    @property
    def version(self) -> datetime:
        """When AWS last updated the notice (else when it was sent): a later update of the same
        ``eventArn`` has a later version."""
        return self.detail.lastUpdatedTime or self.time
