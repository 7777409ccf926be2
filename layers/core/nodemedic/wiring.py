"""Adapters built once per Lambda container from the settings (cached, created lazily)."""

from __future__ import annotations

import time
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import ClientError

from nodemedic.aws_retries import CLIENT_CONFIG, retryable
from nodemedic.errors import PolicyError
from nodemedic.orchestrators.base import Orchestrator
from nodemedic.orchestrators.slurm import SlurmViaSSM
from nodemedic.providers.base import Provider
from nodemedic.providers.hyperpod import HyperPodProvider
from nodemedic.providers.kinds import provider_for
from nodemedic.providers.node_names import NamedByOrchestrator
from nodemedic.providers.relay_command import RelayCommand
from nodemedic.providers.run_command import Commands, Documents, RunCommand
from nodemedic.safety.gate import hands_off as held
from nodemedic.safety.policy import SafetyPolicy, parse_policy
from nodemedic.settings import settings
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger

if TYPE_CHECKING:
    from nodemedic.orchestrators.kubernetes import KubernetesOrchestrator

POLICY_CACHE_SECONDS = 30.0


@cache
def client(service: str) -> Any:
    """A client that retries throttling and transient errors (see :mod:`nodemedic.aws_retries`)."""
    return boto3.client(service, config=CLIENT_CONFIG)  # type: ignore[call-overload]  # any service, by name


@lru_cache(maxsize=1)
def ledger() -> Ledger:
    return Ledger(client("dynamodb"), settings().incidents_table)


@lru_cache(maxsize=1)
def control() -> ControlStore:
    return ControlStore(client("dynamodb"), settings().incidents_table, settings().cluster_name)


_policy_cache: dict[str, tuple[float, SafetyPolicy]] = {}


def policy() -> SafetyPolicy:
    """The cluster's safety policy from SSM Parameter Store, re-read at most every 30 s."""
    name = settings().safety_policy_parameter
    cached = _policy_cache.get(name)
    if cached and time.monotonic() - cached[0] < POLICY_CACHE_SECONDS:
        return cached[1]
    try:
        text = client("ssm").get_parameter(Name=name)["Parameter"]["Value"]
    except ClientError as exc:
        if retryable(exc):  # throttled: the handler reports AwsThrottledError, which the state machine retries
            raise
        raise PolicyError(f"cannot read the safety policy parameter {name}: {exc}") from exc
    loaded = parse_policy(text, origin=f"safety policy {name}")
    _policy_cache[name] = (time.monotonic(), loaded)
    return loaded


def hands_off(node: str, instance_id: str) -> str | None:
    """Why automation must not touch the node now, read as the gate reads it: the control state
    (a pause), the safety policy and the instance's tags (an exclusion). Drain, Spares, Repair
    and the check after a rung ask it right before each step that changes a node. Without
    ``instance_id`` (a spare, known by its name) the instance is the one backing ``node``."""
    member = provider().member(instance_id) if instance_id else provider().member_by_node(node)
    return held(control().read(), policy(), node, member.tags if member else {})


@lru_cache(maxsize=1)
def run_command() -> RunCommand:
    return RunCommand(client("ssm"), settings().command_poll_interval_seconds)


@lru_cache(maxsize=1)
def node_commands() -> RunCommand:
    """Commands to the cluster's nodes (a GPU reset, a deep check), each refusal told from an
    instance that is gone: for a function whose role may ``ec2:DescribeInstances``."""
    return RunCommand(client("ssm"), settings().command_poll_interval_seconds, ec2=client("ec2"))


@lru_cache(maxsize=1)
def controller_commands() -> Commands:
    """How the Slurm controller's documents reach it: SSM Run Command, or the relay."""
    s = settings()
    if s.slurm_channel == "relay":
        return RelayCommand(client("sqs"), s.relay_queue_url, client("dynamodb"), s.incidents_table,
                            s.command_poll_interval_seconds)
    return run_command()


def documents() -> Documents:
    return Documents(settings().cluster_name)


@lru_cache(maxsize=1)
def kubernetes() -> KubernetesOrchestrator:
    """The EKS cluster's API server (token from STS, endpoint and CA from EKS)."""
    # imported here: the Kubernetes client adds about 0.3 s to the cold start of every function
    from nodemedic.orchestrators.kubernetes import connect

    s = settings()
    return connect(client("eks"), client("sts"), s.eks_cluster_name, s.kubernetes_drain_policy,
                   s.drain_reason_prefix, refusals_pass=True)


@lru_cache(maxsize=1)
def orchestrator() -> Orchestrator:
    """Slurm through SSM, or Kubernetes (:func:`kubernetes`)."""
    s = settings()
    if s.orchestrator == "kubernetes":
        return kubernetes()
    return SlurmViaSSM(controller_commands(), s.slurm_controller_instance_id, s.command_timeout_seconds, documents(),
                       spare_reservation=s.spare_reservation, nodes_runner=run_command())


@lru_cache(maxsize=1)
def provider() -> Provider:
    """The capacity provider; on Kubernetes its members are named by their nodes' providerID."""
    s = settings()
    capacity = provider_for(s.provider, client, cluster=s.cluster_name, autoscaling_group=s.autoscaling_group_name,
                            hyperpod_cluster=s.hyperpod_cluster_name, karpenter_node_pool=s.karpenter_node_pool,
                            kubernetes_api=lambda: kubernetes().api, on_kubernetes=s.orchestrator == "kubernetes")
    return NamedByOrchestrator(capacity, kubernetes()) if s.orchestrator == "kubernetes" else capacity


@lru_cache(maxsize=1)
def hyperpod() -> HyperPodProvider:
    """The SageMaker HyperPod cluster itself (its own deep health check), on ``Provider=hyperpod``."""
    return HyperPodProvider(client("sagemaker"), settings().hyperpod_cluster_name)


def reset(*, keep_clients: bool = False) -> None:
    """Forget the settings and every adapter built from them, and the boto3 clients too unless
    ``keep_clients`` (the local mode runs each function in one process, each with its own settings)."""
    # every cached adapter of this module (and the settings it imports), found rather than listed:
    # one left out of a list kept another function's client, with that function's role
    for cached in [f for f in list(globals().values()) if callable(getattr(f, "cache_clear", None)) and f is not client]:
        cached.cache_clear()
    _policy_cache.clear()
    if not keep_clients:
        client.cache_clear()
