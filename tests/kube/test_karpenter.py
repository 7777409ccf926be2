"""Karpenter on EKS (Provider=karpenter): a NodePool's instances are the cluster, replace deletes the
node's NodeClaim through the API server, and the replacement is the pool's next launch.

No Karpenter runs here. The NodeClaim CRD is installed on the real API server (a schema that keeps
what Karpenter writes, with its status subresource), and ``_Karpenter``
(:class:`nodemedic_sandbox.karpenter.SimKarpenter`) plays Karpenter's part: it launches an instance
tagged as Karpenter tags it (``karpenter.sh/nodepool``, ``karpenter.sh/nodeclaim``; EC2NodeClass
``spec.tags``), records the NodeClaim's providerID and ``Launched`` condition, and the kubelet
registers the node; for a deleted NodeClaim it terminates the instance, and a static NodePool
(``spec.replicas``) launches another. The provider's calls to the API server run as the Lambda,
through its presigned token and the RBAC of deploy/kubernetes/rbac.yaml. The whole stack with
``Provider=karpenter``: tests/kube/test_karpenter_stack.py."""

from __future__ import annotations

import itertools
import uuid

import pytest
from kubernetes import client as k8s
from nodemedic.errors import CapacityError, ReplacementFailedError
from nodemedic.orchestrators.kubernetes import DRAIN_TAINT, KubernetesOrchestrator
from nodemedic.providers.karpenter import GROUP, NODECLAIMS, NODEPOOL_TAG, VERSION, KarpenterProvider
from nodemedic.providers.node_names import NamedByOrchestrator
from nodemedic_sandbox.eks_authenticator import EksAuthenticator
from nodemedic_sandbox.embedded_aws import EmbeddedAWS
from nodemedic_sandbox.karpenter import SimKarpenter, install_crd
from nodemedic_sandbox.kube_apiserver import KubeAPIServer

from tests.kube.conftest import EKS_CLUSTER, IMAGE, Cluster
from tests.kube.test_access import _as_lambda, lambda_identity, rbac  # noqa: F401 - fixtures

_hosts = itertools.count(1)


@pytest.fixture(scope="module")
def nodeclaim_crd(apiserver: KubeAPIServer) -> None:
    install_crd(apiserver.api_client())


class _Karpenter(SimKarpenter):
    """Karpenter's part for one NodePool, and the kubelet's: each launch registers its node."""

    def __init__(self, cluster: Cluster, aws: EmbeddedAWS, pool: str, replicas: int) -> None:
        super().__init__(aws.client("ec2"), cluster.api, pool, replicas, image=IMAGE, zone="us-east-1a")
        self.cluster = cluster
        self.nodes: dict[str, str] = {}  # instance -> node, while it runs

    def launch(self) -> tuple[str, str]:
        """A NodeClaim, its instance and, once the kubelet registers, its node: (instance, node)."""
        instance, provider_id = super().launch()
        # the kubelet names the node after its host, not its NodeClaim
        self.nodes[instance] = self.cluster.node(f"ip-10-0-0-{next(_hosts)}.ec2.internal", provider_id=provider_id,
                                                 labels={NODEPOOL_TAG: self.pool})
        return instance, self.nodes[instance]

    def reconcile(self) -> list[str]:
        launched = super().reconcile()
        self.nodes = {i: n for i, n in self.nodes.items() if i in self.live}
        return launched


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
