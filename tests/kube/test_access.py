"""How the Lambda reaches an EKS API server, and what it may do there, on the real API server:
the presigned-STS bearer token (checked by EKS's authenticator, played by a TokenReview webhook
that verifies the SigV4 signature for this cluster), the access entry's group, and the RBAC of
deploy/kubernetes/rbac.yaml (everything the adapter does is allowed; nothing more is). The manifests are
accepted by the API server (server-side dry run)."""

from __future__ import annotations

import base64
import subprocess
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from nodemedic.errors import AwsThrottledError, DrainFailedError
from nodemedic.orchestrators import eks_auth
from nodemedic.orchestrators.kubernetes import CHECKPOINT_REQUESTED, KubernetesOrchestrator
from nodemedic_agent.config import parse_config
from nodemedic_sandbox.eks_authenticator import AccessEntry, EksAuthenticator
from nodemedic_sandbox.kube_apiserver import KubeAPIServer

from tests.kube.conftest import EKS_CLUSTER, Cluster

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
ROLE_ARN = "arn:aws:sts::123456789012:assumed-role/nodemedic-prod-a-functions/nodemedic-drain"
KEY, SECRET = "ASIATESTNODEMEDIC0001", "test-secret-for-the-local-authenticator"
READER_ARN = "arn:aws:sts::123456789012:assumed-role/nodemedic-prod-a-detect/nodemedic-detect"
READER_KEY = "ASIATESTNODEMEDIC0002"
# what the access entries name: the roles (EKS maps a caller's assumed-role session to its role)
ROLE = "arn:aws:iam::123456789012:role/nodemedic-prod-a-functions"
READER_ROLE = "arn:aws:iam::123456789012:role/nodemedic-prod-a-detect"
# a role of its own: the API server caches a token's groups a while, and a token is the same within its second
PLANNED_ARN = "arn:aws:sts::123456789012:assumed-role/nodemedic-prod-a-planned/nodemedic-planned"
PLANNED_KEY = "ASIATESTNODEMEDIC0003"
PLANNED_ROLE = "arn:aws:iam::123456789012:role/nodemedic-prod-a-planned"


def _sts(key: str = KEY, secret: str = SECRET) -> Any:
    return boto3.client("sts", region_name="us-east-1", aws_access_key_id=key, aws_secret_access_key=secret)


@pytest.fixture(scope="module")
def rbac(apiserver: KubeAPIServer) -> None:
    subprocess.run(["kubectl", "--kubeconfig", str(apiserver.kubeconfig()), "apply", "-f", str(MANIFESTS / "rbac.yaml")],
                   check=True, capture_output=True)


@pytest.fixture
def lambda_identity(authenticator: EksAuthenticator, rbac: None) -> EksAuthenticator:
    authenticator.credentials[KEY] = (SECRET, ROLE_ARN)
    authenticator.access_entries[ROLE] = AccessEntry(("nodemedic:remediator",))
    return authenticator


def _as_lambda(apiserver: KubeAPIServer, cluster: str = EKS_CLUSTER, sts: Any = None) -> Any:
    """The client the Lambda builds: endpoint and CA as DescribeCluster returns them, a token from STS."""
    eks = _DescribeCluster(apiserver)
    return eks_auth.api_client(eks, sts or _sts(), cluster)


class _DescribeCluster:
    """eks:DescribeCluster's answer for the local API server (its endpoint and CA, base64 as EKS gives it)."""

    def __init__(self, apiserver: KubeAPIServer) -> None:
        self._server = apiserver

    def describe_cluster(self, name: str) -> dict[str, Any]:
        ca = base64.b64encode(self._server.ca_file.read_bytes()).decode()
        return {"cluster": {"name": name, "endpoint": self._server.url, "certificateAuthority": {"data": ca}}}


def test_the_token_is_a_presigned_get_caller_identity_with_the_cluster_header_signed() -> None:
    token = eks_auth.token(_sts(), EKS_CLUSTER)
    assert token.startswith("k8s-aws-v1.") and "=" not in token
    url = base64.urlsafe_b64decode(token[len("k8s-aws-v1."):] + "==").decode()
    assert url.startswith("https://sts.") and "Action=GetCallerIdentity" in url
    assert "X-Amz-SignedHeaders=host%3Bx-k8s-aws-id" in url and "X-Amz-Expires=60" in url


def test_the_lambda_authenticates_with_its_token_and_remediates_within_its_role(
        apiserver: KubeAPIServer, cluster: Cluster, lambda_identity: EksAuthenticator) -> None:
    node = cluster.node("gpu-1")
    cluster.pod("train-0", node)
    orch = KubernetesOrchestrator(_as_lambda(apiserver))
    assert orch.drain(node, "nodemedic:inc-9 XID 79")
    assert orch.request_checkpoint(node, [f"{cluster.namespace}/Job/train"], "USR1", "batch") == []
    assert [j.job_id for j in orch.running_jobs(node)] == [f"{cluster.namespace}/Job/train"]
    assert orch.evacuate(node, datetime.now(UTC).timestamp()).requeued == [f"{cluster.namespace}/Job/train"]
    cluster.confirm_deletions()
    assert orch.busy(node) is None
    assert orch.add_spare(node, "nodemedic:inc-9") and orch.spares()
    orch.take_spare(node)
    assert orch.job_states([f"{cluster.namespace}/Job/train"])


def test_the_role_allows_nothing_beyond_remediation(
        apiserver: KubeAPIServer, cluster: Cluster, lambda_identity: EksAuthenticator) -> None:
    api = _as_lambda(apiserver)
    core = k8s.CoreV1Api(api)
    for forbidden in (lambda: core.list_secret_for_all_namespaces(),
                      lambda: core.delete_node(cluster.node("gpu-1")),
                      lambda: core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="x"))),
                      lambda: k8s.AppsV1Api(api).list_daemon_set_for_all_namespaces()):
        with pytest.raises(ApiException) as denied:
            forbidden()
        assert denied.value.status == 403


def test_the_reader_group_names_nodes_and_reads_jobs_but_changes_nothing(
        apiserver: KubeAPIServer, cluster: Cluster, authenticator: EksAuthenticator, rbac: None) -> None:
    """Detect, Gate and the sweeper (which node an instance backs), Shadow (what it would do) and
    PlannedEvents (whether a node's jobs leave it slack)."""
    authenticator.credentials[READER_KEY] = (SECRET, READER_ARN)
    authenticator.access_entries[READER_ROLE] = AccessEntry(("nodemedic:reader",))
    node = cluster.node("gpu-1", provider_id="aws:///us-east-1a/i-0a1b2c3d4e5f60789")
    cluster.pod("train-0", node)
    orch = KubernetesOrchestrator(_as_lambda(apiserver, sts=_sts(key=READER_KEY)))
    assert orch.node_of("i-0a1b2c3d4e5f60789") == node and orch.instance_of(node) == "i-0a1b2c3d4e5f60789"
    assert orch.node_status(node).state == "ALLOCATED"
    assert orch.jobs_on(node) == [f"{cluster.namespace}/Job/train"]
    assert [j.job_id for j in orch.running_jobs(node)] == [f"{cluster.namespace}/Job/train"]
    with pytest.raises(DrainFailedError, match="403"):
        orch.drain(node, "nodemedic:inc-9 XID 79")
    with pytest.raises(ApiException) as denied:
        k8s.CoreV1Api(orch._api).create_namespaced_pod_eviction(
            "train-0", cluster.namespace, {"metadata": {"name": "train-0", "namespace": cluster.namespace}})
    assert denied.value.status == 403
    assert not cluster.read_node(node).spec.unschedulable and "train-0" in cluster.live_pods(node)


def test_the_checkpointer_group_annotates_the_pods_checkpoint_request_and_nothing_else(
        apiserver: KubeAPIServer, cluster: Cluster, authenticator: EksAuthenticator, rbac: None) -> None:
    """PlannedEvents (reader and checkpointer): a rebalance recommendation asks the pods on the
    node to checkpoint; it may not cordon the node, evict or delete a pod."""
    authenticator.credentials[PLANNED_KEY] = (SECRET, PLANNED_ARN)
    authenticator.access_entries[PLANNED_ROLE] = AccessEntry(("nodemedic:reader", "nodemedic:checkpointer"))
    node = cluster.node("gpu-1")
    cluster.pod("train-0", node)
    orch = KubernetesOrchestrator(_as_lambda(apiserver, sts=_sts(key=PLANNED_KEY)))
    assert orch.request_checkpoint(node, [f"{cluster.namespace}/Job/train"], "USR1", "batch") == []
    assert CHECKPOINT_REQUESTED in cluster.live_pods(node)["train-0"].metadata.annotations
    with pytest.raises(DrainFailedError, match="403"):
        orch.drain(node, "nodemedic:inc-9 XID 79")
    core = k8s.CoreV1Api(orch._api)
    for forbidden in (lambda: core.create_namespaced_pod_eviction(
                          "train-0", cluster.namespace, {"metadata": {"name": "train-0", "namespace": cluster.namespace}}),
                      lambda: core.delete_namespaced_pod("train-0", cluster.namespace)):
        with pytest.raises(ApiException) as denied:
            forbidden()
        assert denied.value.status == 403
    assert not cluster.read_node(node).spec.unschedulable and "train-0" in cluster.live_pods(node)


def test_the_pipelines_client_passes_a_refusal_on_to_be_retried_and_says_what_lasting_one_means(
        apiserver: KubeAPIServer, cluster: Cluster, authenticator: EksAuthenticator, rbac: None) -> None:
    """An API server that has just restarted refuses requests until its RBAC has synced (403 for
    a while, kubernetes#121635): in a function the refusal is AwsThrottledError, which the state
    machine retries within its budget, and its message says what a refusal that lasts means. The
    operator's client (the CLI) keeps the API server's answer."""
    authenticator.credentials[READER_KEY] = (SECRET, READER_ARN)
    authenticator.access_entries[READER_ROLE] = AccessEntry(("nodemedic:reader",))
    node = cluster.node("gpu-1")
    eks = _DescribeCluster(apiserver)
    pipeline = KubernetesOrchestrator(eks_auth.api_client(eks, _sts(key=READER_KEY), EKS_CLUSTER, refusals_pass=True))
    with pytest.raises(AwsThrottledError, match="403 Forbidden") as refused:
        pipeline.drain(node, "nodemedic:inc-9 XID 79")  # a reader may not patch nodes
    assert "until its RBAC has synced" in str(refused.value) and "deploy/kubernetes/rbac.yaml" in str(refused.value)
    with pytest.raises(DrainFailedError, match="403"):
        KubernetesOrchestrator(_as_lambda(apiserver, sts=_sts(key=READER_KEY))).drain(node, "nodemedic:inc-9 XID 79")
    assert not cluster.read_node(node).spec.unschedulable


def test_a_token_for_another_cluster_or_from_unknown_credentials_is_refused(
        apiserver: KubeAPIServer, lambda_identity: EksAuthenticator) -> None:
    for api, why in ((_as_lambda(apiserver, cluster="someone-elses-cluster"), "SignatureDoesNotMatch"),
                     (_as_lambda(apiserver, sts=_sts(key="ASIAUNKNOWNKEY000001")), "InvalidClientTokenId")):
        with pytest.raises(ApiException) as refused:
            k8s.CoreV1Api(api).list_node()
        assert refused.value.status == 401
        assert why in lambda_identity.rejected[-1]


def test_the_manifests_are_accepted_by_the_api_server(apiserver: KubeAPIServer) -> None:
    """Server-side dry run of every object (the namespace is created for real first: a dry-run
    namespace does not exist for the objects in it)."""
    kubeconfig = str(apiserver.kubeconfig())
    subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "create", "namespace", "nodemedic"], capture_output=True)
    for manifest in ("rbac.yaml", "agent-daemonset.yaml"):
        done = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "apply", "--dry-run=server", "-f",
                               str(MANIFESTS / manifest)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert "(server dry run)" in done.stdout


def test_the_daemonsets_agent_configuration_is_valid_and_names_the_kubernetes_node() -> None:
    docs = {d["kind"]: d for d in yaml.safe_load_all((MANIFESTS / "agent-daemonset.yaml").read_text())}
    parse_config(tomllib.loads(docs["ConfigMap"]["data"]["agent.toml"]), "the DaemonSet's ConfigMap")
    container = docs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODEMEDIC_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert container["securityContext"]["privileged"] is False
    assert docs["ServiceAccount"]["automountServiceAccountToken"] is False


def test_the_functions_build_the_kubernetes_adapter_from_their_settings(
        apiserver: KubeAPIServer, cluster: Cluster, lambda_identity: EksAuthenticator,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a stage function gets from ``wiring.orchestrator()`` with ORCHESTRATOR=kubernetes."""
    from nodemedic import wiring

    for name, value in {"CLUSTER_NAME": "prod-a", "INCIDENTS_TABLE": "t", "PROVIDER": "ec2",
                        "ORCHESTRATOR": "kubernetes", "EKS_CLUSTER_NAME": EKS_CLUSTER,
                        "KUBERNETES_DRAIN_POLICY": '{"default": {"mode": "delete", "timeout_seconds": 60}}'}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_CONTROLLER_INSTANCE_ID", raising=False)
    clients = {"eks": _DescribeCluster(apiserver), "sts": _sts()}
    monkeypatch.setattr(wiring, "client", lambda service: clients[service])
    wiring.reset(keep_clients=True)
    try:
        orch = wiring.orchestrator()
        assert isinstance(orch, KubernetesOrchestrator)
        node = cluster.node("gpu-1")
        assert node in {n.name for n in orch.nodes()}
        assert orch._policy.default.mode == "delete"
    finally:
        wiring.reset(keep_clients=True)


@pytest.mark.parametrize(("env", "why"), [
    ({"ORCHESTRATOR": "kubernetes"}, "ORCHESTRATOR=kubernetes needs EKS_CLUSTER_NAME"),
    ({"ORCHESTRATOR": "slurm"}, "ORCHESTRATOR=slurm needs SLURM_CONTROLLER_INSTANCE_ID"),
    ({"PROVIDER": "karpenter", "ORCHESTRATOR": "kubernetes", "EKS_CLUSTER_NAME": "c"},
     "PROVIDER=karpenter needs KARPENTER_NODE_POOL and ORCHESTRATOR=kubernetes"),
    ({"PROVIDER": "karpenter", "KARPENTER_NODE_POOL": "gpu", "ORCHESTRATOR": "slurm",
      "SLURM_CONTROLLER_INSTANCE_ID": "i-0123abcd"}, "PROVIDER=karpenter needs KARPENTER_NODE_POOL and ORCHESTRATOR"),
])
def test_settings_name_what_each_orchestrator_needs(env: dict[str, str], why: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from nodemedic.settings import Settings

    for name, value in {"CLUSTER_NAME": "prod-a", "INCIDENTS_TABLE": "t", "PROVIDER": "ec2", **env}.items():
        monkeypatch.setenv(name, value)
    for name in ("SLURM_CONTROLLER_INSTANCE_ID", "EKS_CLUSTER_NAME", "KARPENTER_NODE_POOL"):
        if name not in env:
            monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=why):
        Settings()
