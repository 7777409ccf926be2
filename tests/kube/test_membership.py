"""Which node an event is about, on Kubernetes: the kubelet names the node, and the node's
``spec.providerID`` names the EC2 instance behind it. Detect (the pipeline's own stage code) takes
membership from the Auto Scaling group (a managed node group is one) and the name from the API
server; nothing is drained for an instance no node names, or a name that is not the instance's."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from nodemedic.contracts.stages import DetectInput
from nodemedic.errors import UnknownNodeError, UnknownNodeQuietError
from nodemedic.orchestrators.kubernetes import KubernetesOrchestrator, instance_of_provider_id
from nodemedic.providers.autoscaling import AutoScalingProvider
from nodemedic.providers.node_names import NamedByOrchestrator
from nodemedic.stages.detect import detect
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from tests.kube.conftest import Cluster

CLUSTER = "c1"


def _event(node: dict[str, str]) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat()
    return {"version": "0", "id": str(uuid.uuid4()), "detail-type": "Node Health Event", "source": "nodemedic.agent",
            "account": "123456789012", "time": now, "region": "us-east-1", "resources": [],
            "detail": {"schema_version": "1", "event_id": str(uuid.uuid4()), "cluster": CLUSTER,
                       "node": {"hostname": "gpu-host", **node},
                       "check": "kernel_log", "fault_code": "XID 79", "severity": "critical",
                       "observed_at": now, "sent_at": now, "component": {"kind": "gpu", "index": 0}}}


def _runbook(node: str) -> dict[str, Any]:
    return {"version": "0", "id": str(uuid.uuid4()), "detail-type": "Remediation Request",
            "source": "nodemedic.operator", "account": "123456789012", "time": datetime.now(UTC).isoformat(),
            "region": "us-east-1", "resources": [],
            "detail": {"schema_version": "1", "cluster": CLUSTER, "slurm_node": node, "action": "reboot",
                       "reason": "EFA stuck", "requested_by": "oncall@example.com"}}


@pytest.mark.parametrize(("provider_id", "instance"), [
    ("aws:///us-east-1a/i-0a1b2c3d4e5f60789", "i-0a1b2c3d4e5f60789"),  # managed/self-managed/Karpenter
    ("aws:///usw2-az2/sagemaker/cluster/hyperpod-abc123xyz-i-0a1b2c3d4e5f60789", "i-0a1b2c3d4e5f60789"),
    ("aws:///us-east-1a/i-0123abcd", "i-0123abcd"),  # the older 8-digit ids
    ("aws:///us-east-1a/fargate-ip-10-0-1-2.ec2.internal", None),
    ("eks-hybrid:///us-west-2/my-cluster/node-1", None),
    ("gce://project/zone/i-0a1b2c3d4e5f60789", None),
    ("", None),
])
def test_the_instance_is_read_from_the_providers_id(provider_id: str, instance: str | None) -> None:
    assert instance_of_provider_id(provider_id) == instance


def test_detect_names_the_incident_after_the_kubernetes_node_and_drains_nothing_it_cannot_map(
        cluster: Cluster, aws: EmbeddedAWS, ledger: Ledger, group: list[str]) -> None:
    name, first, second, not_joined = group
    node = cluster.node("ip-10-0-1-17.ec2.internal", provider_id=f"aws:///us-east-1a/{first}")
    peer = cluster.node("ip-10-0-1-18.ec2.internal", provider_id=f"aws:///us-east-1a/{second}")
    stranger = cluster.node("ip-10-9-9-9.ec2.internal", provider_id="aws:///us-east-1a/i-0fffffffffffffff0")
    orch = KubernetesOrchestrator(cluster.api)
    provider = NamedByOrchestrator(AutoScalingProvider(aws.client("autoscaling"), aws.client("ec2"), name), orch)
    control = ControlStore(aws.client("dynamodb"), ledger._table, CLUSTER)

    def run(event: dict[str, Any]) -> Any:
        return detect(DetectInput(event=event, incident_id=f"inc-{uuid.uuid4().hex[:8]}"), cluster=CLUSTER,
                      overrides_json="", provider=provider, ledger=ledger, control=control, now=datetime.now(UTC))

    # the agent names its instance and its Kubernetes node (NODEMEDIC_NODE_NAME): the incident is the node's
    opened = run(_event({"instance_id": first, "slurm_node": node}))
    assert opened.decision == "remediate"
    assert (opened.incident.slurm_node, opened.incident.instance_id) == (node, first)
    # an event that names only the instance (as an alarm does): its node is found by providerID
    by_instance = run(_event({"instance_id": second}))
    assert (by_instance.incident.slurm_node, by_instance.incident.instance_id) == (peer, second)
    # an operator's runbook names only the node
    assert provider.member_by_node(node).instance_id == first  # type: ignore[union-attr]
    # the group's instances in one listing (the reconciler's look for agents it never heard),
    # each named by the node whose providerID names it; the stranger is no member
    assert {m.instance_id: m.slurm_node for m in provider.members()} == {first: node, second: peer, not_joined: None}

    # an instance of the group that no node names yet (still joining): nothing drained, and why
    with pytest.raises((UnknownNodeError, UnknownNodeQuietError), match="backs no node"):
        run(_event({"instance_id": not_joined}))
    # a node whose instance is not in the group (another node group, another cluster)
    with pytest.raises((UnknownNodeError, UnknownNodeQuietError), match="not a member"):
        run(_runbook(stranger))
    # a node name that is not the instance's, in either field
    for field in ("slurm_node", "k8s_node"):
        with pytest.raises((UnknownNodeError, UnknownNodeQuietError), match="identity mismatch"):
            run(_event({"instance_id": first, field: peer}))
    assert sorted(i.slurm_node for i in ledger.list_incidents()) == sorted([node, peer])
    assert not cluster.read_node(node).spec.unschedulable  # Detect decides; Drain acts
