"""Deep health check duration: ``nodemedic-agent health-check --level quick|full`` as the pipeline
runs it, a process per check, on a healthy simulated node.

Without a GPU this measures what NodeMedic adds: process start, the agent's checks, the settle
rule (``--settle-seconds 0``: the first clean poll is the verdict; on hardware the instance
type's settle window comes on top) and the report. The full level's GPU steps (dcgmi diag, the
GEMM/HBM burn, the NCCL all-reduce) find no tool here and are reported ``not run``, so their
minutes are not in these figures; ``bench/gpu_node.py`` (``make gpu-check``) measures them on a GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nodemedic_agent.hardware.simulated import SimulatedNode

from bench.results import record, summarize


def config(root: Path) -> Path:
    sim = SimulatedNode(root / "hw").create(gpus=8, efa=4)
    path = root / "agent.toml"
    path.write_text("\n".join([
        'cluster = "bench"', 'event_bus = "bench"', 'region = "us-east-1"',
        "[node]", 'instance_id = "i-0123456789abcdef0"', 'slurm_node = "gpu-1"', 'hostname = "gpu-1"',
        "[expected]", "gpus = 8", "efa_devices = 4",
        "[kernel_log]", 'source = "off"',
        "[hardware]", 'backend = "simulated"', f'simulated_dir = "{sim.dir}"',
        "[publish]", f'spool_dir = "{root / "spool"}"']) + "\n")
    return path


def run(path: Path, level: str) -> float:
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "nodemedic_agent.cli", "--config", str(path), "health-check",
                          "--level", level, "--instance-type", "p5.48xlarge", "--settle-seconds", "0"],
                         capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - started
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if not report["healthy"]:
        raise RuntimeError(f"the simulated node failed its {level} check: {out.stdout[-500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nodemedic-bench-hc-") as tmp:
        path = config(Path(tmp))
        results = []
        for level in ("quick", "full"):
            values = [run(path, level) for _ in range(args.runs)]
            results.append(summarize(
                f"health_check_{level}_duration", "s", values, f"make bench (python -m bench.health_check --runs {args.runs})",
                note="simulated healthy p5 node, settle 0 s; full: the GPU steps (DCGM diag, GEMM/HBM burn, "
                     "NCCL) are not run without a GPU, so they are not in this figure"))
    record(results)


if __name__ == "__main__":
    main()
