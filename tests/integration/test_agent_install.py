"""The lifecycle script installs the agent from its self-contained wheelhouse into its own venv,
with no package index, and writes a valid config and the deep-health-check command the pipeline
runs on a node."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "node_agent/lifecycle/install-agent.sh"
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def no_index_env() -> dict[str, str]:
    """The environment of a node in a private subnet: no pip configuration, no reachable index."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's wheelhouse for this machine's Python, built once for the module."""
    out = tmp_path_factory.mktemp("wheelhouse")
    build = subprocess.run(["bash", str(ROOT / "node_agent/lifecycle/build-wheelhouse.sh"), "--out", str(out),
                            "--pythons", PYTHON, "--archs", platform.machine(), "--python", sys.executable],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    [house] = out.glob("nodemedic-agent-wheelhouse-*.tar.gz")
    return house


def test_lifecycle_script_installs_a_working_agent_from_the_wheelhouse_with_no_index(tmp_path: Path,
                                                                                    wheelhouse: Path) -> None:
    house = wheelhouse
    with tarfile.open(house) as tar:
        members = {Path(m).name for m in tar.getnames()}
        manifest = json.load(tar.extractfile("nodemedic-agent-wheelhouse/wheelhouse.json"))
        [agent] = [m for m in tar.getmembers() if Path(m.name).name.startswith("nodemedic_agent-")]
        names = zipfile.ZipFile(tar.extractfile(agent)).namelist()
    assert manifest["pythons"] == [PYTHON] and manifest["archs"] == [platform.machine()]
    assert any(m.startswith("pydantic_core-") and f"cp{PYTHON.replace('.', '')}" in m for m in members)
    # the node runs the same contract models and fault table as the pipeline
    assert {"nodemedic/contracts/events.py", "nodemedic/domain/fault_table.json", "nodemedic/domain/xid_catalog.csv",
            "nodemedic/domain/nvlink5_decode.csv", "nodemedic/domain/instance_types.json",
            "nodemedic_agent/cli.py"} <= set(names)

    root = tmp_path / "node"
    proc = subprocess.run(
        ["bash", str(INSTALL), "--cluster", "local", "--bus", "nodemedic-local",
         "--acknowledgements-table", "nodemedic-local-IncidentsTable-1A2B", "--region", "us-east-1",
         "--instance-id", "i-0123456789abcdef0", "--slurm-node", "gpu-1", "--shared-mount", "/",
         "--wheelhouse", str(house), "--root", str(root), "--no-systemd", "--python", sys.executable,
         "--relay-queue", "https://sqs.us-east-1.amazonaws.com/123456789012/nodemedic-local-RelayQueue-1A2B"],
        capture_output=True, text=True, timeout=600, env=no_index_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(from the wheelhouse, no package index)" in proc.stdout
    assert "valid (cluster local, bus nodemedic-local, hardware nvml)" in proc.stdout
    assert "NodeMedic health report: gpu-1 (i-0123456789abcdef0)" in proc.stdout
    written = tomllib.loads((root / "etc/nodemedic/agent.toml").read_text())
    assert written["publish"]["acknowledgements_table"] == "nodemedic-local-IncidentsTable-1A2B"
    # on a controller of a SlurmChannel relay stack: the relay's section, validated with the rest
    assert written["relay"] == {"queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/nodemedic-local-RelayQueue-1A2B",
                                "table": "nodemedic-local-IncidentsTable-1A2B"}

    check = subprocess.run([str(root / "opt/nodemedic/bin/deep-health-check"), "--level", "quick",
                            "--settle-seconds", "1"],  # a failing check is repeated for the settle window
                           capture_output=True, text=True, timeout=60)
    report = json.loads(check.stdout.strip().splitlines()[-1])
    # this machine has no GPU driver: the gate must say unhealthy, with the reason, and exit 1
    assert check.returncode == 1 and report["healthy"] is False
    gpu = next(c for c in report["checks"] if c["name"] == "gpu")
    assert gpu["status"] == "error" and "NVML" in gpu["detail"]

    # the ladder's first rung: with no nvidia-smi here it fails, says why, and touches nothing
    reset = subprocess.run([str(root / "opt/nodemedic/bin/gpu-reset"), "--gpus", "0"], capture_output=True, text=True,
                           timeout=60, env={"PATH": str(tmp_path / "empty")})
    assert reset.returncode == 1 and "nvidia-smi" in json.loads(reset.stdout.strip().splitlines()[-1])["failed"]


def _unit_security(tmp_path: Path, name: str) -> tuple[float, str, dict[str, str]]:
    """The unit's overall exposure by ``systemd-analyze security`` (offline), its report, and its
    settings (skipped where systemd-analyze is not installed)."""
    import re
    import shutil

    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    unit = tmp_path / name
    unit.write_text((ROOT / "node_agent/systemd" / name).read_text())
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True,
                         text=True, timeout=60).stdout
    exposure = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out).group(1))
    settings = dict(line.split("=", 1) for line in unit.read_text().splitlines() if "=" in line and line[0] != "#")
    return exposure, out, settings


def test_the_systemd_unit_is_sandboxed_but_keeps_what_the_agent_reads(tmp_path: Path) -> None:
    exposure, out, settings = _unit_security(tmp_path, "nodemedic-agent.service")
    assert exposure <= 3.0, out[-3000:]  # main's unit: 9.6 UNSAFE
    # what would break the agent: /dev/kmsg hidden, NVML's devices hidden, / read-only (the read-only
    # file system check would flag every node), kernel log capability dropped
    assert settings.get("ProtectKernelLogs", "no") == "no" and settings.get("PrivateDevices", "no") == "no"
    assert settings["ProtectSystem"] != "strict"
    assert "CAP_SYSLOG" in settings["CapabilityBoundingSet"]


def test_the_relays_unit_is_sandboxed_but_keeps_what_its_documents_need(tmp_path: Path) -> None:
    """The relay ran as root with light sandboxing (exposure 7.9): whoever could make it run a
    command could change anything. Its documents run scontrol, scancel, squeue, flock and date."""
    exposure, out, settings = _unit_security(tmp_path, "nodemedic-relay.service")
    assert exposure <= 3.0, out[-3000:]
    # what would break the documents: no network (slurmctld), no UNIX sockets (munged), no /tmp for
    # their locks, Slurm's key unreadable to root (auth/slurm keeps it the SlurmUser's, mode 0600)
    assert settings.get("PrivateNetwork", "no") == "no" and "AF_UNIX" in settings["RestrictAddressFamilies"]
    assert settings["PrivateTmp"] == "yes" and "CAP_DAC_READ_SEARCH" in settings["CapabilityBoundingSet"]
    assert settings["ProtectSystem"] == "full"  # slurm.conf read-only to whatever it runs


def test_a_relay_without_the_table_its_requests_are_recorded_in_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(INSTALL), "--cluster", "local", "--bus", "b", "--root", str(tmp_path), "--no-systemd",
                           "--relay-queue", "https://sqs.us-east-1.amazonaws.com/123456789012/q"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--relay-queue needs --acknowledgements-table" in proc.stderr
    assert not (tmp_path / "opt").exists()


def test_an_old_python_is_refused_with_what_to_install(tmp_path: Path) -> None:
    """AL2023 ships Python 3.9: the installer says what it needs instead of failing later in pip."""
    old = tmp_path / "python3"
    old.write_text("#!/bin/sh\n[ \"$1\" = -V ] && { echo 'Python 3.9.16'; exit 0; }\nexit 1\n")
    old.chmod(0o755)
    proc = subprocess.run(["bash", str(INSTALL), "--cluster", "c", "--bus", "b",
                           "--python", str(old), "--root", str(tmp_path / "node"), "--no-systemd"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Python 3.9.16" in proc.stderr and "needs Python 3.10 or newer" in proc.stderr
    assert "dnf install -y python3.11" in proc.stderr
    assert not (tmp_path / "node").exists()  # nothing installed


def test_a_wheelhouse_for_another_python_is_refused_before_anything_is_installed(tmp_path: Path) -> None:
    """A wheelhouse built for other Pythons or CPUs would fail inside pip, half installed; the
    installer reads its manifest first and says what to rebuild."""
    house = tmp_path / "house.tar.gz"
    manifest = tmp_path / "wheelhouse.json"
    manifest.write_text(json.dumps({"agent": "0.1.0", "pythons": ["3.9"], "archs": ["riscv64"]}))
    with tarfile.open(house, "w:gz") as tar:
        tar.add(manifest, arcname="nodemedic-agent-wheelhouse/wheelhouse.json")
    proc = subprocess.run(["bash", str(INSTALL), "--cluster", "c", "--bus", "b", "--wheelhouse", str(house),
                           "--python", sys.executable, "--root", str(tmp_path / "node"), "--no-systemd"],
                          capture_output=True, text=True, timeout=120, env=no_index_env())
    assert proc.returncode == 2, proc.stderr
    assert f"the wheelhouse holds CPython 3.9 on riscv64; {sys.executable} is CPython {PYTHON} on {platform.machine()}" \
        in proc.stderr
    assert f"build-wheelhouse.sh --pythons {PYTHON} --archs {platform.machine()}" in proc.stderr
    assert not (tmp_path / "node").exists()  # nothing installed

    both = subprocess.run(["bash", str(INSTALL), "--cluster", "c", "--bus", "b", "--wheelhouse", str(house),
                           "--wheel", "agent.whl", "--root", str(tmp_path / "node"), "--no-systemd"],
                          capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "--wheel and --wheelhouse: give one" in both.stderr


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """The embedded S3 on a real local endpoint (moto's server), which the real AWS CLI talks to;
    without the AWS CLI (make awscli) the test is skipped, and fails under CI."""
    import shutil

    import boto3
    from moto.server import ThreadedMotoServer

    from bench.moto_bus import free_port
    from tests.conftest import require

    require("the AWS CLI (make awscli)", None if shutil.which("aws") else "no aws on PATH")
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
                       "AWS_SHARED_CREDENTIALS_FILE": os.devnull}.items():
        monkeypatch.setenv(key, value)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        client.create_bucket(Bucket="lifecycle")
        yield client, url
    finally:
        server.stop()


def test_the_wheelhouse_is_fetched_from_s3_with_the_aws_cli(tmp_path: Path, wheelhouse: Path,
                                                            s3: tuple[Any, str]) -> None:
    """HyperPod lifecycle scripts and user data fetch from S3: the installer copies the object with
    the AWS CLI (through an S3 interface endpoint's URL, here the embedded S3's) and installs it."""
    client, url = s3
    client.upload_file(str(wheelhouse), "lifecycle", f"agent/{wheelhouse.name}")
    root = tmp_path / "node"
    proc = subprocess.run(
        ["bash", str(INSTALL), "--cluster", "local", "--bus", "nodemedic-local", "--region", "us-east-1",
         "--instance-id", "i-0123456789abcdef0", "--slurm-node", "gpu-1",
         "--wheelhouse", f"s3://lifecycle/agent/{wheelhouse.name}", "--s3-endpoint-url", url,
         "--root", str(root), "--no-systemd", "--python", sys.executable],
        capture_output=True, text=True, timeout=600, env=no_index_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(from the wheelhouse, no package index)" in proc.stdout
    assert (root / "opt/nodemedic/agent/bin/nodemedic-agent").exists()


def test_an_s3_object_that_cannot_be_copied_stops_the_install_saying_why(tmp_path: Path, s3: tuple[Any, str]) -> None:
    _, url = s3
    root = tmp_path / "node"
    proc = subprocess.run(
        ["bash", str(INSTALL), "--cluster", "local", "--bus", "nodemedic-local", "--region", "us-east-1",
         "--wheelhouse", "s3://lifecycle/agent/missing.tar.gz", "--s3-endpoint-url", url,
         "--root", str(root), "--no-systemd", "--python", sys.executable],
        capture_output=True, text=True, timeout=120, env=no_index_env())
    assert proc.returncode == 2
    assert "cannot copy s3://lifecycle/agent/missing.tar.gz (the instance role needs s3:GetObject on it)" in proc.stderr
    assert not (root / "opt/nodemedic/agent").exists()  # nothing installed
