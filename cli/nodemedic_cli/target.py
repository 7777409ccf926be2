"""Which deployed NodeMedic stack the CLI talks to, and the clients and adapters to reach it.

The stack is named with ``--stack`` or, failing that, by ``stack_name`` in ``samconfig.toml``
(what ``sam deploy --guided`` writes). Credentials and region come from the usual AWS chain,
``--profile`` and ``--region``; ``--endpoint-url`` points every client at an AWS emulator. The
local mode's tests build a :class:`Target` over the embedded AWS the same way.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from nodemedic.errors import NodeMedicError
from nodemedic.orchestrators.base import Orchestrator
from nodemedic.orchestrators.slurm import SlurmViaSSM
from nodemedic.providers.base import Provider
from nodemedic.providers.kinds import provider_for
from nodemedic.providers.node_names import NamedByOrchestrator
from nodemedic.providers.relay_command import RelayCommand
from nodemedic.providers.run_command import Commands, Documents, RunCommand
from nodemedic.safety.policy import SafetyPolicy, parse_policy
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger

if TYPE_CHECKING:
    from nodemedic.orchestrators.kubernetes import KubernetesOrchestrator


class TargetError(NodeMedicError):
    """The CLI cannot find or read the stack it was pointed at."""


def stack_from_samconfig(path: Path = Path("samconfig.toml")) -> str | None:
    """``stack_name`` of the default environment's deploy parameters, if the file names one."""
    if not path.is_file():
        return None
    try:
        config = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TargetError(f"{path} is not valid TOML: {exc}") from exc
    params = config.get("default", {}).get("deploy", {}).get("parameters", {})
    name = params.get("stack_name") or config.get("default", {}).get("global", {}).get("parameters", {}).get(
        "stack_name")
    return str(name) if name else None


@dataclass
class Target:
    stack: str
    session: Any = field(default_factory=boto3.Session)
    endpoint_url: str | None = None
    _clients: dict[str, Any] = field(default_factory=dict)

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self.session.client(service, endpoint_url=self.endpoint_url)
        return self._clients[service]

    @cached_property
    def _description(self) -> dict[str, Any]:
        try:
            stacks = self.client("cloudformation").describe_stacks(StackName=self.stack)["Stacks"]
        except ClientError as exc:
            if "does not exist" in str(exc):
                raise TargetError(f"stack {self.stack!r} does not exist in {self.session.region_name or 'the default region'}"
                                  " - name it with --stack, or deploy it (sam deploy --guided)") from exc
            raise TargetError(f"cannot read stack {self.stack!r}: {exc}") from exc
        except BotoCoreError as exc:
            raise TargetError(f"cannot reach AWS to read stack {self.stack!r}: {exc}") from exc
        return dict(stacks[0])

    @property
    def status(self) -> str:
        return str(self._description["StackStatus"])

    @cached_property
    def _resources(self) -> list[dict[str, Any]]:
        pages = self.client("cloudformation").get_paginator("list_stack_resources").paginate(StackName=self.stack)
        return [r for page in pages for r in page["StackResourceSummaries"]]

    def resources_of(self, resource_type: str) -> dict[str, str]:
        """Logical id -> physical id of the stack's resources of one type."""
        return {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in self._resources
                if r["ResourceType"] == resource_type}

    def resource_id(self, logical_id: str) -> str:
        for r in self._resources:
            if r["LogicalResourceId"] == logical_id:
                return str(r["PhysicalResourceId"])
        raise TargetError(f"stack {self.stack!r} has no resource {logical_id}: is it a NodeMedic stack of this version?")

    @property
    def account(self) -> str:
        return str(self._description["StackId"].split(":")[4])

    @property
    def region(self) -> str:
        return str(self._description["StackId"].split(":")[3])

    @property
    def partition(self) -> str:
        return str(self._description["StackId"].split(":")[1])

    @cached_property
    def outputs(self) -> dict[str, str]:
        return {o["OutputKey"]: o["OutputValue"] for o in self._description.get("Outputs", [])}

    @cached_property
    def parameters(self) -> dict[str, str]:
        return {p["ParameterKey"]: p.get("ParameterValue", "") for p in self._description.get("Parameters", [])}

    def output(self, key: str) -> str:
        if key not in self.outputs:
            raise TargetError(f"stack {self.stack!r} has no output {key}: is it a NodeMedic stack?")
        return self.outputs[key]

    @property
    def cluster(self) -> str:
        return self.parameters.get("ClusterName", "")

    @cached_property
    def ledger(self) -> Ledger:
        return Ledger(self.client("dynamodb"), self.output("IncidentsTableName"))

    @cached_property
    def control(self) -> ControlStore:
        return ControlStore(self.client("dynamodb"), self.output("IncidentsTableName"), self.cluster)

    def policy(self) -> SafetyPolicy:
        """The cluster's safety policy, read as the gate reads it; PolicyError when it is invalid."""
        name = self.output("SafetyPolicyParameterName")
        text = self.client("ssm").get_parameter(Name=name)["Parameter"]["Value"]
        return parse_policy(text, origin=f"safety policy {name}")

    @property
    def on_kubernetes(self) -> bool:
        return self.parameters.get("Orchestrator") == "kubernetes"

    @cached_property
    def kubernetes(self) -> KubernetesOrchestrator:
        """The EKS cluster's API server, with the operator's own credentials (their IAM principal
        needs an access entry in the cluster). One read first, so that a refusal is a
        :class:`TargetError` saying which access entry to create, not a failure of the command."""
        from kubernetes import client as k8s  # the Kubernetes client loads only when used
        from kubernetes.client.rest import ApiException
        from nodemedic.orchestrators.kubernetes import connect, refusal

        p = self.parameters
        cluster = p["EksClusterName"]
        try:
            orchestrator = connect(self.client("eks"), self.client("sts"), cluster,
                                   p.get("KubernetesDrainPolicy", ""), p.get("DrainReasonPrefix", "nodemedic"))
            k8s.CoreV1Api(orchestrator.api).list_node(limit=1)
        except (BotoCoreError, ClientError) as exc:
            raise TargetError(f"cannot reach EKS cluster {cluster}: {exc}") from exc
        except ApiException as exc:
            if exc.status not in (401, 403):
                raise TargetError(f"the API server of EKS cluster {cluster} failed: {refusal(exc)}") from exc
            raise TargetError(self._no_access(cluster, exc.status, exc.reason)) from exc
        return orchestrator

    def _no_access(self, cluster: str, status: int, reason: str) -> str:
        """What an operator refused by the API server needs: an access entry for their principal
        (401: none; 403: its groups may not read nodes), with the command that creates it."""
        from nodemedic.orchestrators.eks_auth import principal_of

        principal = principal_of(self.client("sts").get_caller_identity()["Arn"])
        if status == 401:
            what, verb = f"does not know {principal}", "create"
        else:
            what, verb = f"knows {principal}, but no group of its access entry may list nodes", "update"
        return (f"the API server of EKS cluster {cluster} {what} ({status} {reason}). Put it in NodeMedic's "
                f"groups: aws eks {verb}-access-entry --cluster-name {cluster} --principal-arn "
                f"{principal} --kubernetes-groups nodemedic:remediator (nodemedic:reader for the commands that only "
                f"read)")

    @cached_property
    def orchestrator(self) -> Orchestrator:
        """Slurm through the stack's documents (SSM Run Command, or the relay where the stack's
        SlurmChannel says so), or :attr:`kubernetes`."""
        if self.on_kubernetes:
            return self.kubernetes
        p = self.parameters
        ssm = RunCommand(self.client("ssm"), poll_interval=0.5)
        controller: Commands = ssm
        if p.get("SlurmChannel") == "relay":
            controller = RelayCommand(self.client("sqs"), self.output("RelayQueueUrl"), self.client("dynamodb"),
                                      self.output("IncidentsTableName"), poll_interval=0.5)
        return SlurmViaSSM(controller, p["SlurmControllerInstanceId"], int(p.get("CommandTimeoutSeconds") or 120),
                           Documents(self.cluster), spare_reservation=p.get("SpareReservation") or "nodemedic_spares",
                           nodes_runner=ssm)

    @cached_property
    def provider(self) -> Provider:
        p = self.parameters
        capacity = provider_for(p.get("Provider") or "autoscaling", self.client, cluster=self.cluster,
                                autoscaling_group=p.get("AutoScalingGroupName", ""),
                                hyperpod_cluster=p.get("HyperPodClusterName", ""),
                                karpenter_node_pool=p.get("KarpenterNodePool", ""),
                                kubernetes_api=lambda: self.kubernetes.api, on_kubernetes=self.on_kubernetes)
        if self.on_kubernetes:  # a node's spec.providerID names its instance
            return NamedByOrchestrator(capacity, self.kubernetes)
        return capacity
