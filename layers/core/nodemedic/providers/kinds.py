"""The provider of a cluster, by kind (template parameter ``Provider``): the one place that maps
a kind and its names to an adapter, for the stage Lambdas and the operator CLI alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodemedic.providers.autoscaling import AutoScalingProvider
from nodemedic.providers.base import Provider
from nodemedic.providers.ec2 import EC2Provider
from nodemedic.providers.hyperpod import HyperPodProvider


def provider_for(kind: str, client: Callable[[str], Any], *, cluster: str, autoscaling_group: str,
                 hyperpod_cluster: str) -> Provider:
    """``client(service)`` gives a boto3 client of the account the cluster runs in."""
    if kind == "ec2":
        return EC2Provider(client("ec2"), cluster)
    if kind == "hyperpod":
        return HyperPodProvider(client("sagemaker"), hyperpod_cluster)
    return AutoScalingProvider(client("autoscaling"), client("ec2"), autoscaling_group)
