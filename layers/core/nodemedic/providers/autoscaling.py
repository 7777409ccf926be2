"""Capacity through an EC2 Auto Scaling group: replace = terminate without decrementing; the
group launches a new instance, which NodeMedic claims and tags with the Slurm node it backs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from nodemedic.errors import CapacityError, ProviderBusyError, ReplacementFailedError
from nodemedic.providers.base import (
    CAPACITY_ERRORS,
    ENDED,
    SLURM_NODE_TAG,
    Member,
    ReplaceStep,
    batches,
    ec2_instances,
    ec2_member,
    reboot_ec2,
)

# what TerminateInstanceInAutoScalingGroup answers while the group is busy: "You already have a
# pending update to an Amazon EC2 Auto Scaling resource" / "The operation can't be performed because
# there are scaling activities in progress" (Amazon EC2 Auto Scaling API reference, its Errors)
_BUSY = {"ResourceContention", "ResourceContentionFault", "ScalingActivityInProgress", "ScalingActivityInProgressFault"}
# what it answers for an instance the group no longer manages (ended or detached by someone else
# since NodeMedic read the group): ValidationError "Instance Id not found - No managed instance
# found for instance ID i-..."
_UNMANAGED = "No managed instance found"


class AutoScalingProvider:
    kind = "autoscaling"
    knows_new_instances = False  # the group's instances are alike but for their node tag

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
        return next((m for m in self.members() if m.slurm_node == slurm_node), None)

    def members(self) -> list[Member]:
        ids = [i["InstanceId"] for i in self._group_instances()]
        found = [i for chunk in batches(ids, 100) for i in ec2_instances(self._ec2, [{"Name": "instance-id", "Values": chunk}])]
        return [ec2_member(i) for i in found if i["State"]["Name"] not in ENDED]

    def ended(self) -> list[Member]:
        """The group's instances that backed a Slurm node and that EC2 has ended since (it lists a
        terminated instance, its tags kept, for about an hour), in one listing."""
        return [ec2_member(i) for i in ec2_instances(self._ec2, [
            {"Name": "tag:aws:autoscaling:groupName", "Values": [self._group]},
            {"Name": "tag-key", "Values": [SLURM_NODE_TAG]},
            {"Name": "instance-state-name", "Values": sorted(ENDED)}])]

    def reboot(self, instance_ids: list[str]) -> None:
        reboot_ec2(self._ec2, instance_ids)

    def replace(self, instance_id: str, slurm_node: str, progress: dict[str, Any],
                claim: Callable[[str], bool]) -> ReplaceStep:
        done = dict(progress)
        if not done.get("requested_at"):
            self._terminate(instance_id)
            done["requested_at"] = datetime.now(UTC).isoformat()
        new = done.get("new_instance_id")
        if not new:
            new = next((c for c in self._candidates(exclude=instance_id) if claim(c)), None)
            if new is None:
                self._raise_if_out_of_capacity(datetime.fromisoformat(done["requested_at"]))
                return ReplaceStep(done)
            self._ec2.create_tags(Resources=[new], Tags=[{"Key": SLURM_NODE_TAG, "Value": slurm_node}])
            done["new_instance_id"] = new
        return ReplaceStep(done, str(new))

    def _terminate(self, instance_id: str) -> None:
        found = self._describe([instance_id])
        if not found or found[0]["State"]["Name"] in ENDED:
            return
        if instance_id not in {i["InstanceId"] for i in self._group_instances()}:
            return
        try:
            self._asg.terminate_instance_in_auto_scaling_group(
                InstanceId=instance_id, ShouldDecrementDesiredCapacity=False)
        except ClientError as exc:
            if _UNMANAGED in exc.response.get("Error", {}).get("Message", ""):
                return  # it left the group since: the group launches another in its place either way
            if exc.response.get("Error", {}).get("Code") in _BUSY:  # another replacement's launch, a refresh
                raise ProviderBusyError(f"Auto Scaling group {self._group} is busy; {instance_id} is terminated once "
                                        f"it is not: {exc}") from exc
            raise ReplacementFailedError(f"cannot terminate {instance_id}: {exc}") from exc

    def _candidates(self, exclude: str) -> list[str]:
        """In-service instances that back no Slurm node yet, oldest first."""
        in_service = [
            i["InstanceId"] for i in self._group_instances()
            if i["LifecycleState"] == "InService" and i["HealthStatus"] == "Healthy" and i["InstanceId"] != exclude
        ]
        instances = [i for i in self._describe(in_service)
                     if i["State"]["Name"] == "running" and ec2_member(i).slurm_node is None]
        instances.sort(key=lambda i: (i["LaunchTime"], i["InstanceId"]))
        return [i["InstanceId"] for i in instances]

    def _raise_if_out_of_capacity(self, since: datetime) -> None:
        """The group launches asynchronously; its newest launch activity since the request says
        whether EC2 refused it for capacity (the group keeps retrying by itself). From the start of
        the request's second: an activity's time may be whole seconds, and a launch that failed
        for capacity just before the request says as much of the capacity as one after it."""
        activities = self._asg.describe_scaling_activities(AutoScalingGroupName=self._group, MaxRecords=20)
        since = since.replace(microsecond=0)
        launches = [a for a in activities.get("Activities", [])
                    if a.get("StartTime") and a["StartTime"] >= since and "Launching" in a.get("Description", "")]
        if not launches:
            return
        latest = max(launches, key=lambda a: a["StartTime"])
        message = latest.get("StatusMessage", "")
        if latest.get("StatusCode") == "Failed" and any(code in message for code in CAPACITY_ERRORS):
            raise CapacityError(f"Auto Scaling group {self._group} cannot launch a replacement: {message}")

