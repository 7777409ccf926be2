"""The local mode's Kubernetes cluster: a real kube-apiserver (etcd, RBAC, EKS's IAM token
authentication through :class:`~nodemedic_sandbox.eks_authenticator.EksAuthenticator`), reached
the same way as on EKS, plus the parts of a cluster that cannot run here, played from one thread:

- the kubelet: a node registers (``spec.providerID`` naming its instance) once its instance has
  booted, with NodeMedic's burn-in startup taint ``nodemedic.io/burn-in`` (as the node group's
  ``taints`` or ``--register-with-taints`` put it, docs/kubernetes.md), and is ``Ready``
  ``READY_AFTER_S`` later (on EKS the CNI takes tens of seconds; scaled
  down), not while the instance reboots; the deletion of an evicted pod is confirmed;
- the cloud node-lifecycle controller: the node of a terminated instance is deleted;
- the pod garbage collector: a pod bound to a node that is gone is deleted (force, no budget)
  ``ORPHAN_QUARANTINE_S`` after it is first seen so (kube-controller-manager's podgc waits
  ``quarantineTime`` = 40 s; scaled down);
- any other controller the cluster adds (``controllers``: Karpenter, :mod:`nodemedic_sandbox.karpenter`);
- a training operator and the scheduler: each training job keeps its pods, a missing pod is made
  again and bound to a node that is ready, not cordoned and carries no taint (a hot spare does
  until NodeMedic takes it), at most one training pod per node. A job is placed on free nodes
  first; after that its pods only go to its own nodes or to the spare pool's (as a node
  affinity to its node group would), so a job whose node is out waits for it or for a spare.

It offers the local mode's scheduler interface (:class:`~nodemedic_sandbox.scheduler.Scheduler`),
so the demo and the tests drive it as they drive Slurm: ``submit``, ``job``, ``node``.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils
from kubernetes.client.rest import ApiException
from nodemedic.orchestrators.kubernetes import BURN_IN_TAINT, SPARE_TAINT, KubernetesOrchestrator

from nodemedic_sandbox import kube_apiserver
from nodemedic_sandbox.eks_authenticator import EksAuthenticator
from nodemedic_sandbox.kube_apiserver import KubeAPIServer

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "deploy" / "kubernetes" / "rbac.yaml"
NAMESPACE = "training"
TICK_S = 0.2
READY_AFTER_S = 1.0  # a new node's registration -> Ready (the CNI's start on EKS, scaled down)
ORPHAN_QUARANTINE_S = 2.0  # podgc's quarantineTime (pkg/controller/podgc/gc_controller.go: 40 s), scaled down
_TRAINING_OWNER = ("kubeflow.org/v1", "PyTorchJob")


@dataclass(frozen=True)
class Machine:
    """An instance of the cluster's node group, as the kubelet on it sees it."""

    instance_id: str
    zone: str
    dns_name: str  # the name its kubelet registers under (EKS's default: the private DNS name)
    running: bool
    booted: bool  # it has (re)booted: its kubelet answers
    terminated: bool


@dataclass
class TrainingJob:
    name: str
    replicas: int
    restarts: int = 0
    started: bool = False
    nodes: set[str] = field(default_factory=set)  # where its pods have run


@dataclass
class KubeScheduler:
    """Start with ``start()``, stop with ``stop()`` (the local mode does both)."""

    root: Path
    nodes: list[str]
    eks_cluster: str = "nodemedic-local"
    kind: str = "kubernetes"
    machines: Callable[[], list[Machine]] | None = None  # set by the cluster that owns the instances
    controllers: list[Callable[[], object]] = field(default_factory=list)  # more controllers to play (Karpenter)
    jobs: dict[str, TrainingJob] = field(default_factory=dict)
    _names: dict[str, str] = field(default_factory=dict)  # instance -> node name
    _ready: dict[str, bool] = field(default_factory=dict)  # node -> its Ready condition, as last set
    _registered: dict[str, float] = field(default_factory=dict)  # node -> time.monotonic() it registered
    _spares_seen: set[str] = field(default_factory=set)  # nodes that have been in the spare pool
    _orphans: dict[str, float] = field(default_factory=dict)  # pod -> time.monotonic() first seen on a gone node
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    errors: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {}

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        try:
            self.authenticator = self._stack.enter_context(EksAuthenticator(self.eks_cluster))
            self.server = self._stack.enter_context(KubeAPIServer(webhook_url=self.authenticator.url))
            self.api = self.server.api_client()
            self.core = k8s.CoreV1Api(self.api)
            k8s_utils.create_from_yaml(self.api, yaml_objects=list(yaml.safe_load_all(RBAC.read_text())))
            self.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
            self.view = KubernetesOrchestrator(self.api)  # the admin's view, in the stages' words
        except BaseException:
            self._stack.close()
            raise

    def start_playing(self) -> None:
        """Start the kubelet/controller/operator thread (once the instances exist)."""
        self._thread = threading.Thread(target=self._loop, name="kube-cluster", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._stack.close()

    def stop_controller(self, *, graceful: bool = False) -> None:
        """Stop the API server (the control plane of this cluster, as slurmctld is Slurm's)."""
        self.server.stop_apiserver(graceful=graceful)

    def start_controller(self, *, unsynced_s: float = 0.0) -> None:
        """Start the API server again. ``unsynced_s``: for that long after it answers, it refuses
        NodeMedic's groups (403), as an API server whose RBAC informers have not synced yet does
        (kubernetes#121635): their bindings are taken away, then put back, so the real authorizer
        answers as the unsynced one would."""
        self.server.start_apiserver()
        if unsynced_s:
            rbac = k8s.RbacAuthorizationV1Api(self.api)
            bindings = [o for o in yaml.safe_load_all(RBAC.read_text()) if o and o["kind"] == "ClusterRoleBinding"]
            for binding in bindings:
                rbac.delete_cluster_role_binding(binding["metadata"]["name"])
            time.sleep(unsynced_s)
            k8s_utils.create_from_yaml(self.api, yaml_objects=bindings)

    # -- nodes ------------------------------------------------------------------------------
    def register(self, node: str, machine: Machine, *, spare: bool = False, ready: bool = True) -> None:
        """The kubelet of ``machine`` registers as ``node``: ``ready`` at once (the cluster's first
        nodes; a spare carries NodeMedic's spare taint) or not yet (a node joining later, held for
        its burn-in by the startup taint)."""
        taints = [k8s.V1Taint(key=SPARE_TAINT, value="true", effect="NoSchedule")] if spare else []
        if not ready:
            taints.append(k8s.V1Taint(key=BURN_IN_TAINT, value="pending", effect="NoSchedule"))
        self.core.create_node(k8s.V1Node(
            metadata=k8s.V1ObjectMeta(name=node, labels={
                "nvidia.com/gpu.present": "true", "topology.kubernetes.io/zone": machine.zone,
                "node.kubernetes.io/instance-type": "p5.48xlarge"}),
            spec=k8s.V1NodeSpec(provider_id=f"aws:///{machine.zone}/{machine.instance_id}", taints=taints or None)))
        with self._lock:
            self._names[machine.instance_id] = node
            # a node Ready at once has been up READY_AFTER_S already: the kubelet loop must not
            # report it NotReady for its first second (jobs submitted then landed elsewhere)
            self._registered[node] = time.monotonic() - (READY_AFTER_S if ready else 0.0)
        self._set_ready(node, ready)

    def start_node(self, node: str) -> None:
        self._set_ready(node, True)

    def stop_node(self, node: str) -> None:
        self._set_ready(node, False)

    def _set_ready(self, node: str, ready: bool) -> None:
        kube_apiserver.set_ready(self.api, node, ready, "local mode")
        self._ready[node] = ready

    def node(self, node: str) -> dict[str, str]:
        """The node in the stages' words (``IDLE``, ``ALLOCATED``, ``+DRAIN``…) and NodeMedic's reason."""
        status = self.view.node_status(node)
        return {"State": status.state, "Reason": status.reason}

    def node_names(self) -> list[str]:
        return sorted(n.metadata.name for n in self.core.list_node().items)

    def instance_of(self, node: str) -> str | None:
        return self.view.instance_of(node)

    def node_of(self, instance_id: str) -> str | None:
        return self.view.node_of(instance_id)

    def spares(self) -> list[str]:
        return sorted(s.name for s in self.view.spares())

    def taints(self, node: str) -> dict[str, str]:
        return {t.key: f"{t.value}:{t.effect}" for t in self.core.read_node(node).spec.taints or []}

    def cordoned_by_operator(self, node: str) -> None:
        """What ``kubectl cordon`` does."""
        self.core.patch_node(node, {"spec": {"unschedulable": True}})

    def hostnames(self, nodelist: str) -> list[str]:
        return [n for n in nodelist.split(",") if n]

    # -- training jobs ------------------------------------------------------------------------
    def submit(self, nodes: int, name: str = "train", seconds: int = 3600) -> str:
        """A PyTorchJob of ``nodes`` workers, one per node (its operator and the scheduler are
        played here); returns its id as the adapter names it, ``namespace/Kind/name``."""
        job = f"{name}-{next(self._ids)}" if name in self.jobs else name
        with self._lock:
            self.jobs[job] = TrainingJob(job, nodes)
        self._reconcile_jobs()
        return f"{NAMESPACE}/{_TRAINING_OWNER[1]}/{job}"

    def budget(self, job_id: str, allowed: int) -> None:
        """A PodDisruptionBudget over the job's pods (made once), with ``allowed`` disruptions (its
        status as the disruption controller would compute it)."""
        name = job_id.rsplit("/", 1)[1]
        with contextlib.suppress(ApiException):  # 409: it exists
            kube_apiserver.create_budget(self.api, NAMESPACE, name, {"job": name})
        kube_apiserver.allow_disruptions(self.api, NAMESPACE, name, allowed)

    def job(self, job_id: str) -> dict[str, str]:
        name = job_id.rsplit("/", 1)[1]
        with self._lock:
            job = self.jobs[name]
        pods = self._live_pods(name)
        running = len(pods) == job.replicas and all(p.status.phase == "Running" for p in pods)
        return {"JobState": "RUNNING" if running else "PENDING",
                "NodeList": ",".join(sorted(p.spec.node_name for p in pods if p.spec.node_name)),
                "Restarts": str(job.restarts), "Reason": "" if running else "Resources", "StartTime": ""}

    def pods_on(self, node: str) -> list[str]:
        return sorted(p.metadata.name for p in self.core.list_namespaced_pod(NAMESPACE).items
                      if p.spec.node_name == node and p.metadata.deletion_timestamp is None)

    def _live_pods(self, job: str) -> list[Any]:
        return [p for p in self.core.list_namespaced_pod(NAMESPACE, label_selector=f"job={job}").items
                if p.metadata.deletion_timestamp is None]

    # -- the parts a real cluster plays ----------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                for controller in self.controllers:
                    controller()
                self._kubelets()
                nodes = self.core.list_node().items
                self._see_spares(nodes)
                pods = self.core.list_namespaced_pod(NAMESPACE).items  # one read of each a tick
                self._confirm_deletions(pods)
                self._collect_orphans(nodes, pods)
                self._reconcile_jobs()
            except Exception as exc:  # noqa: BLE001 - a stopping API server, a race: try again next tick
                if not self._stop.is_set():
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def _kubelets(self) -> None:
        """A booted instance's kubelet registers its node, and reports it not ready while the
        instance reboots; a terminated instance's node is deleted (the cloud node-lifecycle
        controller)."""
        if self.machines is None:
            return
        for machine in self.machines():
            with self._lock:
                name = self._names.get(machine.instance_id)
            if name is None:
                if machine.running and machine.booted:
                    self.register(machine.dns_name, machine, ready=False)
                continue
            if machine.terminated:
                with contextlib.suppress(ApiException):
                    self.core.delete_node(name)
                with self._lock:
                    del self._names[machine.instance_id]
                continue
            up = time.monotonic() - self._registered[name] >= READY_AFTER_S
            if self._ready.get(name) != (ready := machine.running and machine.booted and up):
                self._set_ready(name, ready)

    def _see_spares(self, nodes: list[Any]) -> None:
        """Remember which of ``nodes`` are in the spare pool now: a started job's pods may go there
        once NodeMedic takes the spare (looked at every tick, so a node that joins the pool while
        no pod waits counts too)."""
        self._spares_seen |= {str(n.metadata.name) for n in nodes if any(t.key == SPARE_TAINT for t in n.spec.taints or [])}

    def _confirm_deletions(self, pods: list[Any]) -> None:
        """The kubelet confirms an evicted pod's deletion (its containers have stopped)."""
        for pod in pods:
            if pod.metadata.deletion_timestamp is not None:
                with contextlib.suppress(ApiException):
                    self.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)

    def _collect_orphans(self, nodes: list[Any], pods: list[Any]) -> None:
        """The pod garbage collector: a pod bound to a node the API server no longer has is
        deleted at once (grace 0) once it has been so for ``ORPHAN_QUARANTINE_S``."""
        names = {str(n.metadata.name) for n in nodes}
        now = time.monotonic()
        orphans = {str(p.metadata.name) for p in pods if p.spec.node_name and p.spec.node_name not in names}
        self._orphans = {pod: self._orphans.get(pod, now) for pod in orphans}
        for pod, since in list(self._orphans.items()):
            if now - since >= ORPHAN_QUARANTINE_S:
                with contextlib.suppress(ApiException):
                    self.core.delete_namespaced_pod(pod, NAMESPACE, grace_period_seconds=0)

    def _reconcile_jobs(self) -> None:
        """The training operator makes a missing worker again at once (Pending); the scheduler
        binds a pending worker to a free node and the kubelet there runs it."""
        with self._lock:
            for job in list(self.jobs.values()):
                pods = self._live_pods(job.name)
                live = {p.metadata.labels["worker"] for p in pods}
                made = [self._create_pod(job, i) for i in range(job.replicas) if str(i) not in live]
                if job.started and made:
                    job.restarts += 1  # as Slurm counts a requeue: once per restart of the job
                unbound = [p.metadata.name for p in pods if not p.spec.node_name] + made
                bound = 0
                for pod in unbound:
                    node = self._free_node(job)
                    if node is None:
                        break
                    self._bind(job, pod, node)
                    bound += 1
                job.started = job.started or bound == len(unbound)  # a bound worker runs at once here

    def _free_node(self, job: TrainingJob) -> str | None:
        """A node a pod of ``job`` fits on: the job's own or a (former) spare once it has started.
        A real scheduler scores the nodes and breaks ties at random; this one takes the last in
        name order (the local mode names spares last)."""
        nodes = self.core.list_node().items
        self._see_spares(nodes)
        busy = {p.spec.node_name for p in self.core.list_namespaced_pod(NAMESPACE).items}
        for node in sorted(nodes, key=lambda n: str(n.metadata.name), reverse=True):
            name = str(node.metadata.name)
            ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
            taints = [t for t in node.spec.taints or [] if t.effect in ("NoSchedule", "NoExecute")]
            allowed = not job.started or name in job.nodes or name in self._spares_seen
            if ready and not node.spec.unschedulable and not taints and name not in busy and allowed:
                return name
        return None

    def _create_pod(self, job: TrainingJob, index: int) -> str:
        """A worker of ``job`` as its operator makes it: Pending, on no node yet. Returns its name."""
        name = f"{job.name}-worker-{index}-{next(self._ids)}"
        self.core.create_namespaced_pod(NAMESPACE, k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=name, labels={"job": job.name, "worker": str(index)}, owner_references=[
                k8s.V1OwnerReference(api_version=_TRAINING_OWNER[0], kind=_TRAINING_OWNER[1], name=job.name,
                                     uid=f"uid-{job.name}", controller=True)]),
            spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="trainer", image="trainer:local")])))
        return name

    def _bind(self, job: TrainingJob, pod: str, node: str) -> None:
        """The scheduler's binding, then the kubelet starting the container."""
        job.nodes.add(node)
        # the client cannot read the binding's answer back (a Status, not a V1Binding)
        self.core.create_namespaced_pod_binding(pod, NAMESPACE, k8s.V1Binding(
            metadata=k8s.V1ObjectMeta(name=pod), target=k8s.V1ObjectReference(kind="Node", name=node)),
            _preload_content=False)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.core.patch_namespaced_pod_status(pod, NAMESPACE, {"status": kube_apiserver.running_status(
            now, "trainer", "trainer:local")})
