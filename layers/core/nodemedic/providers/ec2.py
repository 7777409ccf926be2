"""Plain EC2 instances (no Auto Scaling group): the cluster is the instances tagged
``nodemedic:cluster=<cluster>`` (on Slurm, those that also carry ``nodemedic:slurm-node``: the
controller carries the cluster tag too; on Kubernetes the node's ``spec.providerID`` names its
instance, and there is no controller instance). Reboot = ``RebootInstances``; replace = stop and
start, which moves the instance to new hardware and keeps its id, volumes and node name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from nodemedic.errors import CapacityError, NodeGoneError, ReplacementFailedError
from nodemedic.providers.base import (
    ENDED,
    SLURM_NODE_TAG,
    Member,
    ReplaceStep,
    ec2_instances,
    ec2_member,
    ended_state,
    is_capacity_error,
    reboot_ec2,
)

CLUSTER_TAG = "nodemedic:cluster"
_LIVE = ["pending", "running", "stopping", "stopped"]


class EC2Provider:
    kind = "ec2"
    knows_new_instances = True  # the replacement is the same instance, restarted

    def __init__(self, ec2: Any, cluster: str, *, slurm_tagged: bool = True) -> None:
        """``slurm_tagged``: members carry ``nodemedic:slurm-node`` (Slurm); False on Kubernetes."""
        self._ec2 = ec2
        self._cluster = cluster
        self._slurm_tagged = slurm_tagged

    def _instances(self, *filters: dict[str, Any]) -> list[dict[str, Any]]:
        named = [{"Name": "tag-key", "Values": [SLURM_NODE_TAG]}] if self._slurm_tagged else []
        return ec2_instances(self._ec2, [
            {"Name": f"tag:{CLUSTER_TAG}", "Values": [self._cluster]},
            *named,  # on Slurm the controller carries the cluster tag too
            {"Name": "instance-state-name", "Values": _LIVE}, *filters])

    def member(self, instance_id: str) -> Member | None:
        found = self._instances({"Name": "instance-id", "Values": [instance_id]})
        return ec2_member(found[0]) if found else None

    def member_by_node(self, slurm_node: str) -> Member | None:
        return next((m for m in self.members() if m.slurm_node == slurm_node), None)

    def members(self) -> list[Member]:
        return [ec2_member(i) for i in self._instances()]

    def ended(self) -> list[Member]:
        """The cluster's instances that backed a Slurm node and that EC2 has ended since (it lists a
        terminated instance, its tags kept, for about an hour), in one listing."""
        return [ec2_member(i) for i in ec2_instances(self._ec2, [
            {"Name": f"tag:{CLUSTER_TAG}", "Values": [self._cluster]},
            {"Name": "tag-key", "Values": [SLURM_NODE_TAG]},
            {"Name": "instance-state-name", "Values": sorted(ENDED)}])]

    def size(self) -> int:
        return len(self._instances())

    def reboot(self, instance_ids: list[str]) -> None:
        reboot_ec2(self._ec2, instance_ids)

    def replace(self, instance_id: str, slurm_node: str, progress: dict[str, Any],
                claim: Callable[[str], bool]) -> ReplaceStep:
        done = dict(progress)
        state = self._state(instance_id)
        if not done.get("stop_requested"):
            if state in ("pending", "running"):
                self._call("stop_instances", instance_id)
            done["stop_requested"] = True
            state = self._state(instance_id)
        if state == "stopped":
            self._call("start_instances", instance_id)
            done["start_requested"] = True
            state = self._state(instance_id)
        if state == "running" and done.get("start_requested"):
            return ReplaceStep(done, instance_id)
        return ReplaceStep(done)  # stopping, or starting: the next step looks again

    def _state(self, instance_id: str) -> str:
        """The instance's state. One EC2 ended (someone else terminated it) is :class:`NodeGoneError`:
        nothing launches an instance in its place, so the incident is retired and the reconciler
        pages the node once with what to do. One that left the cluster otherwise (its tag taken
        off) is a :class:`ReplacementFailedError`."""
        found = self._instances({"Name": "instance-id", "Values": [instance_id]})
        if found:
            return str(found[0]["State"]["Name"])
        if (state := ended_state(self._ec2, instance_id)) is not None:
            raise NodeGoneError(f"EC2 ended {instance_id} ({state}) outside NodeMedic, and with Provider=ec2 nothing "
                                f"launches an instance in its place: launch one tagged {CLUSTER_TAG}={self._cluster}"
                                + (f" and {SLURM_NODE_TAG}=<node>" if self._slurm_tagged else ""))
        raise ReplacementFailedError(f"instance {instance_id} is no instance of cluster {self._cluster} now (its "
                                     f"{CLUSTER_TAG} tag taken off?); it cannot be stopped and started")

    def _call(self, operation: str, instance_id: str) -> None:
        try:
            getattr(self._ec2, operation)(InstanceIds=[instance_id])
        except ClientError as exc:
            if is_capacity_error(exc):
                raise CapacityError(f"EC2 has no capacity to start {instance_id} again: {exc}") from exc
            raise ReplacementFailedError(f"{operation} {instance_id}: {exc}") from exc
