"""EC2's instance state-change notification as EventBridge delivers it (source ``aws.ec2``), for
the one state NodeMedic reads: ``running``. The fields NodeMedic reads, validated; the rest is
ignored.

From the EC2 User Guide, "Amazon EC2 instance state change events"
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instance-state-changes.html):
EC2 emits "EC2 Instance State-change Notification" when an instance changes state; the detail
names the instance (``instance-id``) and its new ``state`` (pending, running, stopping, stopped,
shutting-down, terminated). A stopped or hibernated Spot Instance is started again by EC2 alone,
when capacity comes back (EC2 User Guide, "Behavior of Spot Instance interruptions"): its
``running`` is how NodeMedic learns that a node it retired for that interruption is back.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field

from nodemedic.contracts.ec2_event import Ec2Event, InstanceDetail

STATE_CHANGE_DETAIL_TYPE = "EC2 Instance State-change Notification"


class InstanceStateDetail(InstanceDetail):
    state: Literal["running"]  # the template's rule sends no other state


class InstanceRunningEnvelope(Ec2Event):  # its time: when the instance entered the state
    detail_type: Literal["EC2 Instance State-change Notification"] = \
        Field(validation_alias=AliasChoices("detail-type", "detail_type"))
    detail: InstanceStateDetail
