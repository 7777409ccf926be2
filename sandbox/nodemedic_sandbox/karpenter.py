"""Karpenter's part, for a NodePool whose instances are a NodeMedic cluster (``Provider=karpenter``).

No Karpenter runs here. The NodeClaim CRD is installed on the real API server (a schema that keeps
what Karpenter writes, with its status subresource), and :class:`SimKarpenter` does what
Karpenter does for a static NodePool (``spec.replicas``), from the caller's thread:

- launch: an instance tagged as Karpenter tags it (``karpenter.sh/nodepool``,
  ``karpenter.sh/nodeclaim``, plus the EC2NodeClass's ``spec.tags``: here ``nodemedic:cluster``,
  which the functions' SSM permission requires, docs/kubernetes.md), and its NodeClaim with the
  ``providerID`` and the ``Launched`` condition. The kubelet on the instance registers the node
  (the local mode's kubelets, or the caller);
- reconcile: the instance of a deleted NodeClaim is terminated (Karpenter's termination
  controller), and the pool launches up to its replicas.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from nodemedic.providers.karpenter import GROUP, NODECLAIM_TAG, NODECLAIMS, NODEPOOL_TAG, VERSION

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{NODECLAIMS}.{GROUP}"},
    "spec": {"group": GROUP, "scope": "Cluster",
             "names": {"kind": "NodeClaim", "plural": NODECLAIMS, "singular": "nodeclaim", "listKind": "NodeClaimList"},
             "versions": [{"name": VERSION, "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]}}
_names = itertools.count(1)


def install_crd(api: Any) -> None:
    """Install the NodeClaim CRD (once) and wait until the API server serves it."""
    extensions = k8s.ApiextensionsV1Api(api)
    try:
        extensions.create_custom_resource_definition(CRD)
    except ApiException as exc:
        if exc.status != 409:
            raise
    for _ in range(200):  # the API server serves a new resource within moments of accepting it
        conditions = extensions.read_custom_resource_definition(CRD["metadata"]["name"]).status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        time.sleep(0.05)
    raise RuntimeError("the API server never established the NodeClaim CRD")


class SimKarpenter:
    """Karpenter's part for the static NodePool ``pool`` of ``replicas`` nodes (module docstring)."""

    def __init__(self, ec2: Any, api: Any, pool: str, replicas: int, *, image: str, zone: str,
                 tags: dict[str, str] | None = None, instance_type: str = "p5.48xlarge") -> None:
        self.ec2, self.pool, self.replicas = ec2, pool, replicas
        self.custom = k8s.CustomObjectsApi(api)
        self.image, self.zone, self.tags, self.instance_type = image, zone, tags or {}, instance_type
        self.nodeclaim: dict[str, str] = {}  # instance -> its NodeClaim, for every instance it launched
        self.live: set[str] = set()  # the instances it has not terminated

    def launch(self) -> tuple[str, str]:
        """A NodeClaim and its instance; returns (instance, providerID)."""
        name = self._new_claim()
        tags = {**self.tags, NODEPOOL_TAG: self.pool, NODECLAIM_TAG: name}
        instance = self.ec2.run_instances(
            ImageId=self.image, InstanceType=self.instance_type, MinCount=1, MaxCount=1,
            Placement={"AvailabilityZone": self.zone},
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        )["Instances"][0]["InstanceId"]
        provider_id = f"aws:///{self.zone}/{instance}"
        self._status(name, {"providerID": provider_id, "conditions": [{"type": "Launched", "status": "True"}]})
        self.nodeclaim[instance] = name
        self.live.add(instance)
        return instance, provider_id

    def fail_launch(self, message: str) -> str:
        """A NodeClaim whose launch EC2 refused (its ``Launched`` condition says why)."""
        name = self._new_claim()
        self._status(name, {"conditions": [{"type": "Launched", "status": "False",
                                            "reason": "LaunchFailed", "message": message}]})
        return name

    def _new_claim(self) -> str:
        """A NodeClaim of the pool, with no status yet; returns its name."""
        name = f"{self.pool}-{next(_names):05d}"
        self.custom.create_cluster_custom_object(GROUP, VERSION, NODECLAIMS, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {NODEPOOL_TAG: self.pool}}, "spec": {}})
        return name

    def _status(self, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_cluster_custom_object_status(GROUP, VERSION, NODECLAIMS, name, {"status": status})

    def claims(self) -> dict[str, Any]:
        """The pool's NodeClaims by name."""
        listed = self.custom.list_cluster_custom_object(GROUP, VERSION, NODECLAIMS,
                                                        label_selector=f"{NODEPOOL_TAG}={self.pool}")
        return {c["metadata"]["name"]: c for c in listed["items"]}

    def reconcile(self) -> list[str]:
        """Terminate the instances whose NodeClaim is gone; launch up to the pool's replicas.
        Returns the instances launched."""
        live = {c["status"]["providerID"].rsplit("/", 1)[-1] for c in self.claims().values()
                if c.get("status", {}).get("providerID")}
        gone = sorted(self.live - live)
        if gone:
            self.ec2.terminate_instances(InstanceIds=gone)
            self.live -= set(gone)
        return [self.launch()[0] for _ in range(self.replicas - len(self.live))]
