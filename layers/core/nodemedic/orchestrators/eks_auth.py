"""Talk to an EKS cluster's API server from Lambda without kubectl or aws-iam-authenticator.

The endpoint and its CA come from ``eks:DescribeCluster``. The bearer token is what
aws-iam-authenticator and ``aws eks get-token`` make: an STS ``GetCallerIdentity`` URL presigned
with the function's own credentials, with the header ``x-k8s-aws-id: <cluster>`` signed into it,
base64url-encoded after ``k8s-aws-v1.``. EKS calls that URL to learn who is asking (the Lambda
role), then maps the role through the cluster's access entry to the Kubernetes group that
``deploy/kubernetes/rbac.yaml`` binds to NodeMedic's ClusterRole. A token is renewed after
``TOKEN_REFRESH_S`` (EKS accepts one for 15 minutes).
"""

from __future__ import annotations

import base64
import re
import ssl
import time
from typing import Any

import urllib3
from kubernetes import client as k8s

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
PRESIGN_EXPIRES_S = 60
TOKEN_REFRESH_S = 600.0
_ASSUMED_ROLE = re.compile(r"^arn:(aws[a-z-]*):sts::(\d{12}):assumed-role/([^/]+)/[^/]+$")


def principal_of(caller_arn: str) -> str:
    """The IAM principal an access entry names for a caller: STS answers a role's session as
    ``arn:aws:sts::<account>:assumed-role/<role>/<session>``; the entry names the role,
    ``arn:aws:iam::<account>:role/<role>``. A user's ARN is its own principal."""
    match = _ASSUMED_ROLE.match(caller_arn)
    return f"arn:{match[1]}:iam::{match[2]}:role/{match[3]}" if match else caller_arn


def token(sts: Any, cluster: str) -> str:
    """A bearer token for ``cluster`` from ``sts`` (a boto3 STS client with the caller's credentials)."""

    def add_cluster_header(request: Any, **_: Any) -> None:
        request.headers[CLUSTER_ID_HEADER] = cluster

    sts.meta.events.register_first("before-sign.sts.GetCallerIdentity", add_cluster_header)
    try:
        url = sts.generate_presigned_url("get_caller_identity", Params={}, ExpiresIn=PRESIGN_EXPIRES_S,
                                         HttpMethod="GET")
    finally:
        sts.meta.events.unregister("before-sign.sts.GetCallerIdentity", add_cluster_header)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def client_for(host: str, ca_pem: bytes, fresh_token: Any) -> Any:
    """An API client for ``host`` that trusts only ``ca_pem`` and asks ``fresh_token()`` for a
    new token whenever the last one is ``TOKEN_REFRESH_S`` old."""
    config = k8s.Configuration()
    config.host = host
    issued = [0.0]

    def refresh(conf: Any) -> None:
        if time.monotonic() - issued[0] >= TOKEN_REFRESH_S:
            conf.api_key = {"authorization": f"Bearer {fresh_token()}"}
            issued[0] = time.monotonic()

    config.refresh_api_key_hook = refresh
    refresh(config)
    api = k8s.ApiClient(config)
    # this client version takes a CA only as a file path: trust the cluster's CA from memory instead
    # (no file to write or clean up), with certificate and host name verification as ever
    api.rest_client.pool_manager = urllib3.PoolManager(
        num_pools=4, maxsize=config.connection_pool_maxsize,
        ssl_context=ssl.create_default_context(cadata=ca_pem.decode()))
    return api


def api_client(eks: Any, sts: Any, cluster: str) -> Any:
    """An API client for the EKS cluster ``cluster``."""
    described = eks.describe_cluster(name=cluster)["cluster"]
    ca = base64.b64decode(described["certificateAuthority"]["data"])
    return client_for(described["endpoint"], ca, lambda: token(sts, cluster))
