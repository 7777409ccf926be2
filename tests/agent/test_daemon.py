"""``nodemedic-agent run`` as systemd runs it: a separate process that publishes a fault, and on
SIGTERM sends its goodbye heartbeat and exits 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from .conftest import Bus


def test_the_daemon_publishes_a_fault_and_says_goodbye_on_sigterm(server, sim, tmp_path: Path):
    bus = Bus(endpoint_url=server.url)
    config = tmp_path / "agent.toml"
    config.write_text(f"""
cluster = "local"
event_bus = "nodemedic-local"
region = "us-east-1"
[node]
instance_id = "i-0123456789abcdef0"
slurm_node = "gpu-1"
[intervals]
heartbeat_seconds = 0.5
poll_seconds = 0.2
[expected]
efa_devices = 2
[storage]
shared_mounts = ["/fsx"]
[kernel_log]
source = "file"
path = "{sim.kmsg_path}"
[hardware]
backend = "simulated"
simulated_dir = "{sim.dir}"
[publish]
spool_dir = "{tmp_path / 'spool'}"
endpoint_url = "{server.url}"
""")
    agent = subprocess.Popen([sys.executable, "-m", "nodemedic_agent.cli", "-c", str(config), "run"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)  # started, following the kernel log
        sim.inject("xid", xid=79, gpu=2)
        events = bus.wait_health(1, timeout=10)
        assert [e["fault_code"] for e in events] == ["XID 79"]
    finally:
        agent.send_signal(signal.SIGTERM)
        _, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 0, stderr
    assert "watching gpu-1 (i-0123456789abcdef0)" in stderr and "stopping" in stderr
    beats = bus.heartbeats()
    assert beats and beats[-1]["status"] == "stopping"
