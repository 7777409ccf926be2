"""A simulated GPU cluster in the embedded AWS: EC2 instances in an Auto Scaling group (or, on
Kubernetes with ``provider="karpenter"``, a Karpenter NodePool: :mod:`nodemedic_sandbox.karpenter`),
each backing one node of the local scheduler, plus a Slurm controller instance (on Slurm), or the
EKS cluster whose API server is the local one (on Kubernetes: :mod:`nodemedic_sandbox.kube_cluster`).

It is also the local mode's :class:`~nodemedic_sandbox.embedded_aws.CommandHost`: what SSM
Run Command sends to an instance runs on this machine, against the local scheduler, with
``NODEMEDIC_INSTANCE_ID`` telling node-side commands which instance they are on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from nodemedic.providers.base import SLURM_NODE_TAG
from nodemedic.providers.ec2 import CLUSTER_TAG
from nodemedic_agent.documents import run_script

from nodemedic_sandbox import faults as faults_file
from nodemedic_sandbox.aws_rules import SSM_AGENT_PATH
from nodemedic_sandbox.embedded_aws import ACCOUNT_ID, CommandOutcome, EmbeddedAWS
from nodemedic_sandbox.scheduler import Scheduler

if TYPE_CHECKING:
    from nodemedic_sandbox.karpenter import SimKarpenter
    from nodemedic_sandbox.kube_cluster import KubeScheduler, Machine

INSTANCE_TYPE = "p5.48xlarge"
IMAGE = "ami-0123456789abcdef0"
PROVIDERS = ("autoscaling", "karpenter")
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
    provider: str = "autoscaling"  # or karpenter (Kubernetes only): where the instances come from
    node_pool: str = "nodemedic-local-gpu"  # the Karpenter NodePool (provider karpenter)
    karpenter: SimKarpenter | None = None  # Karpenter's part (provider karpenter), once created
    controller_id: str = ""
    spares: list[str] = field(default_factory=list)  # nodes that start in the spare reservation
    spare_reservation: str = "nodemedic_spares"
    drain_prefix: str = "nodemedic"  # the template's DrainReasonPrefix default
    boot_seconds: float = 0.0  # how long a new or rebooted instance takes before it answers SSM
    commands: list[CommandLog] = field(default_factory=list)
    _booted: dict[str, float] = field(default_factory=dict)  # instance -> time.time() it answers again
    _registered: set[str] = field(default_factory=set)  # instances SSM knows: each came up once since launch

    @property
    def state_dir(self) -> Path:
        return self.scheduler.root

    @property
    def kubernetes(self) -> KubeScheduler | None:
        """The Kubernetes cluster, when the nodes run Kubernetes instead of Slurm."""
        return cast("KubeScheduler", self.scheduler) if self.scheduler.kind == "kubernetes" else None

    def create(self) -> None:
        """Launch one instance per scheduler node: on Slurm tagged with its node's name, beside a
        controller instance; on Kubernetes, each node registered with its instance as providerID."""
        if self.provider not in PROVIDERS or (self.provider == "karpenter" and self.kubernetes is None):
            raise ValueError(f"the local mode's providers: {', '.join(PROVIDERS)} (karpenter on Kubernetes only)")
        ec2 = self.aws.client("ec2")
        if self.kubernetes is None:
            controller = ec2.run_instances(ImageId=IMAGE, InstanceType="m7i.xlarge", MinCount=1, MaxCount=1,
                                           TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                               {"Key": "Name", "Value": "slurm-controller"},
                                               {"Key": CLUSTER_TAG, "Value": self.name}]}])
            self.controller_id = controller["Instances"][0]["InstanceId"]
        instances = self._karpenter_launch() if self.provider == "karpenter" else self._group_launch()
        self._booted = {i: 0.0 for i in [*instances, *filter(None, [self.controller_id])]}  # up before the pipeline
        self._registered = set(self._booted)
        nodes = dict(zip(instances, self.scheduler.nodes, strict=True))
        with faults_file.change(self.state_dir) as faults:
            faults.clear()  # members: the Slurm node each instance backs (the node check reads its slurmd)
            faults.update({"broken": {}, "bad_replacements": [], "members": {} if self.kubernetes else nodes})
        if self.kubernetes is not None:
            self._create_kubernetes(nodes)
            return
        for instance_id, node in nodes.items():
            # the Slurm node each backs, and (for the plain-EC2 provider) the cluster they form
            ec2.create_tags(Resources=[instance_id], Tags=[{"Key": SLURM_NODE_TAG, "Value": node},
                                                           {"Key": CLUSTER_TAG, "Value": self.name}])
        if self.spares:
            self._reserve(self.spares)

    def _group_launch(self) -> list[str]:
        """The Auto Scaling group of one instance per node; its instances, in id order."""
        ec2, asg = self.aws.client("ec2"), self.aws.client("autoscaling")
        ec2.create_launch_template(LaunchTemplateName=f"{self.asg_name}-lt",
                                   LaunchTemplateData={"ImageId": IMAGE, "InstanceType": INSTANCE_TYPE})
        n = len(self.scheduler.nodes)
        asg.create_auto_scaling_group(
            AutoScalingGroupName=self.asg_name, MinSize=n, MaxSize=n + 2, DesiredCapacity=n,
            LaunchTemplate={"LaunchTemplateName": f"{self.asg_name}-lt", "Version": "$Latest"},
            AvailabilityZones=[f"{self.aws.region}a"],
            # the tag the functions' SendCommand permission requires, on every instance it launches
            Tags=[{"Key": CLUSTER_TAG, "Value": self.name, "PropagateAtLaunch": True,
                   "ResourceId": self.asg_name, "ResourceType": "auto-scaling-group"}],
        )
        return sorted(i["InstanceId"] for i in asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.asg_name])["AutoScalingGroups"][0]["Instances"])

    def _karpenter_launch(self) -> list[str]:
        """The NodeClaim CRD on the API server, and Karpenter's static NodePool of one instance per
        node (it keeps that many from then on); its instances, in launch order."""
        from nodemedic_sandbox.karpenter import SimKarpenter, install_crd

        kube = self.kubernetes
        assert kube is not None
        install_crd(kube.api)
        # the EC2NodeClass's spec.tags: the cluster tag the functions' SendCommand permission requires
        karpenter = self.karpenter = SimKarpenter(
            self.aws.client("ec2"), kube.api, self.node_pool, len(self.scheduler.nodes),
            image=IMAGE, zone=f"{self.aws.region}a", tags={CLUSTER_TAG: self.name})
        return [karpenter.launch()[0] for _ in self.scheduler.nodes]

    def _create_kubernetes(self, nodes: dict[str, str]) -> None:
        """EKS's part: the cluster whose endpoint and CA are the local API server's, whose access
        entries go to its authenticator, which knows the functions' credentials as STS does. The
        kubelets' part: each instance's node registers (spares with NodeMedic's spare taint)."""
        kube = self.kubernetes
        assert kube is not None
        self.aws.client("eks").create_cluster(name=kube.eks_cluster, roleArn=f"arn:aws:iam::{ACCOUNT_ID}:role/eks",
                                              resourcesVpcConfig={"subnetIds": []})
        self.aws.point_eks_cluster(kube.eks_cluster, kube.server.url, kube.server.ca_file.read_bytes())
        kube.authenticator.credentials = self.aws.credentials
        self.aws.eks_access_entries[kube.eks_cluster] = kube.authenticator.add_access_entry
        machines = {m.instance_id: m for m in self._machines()}
        for instance_id, node in nodes.items():
            kube.register(node, machines[instance_id], spare=node in self.spares)
        kube.machines = self._machines
        if self.karpenter is not None:
            kube.controllers.append(self._karpenter_reconcile)
        kube.start_playing()

    def _karpenter_reconcile(self) -> list[str]:
        """Karpenter's reconcile; an instance it launches in place of one whose replacement was to
        be bad (:meth:`fail_replacement_of`) is that bad replacement."""
        karpenter = self.karpenter
        assert karpenter is not None
        before = set(karpenter.live)
        launched = karpenter.reconcile()
        gone = sorted(before - karpenter.live)
        if gone and launched:
            with faults_file.change(self.state_dir) as faults:
                bad = list(faults.get("bad_replacements_of", []))
                for old, new in zip([g for g in gone if g in bad], launched, strict=False):
                    bad.remove(old)
                    faults["broken"] = {**faults.get("broken", {}), new: "replace"}
                faults["bad_replacements_of"] = bad
        return launched

    def _machines(self) -> list[Machine]:
        """The group's instances, and the ones it had (terminated), as their kubelets see them."""
        from nodemedic_sandbox.kube_cluster import Machine

        found = self.aws.client("ec2").describe_instances(Filters=[{"Name": f"tag:{CLUSTER_TAG}",
                                                                    "Values": [self.name]}])
        now, hung = time.time(), set(self._hung())
        out = []
        for instance in (i for r in found["Reservations"] for i in r["Instances"]):
            instance_id = instance["InstanceId"]
            ready = self._booted.get(instance_id)
            if ready is None:  # launched by the group since: boots from its launch
                ready = instance["LaunchTime"].timestamp() + self.boot_seconds
            state = instance["State"]["Name"]
            out.append(Machine(instance_id, instance["Placement"]["AvailabilityZone"], instance["PrivateDnsName"],
                               running=state in ("pending", "running"), booted=ready <= now and instance_id not in hung,
                               terminated=state in ("shutting-down", "terminated")))
        return out

    def _reserve(self, nodes: list[str]) -> None:
        """The hot-spare pool the pipeline expects: a reservation of idle nodes (SpareReservation)."""
        env = {**os.environ, **self.scheduler.env}
        subprocess.run(["scontrol", "create", "reservation", f"reservationname={self.spare_reservation}",
                        f"nodes={','.join(nodes)}", "users=root", "starttime=now", "duration=infinite",
                        "flags=ignore_jobs"], env=env, check=True, capture_output=True, timeout=30)

    def spare_pool(self) -> list[str]:
        """The nodes in the spare pool now (read from Slurm's reservation, or Kubernetes's spare taint)."""
        if self.kubernetes is not None:
            return self.kubernetes.spares()
        env = {**os.environ, **self.scheduler.env}
        out = subprocess.run(["scontrol", "show", "reservation", self.spare_reservation, "-o"], env=env,
                             capture_output=True, text=True, timeout=30, check=False).stdout
        nodes = next((f.split("=", 1)[1] for f in out.split() if f.startswith("Nodes=")), "")
        return self.scheduler.hostnames(nodes) if nodes and nodes != "(null)" else []

    def template_parameters(self) -> dict[str, str]:
        node_cmd = f"{sys.executable} -m nodemedic_sandbox.node --state {self.state_dir}"
        if self.kubernetes is not None:
            scheduler = {"Orchestrator": "kubernetes", "EksClusterName": self.kubernetes.eks_cluster}
        else:
            scheduler = {"SlurmControllerInstanceId": self.controller_id, "SpareReservation": self.spare_reservation}
        capacity = ({"Provider": "karpenter", "KarpenterNodePool": self.node_pool} if self.provider == "karpenter"
                    else {"AutoScalingGroupName": self.asg_name})
        return {
            "ClusterName": self.name,
            **scheduler,
            **capacity,
            "NodeJoinCommand": f'{node_cmd} join "$SLURM_NODE"',
            "DeepHealthCheckCommand": f"{node_cmd} health-check --level quick",
            "FullHealthCheckCommand": f"{node_cmd} health-check --level full",
            "GpuResetCommand": f"{node_cmd} gpu-reset",
            "HotSpares": str(len(self.spares)),
            "CommandTimeoutSeconds": "60",
            # a rung's check waits for the boot; then a minute for the check itself
            "HealthCheckTimeoutSeconds": str(int(self.boot_seconds) + 60),
            "JobStartWaitSeconds": "30",
            # one sweep per sweeper run: the local mode fires the schedule at the sweep cadence
            "SilenceSweepsPerInvocation": "1",
        }

    # -- identity -------------------------------------------------------------------------
    def instance_of(self, node: str) -> str:
        if self.kubernetes is not None:  # the node's spec.providerID names it
            instance = self.kubernetes.instance_of(node)
            if instance is None:
                raise LookupError(f"no Kubernetes node {node} backed by an instance")
            return instance
        ec2 = self.aws.client("ec2")
        found = ec2.describe_instances(Filters=[
            {"Name": f"tag:{SLURM_NODE_TAG}", "Values": [node]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        ids = [i["InstanceId"] for r in found["Reservations"] for i in r["Instances"]]
        if len(ids) != 1:
            raise LookupError(f"{len(ids)} running instances back {node}")
        return str(ids[0])

    def group_instances(self) -> list[dict[str, str]]:
        groups = self.aws.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[self.asg_name])
        instances: list[dict[str, str]] = groups["AutoScalingGroups"][0]["Instances"]
        return instances

    # -- fault injection for the node-side health check -----------------------------------
    def fail_replacement_of(self, node: str) -> None:
        """The next instance that joins as ``node`` is bad hardware: it fails its deep health check.
        With Karpenter, the instance it launches once ``node``'s NodeClaim is gone."""
        if self.karpenter is not None:
            instance = self.instance_of(node)
            with faults_file.change(self.state_dir) as faults:
                faults["bad_replacements_of"] = [*faults.get("bad_replacements_of", []), instance]
            return
        with faults_file.change(self.state_dir) as faults:
            faults["bad_replacements"] = [*faults.get("bad_replacements", []), node]

    def break_node(self, node: str, fixed_by: str = "replace") -> str:
        """The hardware behind ``node`` fails its deep health check until ``fixed_by`` (a ladder
        rung: gpu_reset, reboot or replace) is applied to it. Returns the instance id."""
        instance = self.instance_of(node)
        with faults_file.change(self.state_dir) as faults:
            faults["broken"] = {**faults.get("broken", {}), instance: fixed_by}
        return instance

    def hang(self, node: str) -> None:
        """The instance behind ``node`` hangs: SSM commands time out until EC2 reboots it."""
        instance = self.instance_of(node)
        with faults_file.change(self.state_dir) as faults:
            faults["hung"] = [*faults.get("hung", []), instance]

    def _hung(self) -> list[str]:
        return list(faults_file.read(self.state_dir).get("hung", []))

    # -- CommandHost ------------------------------------------------------------------------
    def rebooted(self, instance_ids: list[str]) -> None:
        with faults_file.change(self.state_dir) as faults:
            faults["hung"] = [i for i in faults.get("hung", []) if i not in instance_ids]
            faults["broken"] = {i: rung for i, rung in faults.get("broken", {}).items()
                                if i not in instance_ids or rung == "replace"}
        for instance in instance_ids:
            self._booted[instance] = time.time() + self.boot_seconds

    def registered(self, instance_id: str, launched: float) -> bool:
        """SSM knows an instance once its agent came up: a new one at the end of its first boot,
        ``boot_seconds`` after its launch. A reboot or a stop does not unregister it."""
        if instance_id not in self._registered:
            if time.time() < launched + self.boot_seconds:
                return False
            self._registered.add(instance_id)
        return True

    def _wait_for_boot(self, instance_id: str, timeout_s: float) -> bool:
        """A rebooted or started instance answers SSM once it has booted again (the command waits,
        as SSM's does for an agent coming back). False if it does not boot within ``timeout_s``. A
        new instance has booted already: SSM sends it nothing before it is :meth:`registered`."""
        wait = self._booted.get(instance_id, 0.0) - time.time()
        if wait > timeout_s:
            return False
        if wait > 0:
            time.sleep(wait)
        return True

    def command_env(self, instance_id: str) -> dict[str, str]:
        """The environment a document's script runs in on ``instance_id`` (through SSM or the
        relay): SSM's agent's PATH, not this process's; this cluster's Slurm; TMPDIR, so the
        documents' lock files land in this cluster's state dir, gone with it."""
        return {**os.environ, "PATH": SSM_AGENT_PATH, **self.scheduler.env, "NODEMEDIC_INSTANCE_ID": instance_id,
                "TMPDIR": str(self.state_dir)}

    def run(self, instance_id: str, script: str, timeout_s: int) -> CommandOutcome:
        started = time.time()
        if self.kubernetes is not None:
            self._bad_replacement(instance_id)
        state = self._instance_state(instance_id)
        if state != "running":
            outcome = CommandOutcome("Undeliverable", -1, "", f"instance {instance_id} is {state}")
        elif instance_id in self._hung():  # a hung instance never answers: SSM times the command out
            outcome = CommandOutcome("TimedOut", -1, "", f"instance {instance_id} did not answer (hung)")
        elif not self._wait_for_boot(instance_id, timeout_s):
            outcome = CommandOutcome("TimedOut", -1, "", f"instance {instance_id} still booting")
        else:
            done = run_script(script, timeout_s, self.command_env(instance_id))
            outcome = CommandOutcome(done.status, done.exit_code, done.stdout, done.stderr)
        self.commands.append(CommandLog(instance_id, script, outcome.status, outcome.exit_code, outcome.stdout,
                                        started, time.time() - started))
        return outcome

    def _bad_replacement(self, instance_id: str) -> None:
        """On Kubernetes no join document runs on a replacement (its kubelet registers it): a
        replacement asked for by :meth:`fail_replacement_of` is found, at its first command, by the
        node tag the replace rung puts on it, and is bad hardware from then on."""
        if instance_id in faults_file.read(self.state_dir).get("checked", []):
            return
        tags = self.aws.client("ec2").describe_tags(Filters=[{"Name": "resource-id", "Values": [instance_id]},
                                                             {"Name": "key", "Values": [SLURM_NODE_TAG]}])["Tags"]
        with faults_file.change(self.state_dir) as faults:
            if tags and instance_id not in faults.get("checked", []):
                faults_file.take_bad_replacement(faults, tags[0]["Value"], instance_id)
            faults["checked"] = sorted({*faults.get("checked", []), instance_id})

    def _instance_state(self, instance_id: str) -> str:
        ec2 = self.aws.client("ec2")
        try:
            found = ec2.describe_instances(InstanceIds=[instance_id])
        except ec2.exceptions.ClientError:
            return "unknown"
        return str(found["Reservations"][0]["Instances"][0]["State"]["Name"])
