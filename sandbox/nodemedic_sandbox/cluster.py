"""A simulated GPU cluster in the embedded AWS: EC2 instances in an Auto Scaling group, each
backing one node of the local scheduler, plus a Slurm controller instance.

It is also the local mode's :class:`~nodemedic_sandbox.embedded_aws.CommandHost`: what SSM
Run Command sends to an instance runs on this machine, against the local scheduler, with
``NODEMEDIC_INSTANCE_ID`` telling node-side commands which instance they are on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodemedic.providers.base import SLURM_NODE_TAG

from nodemedic_sandbox.embedded_aws import CommandOutcome, EmbeddedAWS
from nodemedic_sandbox.scheduler import Scheduler

INSTANCE_TYPE = "p5.48xlarge"
GPUS_PER_INSTANCE = 8


@dataclass
class CommandLog:
    instance_id: str
    script: str
    status: str
    exit_code: int
    stdout: str
    started_at: float = 0.0  # time.time() when the command started on the instance
    seconds: float = 0.0  # how long it ran


@dataclass
class SimCluster:
    aws: EmbeddedAWS
    scheduler: Scheduler
    name: str = "local"
    asg_name: str = "nodemedic-local-gpu-nodes"
    controller_id: str = ""
    commands: list[CommandLog] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        return self.scheduler.root

    def create(self) -> None:
        """Launch the controller and one instance per scheduler node, tagged with its name."""
        ec2, asg = self.aws.client("ec2"), self.aws.client("autoscaling")
        image = "ami-0123456789abcdef0"
        controller = ec2.run_instances(ImageId=image, InstanceType="m7i.xlarge", MinCount=1, MaxCount=1,
                                       TagSpecifications=[{"ResourceType": "instance",
                                                           "Tags": [{"Key": "Name", "Value": "slurm-controller"}]}])
        self.controller_id = controller["Instances"][0]["InstanceId"]
        ec2.create_launch_template(LaunchTemplateName=f"{self.asg_name}-lt",
                                   LaunchTemplateData={"ImageId": image, "InstanceType": INSTANCE_TYPE})
        n = len(self.scheduler.nodes)
        asg.create_auto_scaling_group(
            AutoScalingGroupName=self.asg_name, MinSize=n, MaxSize=n + 2, DesiredCapacity=n,
            LaunchTemplate={"LaunchTemplateName": f"{self.asg_name}-lt", "Version": "$Latest"},
            AvailabilityZones=[f"{self.aws.region}a"],
        )
        instances = sorted(i["InstanceId"] for i in asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.asg_name])["AutoScalingGroups"][0]["Instances"])
        for instance_id, node in zip(instances, self.scheduler.nodes, strict=True):
            ec2.create_tags(Resources=[instance_id], Tags=[{"Key": SLURM_NODE_TAG, "Value": node}])
        members = dict(zip(instances, self.scheduler.nodes, strict=True))
        self._write_faults({"unhealthy": [], "unhealthy_replacements": 0, "members": members})

    def template_parameters(self) -> dict[str, str]:
        node_cmd = f"{sys.executable} -m nodemedic_sandbox.node --state {self.state_dir}"
        return {
            "ClusterName": self.name,
            "AutoScalingGroupName": self.asg_name,
            "SlurmControllerInstanceId": self.controller_id,
            "NodeJoinCommand": f"{node_cmd} join {{slurm_node}}",
            "DeepHealthCheckCommand": f"{node_cmd} health-check --level quick",
            "CommandTimeoutSeconds": "60",
            # one sweep per sweeper run: the local mode fires the schedule at the sweep cadence
            "SilenceSweepsPerInvocation": "1",
        }

    # -- identity -------------------------------------------------------------------------
    def instance_of(self, node: str) -> str:
        ec2 = self.aws.client("ec2")
        found = ec2.describe_instances(Filters=[
            {"Name": f"tag:{SLURM_NODE_TAG}", "Values": [node]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        ids = [i["InstanceId"] for r in found["Reservations"] for i in r["Instances"]]
        if len(ids) != 1:
            raise LookupError(f"{len(ids)} running instances back {node}")
        return ids[0]

    def group_instances(self) -> list[dict[str, str]]:
        groups = self.aws.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[self.asg_name])
        return groups["AutoScalingGroups"][0]["Instances"]

    # -- fault injection for the node-side health check -----------------------------------
    def _faults_path(self) -> Path:
        return self.state_dir / "faults.json"

    def _read_faults(self) -> dict[str, Any]:
        return dict(json.loads(self._faults_path().read_text()))

    def _write_faults(self, faults: dict[str, object]) -> None:
        self._faults_path().write_text(json.dumps(faults))

    def fail_next_replacements(self, count: int) -> None:
        """The next ``count`` instances that join the cluster fail their deep health check."""
        faults = self._read_faults()
        faults["unhealthy_replacements"] = count
        self._write_faults(faults)

    def hang(self, node: str) -> None:
        """The instance behind ``node`` hangs: SSM commands time out until EC2 reboots it."""
        faults = self._read_faults()
        faults["hung"] = [*faults.get("hung", []), self.instance_of(node)]
        self._write_faults(faults)

    def _hung(self) -> list[str]:
        return list(self._read_faults().get("hung", []))

    # -- CommandHost ------------------------------------------------------------------------
    def rebooted(self, instance_ids: list[str]) -> None:
        faults = self._read_faults()
        faults["hung"] = [i for i in faults.get("hung", []) if i not in instance_ids]
        self._write_faults(faults)

    def run(self, instance_id: str, script: str, timeout_s: int) -> CommandOutcome:
        started = time.time()
        state = self._instance_state(instance_id)
        if state != "running":
            outcome = CommandOutcome("Undeliverable", -1, "", f"instance {instance_id} is {state}")
        elif instance_id in self._hung():  # a hung instance never answers: SSM times the command out
            outcome = CommandOutcome("TimedOut", -1, "", f"instance {instance_id} did not answer (hung)")
        else:
            env = {**os.environ, **self.scheduler.env, "NODEMEDIC_INSTANCE_ID": instance_id}
            try:
                done = subprocess.run(["bash", "-c", script], env=env, capture_output=True,
                                      text=True, timeout=timeout_s, check=False)
                status = "Success" if done.returncode == 0 else "Failed"
                outcome = CommandOutcome(status, done.returncode, done.stdout, done.stderr)
            except subprocess.TimeoutExpired as exc:
                outcome = CommandOutcome("TimedOut", -1, str(exc.stdout or ""), "timed out")
        self.commands.append(CommandLog(instance_id, script, outcome.status, outcome.exit_code, outcome.stdout,
                                        started, time.time() - started))
        return outcome

    def _instance_state(self, instance_id: str) -> str:
        ec2 = self.aws.client("ec2")
        try:
            found = ec2.describe_instances(InstanceIds=[instance_id])
        except ec2.exceptions.ClientError:
            return "unknown"
        return str(found["Reservations"][0]["Instances"][0]["State"]["Name"])
