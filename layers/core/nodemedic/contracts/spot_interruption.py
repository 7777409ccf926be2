"""EC2's Spot Instance interruption warning as EventBridge delivers it (source ``aws.ec2``): the
fields NodeMedic reads, validated; the rest is ignored.

From the EC2 User Guide, "Spot Instance interruption notices"
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html):
EC2 emits "EC2 Spot Instance Interruption Warning" two minutes before it stops or terminates the
Spot Instance; with hibernation as the interruption behaviour the notice comes as hibernation
begins, with no two minutes. The detail names the instance (``instance-id``) and what EC2 will do
(``instance-action``: ``terminate``, ``stop`` or ``hibernate``). Notices are best effort.

And EC2's rebalance recommendation, from "EC2 instance rebalance recommendations"
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html): "EC2
Instance Rebalance Recommendation" says a Spot Instance is at elevated risk of interruption; it
may come before the interruption warning, with it, or without one following. The detail names the
instance only (``instance-id``); best effort too.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from nodemedic.contracts.ec2_event import Ec2Event
from nodemedic.contracts.events import INSTANCE_ID

SPOT_DETAIL_TYPE = "EC2 Spot Instance Interruption Warning"
REBALANCE_DETAIL_TYPE = "EC2 Instance Rebalance Recommendation"
INTERRUPTION_LEAD = timedelta(minutes=2)  # from the warning to the interruption (stop, terminate)


class SpotInterruptionDetail(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    instance_id: str = Field(alias="instance-id", pattern=INSTANCE_ID)
    instance_action: Literal["terminate", "stop", "hibernate"] = Field(alias="instance-action")


class SpotInterruptionEnvelope(Ec2Event):
    detail_type: Literal["EC2 Spot Instance Interruption Warning"] = \
        Field(validation_alias=AliasChoices("detail-type", "detail_type"))
    detail: SpotInterruptionDetail

    @property
    def interrupted_at(self) -> datetime:
        """When EC2 interrupts the instance: NodeMedic's deadline (hibernation: at once)."""
        return self.time if self.detail.instance_action == "hibernate" else self.time + INTERRUPTION_LEAD


class RebalanceDetail(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    instance_id: str = Field(alias="instance-id", pattern=INSTANCE_ID)


class RebalanceEnvelope(Ec2Event):
    detail_type: Literal["EC2 Instance Rebalance Recommendation"] = \
        Field(validation_alias=AliasChoices("detail-type", "detail_type"))
    detail: RebalanceDetail
