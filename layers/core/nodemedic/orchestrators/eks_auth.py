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
from kubernetes.client.rest import ApiException

from nodemedic.contracts.problems import read_json
from nodemedic.errors import AwsThrottledError

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


# The client sends every request without a timeout (kubernetes.client.rest passes timeout=None when
# a call names none): a connection the endpoint stopped answering would hold the function until
# its own timeout. Each request gets these instead.
API_TIMEOUT = urllib3.Timeout(connect=5.0, read=30.0)
# A busy or failing-over API server answers 429 (API Priority and Fairness, with Retry-After) or
# 5xx: retried a few times with backoff, on the methods that are safe to send again (a GET, a
# DELETE, and NodeMedic's PATCHes: each tests the resourceVersion it read, or sets the same
# condition again). A POST is not sent again on a status: an eviction's 429 is a
# PodDisruptionBudget's answer, which the drain handles itself.
BUSY_STATUSES = frozenset({429, 500, 502, 503, 504})
API_RETRIES = urllib3.Retry(total=5, connect=3, read=2, status=3, backoff_factor=0.5, backoff_max=8.0,
                            status_forcelist=BUSY_STATUSES,
                            allowed_methods=frozenset({"GET", "HEAD", "PATCH", "PUT", "DELETE"}),
                            raise_on_status=False, respect_retry_after_header=True)


# An API server that has just started (an EKS control-plane update, a restart) accepts requests
# before its RBAC informers have synced, and refuses them (403) for a while: for minutes with
# many bindings (kubernetes#121635; #101422 names the reason "informers not synced"). For the
# pipeline such a refusal passes, and is retried as a busy API server is; one that lasts past the
# stage's budget is a missing access entry or RBAC, and fails the incident saying so. An
# operator's command is told at once.
REFUSED_STATUSES = frozenset({401, 403})


def budget_refusal(exc: ApiException) -> bool:
    """A 429 that is a PodDisruptionBudget refusing an eviction, not a busy API server (API
    Priority and Fairness answers 429 too). The eviction REST handler says so in its Status: the
    message "Cannot evict pod as it would violate the pod's disruption budget." and a cause of
    type ``DisruptionBudget`` (kubernetes pkg/registry/core/pod/storage/eviction.go)."""
    if exc.status != 429:
        return False
    try:
        status = read_json(exc.body or "")
    except (TypeError, ValueError):
        return False
    if not isinstance(status, dict):
        return False
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    causes = causes if isinstance(causes, list) else []
    return "disruption budget" in str(status.get("message", "")).lower() or any(
        isinstance(c, dict) and "DisruptionBudget" in (c.get("type"), c.get("reason")) for c in causes)


class _ApiClient(k8s.ApiClient):  # type: ignore[misc]
    """An API server still busy or unreachable after the transport's retries is
    :class:`AwsThrottledError`: the state machine retries the stage later, within its budget, as
    for a throttled AWS call, instead of failing the incident on an overloaded control plane. An
    eviction a PodDisruptionBudget refuses (also a 429) stays the API server's answer, which the
    drain handles. With ``refusals_pass`` (the pipeline's client), a refusal is too
    (``REFUSED_STATUSES``)."""

    refusals_pass = False

    def call_api(self, resource_path: str, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().call_api(resource_path, method, *args, **kwargs)
        except ApiException as exc:
            if exc.status in BUSY_STATUSES and not budget_refusal(exc):
                raise AwsThrottledError(f"the Kubernetes API server answered {method} {resource_path} with "
                                        f"{exc.status} {exc.reason} after {API_RETRIES.status} retries") from exc
            if self.refusals_pass and exc.status in REFUSED_STATUSES:
                raise AwsThrottledError(
                    f"the Kubernetes API server refused {method} {resource_path}: {exc.status} {exc.reason}. An API "
                    "server refuses so for a while after it starts, until its RBAC has synced; if it lasts, "
                    "NodeMedic's access entry or its RBAC (deploy/kubernetes/rbac.yaml) is missing") from exc
            raise
        except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out, after the transport's retries
            raise AwsThrottledError(f"cannot reach the Kubernetes API server ({method} {resource_path}): {exc}") from exc


class _ApiPool(urllib3.PoolManager):
    """The pool the API client sends through: ``API_TIMEOUT`` for a request sent without one,
    ``API_RETRIES`` for all."""

    def request(self, method: str, url: str, *args: Any, **kw: Any) -> Any:
        if kw.get("timeout") is None:
            kw["timeout"] = API_TIMEOUT
        return super().request(method, url, *args, **kw)


def client_for(host: str, ca_pem: bytes, fresh_token: Any, *, refusals_pass: bool = False) -> Any:
    """An API client for ``host`` that trusts only ``ca_pem`` and asks ``fresh_token()`` for a
    new token whenever the last one is ``TOKEN_REFRESH_S`` old; ``refusals_pass``: see
    :class:`_ApiClient`."""
    config = k8s.Configuration()
    config.host = host
    issued = [0.0]

    def refresh(conf: Any) -> None:
        if time.monotonic() - issued[0] >= TOKEN_REFRESH_S:
            conf.api_key = {"authorization": f"Bearer {fresh_token()}"}
            issued[0] = time.monotonic()

    config.refresh_api_key_hook = refresh
    refresh(config)
    api = _ApiClient(config)
    api.refusals_pass = refusals_pass
    # this client version takes a CA only as a file path: trust the cluster's CA from memory instead
    # (no file to write or clean up), with certificate and host name verification as ever
    api.rest_client.pool_manager = _ApiPool(
        num_pools=4, maxsize=config.connection_pool_maxsize, retries=API_RETRIES,
        ssl_context=ssl.create_default_context(cadata=ca_pem.decode()))
    return api


def api_client(eks: Any, sts: Any, cluster: str, *, refusals_pass: bool = False) -> Any:
    """An API client for the EKS cluster ``cluster``."""
    described = eks.describe_cluster(name=cluster)["cluster"]
    ca = base64.b64decode(described["certificateAuthority"]["data"])
    return client_for(described["endpoint"], ca, lambda: token(sts, cluster), refusals_pass=refusals_pass)
