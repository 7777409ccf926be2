"""Who this node is: from the config, else discovered (EC2 IMDSv2, hostname)."""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from nodemedic.contracts.events import NodeIdentity

from nodemedic_agent.config import AgentConfig

IMDS = "http://169.254.169.254/latest"


class InstanceMetadata:
    """EC2 instance metadata through IMDSv2. The session token is kept and used again until shortly
    before it expires, as AWS recommends (one ``PUT`` per token, not one per read); a token IMDS no
    longer takes (``401``) is replaced once.
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html"""

    TOKEN_TTL_S = 21600  # the longest IMDSv2 grants (6 hours)
    RENEW_BEFORE_S = 60.0

    def __init__(self, base: str = IMDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.base = base
        self.clock = clock
        self._token: str | None = None
        self._expires = 0.0

    def __call__(self, path: str, timeout_s: float = 1.0) -> str:
        """One metadata value, e.g. ``instance-id``; an ``HTTPError`` (404: no such value) or
        ``OSError`` (IMDS unreachable) otherwise."""
        try:
            return self._read(path, self._session(timeout_s), timeout_s)
        except urllib.error.HTTPError as exc:
            if exc.code != 401:
                raise
            self._token = None  # expired or revoked early: one new token, one more try
            return self._read(path, self._session(timeout_s), timeout_s)

    def _session(self, timeout_s: float) -> str:
        now = self.clock()
        if self._token is None or now >= self._expires - self.RENEW_BEFORE_S:
            req = urllib.request.Request(f"{self.base}/api/token", method="PUT",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_S)})
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - fixed link-local URL
                self._token = resp.read().decode()
            self._expires = now + self.TOKEN_TTL_S
        return self._token

    def _read(self, path: str, token: str, timeout_s: float) -> str:
        req = urllib.request.Request(f"{self.base}/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return str(resp.read().decode().strip())


imds = InstanceMetadata()  # this instance's metadata, one token shared by every reader in the agent


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
