"""HyperPod orchestrated by EKS: HyperPod's own reboot/replace APIs do the work, the Kubernetes
node names the instance (``hyperpod-i-…``, providerID ``aws:///<az>/sagemaker/cluster/hyperpod-<id>-i-…``),
and a replacement registers under a new name, since its name carries its new instance id. The
HyperPod provider finds the replacement by its instance group and launch time (a name could never
find it), and the Repair stage's adopt() finds its node by providerID once the kubelet registers it."""

from __future__ import annotations

from nodemedic.orchestrators.kubernetes import DRAIN_TAINT, KubernetesOrchestrator
from nodemedic.providers.hyperpod import HyperPodProvider
from nodemedic.providers.node_names import NamedByOrchestrator
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from tests.kube.conftest import Cluster


def _register(cluster: Cluster, instance_id: str) -> str:
    """The kubelet's part: a HyperPod node registers under a name that carries its instance id."""
    return cluster.node(f"hyperpod-{instance_id}",
                        provider_id=f"aws:///usw2-az2/sagemaker/cluster/hyperpod-abc123xyz-{instance_id}")


def test_a_hyperpod_eks_node_is_replaced_through_hyperpod_and_its_replacement_found_under_its_new_name(
        cluster: Cluster, aws: EmbeddedAWS) -> None:
    ids = aws.hyperpod.create_cluster("hp-eks", ["ip-10-0-0-1", "ip-10-0-0-2", "ip-10-0-0-3"])
    nodes = [_register(cluster, i) for i in ids]
    orch = KubernetesOrchestrator(cluster.api)
    provider = NamedByOrchestrator(HyperPodProvider(aws.client("sagemaker"), "hp-eks"), orch)
    member = provider.member_by_node(nodes[0])
    assert member is not None and (member.instance_id, member.slurm_node) == (ids[0], nodes[0])
    assert provider.size() == 3

    provider.reboot([ids[1]])
    step = provider.replace(ids[0], nodes[0], {}, claim=lambda _: True)
    assert step.instance_id is None
    assert aws.hyperpod.calls == [("reboot", [ids[1]]), ("replace", [ids[0]])]  # HyperPod's APIs, not EC2's
    step = provider.replace(ids[0], nodes[0], step.progress, claim=lambda _: True)
    new = step.instance_id
    assert new is not None and new not in ids  # the peers, launched with the old node, are never taken
    assert orch.adopt(nodes[0], new, "nodemedic:inc-1 XID 79") is None  # not registered yet: Repair waits

    joined = _register(cluster, new)
    assert orch.adopt(nodes[0], new, "nodemedic:inc-1 XID 79") == joined != nodes[0]
    assert cluster.read_node(joined).spec.unschedulable and DRAIN_TAINT in cluster.taints(joined)
    replacement = provider.member(new)
    assert replacement is not None and replacement.slurm_node == joined
    assert provider.replace(ids[0], nodes[0], step.progress, claim=lambda _: True).instance_id == new  # idempotent
    assert len(aws.hyperpod.calls) == 2
