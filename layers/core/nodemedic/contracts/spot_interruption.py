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
instance only (``instance-id``); best effort too. EC2 also writes it in the instance's metadata
(``events/recommendations/rebalance``: ``{"noticeTime": ...}``); a node's agent sends what it reads
there to NodeMedic's bus (source ``nodemedic.agent``, the same detail-type): :class:`NodeRebalanceEnvelope`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from nodemedic.contracts.ec2_event import Ec2Event, InstanceDetail, UtcTime
from nodemedic.contracts.events import CLUSTER_NAME, NodeIdentity

SPOT_DETAIL_TYPE = "EC2 Spot Instance Interruption Warning"
REBALANCE_DETAIL_TYPE = "EC2 Instance Rebalance Recommendation"
INTERRUPTION_LEAD = timedelta(minutes=2)  # from the warning to the interruption (stop, terminate)


class SpotInterruptionDetail(InstanceDetail):
    instance_action: Literal["terminate", "stop", "hibernate"] = Field(alias="instance-action")


class SpotInterruptionEnvelope(Ec2Event):
    detail_type: Literal["EC2 Spot Instance Interruption Warning"] = \
        Field(validation_alias=AliasChoices("detail-type", "detail_type"))
    detail: SpotInterruptionDetail

    @property
    def interrupted_at(self) -> datetime:
        """When EC2 interrupts the instance: NodeMedic's deadline (hibernation: at once)."""
        return self.time if self.detail.instance_action == "hibernate" else self.time + INTERRUPTION_LEAD


class RebalanceEnvelope(Ec2Event):
    detail_type: Literal["EC2 Instance Rebalance Recommendation"] = \
        Field(validation_alias=AliasChoices("detail-type", "detail_type"))
    detail: InstanceDetail

    @property
    def instance_id(self) -> str:
        return self.detail.instance_id

    @property
    def recommended_at(self) -> datetime:
        return self.time

    @property
    def named(self) -> tuple[str | None, str | None]:
        """The cluster and node the sender says the instance is (EC2 names neither)."""
        return None, None


class RebalanceNotice(BaseModel):
    """What a node's agent read from its instance metadata: EC2's ``noticeTime``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: Literal["1"]
    cluster: str = Field(pattern=CLUSTER_NAME)
    node: NodeIdentity
    notice_time: UtcTime


class NodeRebalanceEnvelope(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    id: str = Field(min_length=1, max_length=128)
    source: Literal["nodemedic.agent"]
    detail_type: Literal["EC2 Instance Rebalance Recommendation"] = \
        Field(validation_alias=AliasChoices("detail-type", "detail_type"))
    time: UtcTime  # EventBridge's clock
    detail: RebalanceNotice

    @property
    def instance_id(self) -> str:
        return self.detail.node.instance_id

    @property
    def recommended_at(self) -> datetime:
        """EC2's time in the metadata (the agent's clock plays no part)."""
        return self.detail.notice_time

    @property
    def named(self) -> tuple[str | None, str | None]:
        return self.detail.cluster, self.detail.node.slurm_node or self.detail.node.k8s_node
