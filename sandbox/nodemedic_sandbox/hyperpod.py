"""SageMaker HyperPod in the embedded AWS: moto 5.2.5 creates clusters and lists and describes
their nodes, but has no ``BatchRebootClusterNodes`` / ``BatchReplaceClusterNodes``, gives nodes
ids like ``workers-0`` instead of instance ids, and no host names. These hooks add what the
HyperPod provider uses, with the service's documented limits (1-25 node ids per batch call), and
the host name in ``ListClusterNodes`` summaries as well as in ``DescribeClusterNode`` (botocore's
model has ``PrivateDnsHostname`` in both). A replacement is a new instance launched at the time of
the request in the replaced node's instance group; it keeps the replaced node's host name, which
is what HyperPod's Slurm node names rely on (on EKS its Kubernetes node name is new all the same,
since the node is named after its instance)."""

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
}


@dataclass
class HyperPodEmulation:
    account_id: str
    region: str
    on_reboot: Callable[[list[str]], None] = lambda ids: None
    capacity: bool = True  # False: replacements fail for capacity, as HyperPod reports it
    calls: list[tuple[str, list[str]]] = field(default_factory=list)

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
        if getattr(node, "private_dns_hostname", None):
            details["PrivateDnsHostname"] = f"{node.private_dns_hostname}.ec2.internal"
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

    return [(ClusterNode, "describe", describe), (ClusterNode, "summary", summary),
            (SageMakerResponse, "batch_reboot_cluster_nodes", reboot),
            (SageMakerResponse, "batch_replace_cluster_nodes", replace)]
