"""The Helm chart (deploy/helm/nodemedic), rendered by the official Helm binary and dry-run on the
real API server: it installs what the plain manifests do (the same agent pod, configuration and
RBAC), its configuration is one the agent accepts, its options change what they say, and a
missing required value stops the install with a message naming it."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from nodemedic_agent.config import parse_config
from nodemedic_sandbox import helm
from nodemedic_sandbox.kube_apiserver import KubeAPIServer

from tests.conftest import require

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
REQUIRED = ("--set", "config.cluster=prod-a", "--set", "config.event_bus=nodemedic-prod-a")


@pytest.fixture(autouse=True)
def _helm() -> None:
    require("the official helm binary", helm.unavailable_reason())


def _render(*args: str, values: dict[str, Any] | None = None, tmp_path: Path | None = None) -> str:
    values_file = None
    if values is not None:
        assert tmp_path is not None
        values_file = tmp_path / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
    done = helm.run("template", "nodemedic", str(helm.CHART), "--namespace", "nodemedic", *args, values=values_file)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _objects(text: str) -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(text) if d}


def _agent_toml(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return tomllib.loads(objects["ConfigMap/nodemedic-agent"]["data"]["agent.toml"])


def test_the_chart_lints_clean() -> None:
    done = helm.run("lint", "--strict", str(helm.CHART), *REQUIRED)
    assert done.returncode == 0, done.stdout + done.stderr


def test_by_default_it_installs_what_the_plain_manifests_do() -> None:
    """The same agent pod, configuration, service account and RBAC as deploy/kubernetes/, so the two
    ways of installing cannot drift apart."""
    chart = _objects(_render(*REQUIRED))
    plain = _objects((MANIFESTS / "agent-daemonset.yaml").read_text() + "\n---\n" + (MANIFESTS / "rbac.yaml").read_text())
    del plain["Namespace/nodemedic"]  # helm install --create-namespace
    assert set(chart) == set(plain)
    pod, plain_pod = (o["DaemonSet/nodemedic-agent"]["spec"]["template"]["spec"] for o in (chart, plain))
    plain_pod["containers"][0]["imagePullPolicy"] = "IfNotPresent"  # the API server's default for a tagged image
    assert pod == plain_pod
    # the agent learns its instance id, region and credentials from IMDSv2, which answers one hop
    # away where the hop limit is 1 (Karpenter's default): from a pod network it could not start
    # and it resolves AWS's names with the node's resolver, not cluster DNS, which may run on the sick node
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "Default")
    assert _agent_toml(chart) == tomllib.loads(plain["ConfigMap/nodemedic-agent"]["data"]["agent.toml"])
    assert chart["ServiceAccount/nodemedic-agent"]["automountServiceAccountToken"] is False
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        for name in ("nodemedic-remediator", "nodemedic-reader"):
            key = f"{kind}/{name}"
            assert {k: v for k, v in chart[key].items() if k != "metadata"} == \
                   {k: v for k, v in plain[key].items() if k != "metadata"}


def test_its_configuration_is_one_the_agent_accepts_and_the_journal_option_mounts_the_journal(tmp_path: Path) -> None:
    values = {"config": {"cluster": "prod-a", "event_bus": "nodemedic-prod-a", "region": "us-west-2",
                         "expected": {"gpus": 8, "efa_devices": 32},
                         "intervals": {"heartbeat_seconds": 15, "poll_seconds": 10},
                         "storage": {"shared_mounts": ["/fsx"], "min_free_percent": 5},
                         "thresholds": {"efa_error_rates": {"rx_drops": 500.0}},
                         "kernel_log": {"source": "journal"},
                         "fault_overrides": {"XID 74": "monitor"}},
              "hostPaths": [{"name": "fsx", "path": "/fsx"}], "rbac": {"create": False},
              "image": {"repository": "123456789012.dkr.ecr.us-west-2.amazonaws.com/nodemedic-agent", "tag": "7"}}
    objects = _objects(_render(values=values, tmp_path=tmp_path))

    config = parse_config(_agent_toml(objects), "the chart's ConfigMap")
    assert (config.expected.gpus, config.expected.efa_devices, config.region) == (8, 32, "us-west-2")
    # the container's own root is read-only (readOnlyRootFilesystem): the storage check judges the
    # spool's host file system, the one the pod writes, or it would report FS_READONLY on every node
    assert config.storage.paths == ["/var/spool/nodemedic-agent"] and config.storage.min_free_percent == 5
    assert config.kernel_log.source == "journal" and config.fault_overrides == {"XID 74": "monitor"}
    assert config.storage.shared_mounts == ["/fsx"] and config.thresholds.efa_error_rates == {"rx_drops": 500.0}
    assert not any(k.startswith("ClusterRole") for k in objects)  # rbac.create=false
    pod = objects["DaemonSet/nodemedic-agent"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == "123456789012.dkr.ecr.us-west-2.amazonaws.com/nodemedic-agent:7"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert "kmsg" not in mounts and mounts["journal"]["readOnly"] and mounts["fsx"]["mountPath"] == "/fsx"
    assert mounts["fsx"]["readOnly"] and "add" not in container["securityContext"]["capabilities"]  # no CAP_SYSLOG
    assert {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} == {
        "journal": "/var/log/journal", "machine-id": "/etc/machine-id", "sys": "/sys",
        "spool": "/var/spool/nodemedic-agent", "fsx": "/fsx"}


def test_a_changed_configuration_rolls_the_agents() -> None:
    def checksum(*args: str) -> str:
        ds = _objects(_render(*REQUIRED, *args))["DaemonSet/nodemedic-agent"]
        return str(ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum() == checksum() != checksum("--set", "config.intervals.poll_seconds=5")


@pytest.mark.parametrize(("args", "why"), [
    ((), "config.cluster is required: the stack's ClusterName"),
    (("--set", "config.cluster=prod-a"), "config.event_bus is required: the stack output EventBusName"),
    ((*REQUIRED, "--set", "config.kernel_log.source=file"), "config.kernel_log.source must be kmsg, journal or off"),
    ((*REQUIRED, "--set", "config.storage.paths={/}"), "config.storage.paths may name only the spool directory"),
])
def test_a_missing_or_impossible_value_stops_the_install_and_names_it(args: tuple[str, ...], why: str) -> None:
    done = helm.run("template", "nodemedic", str(helm.CHART), *args)
    assert done.returncode != 0 and why in done.stderr and not done.stdout


@pytest.mark.parametrize("source", ["kmsg", "journal"])
def test_what_it_renders_is_accepted_by_the_api_server(apiserver: KubeAPIServer, source: str) -> None:
    kubeconfig = str(apiserver.kubeconfig())
    subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "create", "namespace", "nodemedic"], capture_output=True)
    rendered = _render(*REQUIRED, "--set", f"config.kernel_log.source={source}",
                       "--set", "hostPaths[0].name=fsx", "--set", "hostPaths[0].path=/fsx")
    done = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "apply", "--dry-run=server", "-f", "-"],
                          input=rendered, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("(server dry run)") == len(_objects(rendered))
