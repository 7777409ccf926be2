"""EKS's side of IAM authentication, for the local API server: a TokenReview webhook.

EKS (aws-iam-authenticator's server) takes the bearer token ``k8s-aws-v1.<base64url URL>``,
checks that the URL is an STS ``GetCallerIdentity`` presigned with ``x-k8s-aws-id`` among its
signed headers, calls it with ``x-k8s-aws-id: <this cluster>`` (a token signed for another
cluster fails STS's signature check), and maps the caller's ARN through the cluster's access
entries to a Kubernetes user and groups. Here no STS can be called, so the webhook plays STS
too: it recomputes the SigV4 query signature with the secret of the access key the URL names
(a registry of test credentials) and checks the date window, as STS would.
See https://docs.aws.amazon.com/eks/latest/userguide/cluster-auth.html and
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-query-string-auth.html
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
MAX_AGE_S = 15 * 60  # EKS accepts a token for 15 minutes after it was signed
_ASSUMED_ROLE = re.compile(r"^arn:(aws[a-z-]*):sts::(\d{12}):assumed-role/([^/]+)/[^/]+$")


def principal_of(caller_arn: str) -> str:
    """The IAM principal an access entry names for a caller: STS answers a role's session as
    ``arn:aws:sts::<account>:assumed-role/<role>/<session>``; the entry names the role,
    ``arn:aws:iam::<account>:role/<role>``. A user's ARN is its own principal. EKS's side, kept
    apart from the CLI's nodemedic.orchestrators.eks_auth.principal_of so that this emulator
    stays evidence for it."""
    match = _ASSUMED_ROLE.match(caller_arn)
    return f"arn:{match[1]}:iam::{match[2]}:role/{match[3]}" if match else caller_arn


@dataclass(frozen=True)
class AccessEntry:
    groups: tuple[str, ...]
    username: str = ""  # empty: EKS's default for a role, the caller's assumed-role ARN


@dataclass
class EksAuthenticator:
    """Start with ``with EksAuthenticator(cluster) as auth:``; ``auth.url`` is the webhook."""

    cluster: str
    credentials: dict[str, tuple[str, str]] = field(default_factory=dict)  # access key -> (secret, caller ARN)
    access_entries: dict[str, AccessEntry] = field(default_factory=dict)  # IAM principal ARN -> user
    rejected: list[str] = field(default_factory=list)
    authenticated: set[tuple[str, tuple[str, ...]]] = field(default_factory=set)  # (caller ARN, its groups)
    _server: ThreadingHTTPServer | None = None

    def __enter__(self) -> EksAuthenticator:
        auth = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = auth.review(str(review.get("spec", {}).get("token", "")))
                body = json.dumps({"apiVersion": review.get("apiVersion"), "kind": "TokenReview", "status": status})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/authenticate"

    def review(self, token: str) -> dict[str, Any]:
        try:
            arn = self.caller(token)
        except ValueError as exc:
            self.rejected.append(str(exc))
            return {"authenticated": False, "error": str(exc)}
        entry = self.access_entries.get(principal_of(arn))
        if entry is None:
            self.rejected.append(f"{arn} has no access entry")
            return {"authenticated": False, "error": f"{arn} has no access entry in {self.cluster}"}
        self.authenticated.add((arn, entry.groups))
        return {"authenticated": True, "user": {"username": entry.username or arn, "uid": arn,
                                                "groups": list(entry.groups)}}

    def add_access_entry(self, principal_arn: str, groups: list[str]) -> None:
        """What ``eks:CreateAccessEntry`` (type STANDARD) does for this cluster."""
        self.access_entries[principal_arn] = AccessEntry(tuple(groups))

    def caller(self, token: str) -> str:
        """The ARN STS would answer for the token's presigned URL, or ValueError saying why not."""
        if not token.startswith(TOKEN_PREFIX):
            raise ValueError("not an EKS token")
        encoded = token[len(TOKEN_PREFIX):]
        url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        parts = urlsplit(url)
        if parts.scheme != "https" or not (parts.hostname or "").startswith("sts.") or parts.path not in ("", "/"):
            raise ValueError(f"not an STS URL: {parts.scheme}://{parts.hostname}{parts.path}")
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if query.get("Action") != "GetCallerIdentity":
            raise ValueError(f"not GetCallerIdentity: {query.get('Action')}")
        signed = query.get("X-Amz-SignedHeaders", "").split(";")
        if CLUSTER_ID_HEADER not in signed:
            raise ValueError(f"{CLUSTER_ID_HEADER} is not signed into the token")
        signed_at = datetime.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        if abs((datetime.now(UTC) - signed_at).total_seconds()) > MAX_AGE_S:
            raise ValueError(f"the token was signed at {signed_at:%H:%M:%S}Z: expired")
        access_key, date, region, service, _ = query["X-Amz-Credential"].split("/")
        if access_key not in self.credentials:
            raise ValueError(f"InvalidClientTokenId: {access_key}")
        secret, arn = self.credentials[access_key]
        headers = {"host": parts.netloc, CLUSTER_ID_HEADER: self.cluster}  # what EKS sends: its own cluster
        canonical_headers = "".join(f"{h}:{headers.get(h, '')}\n" for h in signed)
        canonical_query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                                   for k, v in sorted(query.items()) if k != "X-Amz-Signature")
        empty_body = hashlib.sha256(b"").hexdigest()  # STS signs the (empty) body of a GET
        canonical = "\n".join(["GET", "/", canonical_query, canonical_headers, ";".join(signed), empty_body])
        scope = f"{date}/{region}/{service}/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", query["X-Amz-Date"], scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        key = f"AWS4{secret}".encode()
        for part in (date, region, service, "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, query.get("X-Amz-Signature", "")):
            raise ValueError("SignatureDoesNotMatch (signed for another cluster, or altered)")
        return arn
