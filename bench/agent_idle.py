"""Agent footprint at idle: CPU (% of one core) and resident memory of ``nodemedic-agent run``.

The agent runs as its own process with the production intervals (heartbeat 15 s, polled checks
every 10 s) on a healthy simulated node, publishing heartbeats over HTTP to a local moto server.
CPU is sampled in 5-second windows from /proc/PID/stat after a 5-second warm-up; RSS every
second from /proc/PID/status. The kernel log watcher reads this machine's real /dev/kmsg when it
can (root), else follows a file every 50 ms. The simulated GPU backend checks its XID file every
100 ms where NVML blocks in the driver, so the real agent wakes up less: an upper bound.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nodemedic_agent.hardware.simulated import SimulatedNode

from bench.moto_bus import bus_endpoint
from bench.results import record, summarize

COMMAND = "make bench (python -m bench.agent_idle --seconds 60)"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mb(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=60)
    args = parser.parse_args()
    with bus_endpoint() as url, tempfile.TemporaryDirectory() as tmp:
        sim = SimulatedNode(Path(tmp) / "hw").create(gpus=8, efa=4)
        real_kmsg = os.access("/dev/kmsg", os.R_OK)
        source, log_path = ("kmsg", "/dev/kmsg") if real_kmsg else ("file", sim.kmsg_path)
        config = Path(tmp) / "agent.toml"
        config.write_text(f"""
cluster = "bench"
event_bus = "bench"
region = "us-east-1"
[node]
instance_id = "i-0123456789abcdef0"
slurm_node = "gpu-1"
[expected]
efa_devices = 4
[kernel_log]
source = "{source}"
path = "{log_path}"
[hardware]
backend = "simulated"
simulated_dir = "{sim.dir}"
[publish]
spool_dir = "{Path(tmp) / 'spool'}"
endpoint_url = "{url}"
""")
        agent = subprocess.Popen([sys.executable, "-m", "nodemedic_agent.cli", "-c", str(config), "run"],
                                 stderr=subprocess.DEVNULL)
        try:
            time.sleep(5)
            cpu: list[float] = []
            rss: list[float] = []
            start_cpu, start = cpu_seconds(agent.pid), time.monotonic()
            window_cpu, window_start = start_cpu, start
            while time.monotonic() - start < args.seconds:
                time.sleep(1)
                rss.append(rss_mb(agent.pid))
                if time.monotonic() - window_start >= 5:
                    now_cpu, now = cpu_seconds(agent.pid), time.monotonic()
                    cpu.append(100 * (now_cpu - window_cpu) / (now - window_start))
                    window_cpu, window_start = now_cpu, now
            total = 100 * (cpu_seconds(agent.pid) - start_cpu) / (time.monotonic() - start)
        finally:
            agent.terminate()
            agent.wait(20)
    record([
        summarize("agent at idle: CPU", "% of one core", cpu, COMMAND, target="< 1 %",
                  mean_over_run=round(total, 3), window_s=5, kernel_log=source, notes=__doc__.split("\n\n", 1)[1].strip()),
        summarize("agent at idle: resident memory", "MB", rss, COMMAND, target="< 60 MB", sample_interval_s=1),
    ])


if __name__ == "__main__":
    main()
