"""The interface every capacity provider implements: EC2 Auto Scaling, plain EC2, HyperPod."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from botocore.exceptions import ClientError

from nodemedic.errors import ReplacementFailedError

SLURM_NODE_TAG = "nodemedic:slurm-node"
TOPOLOGY_TAGS = {"nodemedic:rack": "rack", "nodemedic:switch": "switch"}
ENDED = frozenset({"shutting-down", "terminated"})  # EC2's states of an instance that is ending or ended

# Error codes AWS uses when it has no capacity for an instance right now.
CAPACITY_ERRORS = frozenset({"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
                             "InsufficientReservedInstanceCapacity", "InsufficientCapacityException"})


@dataclass(frozen=True)
class Member:
    """An instance that belongs to the cluster, and the Slurm node it backs."""

    instance_id: str
    slurm_node: str | None
    state: str
    tags: dict[str, str] = field(default_factory=dict, compare=False)
    topology: dict[str, str] = field(
        default_factory=dict, compare=False,
        metadata={"doc": "where the instance sits and what it was launched from: availability_zone, "
                         "placement_group, host_id, capacity_reservation, rack, switch, image; what "
                         "correlated failures share"})
    launched_at: datetime | None = field(
        default=None, compare=False,
        metadata={"doc": "EC2's LaunchTime: the instance's most recent start (a stop and start moves it)"})


@dataclass(frozen=True)
class ReplaceStep:
    """Where a replacement stands after one idempotent step: ``progress`` is saved by the caller
    and handed back on the next step; ``instance_id`` is set once the replacement runs."""

    progress: dict[str, Any]
    instance_id: str | None = None


def ec2_member(instance: dict[str, Any]) -> Member:
    """A member from an EC2 ``DescribeInstances`` record (tags and placement included)."""
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    placement = instance.get("Placement", {})
    topology = {
        "availability_zone": placement.get("AvailabilityZone", ""),
        "placement_group": placement.get("GroupName", ""),
        "host_id": placement.get("HostId", ""),
        "capacity_reservation": instance.get("CapacityReservationId", ""),  # e.g. a Capacity Block
        "image": instance.get("ImageId", ""),  # the AMI: a new one rolled out fails many nodes at once
        **{name: tags.get(tag, "") for tag, name in TOPOLOGY_TAGS.items()},
    }
    launched = instance.get("LaunchTime")
    return Member(instance["InstanceId"], tags.get(SLURM_NODE_TAG), instance["State"]["Name"],
                  tags, {k: v for k, v in topology.items() if v},
                  launched if isinstance(launched, datetime) and launched.tzinfo is not None else None)


def ec2_instances(ec2: Any, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every instance ``DescribeInstances`` finds with ``filters``, all pages."""
    pages = ec2.get_paginator("describe_instances").paginate(Filters=filters)
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def ended_state(ec2: Any, instance_id: str) -> str | None:
    """EC2's state of an instance that is shutting down or terminated; None otherwise. An
    instance EC2 does not find is not called ended: right after a launch, ``DescribeInstances``
    may not know it yet (EC2 API reference, "Eventual consistency"), and an instance of another
    account (HyperPod's) is not EC2's here to say."""
    states = [i["State"]["Name"] for i in ec2_instances(ec2, [{"Name": "instance-id", "Values": [instance_id]}])]
    return states[0] if states and states[0] in ENDED else None


def reboot_ec2(ec2: Any, instance_ids: list[str]) -> None:
    """``RebootInstances``. EC2 reboots only a running instance: one still ``pending`` boots
    already, which is what the rung asks. One stopped or stopping was stopped by someone else (an
    operator, a Spot stop, a scheduled stop): NodeMedic never starts an instance it did not stop,
    so that, like any other refusal, is a :class:`~nodemedic.errors.ReplacementFailedError` that
    says so."""
    try:
        ec2.reboot_instances(InstanceIds=instance_ids)
        return
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "IncorrectInstanceState":
            raise ReplacementFailedError(f"cannot reboot {', '.join(instance_ids)}: {exc}") from exc
        refused = exc
    states = {i["InstanceId"]: i["State"]["Name"]
              for i in ec2_instances(ec2, [{"Name": "instance-id", "Values": instance_ids}])}
    if not_booting := [f"{i} ({states.get(i, 'not found')})" for i in instance_ids if states.get(i) != "pending"]:
        raise ReplacementFailedError(
            f"cannot reboot {', '.join(not_booting)}: someone else "
            "stopped it, and NodeMedic does not start an instance it did not stop; start it, or replace the node "
            f"(nodemedic remediate NODE --action replace) ({refused})") from refused


def is_capacity_error(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code", "") in CAPACITY_ERRORS


def batches(ids: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(ids), size):
        yield ids[start:start + size]


class Provider(Protocol):
    kind: str
    # True when replace() tells a new instance from one that served before by itself (HyperPod's
    # and EC2's own launch times); False when only a node tag or node name can (Auto Scaling)
    knows_new_instances: bool

    def member(self, instance_id: str) -> Member | None:
        """The instance if it belongs to the cluster, else None."""
        ...

    def member_by_node(self, slurm_node: str) -> Member | None: ...

    def members(self) -> list[Member]:
        """Every instance of the cluster that is not gone (terminated or shutting down), in as few
        calls as the API allows."""
        ...

    def size(self) -> int:
        """How many nodes the cluster is meant to have (what breaker percentages are of)."""
        ...

    def reboot(self, instance_ids: list[str]) -> None:
        """Reboot these instances (in as few calls as the API allows)."""
        ...

    def replace(self, instance_id: str, slurm_node: str, progress: dict[str, Any],
                claim: Callable[[str], bool]) -> ReplaceStep:
        """One idempotent step toward a healthy instance behind ``slurm_node``. Raises
        :class:`~nodemedic.errors.CapacityError` when AWS has no capacity for it now."""
        ...


def runs_commands(provider: Provider) -> bool:
    """Whether SSM Run Command reaches the provider's instances, as a GPU reset needs. SageMaker
    HyperPod's nodes it does not: SSM addresses them only through Session Manager
    (docs/recovery.md, "Known gap"); HyperPod checks them itself (nodemedic.stages.hyperpod_check)."""
    return provider.kind != "hyperpod"
