"""EC2's warning that it terminates an instance of an interruptible Capacity Reservation, as
EventBridge delivers it (source ``aws.ec2``): the fields NodeMedic reads, validated; the rest is
ignored.

From the EC2 User Guide, "Monitor interruptible Capacity Reservations with EventBridge and
CloudTrail" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitor-interruptible-cr.html):
an account that runs instances in a Capacity Reservation another account shares as interruptible
gets this notification two minutes before the owner's reclaim terminates them. The detail names
the instance (``instance-id``), the action (``terminate``) and when (``instance-termination-time``).
The guide's English page spells the detail-type "EC2 Capacity Reservation Instance Interruption
Warning", its translated pages "EC2 Interruptible Capacity Reservation Instance Interruption
Warning"; both are accepted (and matched by the template's rule).
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field

from nodemedic.contracts.ec2_event import Ec2Event, InstanceDetail, UtcTime

RESERVATION_DETAIL_TYPES = ("EC2 Capacity Reservation Instance Interruption Warning",
                            "EC2 Interruptible Capacity Reservation Instance Interruption Warning")


class ReservationInterruptionDetail(InstanceDetail):
    instance_action: Literal["terminate"] = Field(alias="instance-action")
    termination_time: UtcTime = Field(alias="instance-termination-time")


class ReservationInterruptionEnvelope(Ec2Event):
    detail_type: Literal["EC2 Capacity Reservation Instance Interruption Warning",
                         "EC2 Interruptible Capacity Reservation Instance Interruption Warning"] = \
        Field(validation_alias=AliasChoices("detail-type", "detail_type"))
    detail: ReservationInterruptionDetail
