"""SageMaker HyperPod in the embedded AWS: moto 5.2.5 creates clusters and lists and describes
their nodes, but has no ``BatchRebootClusterNodes`` / ``BatchReplaceClusterNodes``, gives nodes
ids like ``workers-0`` instead of instance ids, and no host names. These hooks add what the
HyperPod provider uses, with the service's documented limits (1-25 node ids per batch call), and
the host name in ``ListClusterNodes`` summaries as well as in ``DescribeClusterNode`` (botocore's
model has ``PrivateDnsHostname`` in both), and ``StartClusterHealthCheck`` with the limits its API
reference states (1-99 configurations, each naming an instance group of the cluster; its instances
in that group), which shows the check as the node's status ``DeepHealthCheckInProgress`` until the
test ends it (:meth:`HyperPodEmulation.end_deep_check`). A batch call refuses a node HyperPod is
working on, as its API reference says (``InstanceIdInUse``: :attr:`HyperPodEmulation.in_use`;
``InvalidInstanceStatus``: a status in transition), where moto would reboot it. A replacement is
a new instance launched at the time of the request in the replaced node's instance group; it keeps
the replaced node's host name, which is what HyperPod's Slurm node names rely on (on EKS its
Kubernetes node name is new all the same, since the node is named after its instance)."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from moto.core.responses import ActionResult
from moto.core.utils import utcnow
from moto.sagemaker.exceptions import ValidationError
from moto.sagemaker.models import ClusterNode, sagemaker_backends
from moto.sagemaker.responses import SageMakerResponse

BATCH_LIMIT = 25
HOOKED = {"hyperpod node details": (ClusterNode, "describe"), "hyperpod node summary": (ClusterNode, "summary")}
ADDED = {  # moto has no handler for these actions; the hooks add one
    "hyperpod batch reboot": (SageMakerResponse, "batch_reboot_cluster_nodes"),
    "hyperpod batch replace": (SageMakerResponse, "batch_replace_cluster_nodes"),
    "hyperpod deep health check": (SageMakerResponse, "start_cluster_health_check"),
}
IN_TRANSITION = frozenset({"Pending", "ShuttingDown", "SystemUpdating", "DeepHealthCheckInProgress"})
DEEP_HEALTH_CHECKS = frozenset({"InstanceStress", "InstanceConnectivity"})  # botocore's model has a third, newer


@dataclass
class HyperPodEmulation:
    account_id: str
    region: str
    on_reboot: Callable[[list[str]], None] = lambda ids: None
    capacity: bool = True  # False: replacements fail for capacity, as HyperPod reports it
    calls: list[tuple[str, list[str]]] = field(default_factory=list)
    # nodes HyperPod is working on itself (its own repair after its health agent's verdict, an
    # operator's reboot): a batch call naming one fails for it with InstanceIdInUse
    in_use: set[str] = field(default_factory=set)
    deep_checks: list[tuple[str, list[str]]] = field(default_factory=list)  # (instance, checks) per request

    def _cluster(self, name: str) -> Any:
        cluster = sagemaker_backends[self.account_id][self.region].clusters.get(name)
        if cluster is None:
            raise ValidationError(message=f"Could not find cluster '{name}'.")
        return cluster

    def create_cluster(self, cluster_name: str, hostnames: list[str],
                       instance_type: str = "ml.p5.48xlarge") -> list[str]:
        """A HyperPod cluster of one instance group whose nodes have instance ids and the host names
        Slurm knows them by. (moto's CreateCluster handler reads ``TargetCount``, which boto3 does
        not accept, so the cluster is created in the backend directly.)"""
        sagemaker_backends[self.account_id][self.region].create_cluster(
            cluster_name=cluster_name, vpc_config={}, tags=[], instance_groups=[{
                "InstanceGroupName": "workers", "InstanceType": instance_type, "TargetCount": len(hostnames),
                "InstanceCount": len(hostnames), "ExecutionRole": f"arn:aws:iam::{self.account_id}:role/hyperpod",
                "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lifecycle/", "OnCreate": "on_create.sh"},
                "ThreadsPerCore": 1}])
        cluster = self._cluster(cluster_name)
        nodes = list(cluster.nodes.values())
        cluster.nodes.clear()
        for node, host in zip(nodes, hostnames, strict=True):
            node.instance_id = _instance_id()
            node.private_dns_hostname = host
            cluster.nodes[node.instance_id] = node
        return list(cluster.nodes)

    def describe(self, node: ClusterNode, original: Callable[[ClusterNode], dict[str, Any]]) -> dict[str, Any]:
        """``DescribeClusterNode``'s details, or with ``original`` the summary: both as HyperPod fills them."""
        details = original(node)
        details["InstanceStatus"] = {"Status": node.status, "Message": getattr(node, "status_message", "")}
        if host := getattr(node, "private_dns_hostname", None):
            details["PrivateDnsHostname"] = f"{host}.ec2.internal"
        return details

    def batch(self, operation: str, response: SageMakerResponse) -> ActionResult:
        body = json.loads(response.body or "{}")
        node_ids = list(body.get("NodeIds", []))
        if not 1 <= len(node_ids) <= BATCH_LIMIT:
            raise ValidationError(message=f"1 validation error detected: Value at 'nodeIds' failed to satisfy "
                                          f"constraint: Member must have length between 1 and {BATCH_LIMIT}")
        cluster = self._cluster(body["ClusterName"])
        self.calls.append((operation, node_ids))
        ok, failed = [], []
        for node_id in node_ids:
            node = cluster.nodes.get(node_id)
            if node is None:
                failed.append({"NodeId": node_id, "ErrorCode": "InstanceIdNotFound",
                               "Message": f"node {node_id} is not in the cluster"})
                continue
            # "Another operation is already in progress for this node" / "The instance is in a
            # state that does not allow rebooting. Wait for the instance to finish any ongoing
            # changes before retrying" (API reference, BatchRebootClusterNodesError and
            # BatchReplaceClusterNodesError); moto would reboot a node HyperPod is patching
            if node_id in self.in_use:
                failed.append({"NodeId": node_id, "ErrorCode": "InstanceIdInUse",
                               "Message": f"Another operation is already in progress for node {node_id}"})
                continue
            if node.status in IN_TRANSITION:
                failed.append({"NodeId": node_id, "ErrorCode": "InvalidInstanceStatus",
                               "Message": f"node {node_id} is {node.status}: wait for it to finish any ongoing changes"})
                continue
            ok.append(node_id)
            if operation == "replace":
                del cluster.nodes[node_id]
                new = copy.copy(node)
                new.instance_id = _instance_id()
                # a real launch takes minutes: the new node is launched after every node the request saw
                newest = max([node.launch_time, *(n.launch_time for n in cluster.nodes.values())])
                new.launch_time = max(utcnow(), newest + timedelta(milliseconds=1))
                new.status, new.status_message = (("Running", "") if self.capacity else
                                                  ("Failure", "InsufficientInstanceCapacity: no ml.p5.48xlarge "
                                                              "capacity in the Availability Zone"))
                cluster.nodes[new.instance_id] = new
        if operation == "reboot" and ok:
            self.on_reboot(ok)
        return ActionResult({"Successful": ok, "Failed": failed})


    def start_deep_check(self, response: SageMakerResponse) -> ActionResult:
        body = json.loads(response.body or "{}")
        cluster = self._cluster(body.get("ClusterName", ""))
        configurations = body.get("DeepHealthCheckConfigurations") or []
        if not 1 <= len(configurations) <= 99:
            raise ValidationError(message="1 validation error detected: Value at 'deepHealthCheckConfigurations' "
                                          "failed to satisfy constraint: Member must have length between 1 and 99")
        for configuration in configurations:
            group = configuration.get("InstanceGroupName")
            members = [n for n in cluster.nodes.values() if n.instance_group_name == group]
            checks = configuration.get("DeepHealthChecks") or []
            if not members:
                raise ValidationError(message=f"Instance group {group} not found in cluster {body['ClusterName']}")
            if not checks or not set(checks) <= DEEP_HEALTH_CHECKS:
                raise ValidationError(message=f"DeepHealthChecks must name some of {sorted(DEEP_HEALTH_CHECKS)}")
            named = configuration.get("InstanceIds") or [n.instance_id for n in members]
            strangers = [i for i in named if i not in {n.instance_id for n in members}]
            if strangers:
                raise ValidationError(message=f"Instances {strangers} are not in instance group {group}")
            for instance in named:
                node = cluster.nodes[instance]
                if node.status != "Running":  # assumed: HyperPod checks a node in service, not one in transition
                    raise ValidationError(message=f"Node {instance} is {node.status}, not Running")
                self.deep_checks.append((instance, list(checks)))
                node.status, node.status_message = "DeepHealthCheckInProgress", ""
        return ActionResult({"ClusterArn": cluster.arn})

    def set_status(self, cluster_name: str, instance_id: str, status: str) -> None:
        """HyperPod's own work on the node shows as its status (``SystemUpdating`` while it patches
        it), or ends (``Running``)."""
        self._cluster(cluster_name).nodes[instance_id].status = status

    def end_deep_check(self, cluster_name: str, instance_id: str, *, passed: bool, message: str = "") -> None:
        """HyperPod's deep check of the node ends: Running again, or Failure with ``message``."""
        node = self._cluster(cluster_name).nodes[instance_id]
        assert node.status == "DeepHealthCheckInProgress", node.status
        node.status, node.status_message = ("Running", "") if passed else ("Failure", message)


def _instance_id() -> str:
    return "i-" + "".join(random.choice("0123456789abcdef") for _ in range(17))


def hooks(emulation: HyperPodEmulation) -> list[tuple[Any, str, Any]]:
    original_describe, original_summary = ClusterNode.describe, ClusterNode.summary

    def describe(node: ClusterNode) -> dict[str, Any]:
        return emulation.describe(node, original_describe)

    def summary(node: ClusterNode) -> dict[str, Any]:
        return emulation.describe(node, original_summary)

    def reboot(response: SageMakerResponse) -> ActionResult:
        return emulation.batch("reboot", response)

    def replace(response: SageMakerResponse) -> ActionResult:
        return emulation.batch("replace", response)

    def deep_check(response: SageMakerResponse) -> ActionResult:
        return emulation.start_deep_check(response)

    return [(ClusterNode, "describe", describe), (ClusterNode, "summary", summary),
            (SageMakerResponse, "batch_reboot_cluster_nodes", reboot),
            (SageMakerResponse, "batch_replace_cluster_nodes", replace),
            (SageMakerResponse, "start_cluster_health_check", deep_check)]
