"""EC2's Capacity Block expiry warning as EventBridge delivers it (source ``aws.ec2``): the fields
NodeMedic reads, validated; the rest is ignored.

From the EC2 User Guide, "Monitor Capacity Blocks using EventBridge"
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-monitor.html): forty minutes
before a Capacity Block reservation ends, EC2 emits this event; the instances running in it begin
to terminate ten minutes later. The detail names only the reservation
(``capacity-reservation-id``) and its ``end-date``, not the instances. The guide spells the
detail-type both "Capacity Block Expiration Warning" and "Capacity Block Reservation Expiration
Warning"; both are accepted (and matched by the template's rule).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from nodemedic.contracts.ec2_event import Ec2Event, UtcTime

# instances in the block begin to terminate this long before its end (the warning comes 40 min
# before the end, termination 10 min after the warning)
TERMINATION_LEAD = timedelta(minutes=30)
RESERVATION_ID = r"^cr-[0-9a-f]{8}([0-9a-f]{9})?$"


class CapacityBlockDetail(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    capacity_reservation_id: str = Field(alias="capacity-reservation-id", pattern=RESERVATION_ID)
    end_date: UtcTime = Field(alias="end-date")

    @property
    def termination_starts(self) -> datetime:
        """When EC2 begins to terminate the block's instances: NodeMedic's deadline."""
        return self.end_date - TERMINATION_LEAD


class CapacityBlockEnvelope(Ec2Event):
    # EventBridge delivers "detail-type"; the guide's samples write "detail_type"
    detail_type: Literal["Capacity Block Expiration Warning", "Capacity Block Reservation Expiration Warning"] = \
        Field(validation_alias=AliasChoices("detail-type", "detail_type"))
    detail: CapacityBlockDetail
