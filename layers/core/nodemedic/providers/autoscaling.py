"""Capacity through an EC2 Auto Scaling group: replace = terminate without decrementing."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from nodemedic.errors import ReplacementFailedError
from nodemedic.providers.base import SLURM_NODE_TAG, Member, ec2_member

_GONE = {"shutting-down", "terminated"}


class AutoScalingProvider:
    def __init__(self, autoscaling: Any, ec2: Any, group_name: str) -> None:
        self._asg = autoscaling
        self._ec2 = ec2
        self._group = group_name

    def _describe_group(self) -> dict[str, Any]:
        groups = self._asg.describe_auto_scaling_groups(AutoScalingGroupNames=[self._group])
        if not groups["AutoScalingGroups"]:
            raise ReplacementFailedError(f"Auto Scaling group {self._group} does not exist")
        return dict(groups["AutoScalingGroups"][0])

    def _group_instances(self) -> list[dict[str, Any]]:
        return list(self._describe_group()["Instances"])

    def size(self) -> int:
        return int(self._describe_group()["DesiredCapacity"])

    def _describe(self, instance_ids: list[str]) -> list[dict[str, Any]]:
        if not instance_ids:
            return []
        try:
            resp = self._ec2.describe_instances(InstanceIds=instance_ids)
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "InvalidInstanceID.NotFound":
                return []
            raise
        return [i for r in resp["Reservations"] for i in r["Instances"]]

    def member(self, instance_id: str) -> Member | None:
        if instance_id not in {i["InstanceId"] for i in self._group_instances()}:
            return None
        found = self._describe([instance_id])
        return ec2_member(found[0]) if found else None

    def member_by_node(self, slurm_node: str) -> Member | None:
        ids = [i["InstanceId"] for i in self._group_instances()]
        for instance in self._describe(ids):
            member = ec2_member(instance)
            if member.slurm_node == slurm_node and member.state not in _GONE:
                return member
        return None

    def start_replacement(self, instance_id: str) -> bool:
        found = self._describe([instance_id])
        if not found or found[0]["State"]["Name"] in _GONE:
            return False
        if instance_id not in {i["InstanceId"] for i in self._group_instances()}:
            return False
        try:
            self._asg.terminate_instance_in_auto_scaling_group(
                InstanceId=instance_id, ShouldDecrementDesiredCapacity=False
            )
        except ClientError as exc:
            raise ReplacementFailedError(f"cannot terminate {instance_id}: {exc}") from exc
        return True

    def replacement_candidates(self, exclude: str) -> list[str]:
        in_service = [
            i["InstanceId"]
            for i in self._group_instances()
            if i["LifecycleState"] == "InService"
            and i["HealthStatus"] == "Healthy"
            and i["InstanceId"] != exclude
        ]
        instances = [
            i for i in self._describe(in_service)
            if i["State"]["Name"] == "running" and ec2_member(i).slurm_node is None
        ]
        instances.sort(key=lambda i: (i["LaunchTime"], i["InstanceId"]))
        return [i["InstanceId"] for i in instances]

    def assign_node(self, instance_id: str, slurm_node: str) -> None:
        self._ec2.create_tags(
            Resources=[instance_id], Tags=[{"Key": SLURM_NODE_TAG, "Value": slurm_node}]
        )

    def reboot(self, instance_id: str) -> None:
        try:
            self._ec2.reboot_instances(InstanceIds=[instance_id])
        except ClientError as exc:
            raise ReplacementFailedError(f"cannot reboot {instance_id}: {exc}") from exc
