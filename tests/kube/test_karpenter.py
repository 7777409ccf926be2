"""Karpenter on EKS (Provider=karpenter): a NodePool's instances are the cluster, replace deletes the
node's NodeClaim through the API server, and the replacement is the pool's next launch.

No Karpenter runs here. The NodeClaim CRD is installed on the real API server (a schema that keeps
what Karpenter writes, with its status subresource), and ``_Karpenter`` plays Karpenter's part and
says which: it launches an instance tagged as Karpenter tags it (``karpenter.sh/nodepool``,
``karpenter.sh/nodeclaim``; EC2NodeClass ``spec.tags``), records the NodeClaim's providerID and
``Launched`` condition, and the kubelet registers the node; for a deleted NodeClaim it terminates
the instance, and a static NodePool (``spec.replicas``) launches another. The provider's calls to
the API server run as the Lambda, through its presigned token and the RBAC of
deploy/kubernetes/rbac.yaml."""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from nodemedic.errors import CapacityError, ReplacementFailedError
from nodemedic.orchestrators.kubernetes import DRAIN_TAINT, KubernetesOrchestrator
from nodemedic.providers.karpenter import GROUP, NODECLAIM_TAG, NODECLAIMS, NODEPOOL_TAG, VERSION, KarpenterProvider
from nodemedic.providers.node_names import NamedByOrchestrator
from nodemedic_sandbox.eks_authenticator import EksAuthenticator
from nodemedic_sandbox.embedded_aws import EmbeddedAWS
from nodemedic_sandbox.kube_apiserver import KubeAPIServer

from tests.kube.conftest import EKS_CLUSTER, IMAGE, Cluster
from tests.kube.test_access import _as_lambda, lambda_identity, rbac  # noqa: F401 - fixtures

_names = itertools.count(1)
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "nodeclaims.karpenter.sh"},
    "spec": {"group": GROUP, "scope": "Cluster",
             "names": {"kind": "NodeClaim", "plural": NODECLAIMS, "singular": "nodeclaim", "listKind": "NodeClaimList"},
             "versions": [{"name": VERSION, "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]}}


@pytest.fixture(scope="module")
def nodeclaim_crd(apiserver: KubeAPIServer) -> None:
    api = k8s.ApiextensionsV1Api(apiserver.api_client())
    try:
        api.create_custom_resource_definition(CRD)
    except ApiException as exc:
        if exc.status != 409:
            raise
    for _ in range(200):  # the API server serves a new resource within moments of accepting it
        conditions = api.read_custom_resource_definition("nodeclaims.karpenter.sh").status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        time.sleep(0.05)
    raise RuntimeError("the API server never established the NodeClaim CRD")


class _Karpenter:
    """Karpenter's part for one NodePool (see the module's docstring)."""

    def __init__(self, cluster: Cluster, aws: EmbeddedAWS, pool: str, replicas: int) -> None:
        self.cluster, self.ec2, self.pool, self.replicas = cluster, aws.client("ec2"), pool, replicas
        self.custom = k8s.CustomObjectsApi(cluster.api)
        self.nodes: dict[str, str] = {}  # instance -> node
        self.nodeclaim: dict[str, str] = {}  # instance -> its NodeClaim

    def launch(self) -> tuple[str, str]:
        """A NodeClaim, its instance and, once the kubelet registers, its node."""
        name = f"{self.pool}-{next(_names):05d}"
        instance = self.ec2.run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1, TagSpecifications=[{
            "ResourceType": "instance", "Tags": [{"Key": NODEPOOL_TAG, "Value": self.pool},
                                                 {"Key": NODECLAIM_TAG, "Value": name}]}])["Instances"][0]["InstanceId"]
        provider_id = f"aws:///us-east-1a/{instance}"
        self.custom.create_cluster_custom_object(GROUP, VERSION, NODECLAIMS, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {NODEPOOL_TAG: self.pool}}, "spec": {}})
        self._status(name, {"providerID": provider_id, "conditions": [{"type": "Launched", "status": "True"}]})
        self.nodeclaim[instance] = name  # the kubelet names the node after its host, not its NodeClaim
        self.nodes[instance] = self.cluster.node(f"ip-10-0-0-{next(_names)}.ec2.internal", provider_id=provider_id,
                                                 labels={NODEPOOL_TAG: self.pool})
        return instance, self.nodes[instance]

    def fail_launch(self, message: str) -> str:
        """A NodeClaim whose launch EC2 refused."""
        name = f"{self.pool}-{next(_names):05d}"
        self.custom.create_cluster_custom_object(GROUP, VERSION, NODECLAIMS, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {NODEPOOL_TAG: self.pool}}, "spec": {}})
        self._status(name, {"conditions": [{"type": "Launched", "status": "False",
                                            "reason": "LaunchFailed", "message": message}]})
        return name

    def _status(self, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_cluster_custom_object_status(GROUP, VERSION, NODECLAIMS, name, {"status": status})

    def claims(self) -> dict[str, Any]:
        listed = self.custom.list_cluster_custom_object(GROUP, VERSION, NODECLAIMS,
                                                        label_selector=f"{NODEPOOL_TAG}={self.pool}")
        return {c["metadata"]["name"]: c for c in listed["items"]}

    def reconcile(self) -> list[str]:
        """Terminate the instances whose NodeClaim is gone; a static pool launches up to its replicas."""
        live = {c["status"]["providerID"].rsplit("/", 1)[-1] for c in self.claims().values()
                if c.get("status", {}).get("providerID")}
        gone = [i for i in self.nodes if i not in live]
        if gone:
            self.ec2.terminate_instances(InstanceIds=gone)
            for instance in gone:
                self.nodes.pop(instance)
        return [self.launch()[0] for _ in range(self.replicas - len(self.nodes))]


@pytest.fixture
def karpenter(cluster: Cluster, aws: EmbeddedAWS, nodeclaim_crd: None) -> _Karpenter:
    return _Karpenter(cluster, aws, f"gpu-{uuid.uuid4().hex[:6]}", replicas=3)


def test_replace_deletes_the_nodeclaim_and_takes_the_pools_next_launch_as_the_lambda(
        apiserver: KubeAPIServer, cluster: Cluster, aws: EmbeddedAWS, karpenter: _Karpenter,
        lambda_identity: EksAuthenticator) -> None:  # noqa: F811 - the fixture imported above
    (old, node), (peer, _), _ = (karpenter.launch() for _ in range(3))
    stranger = aws.client("ec2").run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    as_lambda = _as_lambda(apiserver)
    provider = NamedByOrchestrator(KarpenterProvider(aws.client("ec2"), karpenter.pool, lambda: as_lambda),
                                   KubernetesOrchestrator(as_lambda))
    member = provider.member(old)
    assert member is not None and member.slurm_node == node and provider.size() == 3
    assert provider.member(stranger) is None  # not the pool's: nothing is ever done to it
    assert provider.member_by_node(node).instance_id == old  # type: ignore[union-attr]

    step = provider.replace(old, node, {}, claim=lambda _: True)
    assert step.instance_id is None and step.progress["nodeclaim"] == karpenter.nodeclaim[old]
    # deleted: Karpenter's termination controller takes it from here
    assert sorted(karpenter.claims()) == sorted(karpenter.nodeclaim[i] for i in karpenter.nodes if i != old)
    assert provider.replace(old, node, step.progress, claim=lambda _: True).instance_id is None  # nothing new yet

    refused = karpenter.fail_launch("InsufficientInstanceCapacity: no p5.48xlarge capacity in us-east-1a")
    with pytest.raises(CapacityError, match="InsufficientInstanceCapacity"):
        provider.replace(old, node, step.progress, claim=lambda _: True)
    k8s.CustomObjectsApi(cluster.api).delete_cluster_custom_object(GROUP, VERSION, NODECLAIMS, refused)

    [new] = karpenter.reconcile()  # the old instance terminated; the static pool launches one more
    offered: list[str] = []
    assert provider.replace(old, node, step.progress, claim=lambda c: bool(offered.append(c))).instance_id is None
    assert offered == [new]  # never a peer launched with the old node, never the old one
    step = provider.replace(old, node, step.progress, claim=lambda _: True)
    assert step.instance_id == new != peer
    orch = KubernetesOrchestrator(as_lambda)
    joined = orch.adopt(node, new, "nodemedic:inc-1 XID 79")
    assert joined == karpenter.nodes[new] != node and DRAIN_TAINT in cluster.taints(joined)
    assert provider.replace(old, node, step.progress, claim=lambda _: True).instance_id == new  # idempotent


def test_an_instance_karpenter_did_not_launch_is_never_replaced(
        cluster: Cluster, aws: EmbeddedAWS, karpenter: _Karpenter) -> None:
    karpenter.launch()
    stranger = aws.client("ec2").run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    provider = KarpenterProvider(aws.client("ec2"), karpenter.pool, lambda: cluster.api)
    with pytest.raises(ReplacementFailedError, match="not an instance Karpenter launched"):
        provider.replace(stranger, "gpu-x", {}, claim=lambda _: True)
    assert len(karpenter.claims()) == 1


def test_the_functions_build_the_karpenter_provider_from_their_settings(
        apiserver: KubeAPIServer, cluster: Cluster, aws: EmbeddedAWS, karpenter: _Karpenter,
        lambda_identity: EksAuthenticator, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """PROVIDER=karpenter: the stage functions' provider, named by the API server, with the function's token."""
    from nodemedic import wiring

    from tests.kube.test_access import _DescribeCluster, _sts

    instance, node = karpenter.launch()
    for name, value in {"CLUSTER_NAME": "prod-a", "INCIDENTS_TABLE": "t", "PROVIDER": "karpenter",
                        "KARPENTER_NODE_POOL": karpenter.pool, "ORCHESTRATOR": "kubernetes",
                        "EKS_CLUSTER_NAME": EKS_CLUSTER}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_CONTROLLER_INSTANCE_ID", raising=False)
    clients = {"eks": _DescribeCluster(apiserver), "sts": _sts(), "ec2": aws.client("ec2")}
    monkeypatch.setattr(wiring, "client", lambda service: clients[service])
    wiring.reset(keep_clients=True)
    try:
        provider = wiring.provider()
        assert provider.kind == "karpenter"
        assert provider.member_by_node(node).instance_id == instance  # type: ignore[union-attr]
        provider.replace(instance, node, {}, claim=lambda _: True)
        assert karpenter.claims() == {}  # deleted with the function's own token
    finally:
        wiring.reset(keep_clients=True)


def test_an_instance_karpenter_already_terminated_is_replaced_by_the_pools_next_launch(
        cluster: Cluster, aws: EmbeddedAWS, karpenter: _Karpenter) -> None:
    """Karpenter's own disruption (or node repair) terminated the instance first: there is nothing
    to delete, and the rung takes the pool's next launch as usual."""
    (old, node), _ = (karpenter.launch() for _ in range(2))
    k8s.CustomObjectsApi(cluster.api).delete_cluster_custom_object(GROUP, VERSION, NODECLAIMS, karpenter.nodeclaim[old])
    karpenter.replicas = 1
    assert karpenter.reconcile() == []  # terminated; nothing launched yet
    provider = KarpenterProvider(aws.client("ec2"), karpenter.pool, lambda: cluster.api)
    step = provider.replace(old, node, {}, claim=lambda _: True)
    assert step.progress["nodeclaim"] == karpenter.nodeclaim[old] and step.instance_id is None
    karpenter.replicas = 2
    [new] = karpenter.reconcile()
    assert provider.replace(old, node, step.progress, claim=lambda _: True).instance_id == new
