"""The lifecycle script builds the agent wheel, installs it into its own venv, writes a valid
config and the deep-health-check command the pipeline runs on a node."""

from __future__ import annotations

import json
import subprocess
import sys
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
    assert {"nodemedic/contracts/events.py", "nodemedic/domain/fault_table.json",
            "nodemedic_agent/cli.py"} <= set(names)

    root = tmp_path / "node"
    proc = subprocess.run(
        ["bash", str(ROOT / "node_agent/lifecycle/install-agent.sh"), "--cluster", "local", "--bus", "nodemedic-local",
         "--region", "us-east-1", "--instance-id", "i-0123456789abcdef0", "--slurm-node", "gpu-1",
         "--shared-mount", "/", "--wheel", str(wheel), "--root", str(root), "--no-systemd", "--python", sys.executable],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "valid (cluster local, bus nodemedic-local, hardware nvml)" in proc.stdout
    assert "NodeMedic health report: gpu-1 (i-0123456789abcdef0)" in proc.stdout

    check = subprocess.run([str(root / "opt/nodemedic/bin/deep-health-check"), "--level", "quick"],
                           capture_output=True, text=True, timeout=60)
    report = json.loads(check.stdout.strip().splitlines()[-1])
    # this machine has no GPU driver: the gate must say unhealthy, with the reason, and exit 1
    assert check.returncode == 1 and report["healthy"] is False
    gpu = next(c for c in report["checks"] if c["name"] == "gpu")
    assert gpu["status"] == "error" and "NVML" in gpu["detail"]
