"""How the functions' Kubernetes client behaves on the wire when the API server is busy or
silent: retried with backoff where a request is safe to send again, never left waiting forever.
The API server is played by a small HTTP server, since a real one cannot be made to throttle or
fall silent on cue."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import certifi
import pytest
import urllib3
from kubernetes import client as k8s
from nodemedic.errors import AwsThrottledError
from nodemedic.orchestrators import eks_auth
from nodemedic.orchestrators.kubernetes import KubernetesOrchestrator

NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"},
        "spec": {"providerID": "aws:///us-east-1a/i-0123456789abcdef0"}}
# what kube-apiserver answers when API Priority and Fairness rejects a request
TOO_MANY = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "TooManyRequests", "code": 429,
            "message": "Too many requests, please try again later."}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[str] = []
        self.busy_answers = 0  # how many of the next node reads are answered 503, 429 in turn (-1: all)
        self.silent = threading.Event()  # the first read of node "silent" waits on this
        self.silent_first = True
        self.first_waiting = False
        self.evictions_throttled = False


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", "Content-Length": str(len(data)),
                            **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        waiting = " while the first waited" if self.server.first_waiting else ""
        self.server.seen.append(f"GET {self.path}{waiting}")
        if self.path == "/api/v1/nodes/silent" and self.server.silent_first:
            self.server.silent_first = False
            self.server.first_waiting = True
            self.server.silent.wait(10)  # a connection the endpoint stopped answering
            self.server.first_waiting = False
            return
        if self.server.busy_answers:
            self.server.busy_answers -= self.server.busy_answers > 0
            if self.server.busy_answers % 2:  # a server failing over: no Retry-After
                self._answer(503, {**TOO_MANY, "reason": "ServiceUnavailable", "code": 503,
                                   "message": "the server is currently unable to handle the request"})
            else:
                self._answer(429, TOO_MANY, {"Retry-After": "0"})
            return
        self._answer(200, NODE)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        self.server.seen.append(f"POST {self.path}")
        if self.server.evictions_throttled:  # API Priority and Fairness, not a budget
            self._answer(429, TOO_MANY, {"Retry-After": "0"})
            return
        self._answer(429, {**TOO_MANY, "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                           "details": {"causes": [{"type": "DisruptionBudget", "message": "The disruption budget "
                                                   "train needs 2 healthy pods and has 2 currently"}]}})


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.silent.set()
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def _adapter(server: _Server) -> KubernetesOrchestrator:
    api = eks_auth.client_for(f"http://127.0.0.1:{server.server_address[1]}", certifi.contents().encode(),
                              lambda: "token")
    return KubernetesOrchestrator(api)


def test_a_read_the_server_is_too_busy_for_is_asked_again_and_answered(server: _Server) -> None:
    server.busy_answers = 2
    assert _adapter(server).instance_of("gpu-1") == "i-0123456789abcdef0"
    assert server.seen == ["GET /api/v1/nodes/gpu-1"] * 3


def test_an_eviction_a_budget_refuses_is_not_sent_again_by_the_client(server: _Server) -> None:
    orch = _adapter(server)
    orch._eviction_version = "policy/v1"  # noqa: SLF001 - no discovery on this server
    pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="train-0", namespace="ml"))
    assert orch._evict(pod, None) == "eviction blocked by a PodDisruptionBudget"  # noqa: SLF001 - the drain's answer
    assert server.seen == ["POST /api/v1/namespaces/ml/pods/train-0/eviction"]


def test_a_silent_connection_is_given_up_and_asked_again(server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eks_auth, "API_TIMEOUT", urllib3.Timeout(connect=1.0, read=0.5))
    assert _adapter(server).instance_of("silent") == "i-0123456789abcdef0"
    # the second read came while the first still waited: the client did not wait on it
    assert server.seen == ["GET /api/v1/nodes/silent", "GET /api/v1/nodes/silent while the first waited"]


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eks_auth, "API_RETRIES", eks_auth.API_RETRIES.new(backoff_factor=0))


@pytest.mark.usefixtures("no_backoff")
def test_a_server_busy_past_the_retries_is_retried_by_the_state_machine_not_a_failure(server: _Server) -> None:
    """AwsThrottledError is what every stage's Retry names: the stage runs again later, within its
    budget, instead of failing the incident on an overloaded control plane."""
    server.busy_answers = -1
    with pytest.raises(AwsThrottledError, match=r"answered GET /api/v1/nodes/\{name\} with 503"):
        _adapter(server).instance_of("gpu-1")
    assert len(server.seen) == 1 + eks_auth.API_RETRIES.status


@pytest.mark.usefixtures("no_backoff")
def test_an_api_server_nobody_answers_at_is_retried_by_the_state_machine() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    api = eks_auth.client_for(f"http://127.0.0.1:{port}", certifi.contents().encode(), lambda: "token")
    with pytest.raises(AwsThrottledError, match="cannot reach the Kubernetes API server"):
        KubernetesOrchestrator(api).instance_of("gpu-1")


def test_an_eviction_the_api_server_is_too_busy_for_is_not_taken_for_a_budget(server: _Server) -> None:
    """API Priority and Fairness answers 429 too: that is a busy server, retried by the state
    machine, not a budget the drain would wait out and then report (or override) as one."""
    server.evictions_throttled = True
    orch = _adapter(server)
    orch._eviction_version = "policy/v1"  # noqa: SLF001 - no discovery on this server
    pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="train-0", namespace="ml"))
    with pytest.raises(AwsThrottledError, match="429"):
        orch._evict(pod, None)  # noqa: SLF001
    assert server.seen == ["POST /api/v1/namespaces/ml/pods/train-0/eviction"], "the client does not re-send it"
