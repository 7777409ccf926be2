"""The lifecycle script builds the agent wheel, installs it into its own venv, writes a valid
config and the deep-health-check command the pipeline runs on a node."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_lifecycle_script_installs_a_working_agent(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels),
                    str(ROOT / "node_agent")], check=True, timeout=300)
    [wheel] = wheels.glob("nodemedic_agent-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # the node runs the same contract models and fault table as the pipeline
    assert {"nodemedic/contracts/events.py", "nodemedic/domain/fault_table.json", "nodemedic/domain/xid_catalog.csv",
            "nodemedic/domain/nvlink5_decode.csv", "nodemedic/domain/instance_types.json",
            "nodemedic_agent/cli.py"} <= set(names)

    root = tmp_path / "node"
    proc = subprocess.run(
        ["bash", str(ROOT / "node_agent/lifecycle/install-agent.sh"), "--cluster", "local", "--bus", "nodemedic-local",
         "--acknowledgements-table", "nodemedic-local-IncidentsTable-1A2B", "--region", "us-east-1",
         "--instance-id", "i-0123456789abcdef0", "--slurm-node", "gpu-1",
         "--shared-mount", "/", "--wheel", str(wheel), "--root", str(root), "--no-systemd", "--python", sys.executable],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "valid (cluster local, bus nodemedic-local, hardware nvml)" in proc.stdout
    assert "NodeMedic health report: gpu-1 (i-0123456789abcdef0)" in proc.stdout
    written = tomllib.loads((root / "etc/nodemedic/agent.toml").read_text())
    assert written["publish"]["acknowledgements_table"] == "nodemedic-local-IncidentsTable-1A2B"

    check = subprocess.run([str(root / "opt/nodemedic/bin/deep-health-check"), "--level", "quick",
                            "--settle-seconds", "1"],  # a failing check is repeated for the settle window
                           capture_output=True, text=True, timeout=60)
    report = json.loads(check.stdout.strip().splitlines()[-1])
    # this machine has no GPU driver: the gate must say unhealthy, with the reason, and exit 1
    assert check.returncode == 1 and report["healthy"] is False
    gpu = next(c for c in report["checks"] if c["name"] == "gpu")
    assert gpu["status"] == "error" and "NVML" in gpu["detail"]


def test_the_systemd_unit_is_sandboxed_but_keeps_what_the_agent_reads(tmp_path: Path) -> None:
    import re
    import shutil

    import pytest

    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    unit = tmp_path / "nodemedic-agent.service"
    unit.write_text((ROOT / "node_agent/systemd/nodemedic-agent.service").read_text())
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True,
                         text=True, timeout=60).stdout
    exposure = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out).group(1))
    assert exposure <= 3.0, out[-3000:]  # main's unit: 9.6 UNSAFE
    settings = dict(line.split("=", 1) for line in unit.read_text().splitlines() if "=" in line and line[0] != "#")
    # what would break the agent: /dev/kmsg hidden, NVML's devices hidden, / read-only (the read-only
    # file system check would flag every node), kernel log capability dropped
    assert settings.get("ProtectKernelLogs", "no") == "no" and settings.get("PrivateDevices", "no") == "no"
    assert settings["ProtectSystem"] != "strict"
    assert "CAP_SYSLOG" in settings["CapabilityBoundingSet"]


def test_an_old_python_is_refused_with_what_to_install(tmp_path: Path) -> None:
    """AL2023 ships Python 3.9: the installer says what it needs instead of failing later in pip."""
    old = tmp_path / "python3"
    old.write_text("#!/bin/sh\n[ \"$1\" = -V ] && { echo 'Python 3.9.16'; exit 0; }\nexit 1\n")
    old.chmod(0o755)
    proc = subprocess.run(["bash", str(ROOT / "node_agent/lifecycle/install-agent.sh"), "--cluster", "c", "--bus", "b",
                           "--python", str(old), "--root", str(tmp_path / "node"), "--no-systemd"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Python 3.9.16" in proc.stderr and "needs Python 3.10 or newer" in proc.stderr
    assert "dnf install -y python3.11" in proc.stderr
    assert not (tmp_path / "node").exists()  # nothing installed
