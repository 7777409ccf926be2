"""The Kubernetes tier: the orchestrator adapter against a real kube-apiserver (1.20.2) and etcd.

No kubelet, scheduler or controllers run. The helpers here play them, and each says which:
binding a pod to a node and setting its phase (scheduler, kubelet), a node's Ready condition
(kubelet), a PodDisruptionBudget's status (the disruption controller), deleting an evicted pod
(kubelet confirming the deletion), a training operator recreating a job's pod.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from nodemedic_sandbox import kube_apiserver
from nodemedic_sandbox.eks_authenticator import EksAuthenticator
from nodemedic_sandbox.embedded_aws import EmbeddedAWS
from nodemedic_sandbox.kube_apiserver import KubeAPIServer

from tests.conftest import require

_ids = itertools.count(1)


EKS_CLUSTER = "nodemedic-test"
IMAGE = "ami-12c6146b"  # one of moto's stock images


@pytest.fixture(scope="session")
def authenticator() -> Iterator[EksAuthenticator]:
    """EKS's IAM authentication for the API server (TokenReview webhook), for cluster EKS_CLUSTER."""
    with EksAuthenticator(EKS_CLUSTER) as auth:
        yield auth


@pytest.fixture(scope="session")
def apiserver(authenticator: EksAuthenticator) -> Iterator[KubeAPIServer]:
    require("the real kube-apiserver", kube_apiserver.unavailable_reason())
    with KubeAPIServer(webhook_url=authenticator.url) as server:
        yield server


@pytest.fixture
def cluster(apiserver: KubeAPIServer) -> Iterator[Cluster]:
    c = Cluster(apiserver.api_client(), f"t{next(_ids)}")
    yield c
    c.cleanup()


class Cluster:
    """One test's nodes and namespace on the shared API server, and the parts the test plays."""

    def __init__(self, api: Any, tag: str) -> None:
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.tag = tag
        self.namespace = f"ns-{tag}"
        self.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=self.namespace)))
        self._nodes: list[str] = []

    def node(self, short: str, *, ready: bool = True, taints: list[dict[str, str]] | None = None,
             cordoned: bool = False, labels: dict[str, str] | None = None, provider_id: str = "") -> str:
        """A GPU node (``provider_id``: its instance, ``aws:///<az>/i-…``); the kubelet's part: its
        Ready condition."""
        name = f"{self.tag}-{short}"
        self.core.create_node(k8s.V1Node(
            metadata=k8s.V1ObjectMeta(name=name, labels={"nvidia.com/gpu.present": "true", **(labels or {})}),
            spec=k8s.V1NodeSpec(unschedulable=cordoned or None, provider_id=provider_id or None,
                                taints=[k8s.V1Taint(**t) for t in taints or []] or None)))
        self._nodes.append(name)
        self.set_ready(name, ready)
        return name

    def set_ready(self, node: str, ready: bool) -> None:
        kube_apiserver.set_ready(self.api, node, ready, "test")

    def pod(self, name: str, node: str, *, owner: tuple[str, str] | None = ("Job", "train"),
            labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
            phase: str = "Running", started: datetime | None = None, node_selector: dict[str, str] | None = None,
            affinity: Any = None) -> str:
        """A pod bound to ``node`` (the scheduler's part) in ``phase`` (the kubelet's part)."""
        refs = None
        if owner:
            kind, owner_name = owner
            api_version = {"Job": "batch/v1", "DaemonSet": "apps/v1", "ReplicaSet": "apps/v1",
                           "PyTorchJob": "kubeflow.org/v1"}.get(kind, "example.com/v1")
            refs = [k8s.V1OwnerReference(api_version=api_version, kind=kind, name=owner_name, uid=f"uid-{owner_name}",
                                         controller=True)]
        self.core.create_namespaced_pod(self.namespace, k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=name, labels={"app": "train", **(labels or {})}, owner_references=refs,
                                      annotations=annotations),
            spec=k8s.V1PodSpec(node_name=node, containers=[k8s.V1Container(name="main", image="trainer:1")],
                               node_selector=node_selector, affinity=affinity)))
        self.set_phase(name, phase, started)
        return name

    def set_phase(self, name: str, phase: str, started: datetime | None = None) -> None:
        at = (started or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = (kube_apiserver.running_status(at, "main", "trainer:1") if phase == "Running"
                  else {"phase": phase, "startTime": at})
        self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})

    def pdb(self, name: str, *, allowed: int, labels: dict[str, str] | None = None) -> None:
        """A budget over the job's pods, and its status as the disruption controller computes it."""
        kube_apiserver.create_budget(self.api, self.namespace, name, labels or {"app": "train"})
        self.allow(name, allowed)

    def allow(self, name: str, allowed: int) -> None:
        kube_apiserver.allow_disruptions(self.api, self.namespace, name, allowed)

    def read_node(self, node: str) -> Any:
        return self.core.read_node(node)

    def taints(self, node: str) -> dict[str, str]:
        return {t.key: f"{t.value}:{t.effect}" for t in self.read_node(node).spec.taints or []}

    def condition(self, node: str, kind: str) -> Any:
        return next((c for c in self.read_node(node).status.conditions or [] if c.type == kind), None)

    def live_pods(self, node: str | None = None) -> dict[str, Any]:
        """Pods not being deleted, by name (the kubelet has not confirmed an eviction yet)."""
        pods = self.core.list_namespaced_pod(self.namespace).items
        return {p.metadata.name: p for p in pods
                if p.metadata.deletion_timestamp is None and (node is None or p.spec.node_name == node)}

    def confirm_deletions(self) -> list[str]:
        """The kubelet's part: evicted pods (deletionTimestamp set) go away."""
        gone = []
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            if pod.metadata.deletion_timestamp is not None:
                self.core.delete_namespaced_pod(pod.metadata.name, self.namespace, grace_period_seconds=0)
                gone.append(pod.metadata.name)
        return gone

    def remove_daemon_pods_turned_away(self, node: str) -> list[str]:
        """The DaemonSet controller's part: a daemon pod whose nodeSelector or required node
        affinity no longer accepts its node's labels is deleted (and, the kubelet's part, gone)."""
        labels = self.read_node(node).metadata.labels or {}
        gone = []
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            daemon = any(o.kind == "DaemonSet" for o in pod.metadata.owner_references or [])
            if daemon and pod.spec.node_name == node and not _daemon_accepts(pod.spec, labels):
                self.core.delete_namespaced_pod(pod.metadata.name, self.namespace, grace_period_seconds=0)
                gone.append(pod.metadata.name)
        return sorted(gone)

    def operator_cordon(self, node: str) -> None:
        """What ``kubectl cordon`` does."""
        self.core.patch_node(node, {"spec": {"unschedulable": True}})

    def cleanup(self) -> None:
        for node in self._nodes:
            try:
                self.core.delete_node(node)
            except ApiException:
                pass
        try:
            self.core.delete_namespace(self.namespace)
        except ApiException:
            pass


def _daemon_accepts(spec: Any, labels: dict[str, str]) -> bool:
    """The scheduling predicates the DaemonSet controller applies to a node's labels (nodeSelector;
    required node affinity: terms ORed, expressions ANDed), for the operators these tests use."""
    if any(labels.get(k) != v for k, v in (spec.node_selector or {}).items()):
        return False
    affinity = spec.affinity.node_affinity if spec.affinity and spec.affinity.node_affinity else None
    required = affinity.required_during_scheduling_ignored_during_execution if affinity else None
    if required is None:
        return True
    tests = {"In": lambda e: labels.get(e.key) in (e.values or []), "NotIn": lambda e: labels.get(e.key) not in (e.values or []),
             "Exists": lambda e: e.key in labels, "DoesNotExist": lambda e: e.key not in labels}
    return any(all(tests[e.operator](e) for e in term.match_expressions or []) for term in required.node_selector_terms)


from tests.stages.conftest import aws, ledger  # noqa: E402, F401 - the embedded DynamoDB ledger, for the stage tests


@pytest.fixture
def group(aws: EmbeddedAWS) -> Iterator[list[str]]:  # noqa: F811 - the fixture imported above
    """A managed node group's Auto Scaling group of three GPU instances."""
    ec2, asg = aws.client("ec2"), aws.client("autoscaling")
    name = f"eks-gpu-{uuid.uuid4().hex[:8]}"
    ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData={"ImageId": IMAGE})
    asg.create_auto_scaling_group(AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": name}, MinSize=3,
                                  MaxSize=3, DesiredCapacity=3, AvailabilityZones=["us-east-1a"])
    instances = sorted(i["InstanceId"] for i in asg.describe_auto_scaling_groups(
        AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["Instances"])
    yield [name, *instances]
    asg.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
