"""Kubernetes (EKS, HyperPod-EKS, Karpenter) behind the same orchestrator interface as Slurm.

What "drained" means here: the node is cordoned (``spec.unschedulable``) and carries NodeMedic's
taint ``nodemedic.io/unhealthy`` (``NoSchedule``), its reason in the annotation
``nodemedic.io/drain-reason`` (owner tag first, as on Slurm) and a ``NodeMedicUnhealthy`` node
condition saying why. A cordon without that annotation is someone else's: it is never lifted, and
a drain only takes it over when its reason starts with ``takeover``. Every change is one JSON
patch whose first operation tests the ``resourceVersion`` read just before: when anything changed
the node in between (an operator's ``kubectl cordon`` racing the incident), the apiserver refuses
the patch and the decision is made again on what is there now. That is Slurm's check-and-act in
one scheduler command, here.

"Jobs" are the training workloads whose pods run on the node (:func:`workload_of`): a JobSet, a
LeaderWorkerSet, a Kubeflow training job, a batch Job, or a pod labelled
``nodemedic.io/training=true``; a job's id is ``namespace/Kind/name``. The safety rule (no
destructive step on a node that runs a job) and the job-downtime metric read these.

Evacuation goes through the Eviction API, so PodDisruptionBudgets hold; DaemonSet pods, mirror
pods and finished pods are skipped, and each namespace has a mode (:class:`DrainRule`). The
Eviction API's group version is negotiated by discovery: ``policy/v1`` (Kubernetes 1.22+, every
EKS version) or ``policy/v1beta1`` (1.20/1.21).

Checkpoints (the checkpoint policy, docs/checkpoints.md): NodeMedic asks a job's pods on the node
to checkpoint by annotating them ``nodemedic.io/checkpoint-requested=<epoch>`` (a pod sees its
annotations in a downward-API volume, refreshed by the kubelet); a pod reports a durable
checkpoint by annotating itself ``nodemedic.io/checkpointed=<epoch>``. The eviction after that
gives the pod its termination grace period.

The burn-in hold: a GPU node registers with the startup taint ``nodemedic.io/burn-in``
(``NoSchedule``; the kubelet's ``--register-with-taints``, a managed node group's ``taints``,
Karpenter's ``startupTaints``), so no pod lands on it before its first check. Such a node reads
as drained with the burn-in hold's reason (``<prefix>:burn-in <instance> joined``, as the agent's
hold on Slurm): the reconciler starts its burn-in, whose drain takes it over and whose resume (or
return to the spare pool) removes the taint with NodeMedic's cordon once the full check passed.

Spares are nodes that carry the taint ``nodemedic.io/spare`` (``NoSchedule``): idle, checked,
and unusable by pods that do not tolerate it. Taking a spare removes the taint, so the training
operator's replacement pods can land there.

The node state uses the scheduler-neutral words the stages read (Slurm's): ``IDLE``,
``ALLOCATED`` (training pods run there), ``+DRAIN`` (cordoned), ``+NOT_RESPONDING`` (the
kubelet's ``Ready`` condition is not ``True``), ``+RESERVED`` (a spare).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Literal

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nodemedic.contracts.problems import read_json
from nodemedic.domain.scontrol import burn_in_reason
from nodemedic.errors import (
    CommandFailedError,
    DrainFailedError,
    NodeGoneError,
    NodeMedicError,
    PolicyError,
    ResumeFailedError,
)
from nodemedic.orchestrators import eks_auth
from nodemedic.orchestrators.base import EvacuationResult, JobState, NodeStatus, RunningJob

DRAIN_TAINT = "nodemedic.io/unhealthy"
SPARE_TAINT = "nodemedic.io/spare"
BURN_IN_TAINT = "nodemedic.io/burn-in"  # a joined node's startup taint: out of scheduling until checked
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"  # pods and volumes of a dead node move
REASON = "nodemedic.io/drain-reason"
OUT_OF_SERVICE_SET = "nodemedic.io/out-of-service"  # NodeMedic set the out-of-service taint
# the workloads a drain (its start, epoch) evicts from the node, written before it evicts them
EVICTING = "nodemedic.io/evicting"
CHECKPOINT_REQUESTED = "nodemedic.io/checkpoint-requested"  # NodeMedic asks the pod to checkpoint (epoch)
# A drained node and a hot spare run no workload, so Karpenter's consolidation (an empty node) and
# the Cluster Autoscaler's scale-down would remove them: mid-repair, or the pool's spares. Each
# honours a node annotation that keeps it away (Karpenter: "Node-Level Controls"; the Cluster
# Autoscaler FAQ: scale-down-disabled); NodeMedic sets the ones absent while it holds the node,
# records which in KEPT_FROM_AUTOSCALERS, and removes only those when it lets the node go.
AUTOSCALER_HOLDS = {"karpenter.sh/do-not-disrupt": "true", "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}
KEPT_FROM_AUTOSCALERS = "nodemedic.io/kept-from-autoscalers"
CHECKPOINTED = "nodemedic.io/checkpointed"  # the pod's own report: its checkpoint is durable (epoch)
CONDITION = "NodeMedicUnhealthy"
TRAINING_LABEL = "nodemedic.io/training"
MIRROR = "kubernetes.io/config.mirror"
# a deletion timestamp has whole seconds, and the API server's clock is not the function's
EVICTION_CLOCK_SLACK_S = 2.0
TRAINING_KINDS = frozenset({"Job", "PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob",
                            "TrainJob", "JobSet", "LeaderWorkerSet"})
WORKLOAD_LABELS = (("jobset.sigs.k8s.io/jobset-name", "JobSet"),
                   ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet"))
# SageMaker HyperPod (EKS) marks a node it is checking or recovering itself; NodeMedic leaves such a
# node to it (https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-eks-resiliency-node-labels.html)
HYPERPOD_HEALTH = "sagemaker.amazonaws.com/node-health-status"
HYPERPOD_HOLDS = frozenset({"Unschedulable", "UnschedulablePendingReplacement", "UnschedulablePendingReboot"})
CONFLICT_RETRIES = 5
# What holds a node's GPUs open outside any job, so that the driver refuses a GPU reset: the GPU
# operator's components, each a DaemonSet whose nodeSelector is its nvidia.com/gpu.deploy.<name>
# label set to "true", and out-of-tree NVML clients (this agent's DaemonSet), which select on
# gpu.deploy.client. NVIDIA's own tools pause a component by setting its label to another value
# (k8s-driver-manager: paused-for-driver-upgrade; mig-manager: paused-for-mig-change): the
# DaemonSet controller then removes its pod. They set it back to "true" when done.
GPU_CLIENT_LABELS = tuple(f"nvidia.com/gpu.deploy.{name}" for name in (
    "device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "client"))
# An NVML client's DaemonSet keeps its pod where gpu.deploy.client is "true" or absent (no GPU
# operator, or one older than the label): where it is absent, the pause adds it, and the resume
# takes it away again.
NVML_CLIENT_LABEL = "nvidia.com/gpu.deploy.client"
GPU_CLIENTS_PAUSED = "paused-for-nodemedic-gpu-reset"
PAUSED_CLIENTS = "nodemedic.io/paused-gpu-clients"  # {"owner": incident, "labels": {label: its value before}}
# The EC2 instance behind a node, at the end of its spec.providerID: "aws:///us-east-1a/i-0abc…"
# (managed node groups, self-managed, Karpenter) or ".../sagemaker/cluster/hyperpod-<id>-i-0abc…"
# (HyperPod; https://github.com/kubernetes/autoscaler/pull/8195 describes the form).
_PROVIDER_ID_INSTANCE = re.compile(r"^aws://.*[/-](i-[0-9a-f]{8,17})$")
_LABEL_VALUE_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class DrainRule(BaseModel):
    """How the pods of one namespace leave a drained node.

    ``evict``: the Eviction API at once, with ``grace_seconds``; an eviction a PodDisruptionBudget
    blocks is retried until ``timeout_seconds`` after the drain began, then left running and
    reported (the job is not requeued). ``wait``: the pods run to completion; those still running
    at ``timeout_seconds`` are evicted. ``delete``: evicted at once; one still blocked at
    ``timeout_seconds`` is deleted (the budget is overridden: a dead GPU serves nobody)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    mode: Literal["evict", "wait", "delete"] = "evict"
    grace_seconds: int | None = Field(default=None, ge=0, le=3600, description="None: the pod's own")
    timeout_seconds: int = Field(default=600, ge=0, le=3600)

    def waits(self, elapsed: float) -> bool:
        """``elapsed`` seconds into the drain, the pods still run on (``wait`` mode, before its timeout)."""
        return self.mode == "wait" and elapsed < self.timeout_seconds


class DrainPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    default: DrainRule = DrainRule()
    namespaces: dict[str, DrainRule] = Field(default_factory=dict)

    def rule(self, namespace: str) -> DrainRule:
        return self.namespaces.get(namespace, self.default)


def parse_drain_policy(text: str) -> DrainPolicy:
    try:
        return DrainPolicy.model_validate_json(text or "{}")
    except ValidationError as exc:
        raise PolicyError(f"invalid Kubernetes drain policy: {exc}") from exc


def workload_of(pod: Any) -> str | None:
    """The training workload ``namespace/Kind/name`` a pod belongs to, or None for other pods."""
    meta = pod.metadata
    labels = meta.labels or {}
    for label, kind in WORKLOAD_LABELS:
        if labels.get(label):
            return f"{meta.namespace}/{kind}/{labels[label]}"
    owner = next((o for o in meta.owner_references or [] if o.controller), None)
    if owner is not None and owner.kind in TRAINING_KINDS:
        return f"{meta.namespace}/{owner.kind}/{owner.name}"
    if labels.get(TRAINING_LABEL) == "true":
        return f"{meta.namespace}/Pod/{meta.name}"
    return None


def _live(pod: Any) -> bool:
    return pod.status.phase not in ("Succeeded", "Failed") and pod.metadata.deletion_timestamp is None


def _movable(pod: Any) -> bool:
    """A pod a drain moves, whatever its phase: not a DaemonSet's, not a mirror pod."""
    if (pod.metadata.annotations or {}).get(MIRROR):
        return False
    return not any(o.kind == "DaemonSet" and o.controller for o in pod.metadata.owner_references or [])


def _evictable(pod: Any) -> bool:
    """What a drain moves: a live pod (not finished, not being deleted), not a DaemonSet's, not a mirror pod."""
    return _live(pod) and _movable(pod)


def _leaving_since(pod: Any, since: float) -> bool:
    """A running pod whose deletion (an eviction) was asked at ``since`` or later: its deletion
    timestamp is the request's time plus its grace period (whole seconds)."""
    deleted = pod.metadata.deletion_timestamp
    if deleted is None or pod.status.phase in ("Succeeded", "Failed") or not _movable(pod):
        return False
    asked: float = deleted.timestamp() - (pod.metadata.deletion_grace_period_seconds or 0)
    return asked >= since - EVICTION_CLOCK_SLACK_S


def _started(pod: Any) -> float | None:
    """When the pod's containers last started (else the pod's own start), epoch seconds."""
    starts = [c.state.running.started_at for c in pod.status.container_statuses or []
              if c.state and c.state.running and c.state.running.started_at]
    when = max(starts) if starts else pod.status.start_time
    return when.timestamp() if when else None


def _marker(pod: Any) -> float | None:
    """The pod's checkpoint marker, or None (absent or not an epoch). Python reads "nan" and "inf"
    as numbers: a NaN marker differs from every earlier one, so it would read as a checkpoint just
    written, and an infinite one as infinite work saved; neither is an epoch."""
    value = (pod.metadata.annotations or {}).get(CHECKPOINTED, "")
    try:
        epoch = float(value)
    except ValueError:
        return None
    return epoch if math.isfinite(epoch) and epoch > 0 else None


def _evicting_record(value: str, started_at: float) -> dict[str, int | None]:
    """The workloads in a node's ``nodemedic.io/evicting`` record if the drain that began at
    ``started_at`` wrote it, each with its live pods then (None in a record without them);
    nothing for another drain's record or one that cannot be read."""
    try:
        record = read_json(value)
        since, workloads = float(record["since"]), record["workloads"]
        members = record.get("members", {})
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}
    if not abs(since - started_at) <= 1e-3 or not isinstance(workloads, list):  # "not <=": a NaN is no match
        return {}
    counts = members if isinstance(members, dict) else {}
    return {w: n if isinstance(n := counts.get(w), int) and not isinstance(n, bool) and n > 0 else None
            for w in workloads if isinstance(w, str)}


def _selects(pod: Any, labels: dict[str, str]) -> bool:
    """Whether ``pod``'s nodeSelector and required node affinity still accept a node with
    ``labels``: what the DaemonSet controller asks before it removes a daemon pod from a node."""
    spec = pod.spec
    if any(labels.get(k) != v for k, v in (spec.node_selector or {}).items()):
        return False
    required = getattr(getattr(getattr(spec, "affinity", None), "node_affinity", None),
                       "required_during_scheduling_ignored_during_execution", None)
    terms = (required.node_selector_terms or []) if required is not None else []
    return not terms or any(all(_matches(e, labels) for e in term.match_expressions or []) for term in terms)


def _matches(expression: Any, labels: dict[str, str]) -> bool:
    value, values = labels.get(expression.key), expression.values or []
    match expression.operator:
        case "In":
            return value in values
        case "NotIn":
            return value not in values
        case "Exists":
            return value is not None
        case "DoesNotExist":
            return value is None
        case "Gt" | "Lt":
            try:
                number, bound = int(value or ""), int(values[0])
            except (ValueError, IndexError):
                return False
            return number > bound if expression.operator == "Gt" else number < bound
    return False


def _taint(key: str, value: str, effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": key, "value": _LABEL_VALUE_UNSAFE.sub("_", value)[:63].strip("_.-") or "true", "effect": effect}


def _holds_set(annotations: dict[str, str]) -> set[str]:
    """The autoscaler holds NodeMedic recorded that it set on the node."""
    return set(filter(None, annotations.get(KEPT_FROM_AUTOSCALERS, "").split(",")))


def _kept(annotations: dict[str, str]) -> dict[str, str]:
    """``annotations`` with the autoscalers' hold on the node, and which of its keys NodeMedic set."""
    ours = _holds_set(annotations) | {key for key in AUTOSCALER_HOLDS if key not in annotations}
    return {**annotations, **{k: v for k, v in AUTOSCALER_HOLDS.items() if k in ours},
            **({KEPT_FROM_AUTOSCALERS: ",".join(sorted(ours))} if ours else {})}


def _stray_holds(node: _Node) -> bool:
    """``node`` carries autoscaler holds NodeMedic set, and NodeMedic holds it no more: in service
    (not held: no cordon, no burn-in hold), without NodeMedic's drain taint, and no spare."""
    return bool(_holds_set(node.annotations)) and not node.held and not any(
        node.tainted(t) for t in (DRAIN_TAINT, SPARE_TAINT))


def _released(annotations: dict[str, str]) -> dict[str, str]:
    """``annotations`` without the autoscaler holds NodeMedic set (one someone else set stays)."""
    ours = _holds_set(annotations)
    return {k: v for k, v in annotations.items()
            if k != KEPT_FROM_AUTOSCALERS and not (k in ours and k in AUTOSCALER_HOLDS and v == AUTOSCALER_HOLDS[k])}


def _owned_by(annotations: dict[str, str], owner: str) -> bool:
    """The drain reason is ``owner``'s (the tag alone, or the tag and a word after it)."""
    ours = annotations.get(REASON, "")
    return ours == owner or ours.startswith(f"{owner} ")


class _Node:
    """One read of a node: what the decisions look at, and the patch that changes only our keys."""

    def __init__(self, raw: Any, prefix: str) -> None:
        self.raw = raw
        self.prefix = prefix
        self.name: str = raw.metadata.name
        self.version: str = raw.metadata.resource_version
        self.annotations: dict[str, str] = dict(raw.metadata.annotations or {})
        self.taints: list[dict[str, str]] = [
            {k: v for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect)) if v is not None}
            for t in raw.spec.taints or []]
        self.cordoned = bool(raw.spec.unschedulable)
        self.labels: dict[str, str] = dict(raw.metadata.labels or {})
        health = self.labels.get(HYPERPOD_HEALTH, "")
        self.hyperpod_hold = health if health in HYPERPOD_HOLDS else ""

    def tainted(self, key: str) -> bool:
        return any(t["key"] == key for t in self.taints)

    @property
    def ready(self) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in self.raw.status.conditions or [])

    @property
    def reason(self) -> str:
        """Ours (the annotation), a word on someone else's cordon, or the burn-in hold's."""
        if self.hyperpod_hold:
            return f"HyperPod: {self.hyperpod_hold}"
        if REASON in self.annotations:
            return self.annotations[REASON]
        if self.cordoned:
            return "cordoned (not by NodeMedic)"
        if self.tainted(BURN_IN_TAINT):
            return burn_in_reason(self.prefix, instance_of_provider_id(self.raw.spec.provider_id or "") or self.name)
        return ""

    @property
    def held(self) -> bool:
        """Out of scheduling: cordoned, held for its burn-in, or checked or recovered by HyperPod."""
        return self.cordoned or self.tainted(BURN_IN_TAINT) or bool(self.hyperpod_hold)

    def status(self, jobs: list[str]) -> NodeStatus:
        state = "ALLOCATED" if jobs else "IDLE"
        flags = [("DRAIN", self.held), ("NOT_RESPONDING", not self.ready), ("RESERVED", self.tainted(SPARE_TAINT))]
        state += "".join(f"+{flag}" for flag, on in flags if on)
        return NodeStatus(self.name, state, self.reason if self.held else "")

    def patch(self, *, cordoned: bool, taints: list[dict[str, str]], annotations: dict[str, str],
              labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """A JSON patch that applies only if nothing changed since this read."""
        return [{"op": "test", "path": "/metadata/resourceVersion", "value": self.version},
                {"op": "add", "path": "/spec/unschedulable", "value": cordoned},
                {"op": "add", "path": "/spec/taints", "value": taints},
                {"op": "add", "path": "/metadata/annotations", "value": annotations},
                *([{"op": "add", "path": "/metadata/labels", "value": labels}] if labels is not None else [])]

    @property
    def paused_clients(self) -> tuple[str, dict[str, str | None]] | None:
        """(owner, {label: its value before}) of NodeMedic's pause of the node's GPU clients; None
        when there is none (or its record is unreadable)."""
        try:
            record = read_json(self.annotations.get(PAUSED_CLIENTS, ""))
            before = {str(k): (None if v is None else str(v)) for k, v in dict(record["labels"]).items()}
            return str(record["owner"]), before
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def connect(eks: Any, sts: Any, cluster: str, drain_policy: str, prefix: str = "nodemedic", *,
            refusals_pass: bool = False) -> KubernetesOrchestrator:
    """The adapter for the EKS cluster ``cluster``, with the credentials of the ``sts`` client
    (a function's role, or an operator's), the drain policy's JSON text and the stack's
    DrainReasonPrefix; ``refusals_pass`` for the pipeline's functions (eks_auth.REFUSED_STATUSES)."""
    return KubernetesOrchestrator(eks_auth.api_client(eks, sts, cluster, refusals_pass=refusals_pass),
                                  policy=parse_drain_policy(drain_policy), prefix=prefix)


def refusal(exc: ApiException) -> str:
    """An API server's refusal in words: its status and the message of the Status object it
    answers with (``nodes "gpu-2" is forbidden: User … cannot patch …``), else the raw body."""
    try:
        message = read_json(exc.body or "")["message"]
    except (ValueError, TypeError, KeyError):
        message = exc.body
    return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")


def instance_of_provider_id(provider_id: str) -> str | None:
    """The EC2 instance id a node's ``spec.providerID`` names; None for anything else (Fargate,
    hybrid nodes, another cloud)."""
    match = _PROVIDER_ID_INSTANCE.match(provider_id or "")
    return match.group(1) if match else None


class KubernetesOrchestrator:
    """:class:`~nodemedic.orchestrators.base.Orchestrator` for Kubernetes, through its API server."""

    def __init__(self, api: Any, *, policy: DrainPolicy | None = None, prefix: str = "nodemedic",
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._core = k8s.CoreV1Api(api)
        self._prefix = prefix
        self._api = api
        self._policy = policy or DrainPolicy()
        self._clock = clock
        self._eviction_version: str | None = None

    @property
    def api(self) -> Any:
        """The API client (authenticated as the caller), for Karpenter's NodeClaims."""
        return self._api

    # -- reads ------------------------------------------------------------------------------
    def _read(self, node: str) -> _Node:
        try:
            return _Node(self._core.read_node(node), self._prefix)
        except ApiException as exc:
            if exc.status == 404:
                raise NodeGoneError(f"the API server has no node {node}: it was deleted (the cloud controller "
                                    "deletes the node of an instance that ended)") from exc
            raise CommandFailedError(f"the API server did not describe node {node}: {exc.status} {exc.reason}") from exc

    def _pods_on(self, node: str) -> list[Any]:
        try:
            return list(self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items)
        except ApiException as exc:
            raise CommandFailedError(f"cannot list the pods on {node}: {exc.status} {exc.reason}") from exc

    def _jobs(self, pods: Iterable[Any]) -> list[str]:
        return sorted({w for p in pods if _live(p) and (w := workload_of(p))})

    def node_status(self, node: str) -> NodeStatus:
        return self._read(node).status(self._jobs(self._pods_on(node)))

    def _running_pods(self) -> list[Any]:
        try:
            return list(self._core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items)
        except ApiException as exc:
            raise CommandFailedError(f"cannot list pods: {exc.status} {exc.reason}") from exc

    def _list_nodes(self) -> list[Any]:
        try:
            return list(self._core.list_node().items)
        except ApiException as exc:
            raise CommandFailedError(f"cannot list the nodes: {exc.status} {exc.reason}") from exc

    def nodes(self) -> list[NodeStatus]:
        busy: dict[str, list[Any]] = {}
        for pod in self._running_pods():
            busy.setdefault(pod.spec.node_name or "", []).append(pod)
        return [_Node(n, self._prefix).status(self._jobs(busy.get(n.metadata.name, []))) for n in self._list_nodes()]

    def jobs_on(self, node: str) -> list[str]:
        return self._jobs(self._pods_on(node))

    def adopt(self, node: str, instance_id: str, reason: str, since: float | None = None) -> str | None:
        """The node the replacement registered as (by its providerID), cordoned and tainted with
        ``reason`` at once so no pod lands there before its check; None until it registers."""
        new = self.node_of(instance_id)
        if new is not None:
            self.drain(new, reason)  # an operator's cordon already there is kept (drain says so)
        return new

    # -- which instance backs which node: its spec.providerID ---------------------------------
    def instance_of(self, node: str) -> str | None:
        """The instance behind ``node``; None when the cluster has no such node (or it is not EC2)."""
        try:
            raw = self._core.read_node(node)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise CommandFailedError(f"the API server did not describe node {node}: {exc.status} {exc.reason}") from exc
        return instance_of_provider_id(raw.spec.provider_id or "")

    def node_of(self, instance_id: str) -> str | None:
        """The node ``instance_id`` backs; None when no node names it (not joined yet, or gone)."""
        return self.node_names().get(instance_id)

    def node_names(self) -> dict[str, str]:
        """Each instance's node, for every node whose ``spec.providerID`` names an EC2 instance."""
        return {instance: str(n.metadata.name) for n in self._list_nodes()
                if (instance := instance_of_provider_id(n.spec.provider_id or "")) is not None}

    def registered_before(self, moment: datetime) -> set[str]:
        """The instances whose nodes were created (the kubelet registered them) before ``moment``."""
        return {instance for n in self._list_nodes()
                if n.metadata.creation_timestamp < moment
                and (instance := instance_of_provider_id(n.spec.provider_id or "")) is not None}

    def busy(self, node: str) -> str | None:
        """Why no destructive step may touch ``node`` now: a training pod runs there, or it is no
        longer cordoned (someone returned it to service). Read right before the step. A node the
        API server no longer has is busy while a training pod is still bound to it (until the pod
        garbage collector deletes it); else :class:`NodeGoneError`."""
        try:
            current = self._read(node)
        except NodeGoneError:
            jobs = self.jobs_on(node)
            if jobs:
                return f"{node} is gone, but pods of job(s) {', '.join(jobs)} are still bound to it"
            raise
        if current.hyperpod_hold:
            return f"HyperPod is checking or recovering {node} itself ({current.hyperpod_hold})"
        jobs = self.jobs_on(node)
        if jobs:
            return f"{node} runs job(s) {', '.join(jobs)}"
        if not current.cordoned:
            return f"{node} is no longer cordoned: someone returned it to service"
        return None

    # -- check-and-act writes ---------------------------------------------------------------
    def _apply(self, node: str, decide: Callable[[_Node], list[dict[str, Any]] | None], what: str,
               failure: type[NodeMedicError] = CommandFailedError) -> _Node | None:
        """Read, decide, patch on that read's resourceVersion; again while the node changes under us.
        Returns the node as read for the patch that applied, None when ``decide`` changed nothing;
        raises ``failure`` when the API server cannot be read or refuses the change, and
        :class:`NodeGoneError` when it has no such node."""
        try:
            for _ in range(CONFLICT_RETRIES):
                current = self._read(node)
                ops = decide(current)
                if ops is None:
                    return None
                try:
                    self._core.patch_node(node, ops)
                    return current
                except ApiException as exc:
                    if exc.status == 404:
                        raise NodeGoneError(f"{what} {node}: the API server has no such node any more") from exc
                    # a failed "test" of the resourceVersion is a 422 like any invalid patch: it is a
                    # conflict when the node changed since the read; decide again on what is there now
                    if exc.status == 409 or (exc.status == 422 and self._read(node).version != current.version):
                        continue
                    raise failure(f"{what} {node}: {refusal(exc)}") from exc
        except CommandFailedError as exc:
            raise failure(str(exc)) from exc
        raise failure(f"{what} {node}: the node kept changing ({CONFLICT_RETRIES} tries)")

    def _condition(self, node: str, active: bool, reason: str, message: str) -> None:
        now = self._clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"status": {"conditions": [{"type": CONDITION, "status": "True" if active else "False",
                                           "reason": reason, "message": message[:1024],
                                           "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
        try:
            self._core.patch_node_status(node, body)
        except ApiException as exc:
            if exc.status == 404:
                raise NodeGoneError(f"condition on {node}: the API server has no such node any more") from exc
            raise CommandFailedError(f"condition on {node}: {exc.status} {exc.reason}") from exc

    def drain(self, node: str, reason: str, takeover: str = "-") -> bool:
        """Cordon and taint ``node`` with ``reason`` unless it is cordoned already by someone
        whose reason does not start with ``takeover`` (``-``: nobody's is taken over). True when
        the node is drained with ``reason`` now."""
        fault = reason.split(" ", 1)[1] if " " in reason else reason

        def decide(current: _Node) -> list[dict[str, Any]] | None:
            if current.hyperpod_hold:
                return None  # HyperPod reboots or replaces it itself
            if current.cordoned and (takeover == "-" or not current.annotations.get(REASON, "").startswith(takeover)):
                return None  # someone else's cordon (an operator's, or another open incident's)
            taints = [t for t in current.taints if t["key"] != DRAIN_TAINT] + [_taint(DRAIN_TAINT, fault)]
            return current.patch(cordoned=True, taints=taints, annotations=_kept({**current.annotations, REASON: reason}))

        if self._apply(node, decide, "drain", DrainFailedError) is None:
            return False
        self._condition(node, True, "NodeMedicDrained", reason)
        return True

    def resume(self, node: str, owner: str = "*") -> bool:
        """Uncordon ``node`` and remove NodeMedic's taints (the burn-in hold's too: the node has
        been checked) if ``owner``'s drain holds it (``*``: any cordon or burn-in hold, an
        operator's own resume), checked and acted on in one patch. Others' taints stay."""

        def decide(current: _Node) -> list[dict[str, Any]] | None:
            if not current.held or current.hyperpod_hold or (
                    owner != "*" and not (current.cordoned and _owned_by(current.annotations, owner))):
                return None
            drop = {DRAIN_TAINT, BURN_IN_TAINT} | (
                {OUT_OF_SERVICE_TAINT} if OUT_OF_SERVICE_SET in current.annotations else set())
            annotations = {k: v for k, v in current.annotations.items()
                           if k not in (REASON, OUT_OF_SERVICE_SET, EVICTING)}
            taints = [t for t in current.taints if t["key"] not in drop]
            return current.patch(cordoned=False, taints=taints,  # a spare stays held from the autoscalers
                                 annotations=annotations if any(t["key"] == SPARE_TAINT for t in taints)
                                 else _released(annotations))

        if self._apply(node, decide, "resume", ResumeFailedError) is None:
            return False
        self._condition(node, False, "NodeMedicResumed", f"returned to service by {owner}")
        return True

    # -- evacuation -------------------------------------------------------------------------
    def eviction_version(self) -> str:
        """``policy/v1`` where the API server serves it, else ``policy/v1beta1`` (discovery)."""
        if self._eviction_version is None:
            try:
                group = k8s.PolicyApi(self._api).get_api_group()
            except ApiException as exc:
                raise CommandFailedError(f"cannot discover the policy API group: {exc.status} {exc.reason}") from exc
            served = {v.group_version for v in group.versions}
            self._eviction_version = "policy/v1" if "policy/v1" in served else "policy/v1beta1"
        return self._eviction_version

    def _evict(self, pod: Any, grace: int | None) -> str | None:
        """None when the API server accepted the eviction (or the pod is gone); else why it is
        blocked now: a PodDisruptionBudget (429), or several budgets selecting the pod, which the
        Eviction API refuses outright (500, "more than one PodDisruptionBudget") until their owners
        fix them. Either way the namespace's timeout and mode decide, as for any blocked eviction."""
        body = k8s.V1Eviction(api_version=self.eviction_version(), kind="Eviction",
                              metadata=k8s.V1ObjectMeta(name=pod.metadata.name, namespace=pod.metadata.namespace),
                              delete_options=k8s.V1DeleteOptions(grace_period_seconds=grace))
        try:
            self._core.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, body)
            return None
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 429:
                return "eviction blocked by a PodDisruptionBudget"
            if exc.status == 500 and "more than one PodDisruptionBudget" in refusal(exc):
                return "eviction refused: more than one PodDisruptionBudget selects the pod"
            raise CommandFailedError(f"evict {pod.metadata.namespace}/{pod.metadata.name}: {refusal(exc)}") from exc

    def _delete(self, pod: Any, grace: int | None) -> None:
        try:
            self._core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=grace)
        except ApiException as exc:
            if exc.status != 404:
                raise CommandFailedError(f"delete {pod.metadata.namespace}/{pod.metadata.name}: "
                                         f"{exc.status} {exc.reason}") from exc

    def _mark_out_of_service(self, node: str) -> None:
        """A dead (not Ready) node's pods never confirm their deletion: the out-of-service taint lets
        Kubernetes force-delete them and detach their volumes, so they can start elsewhere."""

        def decide(current: _Node) -> list[dict[str, Any]] | None:
            if current.ready or current.tainted(OUT_OF_SERVICE_TAINT) or not current.cordoned:
                return None
            taints = current.taints + [_taint(OUT_OF_SERVICE_TAINT, "nodeshutdown", "NoExecute")]
            return current.patch(cordoned=True, taints=taints, annotations={**current.annotations,
                                                                             OUT_OF_SERVICE_SET: "true"})

        self._apply(node, decide, "out-of-service taint on")

    def _evicting(self, node: str, started_at: float | None, workloads: set[str]) -> dict[str, int | None]:
        """The workloads this drain (``started_at``) recorded on the node as evicting, with
        ``workloads`` added (one patch, only when it adds one), each with its live pods across the
        cluster when it was first recorded: recorded before the evictions, so a retry after a call
        whose answer was lost still knows what it moved once the pods are gone, and the jobs stage
        knows how many pods a restarted workload runs. A record of another drain is replaced."""
        if started_at is None:
            return {}
        recorded: dict[str, int | None] = {}
        counted: dict[str, int] = {}

        def decide(current: _Node) -> list[dict[str, Any]] | None:
            recorded.clear()
            recorded.update(_evicting_record(current.annotations.get(EVICTING, ""), started_at))
            new = workloads - recorded.keys()
            if not new:
                return None
            counted.update(self._members(new - counted.keys()))
            recorded.update({w: counted[w] for w in new})
            members = {w: n for w, n in sorted(recorded.items()) if n is not None}
            value = json.dumps({"since": started_at, "workloads": sorted(recorded), "members": members})
            return current.patch(cordoned=current.cordoned, taints=current.taints,
                                 annotations={**current.annotations, EVICTING: value})

        self._apply(node, decide, "record the evictions on", DrainFailedError)
        return recorded

    def evacuate(self, node: str, started_at: float | None = None) -> EvacuationResult:
        """One pass over the node's pods: evict what may leave now (by each namespace's rule,
        counted from ``started_at``, the drain's start), delete what the ``delete`` mode says.
        Pods still held (a budget within its timeout, ``wait`` mode) are listed in ``pending``:
        the Drain stage calls again. Evicted training pods' workloads are ``requeued`` (their
        controller recreates the pods); each with the nodes its pods ran on. What this drain
        evicted before counts too, so a retry after a call whose answer was lost still reports
        those workloads: pods still terminating (evicted since ``started_at``), and the workloads
        recorded on the node (``nodemedic.io/evicting``) before their evictions, once their pods
        are gone. Only while the node is held out of scheduling (cordoned): one someone uncordoned
        since the drain keeps its pods (``not_drained``), read right before the evictions."""
        elapsed = 0.0 if started_at is None else self._clock().timestamp() - started_at
        try:
            current = self._read(node)
        except NodeGoneError:
            return self._collect_orphans(node)
        if not current.held:  # uncordoned since the drain (during a checkpoint wait): its pods stay
            return EvacuationResult(requeued=[], not_requeued=[], not_drained="uncordoned, schedulable")
        self._mark_out_of_service(node)  # only if the node is not Ready (decided on the read it patches)
        pods = self._pods_on(node)
        moving = [(pod, self._policy.rule(pod.metadata.namespace)) for pod in filter(_evictable, pods)]
        recorded = self._evicting(node, started_at, {workload for pod, rule in moving
                                                     if not rule.waits(elapsed) and (workload := workload_of(pod))})
        requeued: set[str] = {workload for pod in pods if started_at is not None and _leaving_since(pod, started_at)
                              and (workload := workload_of(pod))}
        # recorded, and no pod of it left on the node (one that ran to its end still is: not moved)
        requeued |= recorded.keys() - {workload_of(pod) for pod in pods if pod.metadata.deletion_timestamp is None}
        not_requeued: list[str] = []
        pending: list[str] = []
        for pod, rule in moving:
            name = f"{pod.metadata.namespace}/{pod.metadata.name}"
            workload = workload_of(pod)
            timed_out = elapsed >= rule.timeout_seconds
            if rule.waits(elapsed):
                pending.append(f"{name} (running to completion, up to {rule.timeout_seconds}s)")
            elif (blocked := self._evict(pod, rule.grace_seconds)) is None:
                requeued.update([workload] if workload else [])
            elif not timed_out:
                pending.append(f"{name} ({blocked})")
            elif rule.mode == "delete":
                self._delete(pod, rule.grace_seconds)
                requeued.update([workload] if workload else [])
            else:
                not_requeued.append(f"{name}: {blocked} for {rule.timeout_seconds}s")
                not_requeued.extend([workload] if workload else [])
        return EvacuationResult(requeued=sorted(requeued), not_requeued=not_requeued,
                                job_nodes=self._job_nodes(requeued, node), pending=pending,
                                job_members={w: n for w in sorted(requeued) if (n := recorded.get(w)) is not None})

    def _collect_orphans(self, node: str) -> EvacuationResult:
        """The evacuation of a node the API server no longer has: its pods can never run again, and
        no kubelet will confirm their deletion. They are deleted at once, as the pod garbage
        collector deletes the pods of a deleted node (budgets do not apply to it either), and
        their workloads are requeued: their controllers make the pods again elsewhere."""
        pods = [pod for pod in self._pods_on(node) if _movable(pod) and pod.status.phase not in ("Succeeded", "Failed")]
        requeued = {workload for pod in filter(_live, pods) if (workload := workload_of(pod))}
        members = self._members(requeued)  # before the deletions: as many pods run again once it restarted
        for pod in pods:  # evicted ones too, whose deletion no kubelet will confirm
            self._delete(pod, 0)
        return EvacuationResult(requeued=sorted(requeued), not_requeued=[], job_nodes=self._job_nodes(requeued, node),
                                job_members=members)

    def _job_nodes(self, jobs: set[str], node: str) -> dict[str, list[str]]:
        """The nodes each job's running pods are on (and ``node``, which it just left); the
        cluster's pods are listed only when a job was requeued."""
        if not jobs:
            return {}
        placed: dict[str, set[str]] = {job: {node} for job in jobs}
        for pod in self._running_pods():
            if (job := workload_of(pod)) in placed:
                placed[job].add(pod.spec.node_name)
        return {job: sorted(nodes) for job, nodes in placed.items()}

    # -- jobs -------------------------------------------------------------------------------
    def _workload_pods(self, job_ids: Iterable[str]) -> dict[str, list[Any]]:
        """Each workload's live pods (not finished, not being deleted), one list call per namespace."""
        listed: dict[str, list[Any]] = {}
        pods: dict[str, list[Any]] = {}
        for job in job_ids:
            namespace = job.split("/", 1)[0]
            if namespace not in listed:
                try:
                    listed[namespace] = list(self._core.list_namespaced_pod(namespace).items)
                except ApiException as exc:
                    raise CommandFailedError(f"cannot list pods in {namespace}: {exc.status} {exc.reason}") from exc
            pods[job] = [p for p in listed[namespace] if workload_of(p) == job and _live(p)]
        return pods

    def _members(self, job_ids: Iterable[str]) -> dict[str, int]:
        return {job: len(pods) for job, pods in self._workload_pods(sorted(job_ids)).items()}

    def job_states(self, job_ids: list[str]) -> dict[str, JobState]:
        """RUNNING when every live pod of the workload runs (its start: the last pod's), PENDING
        while any waits, GONE when none is left (finished and collected, or deleted). Each with
        its live pods (``members``): while an evicted pod is not made again, the survivors run
        alone, fewer than the drain saw."""
        states: dict[str, JobState] = {}
        for job, pods in self._workload_pods(job_ids).items():
            if not pods:
                states[job] = JobState(job, "GONE", None, 0)
            elif all(p.status.phase == "Running" for p in pods):
                starts = [s for p in pods if (s := _started(p)) is not None]
                states[job] = JobState(job, "RUNNING", max(starts) if starts else None, len(pods))
            else:
                states[job] = JobState(job, "PENDING", None, len(pods))
        return states

    # -- checkpoints: the annotation contract ------------------------------------------------
    def running_jobs(self, node: str) -> list[RunningJob]:
        """The workloads with running pods on ``node``: its namespace, its pods' first start and
        their latest checkpoint marker."""
        pods: dict[str, list[Any]] = {}
        for pod in self._pods_on(node):
            if pod.status.phase == "Running" and _live(pod) and (job := workload_of(pod)):
                pods.setdefault(job, []).append(pod)
        now = self._clock().timestamp()
        jobs = []
        for job, members in sorted(pods.items()):
            starts = [s for p in members if (s := _started(p)) is not None]
            markers = [m for p in members if (m := _marker(p)) is not None]
            jobs.append(RunningJob(job, members[0].metadata.namespace, min(starts) if starts else None,
                                   max(markers) if markers else None, now))
        return jobs

    def request_checkpoint(self, node: str, job_ids: list[str], signal: str, scope: str) -> list[str]:
        """Annotate each job's running pods on ``node`` (the annotation is the signal; ``signal``
        and ``scope`` are Slurm's); the jobs one of whose pods could not be annotated."""
        wanted = set(job_ids)
        requested = f"{self._clock().timestamp():.0f}"
        failed: set[str] = set()
        for pod in self._pods_on(node):
            job = workload_of(pod)
            if job not in wanted or not _live(pod):
                continue
            try:
                self._core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                                {"metadata": {"annotations": {CHECKPOINT_REQUESTED: requested}}})
            except ApiException as exc:
                if exc.status != 404:  # a pod gone meanwhile needs no checkpoint
                    failed.add(job)
        return sorted(failed)

    # -- hot spares: nodes tainted nodemedic.io/spare ---------------------------------------
    def spares(self) -> list[NodeStatus]:
        return [n for n in self.nodes() if "RESERVED" in n.state.split("+")]

    def take_spare(self, node: str) -> None:
        """Remove the spare taint: the replacement pods can land on ``node`` at once."""

        def decide(current: _Node) -> list[dict[str, Any]] | None:
            if not current.tainted(SPARE_TAINT):
                return None
            return current.patch(cordoned=current.cordoned,
                                 annotations=current.annotations if current.cordoned else _released(current.annotations),
                                 taints=[t for t in current.taints if t["key"] != SPARE_TAINT])

        self._apply(node, decide, "take spare")

    def add_spare(self, node: str, owner: str) -> bool:
        """Taint ``node`` as a spare, then lift ``owner``'s drain in the same patch (the node is
        never schedulable without the spare taint). True when the drain was lifted."""

        def decide(current: _Node) -> list[dict[str, Any]] | None:
            if current.hyperpod_hold:
                return None
            lift = current.cordoned and _owned_by(current.annotations, owner)
            drop = {DRAIN_TAINT, BURN_IN_TAINT, SPARE_TAINT} if lift else {SPARE_TAINT}
            taints = [t for t in current.taints if t["key"] not in drop] + [_taint(SPARE_TAINT, "true")]
            annotations = _kept({k: v for k, v in current.annotations.items() if not (lift and k == REASON)})
            return current.patch(cordoned=current.cordoned and not lift, taints=taints, annotations=annotations)

        before = self._apply(node, decide, "add spare")
        lifted = before is not None and before.cordoned and _owned_by(before.annotations, owner)
        if lifted:
            self._condition(node, False, "NodeMedicSpare", f"checked and held as a hot spare by {owner}")
        return lifted

    # -- the GPU clients a GPU reset must not find -----------------------------------------
    def pause_gpu_clients(self, node: str, owner: str) -> str | None:
        """Pause the GPU operator's components and NVML clients on ``node`` (their deploy labels
        from "true" to ``GPU_CLIENTS_PAUSED``, recorded as ``owner``'s, in one check-and-act
        patch); None once no daemon pod the labels turned away is left on the node, else what is
        still there. A label another operation paused (a driver upgrade, a MIG change) is left as
        it is, and nothing is paused while it lasts."""
        others: list[str] = []
        labels: dict[str, str] = {}  # the node's labels once the decision below holds

        def decide(current: _Node) -> list[dict[str, Any]] | None:
            others[:] = [f"{k}={current.labels[k]}" for k in GPU_CLIENT_LABELS
                         if current.labels.get(k, "true") not in ("true", "false", GPU_CLIENTS_PAUSED)]
            recorded = current.paused_clients
            flip: dict[str, str | None] = {k: "true" for k in GPU_CLIENT_LABELS if current.labels.get(k) == "true"}
            if NVML_CLIENT_LABEL not in current.labels:
                flip[NVML_CLIENT_LABEL] = None
            labels.clear()
            labels.update(current.labels)
            if others or (not flip and recorded is not None and recorded[0] == owner):
                return None
            before = {**(recorded[1] if recorded else {}), **flip}  # a failed incident's pause is taken over
            labels.update(dict.fromkeys(flip, GPU_CLIENTS_PAUSED))
            annotations = {**current.annotations, PAUSED_CLIENTS: json.dumps({"owner": owner, "labels": before})}
            return current.patch(cordoned=current.cordoned, taints=current.taints, annotations=annotations,
                                 labels=dict(labels))

        try:
            self._apply(node, decide, "pause the GPU clients on")
        except NodeGoneError:
            return None  # no pod runs on a node that is gone, GPU clients neither
        if others:
            return f"another operation paused GPU components on {node} ({', '.join(others)}): waiting for it to end"
        staying = sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in self._pods_on(node)
                         if not _movable(p) and p.status.phase not in ("Succeeded", "Failed") and not _selects(p, labels))
        return f"waiting for {len(staying)} GPU client pod(s) to leave {node}: {', '.join(staying)[:300]}" if staying else None

    def resume_gpu_clients(self, node: str, owner: str = "*") -> bool:
        """Undo ``owner``'s pause (``*``: any): each label NodeMedic paused and nobody changed since
        reads as it did before (a label the pause added goes). True when there was a pause to undo."""

        def decide(current: _Node) -> list[dict[str, Any]] | None:
            recorded = current.paused_clients
            if PAUSED_CLIENTS not in current.annotations or (recorded and owner not in ("*", recorded[0])):
                return None
            # an unreadable record: every label that reads as NodeMedic's pause is taken for one it paused from "true"
            before = recorded[1] if recorded else {k: "true" for k, v in current.labels.items() if v == GPU_CLIENTS_PAUSED}
            labels: dict[str, str] = {}
            for key, value in current.labels.items():
                restored = before.get(key) if key in before and value == GPU_CLIENTS_PAUSED else value
                if restored is not None:  # a label the pause added goes again
                    labels[key] = restored
            annotations = {k: v for k, v in current.annotations.items() if k != PAUSED_CLIENTS}
            return current.patch(cordoned=current.cordoned, taints=current.taints, annotations=annotations,
                                 labels=labels)

        try:
            return self._apply(node, decide, "resume the GPU clients on") is not None
        except NodeGoneError:
            return False  # a replacement registers a node of its own, with its labels as deployed

    def stray_autoscaler_holds(self) -> list[str]:
        return [node.name for raw in self._list_nodes() if _stray_holds(node := _Node(raw, self._prefix))]

    def release_autoscaler_holds(self, node: str) -> bool:
        """Also forgets the drain reason and eviction record left with them, and the record that
        NodeMedic set the out-of-service taint where that taint is gone: a cordon or an
        out-of-service taint someone sets later must never read as NodeMedic's (to be lifted)."""

        def decide(current: _Node) -> list[dict[str, Any]] | None:
            if not _stray_holds(current):
                return None
            stale = {REASON, EVICTING} | (set() if current.tainted(OUT_OF_SERVICE_TAINT) else {OUT_OF_SERVICE_SET})
            annotations = {k: v for k, v in current.annotations.items() if k not in stale}
            return current.patch(cordoned=False, taints=current.taints, annotations=_released(annotations))

        return self._apply(node, decide, "release the autoscaler holds of") is not None

    def gpu_clients_paused(self) -> dict[str, str]:
        """Node -> the owner of NodeMedic's pause of its GPU clients, for every node that has one."""
        paused = {}
        for raw in self._list_nodes():
            node = _Node(raw, self._prefix)
            if PAUSED_CLIENTS in node.annotations:
                recorded = node.paused_clients
                paused[node.name] = recorded[0] if recorded else "?"
        return paused
