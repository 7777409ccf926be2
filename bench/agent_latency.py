"""Agent detection latency: a kernel-log XID line written -> the PutEvents call returning.

The agent runs with simulated GPUs; its kernel log is a file it follows (the real agent blocks
on /dev/kmsg instead); PutEvents goes over HTTP to a local moto server (no internet round trip
to EventBridge, typically a further 10-50 ms in-region). The dedupe window is 0 so that every
injected line is its own event. Lines are written one at a time, 50 ms apart.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import threading
import time
from pathlib import Path

from nodemedic.contracts.events import NodeIdentity
from nodemedic_agent.agent import Agent, events_client
from nodemedic_agent.config import parse_config
from nodemedic_agent.hardware.simulated import SimulatedHardware, SimulatedNode

from bench.moto_bus import bus_endpoint
from bench.results import record, summarize

COMMAND = "make bench (python -m bench.agent_latency --faults 200)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between injected lines")
    args = parser.parse_args()
    with bus_endpoint() as url, tempfile.TemporaryDirectory() as tmp:
        sim = SimulatedNode(Path(tmp) / "hw").create(gpus=8, efa=0)
        config = parse_config({
            "cluster": "bench", "event_bus": "bench", "region": "us-east-1",
            "node": {"instance_id": "i-0123456789abcdef0", "slurm_node": "gpu-1"},
            "intervals": {"dedupe_window_seconds": 0, "poll_seconds": 10, "heartbeat_seconds": 15},
            "kernel_log": {"source": "file", "path": str(sim.kmsg_path)},
            "hardware": {"backend": "simulated", "simulated_dir": str(sim.dir)},
            "publish": {"spool_dir": str(Path(tmp) / "spool")},
        })
        agent = Agent(config, SimulatedHardware(sim.dir), NodeIdentity(instance_id="i-0123456789abcdef0",
                      hostname="gpu-1", slurm_node="gpu-1"), events_client(config.model_copy(
                          update={"publish": config.publish.model_copy(update={"endpoint_url": url})})))
        written: dict[int, float] = {}
        returned: dict[int, float] = {}
        done = threading.Event()

        def on_sent(entries: list[dict]) -> None:
            now = time.perf_counter()
            for e in entries:
                if m := re.search(r"pid=(\d+)", e["Detail"]):
                    returned[int(m.group(1))] = now
            if len(returned) >= args.faults:
                done.set()

        agent.publisher.on_sent = on_sent
        agent.start()
        time.sleep(0.5)
        for i in range(args.faults):
            written[i] = time.perf_counter()
            sim.kmsg(f"NVRM: Xid (PCI:0000:{0x10 + i % 8:02x}:00): 79, pid={i}, name=python3, Ch 00000008")
            time.sleep(args.gap)
        done.wait(30)
        agent.stop(graceful=False)
    latencies = [(returned[i] - written[i]) * 1000 for i in written if i in returned]
    lost = args.faults - len(latencies)
    record([summarize("agent: kernel-log XID line -> PutEvents returned", "ms", latencies, COMMAND,
                      target="p90 <= 1000 ms", lost=lost, notes=__doc__.split("\n\n", 1)[1].strip())])
    if lost:
        raise SystemExit(f"{lost} injected faults were never published")


if __name__ == "__main__":
    main()
