"""The provider of a cluster, by kind (template parameter ``Provider``): the one place that maps
a kind and its names to an adapter, for the stage Lambdas and the operator CLI alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodemedic.providers.autoscaling import AutoScalingProvider
from nodemedic.providers.base import Provider
from nodemedic.providers.ec2 import EC2Provider
from nodemedic.providers.hyperpod import HyperPodProvider
from nodemedic.providers.karpenter import KarpenterProvider


def _no_api_server() -> Any:
    raise ValueError("Provider karpenter needs Orchestrator kubernetes (its NodeClaims live in the API server)")


def provider_for(kind: str, client: Callable[[str], Any], *, cluster: str, autoscaling_group: str,
                 hyperpod_cluster: str, karpenter_node_pool: str = "",
                 kubernetes_api: Callable[[], Any] = _no_api_server, on_kubernetes: bool = False) -> Provider:
    """``client(service)`` gives a boto3 client of the account the cluster runs in;
    ``kubernetes_api()`` the EKS cluster's API client (Karpenter's NodeClaims), built when first used;
    ``on_kubernetes``: the nodes are named by the API server, not by a Slurm tag."""
    if kind == "ec2":
        return EC2Provider(client("ec2"), cluster, slurm_tagged=not on_kubernetes)
    if kind == "hyperpod":
        return HyperPodProvider(client("sagemaker"), hyperpod_cluster)
    if kind == "karpenter":
        return KarpenterProvider(client("ec2"), karpenter_node_pool, kubernetes_api)
    return AutoScalingProvider(client("autoscaling"), client("ec2"), autoscaling_group)
