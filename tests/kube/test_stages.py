"""The pipeline's own stage code on Kubernetes: an XID 79 on a GPU node whose training pod has a
PodDisruptionBudget. The stages are the ones the state machine runs (no Kubernetes branch in
them); the ledger is in the embedded DynamoDB; the API server is real. The test plays the
disruption controller, the kubelet and the training operator, as conftest says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nodemedic.contracts.events import NodeHealthEvent
from nodemedic.contracts.incident import SPARE_CLAIM
from nodemedic.contracts.stages import GateOutput
from nodemedic.domain.checkpoint import CheckpointPolicy, CheckpointRule
from nodemedic.errors import (
    CheckpointPendingError,
    EvictionPendingError,
    GpuClientsPendingError,
    NodeGoneError,
    ReplacementPendingError,
)
from nodemedic.orchestrators.kubernetes import (
    AUTOSCALER_HOLDS,
    BURN_IN_TAINT,
    CHECKPOINT_REQUESTED,
    CHECKPOINTED,
    CONDITION,
    DRAIN_TAINT,
    OUT_OF_SERVICE_SET,
    REASON,
    SPARE_TAINT,
    KubernetesOrchestrator,
)
from nodemedic.providers.autoscaling import AutoScalingProvider
from nodemedic.providers.node_names import NamedByOrchestrator
from nodemedic.providers.run_command import CommandResult, Documents, RunCommand
from nodemedic.reconciler import reconcile
from nodemedic.stages.drain import drain
from nodemedic.stages.repair import GPU_CLIENTS_WAIT_S, repair
from nodemedic.stages.resume import await_jobs, resume, retire
from nodemedic.stages.shadow import shadow
from nodemedic.stages.spares import swap_in
from nodemedic.store.ledger import Ledger
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from tests.kube.conftest import Cluster
from tests.stages.conftest import PREFIX, clock, index_lag, opened
from tests.stages.memory_provider import MemoryProvider

pytestmark = pytest.mark.usefixtures("aws")
STARTUP_TAINT = {"key": BURN_IN_TAINT, "value": "pending", "effect": "NoSchedule"}  # the node group's


def test_xid79_cordons_evicts_within_the_budget_swaps_a_spare_and_returns_the_node_to_the_pool(
        cluster: Cluster, ledger: Ledger) -> None:
    node, peer = cluster.node("gpu-1"), cluster.node("gpu-2")
    spare = cluster.node("spare-1", taints=[{"key": SPARE_TAINT, "value": "true", "effect": "NoSchedule"}])
    cluster.pod("llm-worker-0", node, owner=("PyTorchJob", "llm"))
    cluster.pod("llm-worker-1", peer, owner=("PyTorchJob", "llm"))
    cluster.pdb("llm", allowed=0)
    orch = KubernetesOrchestrator(cluster.api)
    job = f"{cluster.namespace}/PyTorchJob/llm"
    incident = opened(ledger, node)

    # Drain: cordoned and tainted at once; the eviction waits while the budget allows none
    with pytest.raises(EvictionPendingError, match="PodDisruptionBudget"):
        drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)
    assert cluster.read_node(node).spec.unschedulable and DRAIN_TAINT in cluster.taints(node)
    assert cluster.condition(node, CONDITION).status == "True"
    assert "llm-worker-0" in cluster.live_pods(node)
    cluster.allow("llm", 1)  # the disruption controller: the job tolerates one disruption now
    out = drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)  # the state machine's retry
    assert out.drained_by_pipeline and out.requeued_jobs == [job]
    assert out.job_sizes == {job: 2} and ledger.interrupted_on(incident.cluster, peer, clock()) == [job]
    assert "llm-worker-0" not in cluster.live_pods(node)

    # Spare: untainted for the job's replacement pod
    spared = swap_in(incident, orchestrator=orch, provider=MemoryProvider(), ledger=ledger, pool_size=1, clock=clock)
    assert spared.spare == spare and spared.destination == "pool"
    assert SPARE_TAINT not in cluster.taints(spare)
    cluster.confirm_deletions()  # the kubelet confirms the eviction
    restarted = datetime.now(UTC)
    cluster.pod("llm-worker-0-r1", spare, owner=("PyTorchJob", "llm"), started=restarted)  # the operator's new pod

    # Repair's guard reads the node right before a destructive rung: drained and running nothing
    assert orch.busy(node) is None

    # Resume: the repaired node refills the spare pool; the job runs again on the spare
    done = resume(incident, "pool", orchestrator=orch, ledger=ledger, prefix=PREFIX, job_wait_s=5,
                  pool_size=1, clock=clock)
    assert done.resumed and done.destination == "pool"
    assert not cluster.read_node(node).spec.unschedulable
    assert cluster.taints(node) == {SPARE_TAINT: "true:NoSchedule"}
    assert done.jobs.running == {job: pytest.approx(restarted.replace(microsecond=0).timestamp()
                                                    - incident.observed_at.timestamp(), abs=1)}
    closed = ledger.get(incident.incident_id)
    assert closed.status == "closed"
    assert all(closed.stages[s].started_at and closed.stages[s].completed_at for s in ("drain", "spare", "resume", "jobs"))


def test_a_workload_whose_survivors_started_just_before_the_drain_is_back_only_with_its_evicted_pod(
        cluster: Cluster, ledger: Ledger) -> None:
    """The fault made the training operator restart the job: its worker on the healthy peer started
    a second before NodeMedic drained. With the evicted worker not made again yet, the survivor
    runs alone; that is not the job back. It is back when its new worker runs."""
    node, peer, spare = cluster.node("gpu-1"), cluster.node("gpu-2"), cluster.node("spare-1")
    cluster.pod("llm-worker-0", node, owner=("PyTorchJob", "llm"))
    cluster.pod("llm-worker-1", peer, owner=("PyTorchJob", "llm"), started=datetime.now(UTC))
    orch = KubernetesOrchestrator(cluster.api)
    job = f"{cluster.namespace}/PyTorchJob/llm"
    incident = opened(ledger, node)
    out = drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)
    assert out.requeued_jobs == [job] and out.job_members == {job: 2}
    cluster.confirm_deletions()
    assert orch.job_states([job])[job].state == "RUNNING"  # the survivor, on its start of a second ago
    polls: list[datetime] = []

    def operator_makes_the_worker_again(_: float) -> None:  # the stage's sleep between two polls
        polls.append(datetime.now(UTC))
        if len(polls) == 1:
            cluster.pod("llm-worker-0-r1", spare, owner=("PyTorchJob", "llm"), started=polls[0] + timedelta(seconds=5))

    jobs = await_jobs(incident, orchestrator=orch, ledger=ledger, wait_s=60, clock=clock,
                      sleep=operator_makes_the_worker_again)
    assert len(polls) == 1, "the survivor alone read as the job back"
    assert jobs.pending == [] and jobs.running == {job: pytest.approx(
        (polls[0] + timedelta(seconds=5)).replace(microsecond=0).timestamp() - incident.observed_at.timestamp(), abs=1e-3)}


def test_an_operators_cordon_survives_the_whole_incident(cluster: Cluster, ledger: Ledger) -> None:
    node = cluster.node("gpu-1", cordoned=True)
    orch = KubernetesOrchestrator(cluster.api)
    incident = opened(ledger, node)
    out = drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)
    assert not out.drained_by_pipeline
    done = resume(incident, "service", orchestrator=orch, ledger=ledger, prefix=PREFIX, job_wait_s=0,
                  pool_size=0, clock=clock)
    assert not done.resumed
    assert cluster.read_node(node).spec.unschedulable and DRAIN_TAINT not in cluster.taints(node)


@pytest.mark.parametrize("startup_taint", [False, True], ids=["plain", "burn-in-startup-taint"])
def test_a_replacement_registers_under_a_name_of_its_own_and_that_node_is_held_then_resumed(
        cluster: Cluster, aws: EmbeddedAWS, ledger: Ledger, group: list[str], startup_taint: bool) -> None:
    """The replace rung on a managed node group: the group launches a new instance, which joins
    under a new node name. A healthy peer's instance (in the same group, carrying no tag) is never
    taken for the replacement; the new node is cordoned the moment it registers, and Resume acts
    on it, not on the name of the node that is gone. A node group that registers its nodes with
    the burn-in startup taint: the replacement's is gone with NodeMedic's cordon once it passed,
    and the reconciler never starts a burn-in of its own for it meanwhile (its instance is claimed)."""
    name, sick_instance, peer_instance, idle_instance = group
    sick = cluster.node("ip-10-0-1-17.ec2.internal", provider_id=f"aws:///us-east-1a/{sick_instance}")
    peer = cluster.node("ip-10-0-1-18.ec2.internal", provider_id=f"aws:///us-east-1a/{peer_instance}")
    idle = cluster.node("ip-10-0-1-19.ec2.internal", provider_id=f"aws:///us-east-1a/{idle_instance}")
    cluster.pod("train-0", peer)
    orch = KubernetesOrchestrator(cluster.api)
    provider = NamedByOrchestrator(AutoScalingProvider(aws.client("autoscaling"), aws.client("ec2"), name), orch)
    incident = opened(ledger, sick, instance=sick_instance, ladder=("replace",))
    drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)

    def climb() -> Any:
        return repair(incident, "service", provider=provider, orchestrator=orch,
                      runner=RunCommand(aws.client("ssm"), 0.1), ledger=ledger, documents=Documents("c1"),
                      timeout_s=5, check_timeout_s=60, prefix=PREFIX, clock=clock)

    with pytest.raises(ReplacementPendingError, match="has not joined"):
        climb()  # terminated; the group's new instance is claimed, and has no node yet
    [new_instance] = set(i["InstanceId"] for i in aws.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["Instances"]) - {peer_instance, idle_instance}
    assert not any(cluster.read_node(n).spec.unschedulable for n in (peer, idle))
    new = cluster.node("ip-10-0-2-40.ec2.internal", provider_id=f"aws:///us-east-1a/{new_instance}",
                       taints=[STARTUP_TAINT] if startup_taint else None)  # the kubelet
    started: list[NodeHealthEvent] = []
    for _ in range(3):
        reconcile(cluster="c1", ledger=ledger, orchestrator=orch, execution_status=lambda _: "RUNNING", prefix=PREFIX,
                  now=datetime.now(UTC), publish=started.append)
    assert started == []
    out = climb()
    assert (out.rung, out.instance_id) == ("replace", new_instance)
    assert cluster.read_node(new).spec.unschedulable and DRAIN_TAINT in cluster.taints(new)  # held until checked
    done = resume(incident, "service", orchestrator=orch, ledger=ledger, prefix=PREFIX, job_wait_s=0,
                  pool_size=0, clock=clock)
    assert done.resumed and done.slurm_node == new
    assert not cluster.read_node(new).spec.unschedulable and cluster.taints(new) == {}
    assert not any(cluster.read_node(n).spec.unschedulable for n in (peer, idle))


def test_a_node_that_joins_under_the_burn_in_startup_taint_is_checked_then_released_and_an_operators_cordon_is_not(
        cluster: Cluster, ledger: Ledger) -> None:
    """Kubernetes' burn-in hold: the node registers with the startup taint, so no pod lands there;
    it reads as held for its burn-in (the agent's hold on Slurm), the reconciler starts its burn-in,
    the burn-in's drain takes it over and its resume, once the check passed, lifts the taint with
    the cordon. A node an operator cordoned keeps both: it is not a burn-in hold."""
    instance = "i-0b1e55ed0000c0de1"
    joined = cluster.node("ip-10-0-3-7.ec2.internal", provider_id=f"aws:///us-east-1a/{instance}",
                          taints=[STARTUP_TAINT])
    kept = cluster.node("gpu-op", cordoned=True, taints=[STARTUP_TAINT], provider_id="aws:///us-east-1a/i-0feed0000000000aa")
    orch = KubernetesOrchestrator(cluster.api, prefix=PREFIX)
    status = orch.node_status(joined)
    assert status.drained and status.reason == f"{PREFIX}:burn-in {instance} joined"
    assert orch.node_status(kept).reason == "cordoned (not by NodeMedic)"

    started: list[NodeHealthEvent] = []
    for _ in range(2):  # the second run that sees it starts it
        reconcile(cluster="c1", ledger=ledger, orchestrator=orch, execution_status=lambda _: "RUNNING", prefix=PREFIX,
                  now=datetime.now(UTC), publish=started.append)
    assert [(e.node.slurm_node, e.node.instance_id, e.fault_code) for e in started if e.node.slurm_node in
            (joined, kept)] == [(joined, instance, "NODE_JOINED")]

    incident = opened(ledger, joined, instance=instance).model_copy(
        update={"action": "burn_in", "fault_code": "NODE_JOINED", "fault_class": "burn_in"})
    out = drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)
    assert out.drained_by_pipeline and out.requeued_jobs == []
    assert cluster.read_node(joined).spec.unschedulable and {DRAIN_TAINT, BURN_IN_TAINT} <= set(cluster.taints(joined))
    done = resume(incident, "service", orchestrator=orch, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=0,
                  clock=clock)
    assert done.resumed
    assert not cluster.read_node(joined).spec.unschedulable and cluster.taints(joined) == {}  # pods may land now
    assert cluster.read_node(kept).spec.unschedulable and BURN_IN_TAINT in cluster.taints(kept)  # untouched
    assert not orch.resume(kept, f"{PREFIX}:{incident.incident_id}")  # nor lifted by an incident not its own


def test_a_planned_drain_asks_the_pods_to_checkpoint_and_evicts_them_once_they_report_it(
        cluster: Cluster, ledger: Ledger) -> None:
    """The annotation contract: NodeMedic annotates the job's pods on the node; the pod (here the
    test plays its trainer) annotates itself once its checkpoint is durable; then it is evicted."""
    node, peer = cluster.node("gpu-1"), cluster.node("gpu-2")
    started = datetime.now(UTC) - timedelta(minutes=30)
    cluster.pod("llm-worker-0", node, owner=("PyTorchJob", "llm"), started=started)
    cluster.pod("llm-worker-1", peer, owner=("PyTorchJob", "llm"), started=started)
    orch = KubernetesOrchestrator(cluster.api)
    incident = opened(ledger, node).model_copy(update={"fault_code": "PLANNED_RETIREMENT", "fault_class": "planned"})
    policy = CheckpointPolicy(default=CheckpointRule(grace_seconds=600))
    with pytest.raises(CheckpointPendingError):
        drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock, checkpoints=policy)
    asked = cluster.core.read_namespaced_pod("llm-worker-0", cluster.namespace).metadata.annotations
    assert CHECKPOINT_REQUESTED in asked  # asked, on the drained node only
    assert CHECKPOINT_REQUESTED not in (cluster.core.read_namespaced_pod(
        "llm-worker-1", cluster.namespace).metadata.annotations or {})
    assert "llm-worker-0" in cluster.live_pods(node)  # not evicted before its checkpoint
    with pytest.raises(CheckpointPendingError, match="waiting"):
        drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock, checkpoints=policy)
    saved_at = datetime.now(UTC).timestamp()
    cluster.core.patch_namespaced_pod("llm-worker-0", cluster.namespace,
                                      {"metadata": {"annotations": {CHECKPOINTED: f"{saved_at:.0f}"}}})
    out = drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock, checkpoints=policy)
    assert out.requeued_jobs == [f"{cluster.namespace}/PyTorchJob/llm"]
    [job] = out.checkpoint.jobs
    assert job.outcome == "checkpointed" and job.work_saved_s >= 29 * 60  # 30 minutes of training kept
    assert "llm-worker-0" not in cluster.live_pods(node)


class _ResettingHost:
    """The host side of the GPU reset rung (no GPU here): the SSM command, behind RunCommand's
    interface. It records each reset with the pods on the node at that moment."""

    def __init__(self, cluster: Cluster, node: str) -> None:
        self.cluster, self.node, self.resets = cluster, node, []  # type: ignore[var-annotated]

    def send(self, instance_id: str, document: str, parameters: dict[str, str], timeout_s: int, comment: str = "") -> str:
        self.resets.append(sorted(self.cluster.live_pods(self.node)))
        return f"cmd-{len(self.resets)}"

    def wait(self, instance_id: str, command_id: str, timeout_s: int) -> CommandResult:
        return CommandResult(instance_id, command_id, "Success", 0, "GPUs reset", "")


@pytest.mark.parametrize("leaves", [True, False], ids=["clients-leave", "clients-stay"])
def test_the_gpu_reset_waits_for_the_gpu_clients_to_leave_and_brings_them_back(
        cluster: Cluster, ledger: Ledger, leaves: bool) -> None:
    """The driver refuses a GPU reset while anything holds the GPUs open: on Kubernetes the GPU
    operator's daemons and the agent. The rung pauses them by their deploy labels, waits until the
    DaemonSet controller has removed them, resets, and puts the labels back before the check.
    Daemons that never leave: after GPU_CLIENTS_WAIT_S the reset is skipped (the ladder goes on)."""
    from tests.kube.test_orchestrator import OPERATOR_LABELS, _gpu_operator_node

    node = _gpu_operator_node(cluster, OPERATOR_LABELS)
    orch, host = KubernetesOrchestrator(cluster.api), _ResettingHost(cluster, node)
    incident = opened(ledger, node, ladder=("gpu_reset", "reboot"))
    drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)
    now = [datetime.now(UTC)]

    def climb() -> Any:
        return repair(incident, "service", provider=MemoryProvider(), orchestrator=orch, runner=host,  # type: ignore[arg-type]
                      ledger=ledger, documents=Documents("c1"), timeout_s=5, check_timeout_s=60, prefix=PREFIX,
                      clock=lambda: now[0])

    with pytest.raises(GpuClientsPendingError, match="3 GPU client pod"):
        climb()
    assert host.resets == []  # nothing reset while the device plugin, dcgm-exporter and the agent hold the GPUs
    if leaves:
        cluster.remove_daemon_pods_turned_away(node)  # the DaemonSet controller
        out = climb()
        assert host.resets == [["fluent-bit-x", "nvidia-driver-x"]]
    else:
        now[0] += timedelta(seconds=GPU_CLIENTS_WAIT_S + 1)
        out = climb()
        assert host.resets == []
    rung = ledger.get(incident.incident_id).stages["repair"].result["rungs"][0]  # type: ignore[index]
    assert out.rung == "gpu_reset" and rung["reset"]["status"] == ("Success" if leaves else "Skipped")
    labels = cluster.read_node(node).metadata.labels
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/gpu.deploy.")} == OPERATOR_LABELS
    assert orch.gpu_clients_paused() == {}


def test_the_reconciler_brings_back_the_gpu_clients_an_ended_incident_left_paused(
        cluster: Cluster, ledger: Ledger, aws: EmbeddedAWS) -> None:
    from tests.kube.test_orchestrator import OPERATOR_LABELS, _gpu_operator_node

    node = _gpu_operator_node(cluster, OPERATOR_LABELS)
    orch = KubernetesOrchestrator(cluster.api)
    running = opened(ledger, node)
    orch.pause_gpu_clients(node, running.incident_id)
    report = reconcile(cluster="c1", ledger=ledger, orchestrator=orch, execution_status=lambda _: "RUNNING",
                       prefix=PREFIX, now=datetime.now(UTC), publish=lambda _: None)
    assert report.gpu_clients_resumed == []  # its incident is open: its GPU reset is under way
    with index_lag(aws.client("dynamodb"), unlisted=[f"INCIDENT#{running.incident_id}"]):  # opened a moment ago
        report = reconcile(cluster="c1", ledger=ledger, orchestrator=orch, execution_status=lambda _: "RUNNING",
                           prefix=PREFIX, now=datetime.now(UTC), publish=lambda _: None)
    assert report.gpu_clients_resumed == []  # the bookkeeping's index did not list it yet: its own read says open
    ledger.end(ledger.get(running.incident_id), "failed", datetime.now(UTC), "repair failed", release_node=True)
    report = reconcile(cluster="c1", ledger=ledger, orchestrator=orch, execution_status=lambda _: "FAILED",
                       prefix=PREFIX, now=datetime.now(UTC), publish=lambda _: None)
    assert report.gpu_clients_resumed == [node] and report.counts()["gpu_clients"] == 1
    assert any("resumed the GPU clients" in p and node in p for p in report.pages)
    labels = cluster.read_node(node).metadata.labels
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/gpu.deploy.")} == OPERATOR_LABELS


def _kept(cluster: Cluster, node: str) -> dict[str, str]:
    annotations = cluster.read_node(node).metadata.annotations or {}
    return {k: v for k, v in annotations.items() if k in AUTOSCALER_HOLDS}


def test_a_node_returned_to_service_by_hand_is_given_back_to_the_autoscalers_by_the_reconciler(
        cluster: Cluster, ledger: Ledger) -> None:
    """NodeMedic keeps the nodes it holds from Karpenter and the Cluster Autoscaler, and lets them go
    when it returns them. An operator who uncordons and untaints one by hand (kubectl) left the
    holds: the node served on and was never consolidated or scaled down again."""
    by_hand, mid_incident, spare, held = (cluster.node(n) for n in ("gpu-1", "gpu-2", "gpu-3", "gpu-4"))
    own = cluster.node("gpu-5")
    cluster.core.patch_node(own, {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}})
    orch = KubernetesOrchestrator(cluster.api, prefix=PREFIX)
    incident = opened(ledger, mid_incident)
    for node in (by_hand, mid_incident, spare, held, own):
        assert orch.drain(node, f"{PREFIX}:{incident.incident_id} XID 79")
    assert orch.add_spare(spare, f"{PREFIX}:{incident.incident_id}")
    # by_hand was dead for a while: NodeMedic set the out-of-service taint too (and recorded that)
    cluster.core.patch_node(by_hand, {"metadata": {"annotations": {OUT_OF_SERVICE_SET: "true"}}})
    for node in (by_hand, mid_incident, own):  # kubectl uncordon, and the taints removed
        cluster.core.patch_node(node, {"spec": {"unschedulable": False, "taints": None}})

    assert set(orch.stray_autoscaler_holds()) == {by_hand, mid_incident, own}  # not the spare, nor the one held
    report = reconcile(cluster="c1", ledger=ledger, orchestrator=orch, execution_status=lambda _: "RUNNING",
                       prefix=PREFIX, now=datetime.now(UTC), publish=[].append)
    assert sorted(report.autoscaler_holds_released) == sorted([by_hand, own]) and report.errors == []
    assert report.counts()["autoscaler_hold"] == 2 and any(by_hand in p and "returned to service" in p
                                                           for p in report.pages)
    left = cluster.read_node(by_hand).metadata.annotations or {}
    assert _kept(cluster, by_hand) == {} and REASON not in left
    assert OUT_OF_SERVICE_SET not in left  # an out-of-service taint set later is not NodeMedic's to lift
    assert _kept(cluster, own) == {"karpenter.sh/do-not-disrupt": "true"}  # the operator's own hold stays
    assert _kept(cluster, mid_incident) == _kept(cluster, spare) == _kept(cluster, held) == {
        "karpenter.sh/do-not-disrupt": "true", "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}
    assert cluster.read_node(held).spec.unschedulable  # NodeMedic's drain is not touched
    again = reconcile(cluster="c1", ledger=ledger, orchestrator=orch, execution_status=lambda _: "RUNNING",
                      prefix=PREFIX, now=datetime.now(UTC), publish=[].append)
    assert again.autoscaler_holds_released == []


def test_a_degraded_nodes_pods_run_on_until_a_lost_gpu_then_leave_within_their_budget(
        cluster: Cluster, ledger: Ledger) -> None:
    """A DEGRADED node's pods run on after its drain; its check rung waits for them. A GPU lost
    on the node (noted on its incident as Detect notes it) ends the wait: the pods are evicted
    through the Eviction API, their PodDisruptionBudget respected, then the node is checked."""
    from nodemedic.contracts.incident import FoldedFault
    from nodemedic.errors import NodeDrainingError

    node, peer = cluster.node("gpu-1"), cluster.node("gpu-2")
    cluster.pod("llm-worker-0", node, owner=("PyTorchJob", "llm"))
    cluster.pod("llm-worker-1", peer, owner=("PyTorchJob", "llm"))
    cluster.pdb("llm", allowed=0)
    orch = KubernetesOrchestrator(cluster.api)
    incident = opened(ledger, node).model_copy(update={"fault_code": "FAIL_SLOW", "fault_class": "fail_slow",
                                                        "action": "degrade", "ladder": ("check", "reboot")})
    out = drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)
    assert out.requeued_jobs == [] and "llm-worker-0" in cluster.live_pods(node)

    def check_rung() -> Any:
        return repair(incident, "service", provider=MemoryProvider(), orchestrator=orch,
                      runner=RunCommand(None, poll_interval=0), ledger=ledger, documents=Documents("c1"),
                      timeout_s=30, check_timeout_s=600, prefix=PREFIX, clock=clock)

    with pytest.raises(NodeDrainingError):
        check_rung()
    ledger.note_folded(incident.incident_id, FoldedFault(fault_code="XID 79", fault_class="gpu_lost",
                                                         action="replace", observed_at=clock()))
    with pytest.raises(EvictionPendingError, match="PodDisruptionBudget"):
        check_rung()
    cluster.allow("llm", 1)
    cluster.confirm_deletions()
    assert check_rung().rung == "check" and "llm-worker-0" not in cluster.live_pods(node)
    [rung] = ledger.get(incident.incident_id).repair_rungs
    assert rung.requeued == [f"{cluster.namespace}/PyTorchJob/llm"] and "XID 79" in rung.requeued_because


def test_a_node_deleted_before_its_return_retires_the_incident_and_one_deleted_after_it_closes_it(
        cluster: Cluster, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster deletes a repaired node (its instance ended outside NodeMedic) before Resume
    returns it: nothing is left to return, and the incident is retired with its lock released
    instead of failing on the API server's 404. Deleted right after its return (while Resume waits
    for the jobs): the return was made, and the incident closes on a node that reads GONE."""
    orch = KubernetesOrchestrator(cluster.api)
    before, after = cluster.node("gpu-1"), cluster.node("gpu-2")
    first, second = opened(ledger, before), opened(ledger, after)
    for incident in (first, second):
        drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)

    cluster.core.delete_node(before)
    with pytest.raises(NodeGoneError, match=f"no node {before}"):
        resume(first, "service", orchestrator=orch, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=0, clock=clock)
    ended = retire(first, ledger=ledger, clock=clock)
    assert ended.status == "retired" and "it was gone before it could be returned" in ended.message
    assert ledger.get(first.incident_id).status == "retired"
    assert ledger.node_lock(first.cluster, first.instance_id) is None

    returned = orch.resume

    def returned_then_deleted(node: str, owner: str = "*") -> bool:
        done = returned(node, owner)
        cluster.core.delete_node(node)
        return done

    monkeypatch.setattr(orch, "resume", returned_then_deleted)
    out = resume(second, "service", orchestrator=orch, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=0,
                 clock=clock)
    assert (out.resumed, out.node_state) == (True, "GONE")
    assert ledger.get(second.incident_id).status == "closed"


def test_a_drain_of_a_deleted_node_moves_its_pods_and_a_retry_after_a_lost_answer_still_knows_its_jobs(
        cluster: Cluster, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node was deleted before the drain (its instance ended): nothing to cordon, no hold kept;
    its training pod, which no kubelet will ever stop, is deleted at once whatever the budget says,
    and its job is requeued. A drain whose answer was lost after those deletions (the function
    timed out) is retried: the pods are gone, yet the job is still reported, so it takes a spare."""
    node, peer = cluster.node("gpu-1"), cluster.node("gpu-2")
    cluster.pod("llm-worker-0", node, owner=("PyTorchJob", "llm"))
    cluster.pod("llm-worker-1", peer, owner=("PyTorchJob", "llm"))
    cluster.pdb("llm", allowed=0)  # a budget does not hold the pod of a deleted node
    orch = KubernetesOrchestrator(cluster.api)
    job = f"{cluster.namespace}/PyTorchJob/llm"
    incident = opened(ledger, node)
    cluster.core.delete_node(node)

    moved = orch.evacuate

    def answer_lost(name: str, started_at: float | None = None) -> Any:
        moved(name, started_at)
        raise TimeoutError("the function timed out after the deletions")

    monkeypatch.setattr(orch, "evacuate", answer_lost)
    with pytest.raises(TimeoutError):
        drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)
    assert "llm-worker-0" not in cluster.live_pods(node)
    monkeypatch.setattr(orch, "evacuate", moved)
    out = drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)  # the state machine's retry
    assert out.node_gone and out.drained_by_pipeline and out.requeued_jobs == [job]
    assert ledger.hold_of(incident.cluster, node) is None
    assert "llm-worker-1" in cluster.live_pods(peer)


@pytest.mark.parametrize("step", ["_mark_out_of_service", "_evicting"])
def test_a_node_deleted_while_its_drain_holds_it_is_evacuated_as_gone_not_failed(
        cluster: Cluster, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """Its instance ended (a spot interruption) after the cordon, while the eviction pass was
    under way (a soak saw it): the cloud controller deleted the node between the pass's read and
    its next write. The drain no longer fails the incident (which left the job's pod bound to a
    node that will never run it): the node's pods are deleted and its job is requeued, as for a
    node gone before the drain; the hold on its name is dropped; the job takes the spare."""
    node, peer = cluster.node("gpu-1", ready=False), cluster.node("gpu-2")
    spare = cluster.node("spare-1", taints=[{"key": SPARE_TAINT, "value": "true", "effect": "NoSchedule"}])
    cluster.pod("llm-worker-0", node, owner=("PyTorchJob", "llm"))
    cluster.pod("llm-worker-1", peer, owner=("PyTorchJob", "llm"))
    cluster.pdb("llm", allowed=0)  # would hold the pod of a node that still exists
    orch = KubernetesOrchestrator(cluster.api)
    job = f"{cluster.namespace}/PyTorchJob/llm"
    incident = opened(ledger, node)
    original = getattr(orch, step)

    def deleted_first(name: str, *args: Any) -> Any:
        if name == node and name in {n.metadata.name for n in cluster.core.list_node().items}:
            cluster.core.delete_node(name)
        return original(name, *args)

    monkeypatch.setattr(orch, step, deleted_first)
    out = drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)
    assert (out.node_gone, out.drained_by_pipeline, out.requeued_jobs) == (True, True, [job])
    assert "llm-worker-0" not in cluster.live_pods(node) and "llm-worker-1" in cluster.live_pods(peer)
    assert ledger.hold_of(incident.cluster, node) is None
    assert ledger.get(incident.incident_id).stages["drain"].completed_at is not None
    spared = swap_in(incident, orchestrator=orch, provider=MemoryProvider(), ledger=ledger, pool_size=1, clock=clock)
    assert (spared.spare, spared.destination) == (spare, "pool")


def test_a_spare_deleted_before_it_is_taken_is_passed_over_for_the_next_one(
        cluster: Cluster, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first spare's instance ended (spot) between the pool's listing and its taking: the
    incident no longer fails with the job requeued and no spare; the claim on the gone name is
    released and the next ready spare takes the job."""
    tainted = [{"key": SPARE_TAINT, "value": "true", "effect": "NoSchedule"}]
    node, peer = cluster.node("gpu-1"), cluster.node("gpu-2")
    first, second = cluster.node("spare-1", taints=tainted), cluster.node("spare-2", taints=tainted)
    cluster.pod("llm-worker-0", node, owner=("PyTorchJob", "llm"))
    cluster.pod("llm-worker-1", peer, owner=("PyTorchJob", "llm"))
    orch = KubernetesOrchestrator(cluster.api)
    incident = opened(ledger, node)
    drain(incident, orchestrator=orch, ledger=ledger, prefix=PREFIX, clock=clock)
    take = orch.take_spare

    def deleted_first(name: str) -> None:
        if name == first and name in {n.metadata.name for n in cluster.core.list_node().items}:
            cluster.core.delete_node(name)
        take(name)

    monkeypatch.setattr(orch, "take_spare", deleted_first)
    spared = swap_in(incident, orchestrator=orch, provider=MemoryProvider(), ledger=ledger, pool_size=2, clock=clock)
    assert (spared.spare, spared.destination) == (second, "pool"), spared.reason
    assert f"{first} is gone" in spared.reason
    assert SPARE_TAINT not in cluster.taints(second)
    assert [c.key for c in ledger.get(incident.incident_id).claims] == [second]
    assert ledger.claim(SPARE_CLAIM, first, "another-incident")  # the gone name's claim was released


def test_a_dry_run_for_a_node_deleted_meanwhile_ends_dry_run_saying_so_not_failed(cluster: Cluster,
                                                                                   ledger: Ledger) -> None:
    """Shadow mode, and the node was deleted (its instance ended) before the plan was made: the
    incident ends ``dry_run`` with a plan that says so; it no longer fails and pages."""
    node = cluster.node("gpu-1")
    incident = opened(ledger, node)
    cluster.core.delete_node(node)
    gate = GateOutput(verdict="dry_run", reason="dry run: would proceed", rules=[], would="proceed")
    out = shadow(incident, gate, orchestrator=KubernetesOrchestrator(cluster.api), ledger=ledger, prefix=PREFIX,
                 health_check_command="nodemedic-check --level full", clock=clock)
    assert out.actions[-1].startswith(f"retire: the API server has no node {node}")
    ended = ledger.get(incident.incident_id)
    assert (ended.status, ended.outcome.count("retire:")) == ("dry_run", 1)
