"""SageMaker HyperPod clusters, Slurm- or EKS-orchestrated: ``BatchRebootClusterNodes`` /
``BatchReplaceClusterNodes`` (at most 25 nodes per call; AWS calls these APIs the preferred
recovery path on both orchestrators). HyperPod node ids are EC2 instance ids. On Slurm the node
name is the node's private DNS host name (``ip-10-1-2-3``), as HyperPod's lifecycle scripts set
it; on EKS the Kubernetes node name comes from the node's ``spec.providerID``
(:class:`~nodemedic.providers.node_names.NamedByOrchestrator`).

A replacement is found by what HyperPod documents rather than by a name: a node of the replaced
node's instance group launched after every node the group had when the replacement was asked
for (both launch times are HyperPod's own, so no clock of NodeMedic's enters). On EKS the
replacement's node name is new — it carries the new instance id — so a name could never find it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from nodemedic.errors import CapacityError, InstanceGoneError, ProviderBusyError, ReplacementFailedError
from nodemedic.providers.base import CAPACITY_ERRORS, Member, ReplaceStep, batches

BATCH_LIMIT = 25  # NodeIds per Batch*ClusterNodes call
# HyperPod's instance-level deep health check: hardware stress (CPU, memory, disk, GPU/PCI), DCGM
# diagnostics and EFA loopback on the one node (InstanceConnectivity needs two nodes and more)
# https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-resiliency-slurm-deep-health-checks.html
INSTANCE_STRESS = "InstanceStress"
# what Batch{Reboot,Replace}ClusterNodes answers for a node HyperPod is working on: "Another operation
# is already in progress for this node" / "a state that does not allow rebooting. Wait for the
# instance to finish any ongoing changes before retrying" (API reference, BatchRebootClusterNodesError
# and BatchReplaceClusterNodesError)
BUSY_ERRORS = frozenset({"InstanceIdInUse", "InvalidInstanceStatus"})
# the node is not in the cluster (any more): HyperPod replaced it itself, or it was removed
GONE_ERRORS = frozenset({"InstanceIdNotFound"})
# a fault on HyperPod's side for that node (the fourth code the API reference lists): asked again
TRANSIENT_ERRORS = frozenset({"InternalServerError"})
_STATES = {"Running": "running", "Pending": "pending", "ShuttingDown": "shutting-down",
           "SystemUpdating": "pending", "DeepHealthCheckInProgress": "pending", "Failure": "failed"}


@dataclass(frozen=True)
class ClusterNodeStatus:
    """A node as ``DescribeClusterNode`` shows it: ``InstanceStatus`` and the node's instance group."""

    status: str
    message: str
    instance_group: str


def _capacity(text: str) -> bool:
    return any(code in text for code in CAPACITY_ERRORS) or "capacity" in text.lower()


def _host(node: dict[str, Any]) -> str | None:
    return str(node.get("PrivateDnsHostname", "")).split(".")[0] or None


class HyperPodProvider:
    kind = "hyperpod"
    knows_new_instances = True  # launched after every node the request saw

    def __init__(self, sagemaker: Any, cluster_name: str) -> None:
        self._sm = sagemaker
        self._cluster = cluster_name

    def _summaries(self) -> list[dict[str, Any]]:
        """Every node of the cluster as ``ListClusterNodes`` summarizes it (instance group, launch
        time, status and host name: no per-node call is needed to find one)."""
        nodes: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"ClusterName": self._cluster}
        while True:
            page = self._sm.list_cluster_nodes(**kwargs)
            nodes += page.get("ClusterNodeSummaries", [])
            if not page.get("NextToken"):
                return nodes
            kwargs["NextToken"] = page["NextToken"]

    def _describe(self, node_id: str) -> dict[str, Any] | None:
        try:
            return dict(self._sm.describe_cluster_node(ClusterName=self._cluster, NodeId=node_id)["NodeDetails"])
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("ValidationException", "ResourceNotFound"):
                return None
            raise

    @staticmethod
    def _member(node: dict[str, Any]) -> Member:
        status = node.get("InstanceStatus", {}).get("Status", "")
        topology = {"availability_zone": node.get("Placement", {}).get("AvailabilityZone", ""),
                    "instance_group": node.get("InstanceGroupName", ""),
                    "image": node.get("CurrentImageId", "")}  # DescribeClusterNode's; a summary has none
        return Member(node["InstanceId"], _host(node), _STATES.get(status, status.lower()), {},
                      {k: v for k, v in topology.items() if v})

    def member(self, instance_id: str) -> Member | None:
        node = self._describe(instance_id)
        return self._member(node) if node else None

    def node_status(self, instance_id: str) -> ClusterNodeStatus | None:
        """HyperPod's status of the node, its message and instance group (one ``DescribeClusterNode``),
        or None where the node is not (or no longer) in the cluster."""
        node = self._describe(instance_id)
        if node is None:
            return None
        status = node.get("InstanceStatus", {})
        return ClusterNodeStatus(str(status.get("Status", "")), str(status.get("Message", "")),
                                 str(node.get("InstanceGroupName", "")))

    def start_deep_check(self, instance_id: str, instance_group: str) -> None:
        """Ask HyperPod for its instance-level deep health check of the node, a member of
        ``instance_group`` (``StartClusterHealthCheck``); ``DescribeClusterNode`` shows it running
        as ``DeepHealthCheckInProgress``."""
        self._sm.start_cluster_health_check(ClusterName=self._cluster, DeepHealthCheckConfigurations=[{
            "InstanceGroupName": instance_group, "InstanceIds": [instance_id], "DeepHealthChecks": [INSTANCE_STRESS]}])

    def member_by_node(self, slurm_node: str) -> Member | None:
        found = next((n for n in self._summaries() if _host(n) == slurm_node
                      and n.get("InstanceStatus", {}).get("Status") != "ShuttingDown"), None)
        return self.member(found["InstanceId"]) if found else None

    def members(self) -> list[Member]:
        """From ``ListClusterNodes`` alone: its summaries carry the instance, status, group and host."""
        return [self._member(n) for n in self._summaries() if n.get("InstanceStatus", {}).get("Status") != "ShuttingDown"]

    def size(self) -> int:
        return len(self._summaries())

    def reboot(self, instance_ids: list[str]) -> None:
        self._batch("batch_reboot_cluster_nodes", instance_ids)

    def _batch(self, operation: str, node_ids: list[str]) -> None:
        failed: list[dict[str, str]] = []
        for chunk in batches(node_ids, BATCH_LIMIT):
            failed += getattr(self._sm, operation)(ClusterName=self._cluster, NodeIds=chunk).get("Failed", [])
        if any(_capacity(f"{f.get('ErrorCode', '')} {f.get('Message', '')}") for f in failed):
            raise CapacityError(f"HyperPod {self._cluster} has no capacity: {failed}")
        if failed and all(f.get("ErrorCode") in GONE_ERRORS for f in failed):
            raise InstanceGoneError(f"{', '.join(f.get('NodeId', '?') for f in failed)} is no longer a node of HyperPod "
                                    f"cluster {self._cluster} (HyperPod replaced it itself, or it was removed): {failed}")
        if failed and all(f.get("ErrorCode") in BUSY_ERRORS | TRANSIENT_ERRORS for f in failed):
            nodes = ", ".join(f.get("NodeId", "?") for f in failed)
            raise ProviderBusyError(f"HyperPod is working on {nodes} itself; {operation} waits until that ends: {failed}"
                                    if all(f.get("ErrorCode") in BUSY_ERRORS for f in failed)
                                    else f"HyperPod could not {operation} {nodes} now; asked again: {failed}")
        if failed:
            raise ReplacementFailedError(f"HyperPod {operation} failed for {failed}")

    def replace_nodes(self, node_ids: list[str]) -> None:
        """Ask HyperPod to replace these nodes (batched, at most 25 per call)."""
        self._batch("batch_replace_cluster_nodes", node_ids)

    def replace(self, instance_id: str, slurm_node: str, progress: dict[str, Any],
                claim: Callable[[str], bool]) -> ReplaceStep:
        """Request the replacement once, remembering the node's instance group and the newest launch
        in it; then take the first running node of that group launched later that ``claim`` grants."""
        done = dict(progress)
        if not done.get("requested_at"):
            nodes = self._summaries()
            group = next((n.get("InstanceGroupName", "") for n in nodes if n["InstanceId"] == instance_id), None)
            if group is None:
                raise InstanceGoneError(f"{instance_id} is no longer a node of HyperPod cluster {self._cluster} "
                                        "(HyperPod replaced it itself, or it was removed)")
            newest = max(n["LaunchTime"] for n in nodes if n.get("InstanceGroupName") == group and n.get("LaunchTime"))
            self.replace_nodes([instance_id])
            done.update(instance_group=group, launched_after=newest.isoformat(),
                        requested_at=datetime.now(UTC).isoformat())
            return ReplaceStep(done)
        if done.get("new_instance_id"):
            return ReplaceStep(done, str(done["new_instance_id"]))
        after = datetime.fromisoformat(done["launched_after"])
        launched = sorted((n for n in self._summaries()
                           if n.get("InstanceGroupName") == done["instance_group"]
                           and n.get("LaunchTime") and n["LaunchTime"] > after),
                          key=lambda n: (n["LaunchTime"], n["InstanceId"]))
        for node in launched:
            if node.get("InstanceStatus", {}).get("Status") == "Running" and claim(node["InstanceId"]):
                done["new_instance_id"] = node["InstanceId"]
                return ReplaceStep(done, node["InstanceId"])
        failures = [n.get("InstanceStatus", {}).get("Message", "") for n in launched
                    if n.get("InstanceStatus", {}).get("Status") == "Failure"]
        if any(_capacity(m) for m in failures):
            raise CapacityError(f"HyperPod cannot place a replacement for {slurm_node}: {failures[-1]}")
        return ReplaceStep(done)
