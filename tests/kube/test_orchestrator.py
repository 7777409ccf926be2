"""The Kubernetes orchestrator adapter against a real kube-apiserver: cordon, taint, condition,
evictions under PodDisruptionBudgets, the out-of-service taint, spares, jobs, and never lifting
a cordon or taint that is not NodeMedic's (also when it races the adapter's own write)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from nodemedic.orchestrators.base import JobState
from nodemedic.orchestrators.eks_auth import budget_refusal
from nodemedic.orchestrators.kubernetes import (
    AUTOSCALER_HOLDS,
    CONDITION,
    DRAIN_TAINT,
    EVICTING,
    GPU_CLIENTS_PAUSED,
    OUT_OF_SERVICE_TAINT,
    PAUSED_CLIENTS,
    SPARE_TAINT,
    DrainPolicy,
    DrainRule,
    KubernetesOrchestrator,
    parse_drain_policy,
)
from nodemedic.stages.spares import ready

from tests.kube.conftest import Cluster

REASON = "nodemedic:inc-1 XID 79"
OWNER = "nodemedic:inc-1"


def _adapter(cluster: Cluster, policy: DrainPolicy | None = None, **kw: Any) -> KubernetesOrchestrator:
    return KubernetesOrchestrator(cluster.api, policy=policy, **kw)


def test_drain_cordons_taints_and_says_why_and_resume_lifts_only_its_own(cluster: Cluster) -> None:
    node = cluster.node("gpu-1", taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    orch = _adapter(cluster)
    assert orch.drain(node, REASON, takeover="nodemedic:")
    status = orch.node_status(node)
    assert status.drained and status.drained_by(OWNER) and status.reason == REASON
    assert cluster.read_node(node).spec.unschedulable
    assert cluster.taints(node) == {"nvidia.com/gpu": "present:NoSchedule", DRAIN_TAINT: "XID_79:NoSchedule"}
    condition = cluster.condition(node, CONDITION)
    assert (condition.status, condition.message) == ("True", REASON)

    assert not orch.resume(node, "nodemedic:inc-2")  # another incident's tag: not its drain
    assert cluster.read_node(node).spec.unschedulable
    assert orch.resume(node, OWNER)
    after = cluster.read_node(node)
    assert not after.spec.unschedulable
    assert cluster.taints(node) == {"nvidia.com/gpu": "present:NoSchedule"}  # the operator's taint stays
    assert cluster.condition(node, CONDITION).status == "False"
    assert orch.node_status(node).state == "IDLE"


def test_an_operators_cordon_is_kept_and_never_lifted(cluster: Cluster) -> None:
    node = cluster.node("gpu-1", cordoned=True)
    orch = _adapter(cluster)
    assert not orch.drain(node, REASON, takeover="nodemedic:")
    assert orch.node_status(node).reason == "cordoned (not by NodeMedic)"
    assert DRAIN_TAINT not in cluster.taints(node)
    assert not orch.resume(node, OWNER)
    assert cluster.read_node(node).spec.unschedulable
    assert orch.busy(node) is None  # drained (by the operator) and idle: a rung may act


def test_an_operators_cordon_racing_the_drain_wins(cluster: Cluster) -> None:
    """``kubectl cordon`` lands between the adapter's read and its patch: the patch is refused
    (its resourceVersion test fails), the adapter reads again, and keeps the operator's cordon."""
    node = cluster.node("gpu-1")
    orch = _adapter(cluster)
    real_patch, raced = orch._core.patch_node, []

    def patch_after_operator(name: str, body: Any) -> Any:
        if not raced:
            raced.append(name)
            cluster.operator_cordon(name)
        return real_patch(name, body)

    orch._core.patch_node = patch_after_operator
    assert not orch.drain(node, REASON, takeover="nodemedic:")
    assert raced == [node]
    assert DRAIN_TAINT not in cluster.taints(node)
    assert not orch.resume(node, OWNER)
    assert cluster.read_node(node).spec.unschedulable


def test_an_operators_taint_added_while_resuming_is_kept(cluster: Cluster) -> None:
    node = cluster.node("gpu-1")
    orch = _adapter(cluster)
    assert orch.drain(node, REASON)
    real_patch, raced = orch._core.patch_node, []

    def patch_after_operator(name: str, body: Any) -> Any:
        if not raced:
            raced.append(name)
            cluster.core.patch_node(name, {"spec": {"taints": [
                {"key": DRAIN_TAINT, "value": "XID_79", "effect": "NoSchedule"},
                {"key": "maintenance", "value": "bios", "effect": "NoSchedule"}]}})
        return real_patch(name, body)

    orch._core.patch_node = patch_after_operator
    assert orch.resume(node, OWNER)
    assert raced and cluster.taints(node) == {"maintenance": "bios:NoSchedule"}


def test_evacuate_evicts_workloads_and_skips_daemonsets_and_mirror_pods(cluster: Cluster) -> None:
    node, other = cluster.node("gpu-1"), cluster.node("gpu-2")
    cluster.pod("train-0", node, owner=("PyTorchJob", "llm"))
    cluster.pod("train-1", other, owner=("PyTorchJob", "llm"))
    cluster.pod("agent", node, owner=("DaemonSet", "nodemedic-agent"))
    cluster.pod("static", node, owner=None, annotations={"kubernetes.io/config.mirror": "x"})
    cluster.pod("web", node, owner=("ReplicaSet", "web-abc"))
    cluster.pod("done", node, phase="Succeeded", owner=("Job", "old"))
    orch = _adapter(cluster)
    assert orch.jobs_on(node) == [f"{cluster.namespace}/PyTorchJob/llm"]
    assert orch.busy(node) is not None and "PyTorchJob/llm" in orch.busy(node)
    assert orch.drain(node, REASON)
    result = orch.evacuate(node, started_at=datetime.now(UTC).timestamp())
    job = f"{cluster.namespace}/PyTorchJob/llm"
    assert result.requeued == [job] and result.pending == [] and result.not_requeued == []
    assert result.job_nodes == {job: sorted([node, other])}
    assert set(cluster.live_pods(node)) == {"agent", "static", "done"}  # evicted: train-0 and web
    cluster.confirm_deletions()
    assert orch.jobs_on(node) == [] and orch.busy(node) is None


def test_a_node_uncordoned_since_the_drain_keeps_its_pods(cluster: Cluster) -> None:
    """Someone returned the node to service while its training pods were asked to checkpoint
    (kubectl uncordon): the evacuation that follows evicts nothing and says so; the Drain stage
    then stops the incident (NodeBusyError) instead of cutting the job short."""
    node = cluster.node("gpu-1")
    cluster.pod("train-0", node, owner=("PyTorchJob", "llm"))
    orch = _adapter(cluster)
    assert orch.drain(node, REASON)
    cluster.core.patch_node(node, {"spec": {"unschedulable": False}})  # kubectl uncordon

    result = orch.evacuate(node, started_at=datetime.now(UTC).timestamp())
    assert result.not_drained and result.requeued == [] and result.pending == []
    assert "train-0" in cluster.live_pods(node)


def test_a_retried_evacuate_still_reports_the_workloads_an_earlier_call_evicted(cluster: Cluster) -> None:
    """The call that evicted the pods never returned its answer (the function timed out; the state
    machine retries the drain): the pods are terminating, no longer evictable, yet this drain moved
    their workload, which must still take a spare."""
    node, other = cluster.node("gpu-1"), cluster.node("gpu-2")
    cluster.pod("train-0", node, owner=("PyTorchJob", "llm"))
    cluster.pod("train-1", other, owner=("PyTorchJob", "llm"))
    orch = _adapter(cluster)
    assert orch.drain(node, REASON)
    started = datetime.now(UTC).timestamp()
    orch.evacuate(node, started_at=started)  # its answer is lost
    assert "train-0" not in cluster.live_pods(node)

    again = orch.evacuate(node, started_at=started)
    job = f"{cluster.namespace}/PyTorchJob/llm"
    assert again.requeued == [job] and again.pending == [] and again.job_nodes == {job: sorted([node, other])}
    # a drain that started after those evictions did not make them
    assert orch.evacuate(node, started_at=started + 60).requeued == []
    cluster.confirm_deletions()  # the pods are gone: the record written before the evictions says
    gone = orch.evacuate(node, started_at=started)
    assert gone.requeued == [job] and gone.job_nodes == {job: sorted([node, other])}
    assert orch.evacuate(node, started_at=started + 60).requeued == [], "another drain's record"
    assert orch.resume(node, OWNER) and EVICTING not in (cluster.read_node(node).metadata.annotations or {})


def test_a_budget_blocks_eviction_until_its_timeout_then_the_namespace_mode_applies(cluster: Cluster) -> None:
    node = cluster.node("gpu-1")
    cluster.pod("train-0", node)
    cluster.pdb("train", allowed=0)
    job = f"{cluster.namespace}/Job/train"
    start = datetime.now(UTC)
    clock = [start]
    evict = _adapter(cluster, DrainPolicy(default=DrainRule(mode="evict", timeout_seconds=300)), clock=lambda: clock[0])
    assert evict.drain(node, REASON)
    first = evict.evacuate(node, started_at=start.timestamp())
    assert first.requeued == [] and len(first.pending) == 1 and "PodDisruptionBudget" in first.pending[0]
    assert "train-0" in cluster.live_pods(node)  # the budget held: the API server answered 429
    # that 429 says it is the budget's (the functions' client tells it from a busy server's 429)
    with pytest.raises(ApiException) as refused:
        k8s.CoreV1Api(cluster.api).create_namespaced_pod_eviction("train-0", cluster.namespace, k8s.V1Eviction(
            api_version=evict.eviction_version(), kind="Eviction",
            metadata=k8s.V1ObjectMeta(name="train-0", namespace=cluster.namespace)))
    assert refused.value.status == 429 and budget_refusal(refused.value)
    clock[0] = start + timedelta(seconds=301)
    late = evict.evacuate(node, started_at=start.timestamp())
    assert late.pending == [] and late.requeued == [] and job in late.not_requeued
    assert "train-0" in cluster.live_pods(node)  # mode evict: left running, reported

    delete = _adapter(cluster, parse_drain_policy(
        f'{{"namespaces": {{"{cluster.namespace}": {{"mode": "delete", "timeout_seconds": 300}}}}}}'),
        clock=lambda: clock[0])
    forced = delete.evacuate(node, started_at=start.timestamp())
    assert forced.requeued == [job] and forced.pending == []
    assert "train-0" not in cluster.live_pods(node)


def test_a_pod_two_budgets_select_is_blocked_until_the_timeout_then_the_namespace_mode_applies(cluster: Cluster) -> None:
    """The Eviction API refuses a pod that several budgets select (500, "more than one
    PodDisruptionBudget"). That failed the Drain stage outright, whatever the namespace's rule."""
    node = cluster.node("gpu-1")
    cluster.pod("train-0", node)
    cluster.pdb("train-a", allowed=1)
    cluster.pdb("train-b", allowed=1)  # both would allow it: the API server refuses all the same
    start = datetime.now(UTC)
    clock = [start]
    orch = _adapter(cluster, parse_drain_policy(
        f'{{"namespaces": {{"{cluster.namespace}": {{"mode": "delete", "timeout_seconds": 300}}}}}}'),
        clock=lambda: clock[0])
    assert orch.drain(node, REASON)
    first = orch.evacuate(node, started_at=start.timestamp())
    assert first.requeued == [] and len(first.pending) == 1 and "more than one PodDisruptionBudget" in first.pending[0]
    assert "train-0" in cluster.live_pods(node)
    clock[0] = start + timedelta(seconds=301)
    late = orch.evacuate(node, started_at=start.timestamp())
    assert late.requeued == [f"{cluster.namespace}/Job/train"] and "train-0" not in cluster.live_pods(node)


def test_a_budget_that_allows_a_disruption_lets_the_eviction_through(cluster: Cluster) -> None:
    node = cluster.node("gpu-1")
    cluster.pod("train-0", node)
    cluster.pdb("train", allowed=0)
    orch = _adapter(cluster)
    assert orch.drain(node, REASON)
    assert orch.evacuate(node, datetime.now(UTC).timestamp()).pending
    cluster.allow("train", 1)  # the disruption controller: a replica is spare now
    result = orch.evacuate(node, datetime.now(UTC).timestamp())
    assert result.requeued == [f"{cluster.namespace}/Job/train"] and result.pending == []


def test_wait_mode_lets_pods_finish_until_the_timeout(cluster: Cluster) -> None:
    node = cluster.node("gpu-1")
    cluster.pod("train-0", node)
    start = datetime.now(UTC)
    clock = [start]
    orch = _adapter(cluster, DrainPolicy(default=DrainRule(mode="wait", timeout_seconds=60)), clock=lambda: clock[0])
    assert orch.drain(node, REASON)
    assert "running to completion" in orch.evacuate(node, start.timestamp()).pending[0]
    assert "train-0" in cluster.live_pods(node)
    clock[0] = start + timedelta(seconds=61)
    assert orch.evacuate(node, start.timestamp()).requeued == [f"{cluster.namespace}/Job/train"]


def test_a_dead_node_gets_the_out_of_service_taint_and_resume_removes_it(cluster: Cluster) -> None:
    node = cluster.node("gpu-1", ready=False)
    cluster.pod("train-0", node)
    orch = _adapter(cluster)
    assert "NOT_RESPONDING" in orch.node_status(node).state
    assert orch.drain(node, REASON)
    orch.evacuate(node, datetime.now(UTC).timestamp())
    assert cluster.taints(node)[OUT_OF_SERVICE_TAINT] == "nodeshutdown:NoExecute"
    cluster.set_ready(node, True)
    assert orch.resume(node, OWNER)
    assert cluster.taints(node) == {}


def test_spares_are_the_tainted_nodes_and_move_in_and_out_of_the_pool(cluster: Cluster) -> None:
    spare = cluster.node("spare-1", taints=[{"key": SPARE_TAINT, "value": "true", "effect": "NoSchedule"}])
    node = cluster.node("gpu-1")
    orch = _adapter(cluster)
    pool = {s.name: s for s in orch.spares() if s.name.startswith(cluster.tag)}
    assert list(pool) == [spare] and ready(pool[spare].state) and pool[spare].state == "IDLE+RESERVED"
    orch.take_spare(spare)
    assert SPARE_TAINT not in cluster.taints(spare)
    assert spare not in {s.name for s in orch.spares()}

    assert orch.drain(node, REASON)
    assert orch.add_spare(node, OWNER)
    after = cluster.read_node(node)
    assert not after.spec.unschedulable and cluster.taints(node) == {SPARE_TAINT: "true:NoSchedule"}
    assert node in {s.name for s in orch.spares()}


def _holds(cluster: Cluster, node: str) -> dict[str, str]:
    annotations = cluster.read_node(node).metadata.annotations or {}
    return {k: v for k, v in annotations.items() if k in AUTOSCALER_HOLDS}


KEPT = {"karpenter.sh/do-not-disrupt": "true", "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}


def test_a_node_nodemedic_holds_is_kept_from_the_autoscalers_until_it_lets_it_go(cluster: Cluster) -> None:
    """A drained node and a hot spare run no workload: Karpenter's consolidation (an empty node)
    and the Cluster Autoscaler's scale-down would remove them, mid-repair or out of the pool."""
    node, spare = cluster.node("gpu-1"), cluster.node("gpu-2")
    orch = _adapter(cluster)
    assert orch.drain(node, REASON) and _holds(cluster, node) == KEPT
    assert orch.resume(node, OWNER) and _holds(cluster, node) == {}
    assert orch.drain(spare, REASON) and orch.add_spare(spare, OWNER)
    assert _holds(cluster, spare) == KEPT  # the drain is lifted; the spare is still held
    orch.take_spare(spare)
    assert _holds(cluster, spare) == {}  # the pods land there: the autoscalers may manage it again


def test_an_autoscaler_hold_someone_else_set_is_never_lifted(cluster: Cluster) -> None:
    node = cluster.node("gpu-1")
    cluster.core.patch_node(node, {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}})
    orch = _adapter(cluster)
    assert orch.drain(node, REASON) and _holds(cluster, node) == KEPT
    assert orch.resume(node, OWNER)
    assert _holds(cluster, node) == {"karpenter.sh/do-not-disrupt": "true"}  # the operator's stays


def test_add_spare_never_lifts_an_operators_cordon(cluster: Cluster) -> None:
    node = cluster.node("gpu-1", cordoned=True)
    orch = _adapter(cluster)
    assert not orch.add_spare(node, OWNER)
    assert cluster.read_node(node).spec.unschedulable


def test_job_states_follow_the_workloads_pods(cluster: Cluster) -> None:
    node, spare = cluster.node("gpu-1"), cluster.node("spare-1")
    t0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
    cluster.pod("train-0", node, started=t0)
    job = f"{cluster.namespace}/Job/train"
    orch = _adapter(cluster)
    assert orch.job_states([job])[job].state == "RUNNING"
    orch.drain(node, REASON)
    orch.evacuate(node, t0.timestamp())
    cluster.confirm_deletions()
    gone = f"{cluster.namespace}/Job/other"
    states = orch.job_states([job, gone])
    assert states[job].state == "GONE" and states[gone].state == "GONE"
    cluster.pod("train-0-retry", spare, phase="Pending")  # the training operator's new pod
    assert orch.job_states([job])[job].state == "PENDING"
    t1 = t0 + timedelta(minutes=3)
    cluster.set_phase("train-0-retry", "Running", started=t1)
    assert orch.job_states([job])[job] == JobState(job, "RUNNING", t1.timestamp(), members=1)


def test_an_evacuation_counts_each_workloads_pods_before_its_evictions_and_a_retry_keeps_that_count(
        cluster: Cluster) -> None:
    """The count is what the jobs stage waits for; a retry after the evicted pod is gone (an answer
    lost) would count one fewer, so the count recorded on the node before the evictions is kept."""
    node, peer = cluster.node("gpu-1"), cluster.node("gpu-2")
    for i, where in enumerate((node, node, peer)):
        cluster.pod(f"llm-worker-{i}", where, owner=("PyTorchJob", "llm"))
    cluster.pod("other-0", peer, owner=("Job", "other"))
    job = f"{cluster.namespace}/PyTorchJob/llm"
    orch = _adapter(cluster)
    orch.drain(node, REASON)
    started = datetime.now(UTC).timestamp()
    assert orch.evacuate(node, started).job_members == {job: 3}
    cluster.confirm_deletions()
    assert orch.job_states([job])[job] == JobState(job, "RUNNING", orch.job_states([job])[job].started_at, members=1)
    assert orch.evacuate(node, started).job_members == {job: 3}


def test_workloads_are_named_by_jobset_leaderworkerset_and_the_training_label(cluster: Cluster) -> None:
    node = cluster.node("gpu-1")
    cluster.pod("js-0", node, owner=("Job", "js-worker-0"), labels={"jobset.sigs.k8s.io/jobset-name": "big"})
    cluster.pod("lws-0", node, owner=("StatefulSet", "lws"), labels={"leaderworkerset.sigs.k8s.io/name": "serve"})
    cluster.pod("adhoc", node, owner=None, labels={"nodemedic.io/training": "true"})
    cluster.pod("web", node, owner=("ReplicaSet", "web-abc"))
    ns = cluster.namespace
    assert _adapter(cluster).jobs_on(node) == [f"{ns}/JobSet/big", f"{ns}/LeaderWorkerSet/serve", f"{ns}/Pod/adhoc"]


def test_the_eviction_version_is_negotiated(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """1.20 serves only policy/v1beta1 (this API server, for real); EKS's versions serve policy/v1:
    there the body says policy/v1 (what the API server is sent is recorded, not served here)."""
    orch = _adapter(cluster)
    assert orch.eviction_version() == "policy/v1beta1"
    newer = _adapter(cluster)
    group = k8s.V1APIGroup(name="policy", versions=[
        k8s.V1GroupVersionForDiscovery(group_version="policy/v1", version="v1"),
        k8s.V1GroupVersionForDiscovery(group_version="policy/v1beta1", version="v1beta1")])
    monkeypatch.setattr(k8s.PolicyApi, "get_api_group", lambda self: group)
    sent: list[Any] = []
    newer._core.create_namespaced_pod_eviction = lambda name, ns, body: sent.append(
        newer._core.api_client.sanitize_for_serialization(body))
    node = cluster.node("gpu-1")
    cluster.pod("train-0", node)
    newer.drain(node, REASON)
    newer.evacuate(node, datetime.now(UTC).timestamp())
    assert sent and sent[0]["apiVersion"] == "policy/v1" and sent[0]["kind"] == "Eviction"


@pytest.mark.parametrize("health", ["UnschedulablePendingReplacement", "UnschedulablePendingReboot", "Unschedulable"])
def test_a_node_hyperpod_is_recovering_is_left_to_hyperpod(cluster: Cluster, health: str) -> None:
    """HyperPod-EKS labels a node it checks, reboots or replaces itself: NodeMedic neither drains
    it, nor takes a destructive step on it, nor returns it to service."""
    node = cluster.node("gpu-1", cordoned=True, labels={"sagemaker.amazonaws.com/node-health-status": health})
    orch = _adapter(cluster)
    assert orch.node_status(node).reason == f"HyperPod: {health}" and "DRAIN" in orch.node_status(node).state
    assert not orch.drain(node, REASON, takeover="nodemedic:")
    assert "HyperPod is checking or recovering" in (orch.busy(node) or "")
    assert not orch.resume(node, "*") and not orch.add_spare(node, OWNER)
    assert cluster.read_node(node).spec.unschedulable and cluster.taints(node) == {}


OPERATOR_LABELS = {"nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.dcgm-exporter": "true",
                   "nvidia.com/gpu.deploy.dcgm": "false",  # disabled in the ClusterPolicy: left as it is
                   "nvidia.com/gpu.deploy.driver": "true"}  # the driver itself is never paused
NVML_CLIENT_AFFINITY = k8s.V1Affinity(node_affinity=k8s.V1NodeAffinity(
    required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(node_selector_terms=[
        k8s.V1NodeSelectorTerm(match_expressions=[k8s.V1NodeSelectorRequirement(
            key="nvidia.com/gpu.deploy.client", operator="In", values=["true"])]),
        k8s.V1NodeSelectorTerm(match_expressions=[k8s.V1NodeSelectorRequirement(
            key="nvidia.com/gpu.deploy.client", operator="DoesNotExist")])])))


def _gpu_operator_node(cluster: Cluster, labels: dict[str, str]) -> str:
    """A node with the GPU operator's daemons (each selecting on its deploy label), the NodeMedic
    agent (an NVML client: its chart's affinity on gpu.deploy.client) and a log shipper."""
    node = cluster.node("gpu", labels=labels)
    for component in ("device-plugin", "dcgm-exporter"):
        cluster.pod(f"nvidia-{component}-x", node, owner=("DaemonSet", f"nvidia-{component}"),
                    node_selector={f"nvidia.com/gpu.deploy.{component}": "true"})
    cluster.pod("nvidia-driver-x", node, owner=("DaemonSet", "nvidia-driver"),
                node_selector={"nvidia.com/gpu.deploy.driver": "true"})
    cluster.pod("nodemedic-agent-x", node, owner=("DaemonSet", "nodemedic-agent"), affinity=NVML_CLIENT_AFFINITY)
    cluster.pod("fluent-bit-x", node, owner=("DaemonSet", "fluent-bit"))
    return node


def test_a_gpu_reset_pauses_the_gpu_clients_by_their_deploy_labels_and_puts_back_only_its_own(cluster: Cluster) -> None:
    node = _gpu_operator_node(cluster, OPERATOR_LABELS)
    orch = KubernetesOrchestrator(cluster.api)
    waiting = orch.pause_gpu_clients(node, "inc-1")
    assert waiting is not None and "3 GPU client pod(s)" in waiting
    labels = cluster.read_node(node).metadata.labels
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == labels["nvidia.com/gpu.deploy.dcgm-exporter"] \
        == labels["nvidia.com/gpu.deploy.client"] == GPU_CLIENTS_PAUSED  # the client label was absent: added
    assert labels["nvidia.com/gpu.deploy.dcgm"] == "false" and labels["nvidia.com/gpu.deploy.driver"] == "true"
    assert orch.gpu_clients_paused() == {node: "inc-1"}
    # the DaemonSet controller removes the daemons the labels turned away, and only those
    assert cluster.remove_daemon_pods_turned_away(node) == ["nodemedic-agent-x", "nvidia-dcgm-exporter-x",
                                                            "nvidia-device-plugin-x"]
    assert orch.pause_gpu_clients(node, "inc-1") is None  # nothing holds the GPUs now: the reset may go
    # meanwhile an operator turns dcgm-exporter off for this node: the resume leaves that
    cluster.core.patch_node(node, {"metadata": {"labels": {"nvidia.com/gpu.deploy.dcgm-exporter": "false"}}})
    assert orch.resume_gpu_clients(node, "inc-2") is False  # another incident's pause is not this one's to undo
    assert orch.resume_gpu_clients(node, "inc-1") is True
    labels = cluster.read_node(node).metadata.labels
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/gpu.deploy.")} == {
        **OPERATOR_LABELS, "nvidia.com/gpu.deploy.dcgm-exporter": "false"}  # client: absent again
    assert PAUSED_CLIENTS not in (cluster.read_node(node).metadata.annotations or {})
    assert orch.gpu_clients_paused() == {} and orch.resume_gpu_clients(node, "inc-1") is False


def test_nothing_is_paused_while_another_operation_has_the_gpu_components_paused(cluster: Cluster) -> None:
    """NVIDIA's driver-manager is upgrading the driver on the node: no GPU reset now."""
    upgrading = {**OPERATOR_LABELS, "nvidia.com/gpu.deploy.device-plugin": "paused-for-driver-upgrade"}
    node = _gpu_operator_node(cluster, upgrading)
    orch = KubernetesOrchestrator(cluster.api)
    waiting = orch.pause_gpu_clients(node, "inc-1")
    assert waiting is not None and "paused-for-driver-upgrade" in waiting
    labels = cluster.read_node(node).metadata.labels
    assert labels["nvidia.com/gpu.deploy.dcgm-exporter"] == "true" and "nvidia.com/gpu.deploy.client" not in labels
    assert orch.gpu_clients_paused() == {}
