"""A real Kubernetes API server on this machine: Debian's etcd and a kube-apiserver built from
Debian's ``kubernetes`` source package (1.20.2, see ``sandbox/install-kube-apiserver.sh``), in a
temporary directory, on loopback.

No kubelet, scheduler or controllers run: a test plays their part (binds pods, sets phases and
node conditions, deletes evicted pods, sets a PodDisruptionBudget's status as the disruption
controller would) and says so. Authorization is RBAC. The harness itself is a static-token admin
(``system:masters``); a token webhook can be given to authenticate other callers as EKS does.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

VERSION = "v1.20.2"


def cache_dir() -> Path:
    """Where the built binary is kept, outside any checkout (one build per machine)."""
    base = os.environ.get("NODEMEDIC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "nodemedic")
    return Path(base)


def binary() -> Path:
    return cache_dir() / f"kube-apiserver-{VERSION}"


def unavailable_reason() -> str | None:
    """Why a real API server cannot start here, or None when it can."""
    if not binary().is_file():
        return (f"no kube-apiserver at {binary()} (build it once per machine: `make kube`, as root on Debian; "
                "about 10 minutes on 2 cores)")
    missing = [b for b in ("etcd", "openssl") if shutil.which(b) is None]
    if missing:
        return f"missing {', '.join(missing)} (Debian: etcd-server, openssl)"
    return None


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class KubeAPIServer:
    """Start with ``with KubeAPIServer() as server:``; ``server.api_client()`` is an admin client."""

    webhook_url: str = ""  # a token webhook (TokenReview) for callers other than the admin
    root: Path = field(init=False)
    port: int = field(init=False, default=0)
    admin_token: str = field(init=False, default="")
    _procs: list[subprocess.Popen[bytes]] = field(init=False, default_factory=list)  # etcd, then the API server
    _args: list[str] = field(init=False, default_factory=list)  # the API server's command line

    def __enter__(self) -> KubeAPIServer:
        why = unavailable_reason()
        if why:
            raise RuntimeError(why)
        self.root = Path(tempfile.mkdtemp(prefix="nodemedic-kube-"))
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self._procs):  # the API server first, while its etcd still answers
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.root / "pki" / "ca.crt"

    def _start(self) -> None:
        pki = self.root / "pki"
        pki.mkdir()
        client_port, peer_port, self.port = _free_ports(3)
        openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
        subprocess.run([*openssl, "-keyout", pki / "ca.key", "-out", pki / "ca.crt", "-subj", "/CN=nodemedic-test-ca"],
                       check=True, capture_output=True)
        subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", pki / "server.key",
                        "-out", pki / "server.csr", "-subj", "/CN=kube-apiserver"], check=True, capture_output=True)
        (pki / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        subprocess.run(["openssl", "x509", "-req", "-in", pki / "server.csr", "-CA", pki / "ca.crt", "-CAkey",
                        pki / "ca.key", "-CAcreateserial", "-out", pki / "server.crt", "-days", "2",
                        "-extfile", pki / "san.ext"], check=True, capture_output=True)
        subprocess.run(["openssl", "genrsa", "-out", pki / "sa.key", "2048"], check=True, capture_output=True)
        self.admin_token = secrets.token_hex(16)
        (pki / "tokens.csv").write_text(f'{self.admin_token},nodemedic-test-admin,1,"system:masters"\n')
        log = (self.root / "etcd.log").open("wb")
        self._procs.append(subprocess.Popen(
            ["etcd", "--data-dir", str(self.root / "etcd"), "--listen-client-urls", f"http://127.0.0.1:{client_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-cluster", f"default=http://127.0.0.1:{peer_port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        args = [str(binary()), "--etcd-servers", f"http://127.0.0.1:{client_port}",
                "--bind-address", "127.0.0.1", "--secure-port", str(self.port),
                "--tls-cert-file", str(pki / "server.crt"), "--tls-private-key-file", str(pki / "server.key"),
                "--client-ca-file", str(pki / "ca.crt"), "--token-auth-file", str(pki / "tokens.csv"),
                "--authorization-mode", "RBAC", "--service-cluster-ip-range", "10.96.0.0/24",
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-account-key-file", str(pki / "sa.key"),
                "--service-account-signing-key-file", str(pki / "sa.key"),
                # no token controller runs to create each namespace's default service account
                "--disable-admission-plugins", "ServiceAccount"]
        if self.webhook_url:
            config = self.root / "webhook.kubeconfig"
            config.write_text(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: webhook\n  cluster:\n"
                f"    server: {self.webhook_url}\nusers:\n- name: apiserver\n  user: {{}}\ncontexts:\n"
                "- name: webhook\n  context: {cluster: webhook, user: apiserver}\ncurrent-context: webhook\n")
            args += ["--authentication-token-webhook-config-file", str(config),
                     "--authentication-token-webhook-cache-ttl", "0s"]
        self._args = args
        self.start_apiserver()

    def stop_apiserver(self, *, graceful: bool = False) -> None:
        """Stop the API server (etcd keeps running, so nothing it stored is lost): every call is
        refused until it starts again, as during an EKS control-plane update or a crash. SIGKILL,
        or ``graceful``: SIGTERM and wait while it finishes the requests in flight."""
        if len(self._procs) < 2:
            return
        proc = self._procs.pop()
        proc.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def start_apiserver(self) -> None:
        """Start the API server (again) on the same port and etcd; return once it answers."""
        with (self.root / "apiserver.log").open("ab") as log:  # the process keeps its own copy
            self._procs.append(subprocess.Popen(self._args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 60) -> None:
        api = k8s.VersionApi(self.api_client())
        deadline = time.monotonic() + timeout_s
        while True:
            if any(p.poll() is not None for p in self._procs):
                raise RuntimeError(f"the API server exited: {self.log_tail()}")
            try:
                api.get_code()
                # RBAC's bootstrap roles land a moment after /version answers
                k8s.RbacAuthorizationV1Api(self.api_client()).read_cluster_role("cluster-admin")
                return
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the API server did not answer in {timeout_s:.0f}s: {self.log_tail()}") from None
                time.sleep(0.5)

    def log_tail(self, lines: int = 20) -> str:
        path = self.root / "apiserver.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def api_client(self, token: str = "") -> Any:
        """An API client as the admin, or as whoever ``token`` authenticates as."""
        config = k8s.Configuration()
        config.host = self.url
        config.ssl_ca_cert = str(self.ca_file)
        config.api_key = {"authorization": f"Bearer {token or self.admin_token}"}
        return k8s.ApiClient(config)

    def kubeconfig(self) -> Path:
        """A kubeconfig for the admin (kubectl)."""
        path = self.root / "admin.kubeconfig"
        path.write_text(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n"
            f"    server: {self.url}\n    certificate-authority: {self.ca_file}\nusers:\n- name: admin\n"
            f"  user:\n    token: {self.admin_token}\ncontexts:\n- name: local\n"
            "  context: {cluster: local, user: admin}\ncurrent-context: local\n")
        return path


# -- the parts of a cluster no process plays here: the kubelet's and its controllers' writes -----
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
CONFLICT_TRIES = 20


def _remove_not_ready_taint(api: Any, core: k8s.CoreV1Api, node: str) -> None:
    """On the read's resourceVersion, as a controller writes, again while the node changes under
    it: a blind write of the taints it read put back what NodeMedic had changed in between (its
    spare taint lost, the burn-in hold back)."""
    for attempt in range(CONFLICT_TRIES):
        raw = core.read_node(node)
        if not any(t.key == NOT_READY_TAINT for t in raw.spec.taints or []):
            return
        taints = [api.sanitize_for_serialization(t) for t in raw.spec.taints if t.key != NOT_READY_TAINT]
        try:
            core.patch_node(node, [{"op": "test", "path": "/metadata/resourceVersion", "value": raw.metadata.resource_version},
                                   {"op": "add", "path": "/spec/taints", "value": taints}])
            return
        except k8s.ApiException as exc:  # 409, or 422 from a failed "test": the node changed since the read
            if exc.status not in (409, 422) or attempt == CONFLICT_TRIES - 1:
                raise


def set_ready(api: Any, node: str, ready: bool, message: str) -> None:
    """The kubelet's ``Ready`` condition of ``node``; and, as the node lifecycle controller does
    for a ready node, the ``not-ready`` taint the API server puts on every new node removed."""
    core = k8s.CoreV1Api(api)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if ready:
        _remove_not_ready_taint(api, core, node)
    core.patch_node_status(node, {"status": {"conditions": [
        {"type": "Ready", "status": "True" if ready else "Unknown", "reason": "KubeletReady" if ready
         else "NodeStatusUnknown", "message": message, "lastHeartbeatTime": now, "lastTransitionTime": now}]}})


def running_status(at: str, container: str, image: str) -> dict[str, Any]:
    """The status the kubelet reports for a pod whose one container started at ``at``: Running,
    and Ready (a pod that is not Ready does not count as healthy: a budget would not protect it)."""
    return {"phase": "Running", "startTime": at,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": at}],
            "containerStatuses": [{"name": container, "image": image, "imageID": "", "ready": True,
                                   "restartCount": 0, "state": {"running": {"startedAt": at}}}]}


def _raw(api: Any, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
    """A request the client has no model for: the policy/v1beta1 budgets this 1.20 API server
    serves (the client only models policy/v1)."""
    data, *_ = api.call_api(path, method, header_params={"Content-Type": content_type, "Accept": "application/json"},
                            body=body, response_type="object", auth_settings=["BearerToken"],
                            _return_http_data_only=False)
    return data


def create_budget(api: Any, namespace: str, name: str, selector: dict[str, str]) -> None:
    """A PodDisruptionBudget that allows no pod of ``selector`` to be unavailable."""
    _raw(api, "POST", f"/apis/policy/v1beta1/namespaces/{namespace}/poddisruptionbudgets", {
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": selector}}})


def allow_disruptions(api: Any, namespace: str, name: str, allowed: int) -> None:
    """The disruption controller's part: the budget's status, with ``allowed`` disruptions."""
    path = f"/apis/policy/v1beta1/namespaces/{namespace}/poddisruptionbudgets/{name}"
    generation = _raw(api, "GET", path)["metadata"]["generation"]
    _raw(api, "PATCH", f"{path}/status", {"status": {
        "observedGeneration": generation, "disruptionsAllowed": allowed, "currentHealthy": 1,
        "desiredHealthy": 1, "expectedPods": 1}}, "application/merge-patch+json")
