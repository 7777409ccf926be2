"""SageMaker HyperPod clusters: ``BatchRebootClusterNodes`` / ``BatchReplaceClusterNodes``
(at most 25 nodes per call). HyperPod node ids are EC2 instance ids; the Slurm node name is
the node's private DNS host name (``ip-10-1-2-3``), as HyperPod's Slurm lifecycle scripts set it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from nodemedic.errors import CapacityError, ReplacementFailedError
from nodemedic.providers.base import CAPACITY_ERRORS, Member, ReplaceStep, batches

BATCH_LIMIT = 25  # NodeIds per Batch*ClusterNodes call
_STATES = {"Running": "running", "Pending": "pending", "ShuttingDown": "shutting-down",
           "SystemUpdating": "pending", "DeepHealthCheckInProgress": "pending", "Failure": "failed"}


def _capacity(text: str) -> bool:
    return any(code in text for code in CAPACITY_ERRORS) or "capacity" in text.lower()


class HyperPodProvider:
    kind = "hyperpod"

    def __init__(self, sagemaker: Any, cluster_name: str) -> None:
        self._sm = sagemaker
        self._cluster = cluster_name

    def _node_ids(self) -> list[str]:
        ids: list[str] = []
        kwargs: dict[str, Any] = {"ClusterName": self._cluster}
        while True:
            page = self._sm.list_cluster_nodes(**kwargs)
            ids += [n["InstanceId"] for n in page.get("ClusterNodeSummaries", [])]
            if not page.get("NextToken"):
                return ids
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
        host = str(node.get("PrivateDnsHostname", "")).split(".")[0] or None
        status = node.get("InstanceStatus", {}).get("Status", "")
        topology = {"availability_zone": node.get("Placement", {}).get("AvailabilityZone", ""),
                    "instance_group": node.get("InstanceGroupName", "")}
        return Member(node["InstanceId"], host, _STATES.get(status, status.lower()), {},
                      {k: v for k, v in topology.items() if v})

    def member(self, instance_id: str) -> Member | None:
        node = self._describe(instance_id)
        return self._member(node) if node else None

    def member_by_node(self, slurm_node: str) -> Member | None:
        for node_id in self._node_ids():
            node = self._describe(node_id)
            if node and self._member(node).slurm_node == slurm_node:
                return self._member(node)
        return None

    def size(self) -> int:
        return len(self._node_ids())

    def reboot(self, instance_ids: list[str]) -> None:
        self._batch("batch_reboot_cluster_nodes", instance_ids)

    def _batch(self, operation: str, node_ids: list[str]) -> None:
        failed: list[dict[str, str]] = []
        for chunk in batches(node_ids, BATCH_LIMIT):
            failed += getattr(self._sm, operation)(ClusterName=self._cluster, NodeIds=chunk).get("Failed", [])
        if any(_capacity(f"{f.get('ErrorCode', '')} {f.get('Message', '')}") for f in failed):
            raise CapacityError(f"HyperPod {self._cluster} has no capacity: {failed}")
        if failed:
            raise ReplacementFailedError(f"HyperPod {operation} failed for {failed}")

    def replace_nodes(self, node_ids: list[str]) -> None:
        """Ask HyperPod to replace these nodes (batched, at most 25 per call)."""
        self._batch("batch_replace_cluster_nodes", node_ids)

    def replace(self, instance_id: str, slurm_node: str, progress: dict[str, Any],
                claim: Callable[[str], bool]) -> ReplaceStep:
        done = dict(progress)
        if not done.get("replace_requested"):
            self.replace_nodes([instance_id])
            done["replace_requested"] = True
            return ReplaceStep(done)
        for node_id in self._node_ids():
            node = self._describe(node_id)
            if node is None or self._member(node).slurm_node != slurm_node or node_id == instance_id:
                continue
            status = node.get("InstanceStatus", {})
            if status.get("Status") == "Running":
                return ReplaceStep(done, node_id)
            if status.get("Status") == "Failure" and _capacity(status.get("Message", "")):
                raise CapacityError(f"HyperPod cannot place a replacement for {slurm_node}: {status.get('Message')}")
        return ReplaceStep(done)
