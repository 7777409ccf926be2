"""Who this node is: from the config, else discovered (EC2 IMDSv2, hostname)."""

from __future__ import annotations

import os
import socket
import urllib.request

from nodemedic.contracts.events import NodeIdentity

from nodemedic_agent.config import AgentConfig

IMDS = "http://169.254.169.254/latest"


def imds(path: str, timeout_s: float = 1.0) -> str:
    """One EC2 instance metadata value (IMDSv2)."""
    token_req = urllib.request.Request(f"{IMDS}/api/token", method="PUT",
                                       headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    with urllib.request.urlopen(token_req, timeout=timeout_s) as resp:  # noqa: S310 - fixed link-local URL
        token = resp.read().decode()
    req = urllib.request.Request(f"{IMDS}/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
        return str(resp.read().decode().strip())


def resolve_region(config: AgentConfig) -> str:
    """``region`` from the config, else the AWS environment, else instance metadata."""
    import boto3

    region = config.region or boto3.session.Session().region_name
    if region:
        return str(region)
    try:
        return imds("placement/region")
    except OSError as exc:
        raise ValueError(f"region is not set in the config or AWS_REGION and instance metadata is unreachable: {exc}") from exc


def resolve_identity(config: AgentConfig) -> NodeIdentity:
    hostname = config.node.hostname or socket.getfqdn()
    instance_id = config.node.instance_id
    if instance_id is None:
        try:
            instance_id = imds("instance-id")
        except OSError as exc:
            raise ValueError(f"node.instance_id is not set and EC2 instance metadata is unreachable: {exc}") from exc
    # on Kubernetes the DaemonSet sets NODEMEDIC_NODE_NAME from spec.nodeName (EKS names nodes by
    # their full private DNS name, which the short hostname is not)
    slurm_node = config.node.slurm_node or os.environ.get("NODEMEDIC_NODE_NAME") or hostname.split(".")[0]
    return NodeIdentity(instance_id=instance_id, hostname=hostname, slurm_node=slurm_node)
