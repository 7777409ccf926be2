"""Capacity through Karpenter on EKS: the cluster is the instances of one NodePool.

Karpenter tags every instance it launches with ``karpenter.sh/nodepool`` and
``karpenter.sh/nodeclaim`` (EC2NodeClass ``spec.tags``, "The default set of tags"), so membership,
size and reboot need EC2 alone (``RebootInstances``: Karpenter has no reboot of its own).

Replace deletes the instance's NodeClaim through the API server. Karpenter's termination
controller then finishes the drain NodeMedic began and terminates the instance, and Karpenter
launches another: by itself for a static NodePool (``spec.replicas``, the StaticCapacity feature
gate, Karpenter ≥ 1.8: the form a fixed GPU training pool takes, e.g. on a Capacity Block), or for
the pods left pending on a dynamic one. The replacement is the first running instance of the pool
launched after every instance the pool had at the request (EC2's own launch times, so no clock of
NodeMedic's enters), which ``claim`` grants. A NodeClaim of the pool whose launch failed for lack
of capacity (its ``Launched`` condition) is a :class:`~nodemedic.errors.CapacityError`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from nodemedic.errors import CapacityError, ReplacementFailedError
from nodemedic.providers.base import CAPACITY_ERRORS, Member, ReplaceStep, ec2_instances, ec2_member, reboot_ec2

NODEPOOL_TAG = "karpenter.sh/nodepool"
NODECLAIM_TAG = "karpenter.sh/nodeclaim"
GROUP, VERSION, NODECLAIMS = "karpenter.sh", "v1", "nodeclaims"
_LIVE = ["pending", "running", "stopping", "stopped"]


def _capacity(text: str) -> bool:
    return any(code in text for code in CAPACITY_ERRORS) or "insufficient capacity" in text.lower()


class KarpenterProvider:
    kind = "karpenter"
    knows_new_instances = True  # launched after every instance the request saw

    def __init__(self, ec2: Any, node_pool: str, kubernetes_api: Callable[[], Any]) -> None:
        """``kubernetes_api()`` gives the API server's client; only replace calls it."""
        self._ec2 = ec2
        self._pool = node_pool
        self._api = kubernetes_api

    def _instances(self, *filters: dict[str, Any], live: bool = True) -> list[dict[str, Any]]:
        """The pool's instances (``live``: not terminated or shutting down)."""
        states = [{"Name": "instance-state-name", "Values": _LIVE}] if live else []
        return ec2_instances(self._ec2, [{"Name": f"tag:{NODEPOOL_TAG}", "Values": [self._pool]}, *states, *filters])

    def member(self, instance_id: str) -> Member | None:
        found = self._instances({"Name": "instance-id", "Values": [instance_id]})
        return ec2_member(found[0]) if found else None

    def member_by_node(self, slurm_node: str) -> Member | None:
        """Karpenter's nodes are named by the orchestrator (NamedByOrchestrator), never by a tag."""
        return None

    def members(self) -> list[Member]:
        return [ec2_member(i) for i in self._instances()]

    def size(self) -> int:
        return len(self._instances())

    def reboot(self, instance_ids: list[str]) -> None:
        reboot_ec2(self._ec2, instance_ids)

    def replace(self, instance_id: str, slurm_node: str, progress: dict[str, Any],
                claim: Callable[[str], bool]) -> ReplaceStep:
        done = dict(progress)
        if not done.get("requested_at"):
            done.update(self._request(instance_id))
            return ReplaceStep(done)
        if done.get("new_instance_id"):
            return ReplaceStep(done, str(done["new_instance_id"]))
        after, seen = datetime.fromisoformat(done["launched_after"]), set(done["launched_with_newest"])
        launched = sorted((i for i in self._instances() if i["LaunchTime"] >= after and i["InstanceId"] not in seen
                           and i["InstanceId"] != instance_id), key=lambda i: (i["LaunchTime"], i["InstanceId"]))
        for instance in launched:
            if instance["State"]["Name"] == "running" and claim(instance["InstanceId"]):
                done["new_instance_id"] = instance["InstanceId"]
                return ReplaceStep(done, instance["InstanceId"])
        self._raise_if_out_of_capacity(slurm_node)
        return ReplaceStep(done)

    def _request(self, instance_id: str) -> dict[str, Any]:
        """Delete the instance's NodeClaim; remember the newest launch in the pool at that moment.
        An instance Karpenter already terminated (its own disruption or repair) needs no delete."""
        pool = self._instances()
        found = ([i for i in pool if i["InstanceId"] == instance_id]
                 or self._instances({"Name": "instance-id", "Values": [instance_id]}, live=False))
        nodeclaim = ec2_member(found[0]).tags.get(NODECLAIM_TAG) if found else None
        if not found or not nodeclaim:
            raise ReplacementFailedError(f"{instance_id} is not an instance Karpenter launched for NodePool {self._pool}")
        if found[0]["State"]["Name"] in _LIVE:
            self._delete_nodeclaim(nodeclaim)
        newest = max((i["LaunchTime"] for i in pool), default=found[0]["LaunchTime"])
        return {"nodeclaim": nodeclaim, "launched_after": newest.isoformat(),
                "launched_with_newest": sorted(i["InstanceId"] for i in pool if i["LaunchTime"] == newest),
                "requested_at": datetime.now(UTC).isoformat()}

    def _custom_objects(self) -> Any:
        from kubernetes import client as k8s  # loaded only where a replacement is asked for

        return k8s.CustomObjectsApi(self._api())

    def _delete_nodeclaim(self, name: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self._custom_objects().delete_cluster_custom_object(GROUP, VERSION, NODECLAIMS, name)
        except ApiException as exc:
            if exc.status != 404:  # already gone: a retried step, or Karpenter's own disruption
                raise ReplacementFailedError(f"cannot delete NodeClaim {name}: {exc.status} {exc.reason}") from exc
        except ClientError as exc:  # the API server's token could not be made
            raise ReplacementFailedError(f"cannot reach the API server to delete NodeClaim {name}: {exc}") from exc

    def _raise_if_out_of_capacity(self, node: str) -> None:
        """A NodeClaim of the pool that has not launched and says why: no capacity."""
        from kubernetes.client.rest import ApiException

        try:
            claims = self._custom_objects().list_cluster_custom_object(
                GROUP, VERSION, NODECLAIMS, label_selector=f"{NODEPOOL_TAG}={self._pool}")
        except ApiException as exc:
            if exc.status in (401, 403):  # a deployment without the RBAC for NodeClaims: say so, never wait on
                raise ReplacementFailedError(f"cannot list NodeClaims of NodePool {self._pool}: {exc.status} "
                                             f"{exc.reason} (apply deploy/kubernetes/rbac.yaml)") from exc
            return  # the API server did not answer this time: the replacement is looked for again
        for nodeclaim in claims.get("items", []):
            launched = next((c for c in nodeclaim.get("status", {}).get("conditions", [])
                             if c.get("type") == "Launched"), None)
            why = f"{(launched or {}).get('reason', '')} {(launched or {}).get('message', '')}"
            if launched and launched.get("status") == "False" and _capacity(why):
                raise CapacityError(f"Karpenter cannot launch a replacement for {node} in NodePool {self._pool}: "
                                    f"{why.strip()}")
