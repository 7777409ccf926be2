"""A reading that never returns (NVML on a wedged driver, a stat of a hung file system) stops the
loop that made it; the heartbeat's own thread keeps telling the cloud the node is fine. The agent
must report the stall itself: CHECK_STALLED, which the pipeline answers with a reboot."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from nodemedic.contracts.events import NodeHealthEvent
from nodemedic.domain.classification import classify
from nodemedic_agent.checks.polled import PolledChecks
from nodemedic_agent.config import ConfigError
from nodemedic_agent.hardware.simulated import SimulatedHardware, SimulatedNode
from nodemedic_agent.watchdog import Watchdog

from tests.agent.conftest import agent_config
from tests.agent.test_bad_input import run_agent

QUICK = {"hardware": {"dcgm": False}, "thresholds": {"check_stall_seconds": 1.5}}  # no dcgmi: a healthy check is quick


def test_a_gpu_reading_that_never_returns_is_reported_while_the_heartbeat_goes_on(bus, sim, make_agent):
    agent = make_agent(intervals={"heartbeat_seconds": 0.2}, **QUICK)
    sim.inject("nvml-hang")
    [event] = bus.wait_health(1, timeout=15)
    assert (event["fault_code"], event["check"], event["evidence"]["check"]) == ("CHECK_STALLED", "nvml", "the gpu check")
    assert event["evidence"]["stalled_seconds"] >= 1 and event["evidence"]["limit_seconds"] == 1.5
    NodeHealthEvent.model_validate(event)
    assert event["severity"] == "critical" and classify("CHECK_STALLED").action == "reboot"
    assert any(b["status"] == "running" for b in bus.heartbeats())  # what alone said all was well
    assert agent.report_stalls() == 1  # still stalled; the dedupe window folds the repeat
    assert len(bus.health_events()) == 1
    assert agent.perf() is None  # the last GPU reading is stale: no speed sample for the peer comparison

    sim.inject("clear")  # the call returns: the checks read again
    sim.inject("ecc-dbe", gpu=1)
    assert [e["fault_code"] for e in bus.wait_health(2)] == ["CHECK_STALLED", "ECC_DBE"]
    assert agent.report_stalls() == 0 and agent.perf() is not None


@pytest.mark.parametrize("hangs", ["at start", "while watching"])
def test_stopping_leaves_a_hung_reading_behind_and_the_driver_open(bus, sim, make_agent, monkeypatch, hangs: str):
    """Stopping waits for the loops once, not once per loop; a reading still inside a driver call
    after that (a loop's, or the first GPU reading of an agent still starting) keeps the hardware
    open: closing NVML under a call that never returned could block the stop as well, and the
    process's exit frees it."""
    if hangs == "at start":
        sim.inject("nvml-hang")
    agent = make_agent(start=False, intervals={"heartbeat_seconds": 0.2}, **QUICK)
    closed: list[bool] = []
    monkeypatch.setattr(agent.hw, "close", lambda: closed.append(True))
    starting = threading.Thread(target=agent.start, daemon=True)
    starting.start()
    if hangs == "while watching":
        starting.join(5)
        sim.inject("nvml-hang")
    bus.wait_health(1, timeout=15)
    started = time.monotonic()
    agent.stop(graceful=False)
    # the stop's one 5 s wait for its loops, and room for a loaded machine: not the hung call's end
    assert time.monotonic() - started < 8.5 and closed == []
    sim.inject("clear")  # the call returns: a second stop closes the hardware
    starting.join(5)
    time.sleep(0.5)
    agent.stop(graceful=False)
    assert closed == [True]


def test_a_driver_that_hangs_at_the_agents_start_is_reported_not_silence(bus, sim, make_agent):
    """The agent reads the GPUs once before its watchers start (NVML's initialisation included).
    That reading blocked before any thread ran: no heartbeat, no event, a node that said nothing."""
    sim.inject("nvml-hang")
    agent = make_agent(start=False, intervals={"heartbeat_seconds": 0.2}, **QUICK)
    starting = threading.Thread(target=agent.start, daemon=True)
    starting.start()
    [event] = bus.wait_health(1, timeout=15)
    assert (event["fault_code"], event["evidence"]["check"]) == ("CHECK_STALLED", "the first GPU reading")
    assert bus.heartbeats()
    sim.inject("clear")  # the driver answers: the agent finishes starting and watches
    starting.join(5)
    sim.inject("ecc-dbe", gpu=2)
    assert [e["fault_code"] for e in bus.wait_health(2)] == ["CHECK_STALLED", "ECC_DBE"]


def test_a_slow_check_under_the_limit_is_no_stall(bus, sim, make_agent):
    agent = make_agent(**{**QUICK, "thresholds": {"check_stall_seconds": 5}})
    sim.inject("nvml-hang")
    time.sleep(1.0)
    assert agent.report_stalls() == 0
    sim.inject("clear")
    assert bus.wait_health(0, settle=0.3) == []


def test_off_reports_nothing(bus, sim, make_agent):
    agent = make_agent(hardware={"dcgm": False}, thresholds={"check_stall_seconds": 0})
    sim.inject("nvml-hang")
    time.sleep(0.5)
    assert agent.report_stalls() == 0
    sim.inject("clear")


class _HungDisk(SimulatedHardware):
    """A stat of a file system that hangs: ``disk_usage`` blocks until released."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.release = threading.Event()

    def disk_usage(self, path: str) -> tuple[int, int]:
        self.release.wait()
        return super().disk_usage(path)


def test_a_stat_that_hangs_names_the_storage_check(sim: SimulatedNode, tmp_path: Path):
    """Only the shared mounts are probed with a timeout; a path in ``storage.paths`` (a local disk
    by design) that hangs blocks the storage check, and every check after it in the loop."""
    hw = _HungDisk(sim.dir)
    checks = PolledChecks(hw, agent_config(sim, tmp_path / "spool", **QUICK))
    poll = threading.Thread(target=checks.run_all, daemon=True)
    poll.start()
    try:
        deadline = time.monotonic() + 5
        while not (stalls := checks.watchdog.stalls(0.2)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(s.what, s.check) for s in stalls] == [("the storage check", "storage")]
        finding = checks.stalled(stalls[0])
        assert finding.fault_code == "CHECK_STALLED" and finding.check == "storage" and finding.status == "failed"
        assert "the storage check has not returned" in finding.summary
    finally:
        hw.release.set()
        poll.join(5)
    assert checks.watchdog.stalls(0) == []  # returned: no longer running


def test_the_watchdog_forgets_a_reading_that_raised():
    now = [100.0]
    watchdog = Watchdog(clock=lambda: now[0])
    with pytest.raises(RuntimeError), watchdog.watching("the gpu check", "nvml"):
        raise RuntimeError("NVML error")
    with watchdog.watching("the efa check", "efa"):
        now[0] += 10
        assert [(s.what, s.seconds) for s in watchdog.stalls(9.9)] == [("the efa check", 10.0)]
        assert watchdog.stalls(10) == []
    assert watchdog.stalls(0) == []


@pytest.mark.parametrize(("sections", "refused"), [
    ({"thresholds": {"check_stall_seconds": 60}}, True),  # dcgmi may run 3 x 30 s on a healthy node
    ({"thresholds": {"check_stall_seconds": 91}}, False),
    ({"thresholds": {"check_stall_seconds": 0}}, False),  # off
    ({"thresholds": {"check_stall_seconds": 60}, "hardware": {"dcgm": False}}, False),
    ({"thresholds": {"check_stall_seconds": 120},
      "storage": {"shared_mounts": ["/fsx", "/home"], "probe_timeout_seconds": 60}}, True),  # probes take 120 s
])
def test_a_stall_limit_a_healthy_check_can_reach_is_refused(sim, tmp_path, sections: dict[str, Any], refused: bool):
    if refused:
        with pytest.raises(ConfigError, match="check_stall_seconds .* must be longer than a healthy check may take"):
            agent_config(sim, tmp_path, **sections)
    else:
        agent_config(sim, tmp_path, **sections)


def _config(sim: SimulatedNode, tmp_path: Path, stall_s: float) -> Path:
    config = tmp_path / "agent.toml"
    config.write_text(f"""
cluster = "local"
event_bus = "nodemedic-local"
[node]
instance_id = "i-0123456789abcdef0"
[expected]
efa_devices = 2
[thresholds]
check_stall_seconds = {stall_s}
[kernel_log]
source = "off"
[hardware]
backend = "simulated"
simulated_dir = "{sim.dir}"
dcgm = false
[publish]
spool_dir = "{tmp_path / 'spool'}"
[intervals]
heartbeat_seconds = 0.2
""")
    return config


def _check_once(sim: SimulatedNode, tmp_path: Path, stall_s: float) -> subprocess.CompletedProcess[str]:
    return run_agent("-c", str(_config(sim, tmp_path, stall_s)), "check", "--once", "--dry-run")


def test_check_once_on_a_node_whose_gpus_do_not_answer_says_so_and_exits(sim, tmp_path):
    """An operator's first question on a sick node: ``check --once`` hung for good, silent, on
    exactly the node where NVML no longer answers. Now it says what it waits for, reports the stall
    and exits unhealthy."""
    assert _check_once(sim, tmp_path, 1.5).returncode == 0  # healthy: as before
    sim.inject("nvml-hang")
    proc = _check_once(sim, tmp_path, 1.5)
    assert proc.returncode == 1, proc.stderr
    assert "waiting for the gpu check" in proc.stderr
    assert '"fault_code": "CHECK_STALLED"' in proc.stdout and "the node cannot be checked" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_the_daemon_stops_when_told_while_its_first_gpu_reading_hangs(sim, tmp_path):
    """``systemctl stop`` (SIGTERM) on a node whose driver no longer answers: the agent ignored it
    while its first GPU reading hung (its main thread was inside that call), until systemd killed
    it. It reports the stall, then stops when told, leaving the hung call behind. (A hang while
    watching: test_stopping_leaves_a_hung_reading_behind_and_the_driver_open.)"""
    sim.inject("nvml-hang")
    daemon = subprocess.Popen([sys.executable, "-m", "nodemedic_agent.cli", "-c", str(_config(sim, tmp_path, 1.5)),
                               "run", "--dry-run"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert daemon.stdout is not None
        stalled = daemon.stdout.readline()  # dry run: each event is a line
        assert '"fault_code": "CHECK_STALLED"' in stalled, stalled
        daemon.send_signal(signal.SIGTERM)
        started = time.monotonic()
        daemon.wait(timeout=30)
        assert time.monotonic() - started < 15 and daemon.returncode == 0  # systemd's stop timeout is 90 s
    finally:
        daemon.kill()
        daemon.communicate()


@pytest.mark.parametrize("level", ["quick", "full"])
def test_the_deep_health_check_on_a_node_whose_gpus_do_not_answer_fails_naming_the_stall(sim, tmp_path, level: str):
    """The pipeline's deep check of a wedged node hung until its command timed out (20 min by
    default, HealthCheckTimeoutSeconds) and left only "no answer". It now answers once a check has
    run past the stall limit: unhealthy, CHECK_STALLED, and no GPU burn started on a driver that
    does not answer."""
    config = _config(sim, tmp_path, 1.5)
    sim.inject("nvml-hang")
    started = time.monotonic()
    proc = run_agent("-c", str(config), "health-check", "--level", level, "--instance-type", "p5.48xlarge")
    assert proc.returncode == 1 and time.monotonic() - started < 30, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["healthy"] is False and report["settle"] == {"stalled": True}
    [check] = report["checks"]
    assert check["findings"] == ["CHECK_STALLED"] and check["detail"].startswith("the gpu check has not returned")
    assert "waiting for the gpu check" in proc.stderr and "Traceback" not in proc.stderr
