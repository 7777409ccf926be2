"""The interface every capacity provider implements (Auto Scaling today; EC2, HyperPod later)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

SLURM_NODE_TAG = "nodemedic:slurm-node"
TOPOLOGY_TAGS = {"nodemedic:rack": "rack", "nodemedic:switch": "switch"}


@dataclass(frozen=True)
class Member:
    """An instance that belongs to the cluster, and the Slurm node it backs."""

    instance_id: str
    slurm_node: str | None
    state: str
    tags: dict[str, str] = field(default_factory=dict, compare=False)
    topology: dict[str, str] = field(
        default_factory=dict, compare=False,
        metadata={"doc": "where the instance sits: availability_zone, placement_group, host_id, rack, "
                         "switch; what correlated failures share"})


def ec2_member(instance: dict[str, Any]) -> Member:
    """A member from an EC2 ``DescribeInstances`` record (tags and placement included)."""
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    placement = instance.get("Placement", {})
    topology = {
        "availability_zone": placement.get("AvailabilityZone", ""),
        "placement_group": placement.get("GroupName", ""),
        "host_id": placement.get("HostId", ""),
        **{name: tags.get(tag, "") for tag, name in TOPOLOGY_TAGS.items()},
    }
    return Member(instance["InstanceId"], tags.get(SLURM_NODE_TAG), instance["State"]["Name"],
                  tags, {k: v for k, v in topology.items() if v})


class Provider(Protocol):
    def member(self, instance_id: str) -> Member | None:
        """The instance if it belongs to the cluster, else None."""
        ...

    def member_by_node(self, slurm_node: str) -> Member | None: ...

    def size(self) -> int:
        """How many nodes the cluster is meant to have (what breaker percentages are of)."""
        ...

    def start_replacement(self, instance_id: str) -> bool:
        """Ask for a replacement of ``instance_id``; False if it was already on its way out."""
        ...

    def replacement_candidates(self, exclude: str) -> list[str]:
        """In-service instances that back no Slurm node yet, oldest first."""
        ...

    def assign_node(self, instance_id: str, slurm_node: str) -> None: ...

    def reboot(self, instance_id: str) -> None: ...
