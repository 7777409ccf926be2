"""Adapters built once per Lambda container from the settings (cached, created lazily)."""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Any

import boto3

from nodemedic.orchestrators.slurm import SlurmViaSSM
from nodemedic.providers.autoscaling import AutoScalingProvider
from nodemedic.providers.run_command import RunCommand
from nodemedic.settings import settings
from nodemedic.store.ledger import Ledger


@cache
def client(service: str) -> Any:
    return boto3.client(service)


@lru_cache(maxsize=1)
def ledger() -> Ledger:
    return Ledger(client("dynamodb"), settings().incidents_table)


@lru_cache(maxsize=1)
def run_command() -> RunCommand:
    return RunCommand(client("ssm"), settings().command_poll_interval_seconds)


@lru_cache(maxsize=1)
def orchestrator() -> SlurmViaSSM:
    s = settings()
    return SlurmViaSSM(run_command(), s.slurm_controller_instance_id, s.command_timeout_seconds)


@lru_cache(maxsize=1)
def provider() -> AutoScalingProvider:
    return AutoScalingProvider(client("autoscaling"), client("ec2"), settings().autoscaling_group_name)


def reset() -> None:
    """Forget every cached adapter and the settings (the local mode redeploys between runs)."""
    for cached in (client, ledger, run_command, orchestrator, provider, settings):
        cached.cache_clear()
