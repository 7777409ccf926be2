"""The agent's health checks on a real GPU node, and what a healthy GPU measures.

Run on a machine with NVIDIA GPUs, the driver, nvidia-ml-py and PyTorch with CUDA (a p5 node, or
the lent GPU machine described in docs/health-checks.md). It drives ``nodemedic-agent health-check``
exactly as the pipeline does (a process per check, real NVML, the instance type's settle rule) and
records:

- the quick and full checks' durations;
- per GPU, the full check's dense BF16 GEMM TFLOPS and device-to-device copy GB/s (the figures its
  thresholds in ``instance_types.json`` are calibrated from);
- the SM clock as a fraction of its maximum while the GPU is busy (what fail-slow compares);
- with ``all_reduce_perf`` on PATH and two GPUs or more, the NCCL all-reduce bus bandwidth.

Results go to docs/benchmarks.{json,md}; ``--out DIR`` also keeps each check's JSON report and the
raw tool output there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.results import JSON, MD, machine, record, summarize

COMMAND = "python -m bench.gpu_node"


def gpu_machine() -> tuple[str, str]:
    """The GPU's name; the GPUs, their driver and power limit, then the host (bench.results.machine)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,power.limit,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True, check=True).stdout
    rows = [[f.strip() for f in r.split(",")] for r in out.strip().splitlines()]
    name, driver, power, memory = rows[0]
    return name, f"{len(rows)}x {name} (driver {driver}, power limit {power}, {memory}), {machine()}"


def write_config(root: Path, gpus: int) -> Path:
    path = root / "agent.toml"
    path.write_text("\n".join([
        'cluster = "bench"', 'event_bus = "bench"', 'region = "us-east-1"',
        "[node]", 'instance_id = "i-0123456789abcdef0"', 'slurm_node = "gpu-bench"', 'hostname = "gpu-bench"',
        "[expected]", f"gpus = {gpus}", "efa_devices = 0",
        "[kernel_log]", 'source = "off"',
        "[hardware]", 'backend = "nvml"',
        "[publish]", f'spool_dir = "{root / "spool"}"']) + "\n")
    return path


def health_check(config: Path, level: str, instance_type: str, *extra: str) -> tuple[float, dict[str, Any], int]:
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "nodemedic_agent.cli", "--config", str(config), "health-check",
                          "--level", level, "--instance-type", instance_type, *extra],
                         capture_output=True, text=True, timeout=900)
    elapsed = time.monotonic() - started
    lines = out.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"health-check {level} printed nothing (exit {out.returncode}): {out.stderr[-1500:]}")
    return elapsed, json.loads(lines[-1]), out.returncode


def busy_clock_fraction(seconds: float = 6.0) -> list[float]:
    """SM clock / max SM clock of each GPU, read through the agent's NVML backend while a GEMM runs."""
    import torch  # type: ignore[import-not-found]
    from nodemedic_agent.hardware.nvml import NvmlHardware

    stop = threading.Event()

    def load(i: int) -> None:
        with torch.cuda.device(i):
            a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
            while not stop.is_set():
                for _ in range(20):
                    torch.matmul(a, a)
                torch.cuda.synchronize()

    threads = [threading.Thread(target=load, args=(i,)) for i in range(torch.cuda.device_count())]
    for t in threads:
        t.start()
    hw = NvmlHardware(dcgm=False)
    samples: list[float] = []
    try:
        time.sleep(2.0)  # clocks ramp
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            samples += [g.sm_clock_mhz / g.max_sm_clock_mhz for g in hw.gpus()
                        if g.max_sm_clock_mhz and g.utilization_pct >= 50]
            time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
        hw.close()
    return samples


def nccl_raw(out_dir: Path | None) -> None:
    """Keep all_reduce_perf's real output (one GPU: the format, not a figure) for the parser's tests."""
    binary = shutil.which("all_reduce_perf")
    if binary is None or out_dir is None:
        return
    out = subprocess.run([binary, "-b", "64M", "-e", "64M", "-g", "1", "-n", "5"], capture_output=True, text=True,
                         timeout=300)
    (out_dir / "all_reduce_perf_1gpu.txt").write_text(out.stdout + out.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instance-type", default="p5.48xlarge",
                        help="whose thresholds and settle rule to apply (default: %(default)s, H100 SXM)")
    parser.add_argument("--quick-runs", type=int, default=5)
    parser.add_argument("--full-runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also keep the reports and raw output here")
    args = parser.parse_args()
    import pynvml

    try:
        pynvml.nvmlInit()
        gpus = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        sys.exit(f"bench.gpu_node: needs an NVIDIA GPU and its driver (NVML: {exc})")
    if not gpus:
        sys.exit("bench.gpu_node: NVML sees no GPU")
    gpu, where = gpu_machine()
    command = f"{COMMAND} --instance-type {args.instance_type} --quick-runs {args.quick_runs} --full-runs {args.full_runs}"
    print(f"{where}\n{gpus} GPU(s), thresholds of {args.instance_type}", flush=True)
    reports: dict[str, list[dict[str, Any]]] = {"quick": [], "full": []}
    durations: dict[str, list[float]] = {"quick": [], "full": []}
    with tempfile.TemporaryDirectory(prefix="nodemedic-bench-gpu-") as tmp:
        config = write_config(Path(tmp), gpus)
        for level, runs in (("quick", args.quick_runs), ("full", args.full_runs)):
            for n in range(runs):
                elapsed, report, code = health_check(config, level, args.instance_type)
                reports[level].append(report)
                durations[level].append(elapsed)
                print(f"{level} {n + 1}/{runs}: exit {code}, healthy {report['healthy']}, {elapsed:.1f} s, "
                      f"settle {report['settle']}", flush=True)
                if code != 0:
                    print(json.dumps(report, indent=1), flush=True)
    rows = [m for r in reports["full"] for c in r["checks"] if c["name"] == "gpu_burn" for m in c.get("measurements", [])]
    gemm = [m["value"] for m in rows if m["metric"] == "gemm_bf16_tflops"]
    hbm = [m["value"] for m in rows if m["metric"] == "hbm_copy_gbps"]
    nccl = [m["value"] for r in reports["full"] for c in r["checks"] if c["name"] == "nccl_all_reduce"
            for m in c.get("measurements", [])]
    clocks = busy_clock_fraction()
    extra = {"machine": where, "instance_type": args.instance_type}
    results = [
        summarize(f"gpu node ({gpu}): quick health check", "s", durations["quick"], command, **extra,
                  note="nodemedic-agent health-check --level quick on a real GPU (NVML), a process per check, with "
                       "the instance type's settle rule (3 clean polls 5 s apart end it on a healthy node)"),
        summarize(f"gpu node ({gpu}): full health check", "s", durations["full"], command, **extra,
                  note="quick (settled), then dcgmi diag, the GEMM/HBM burn (10 s per GPU) and the NCCL all-reduce; "
                       "not run here: " + ", ".join(sorted({n for r in reports["full"] for n in r.get("not_run", [])}))),
    ]
    if gemm:
        results.append(summarize(f"gpu node ({gpu}): dense BF16 GEMM per GPU", "TFLOP/s", gemm, command, **extra,
                                 note="8192x8192x8192 torch.matmul on random data, CUDA-event timed, 5 s per GPU"))
    if hbm:
        results.append(summarize(f"gpu node ({gpu}): HBM device-to-device copy per GPU", "GB/s", hbm, command, **extra,
                                 note="2 GiB copy_, bytes read + written, CUDA-event timed, 5 s per GPU"))
    if nccl:
        results.append(summarize(f"gpu node ({gpu}): NCCL all-reduce bus bandwidth", "GB/s", nccl, command, **extra))
    if clocks:
        results.append(summarize(f"gpu node ({gpu}): busy SM clock / max", "fraction", clocks, command, **extra,
                                 note="read through the agent's NVML backend every 0.5 s while each GPU runs GEMMs"))
    record(results)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "reports.json").write_text(json.dumps(reports, indent=1))
        shutil.copy(JSON, args.out / JSON.name)
        shutil.copy(MD, args.out / MD.name)
        nccl_raw(args.out)
    bad = [r for level in reports for r in reports[level] if not r["healthy"]]
    print(f"{len(bad)} unhealthy report(s)" if bad else "every check passed", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
