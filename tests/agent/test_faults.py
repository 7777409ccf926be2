"""Each fault class, injected into a simulated node, reaches the bus as exactly one correctly
classified Node Health Event."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from nodemedic.contracts.events import NodeHealthEvent
from nodemedic.domain.classification import classify
from nodemedic_agent.checks.polled import PolledChecks
from nodemedic_agent.hardware.host import host_software

from tests.agent.conftest import agent_config

FAULTS = [
    # injected fault, kwargs, expected fault code, expected check, action the pipeline takes
    ("xid", {"xid": 79, "gpu": 3}, "XID 79", {"kernel_log", "nvml"}, "replace"),
    ("xid", {"xid": 13, "gpu": 1}, "XID 13", {"kernel_log", "nvml"}, "monitor"),
    ("ecc-dbe", {"gpu": 2}, "ECC_DBE", {"nvml"}, "reboot"),
    ("remap-failure", {"gpu": 2}, "ROW_REMAP_FAILURE", {"nvml"}, "reboot"),
    ("gpu-lost", {"gpu": 5}, "GPU_LOST", {"kernel_log", "nvml"}, "replace"),
    ("reset-required", {"gpu": 6}, "GPU_RESET_REQUIRED", {"nvml"}, "reboot"),
    ("nvlink", {"gpu": 0}, "NVLINK_ERRORS", {"nvml"}, "reboot"),
    ("nvlink-down", {"gpu": 5}, "NVLINK_DOWN", {"nvml"}, "reboot"),
    ("fabric-manager-down", {}, "GPU_FABRIC_NOT_READY", {"nvml"}, "reboot"),
    ("fabric-error", {"gpu": 2}, "GPU_FABRIC_ERROR", {"nvml"}, "reboot"),
    ("fabric-unhealthy", {"gpu": 4}, "GPU_FABRIC_UNHEALTHY", {"nvml"}, "reboot"),
    ("fabric-degraded", {"gpu": 1}, "GPU_FABRIC_DEGRADED", {"nvml"}, "degrade"),
    ("recovery-action", {"gpu": 3}, "XID154_NODE_REBOOT", {"kernel_log", "nvml"}, "reboot"),
    ("thermal", {"gpu": 6}, "THERMAL_VIOLATION", {"nvml"}, "monitor"),
    ("dcgm", {}, "DCGM_HEALTH", {"dcgm"}, "reboot"),
    ("dcgm-warning", {"gpu": 4}, "DCGM_HEALTH_WARNING", {"dcgm"}, "monitor"),
    ("efa-down", {"efa": 1}, "EFA_DOWN", {"efa"}, "reboot"),
    ("efa-errors", {"efa": 0}, "EFA_HW_ERRORS", {"efa"}, "monitor"),  # one jump: recorded, not a storm
    ("efa-storm", {"efa": 1}, "EFA_ERROR_RATE", {"efa"}, "reboot"),
    ("efa-driver", {}, "EFA_DRIVER_ERROR", {"kernel_log"}, "monitor"),
    ("disk-full", {}, "DISK_FULL", {"storage"}, "monitor"),
    ("fs-readonly", {}, "FS_READONLY", {"storage", "kernel_log"}, "reboot"),
    ("fs-hang", {}, "FS_UNRESPONSIVE", {"storage"}, "reboot"),
    ("hang", {}, "HUNG_TASK", {"kernel_log"}, "reboot"),
    ("memory-ue", {}, "HOST_MEMORY_UE", {"kernel_log"}, "replace"),
    ("pcie-fatal", {"gpu": 5}, "PCIE_AER_FATAL", {"kernel_log"}, "reboot"),
    ("soft-lockup", {}, "SOFT_LOCKUP", {"kernel_log"}, "reboot"),
    ("oom", {}, "OOM_KILL", {"kernel_log"}, "monitor"),
    ("sxid", {}, "SXID 12028", {"kernel_log"}, "monitor"),
    ("sxid-fatal", {}, "NVSWITCH_FATAL", {"kernel_log"}, "reboot"),
]


@pytest.mark.parametrize(("fault", "kwargs", "code", "checks", "action"), FAULTS,
                         ids=[f"{f[0]}-{f[2]}" for f in FAULTS])
def test_each_fault_class_gives_exactly_one_classified_event(bus, sim, make_agent, fault, kwargs, code, checks, action):
    sim.boot(time.time() - 3600)  # up an hour: what a boot makes before its links train is long settled
    make_agent()
    sim.inject(fault, **kwargs)
    events = bus.wait_health(1)
    assert [e["fault_code"] for e in events] == [code]
    event = NodeHealthEvent.model_validate(events[0])  # the contract the pipeline parses
    assert event.check in checks
    assert event.node.instance_id == "i-0123456789abcdef0" and event.cluster == "local"
    assert classify(event.fault_code).action == action
    assert event.severity == ("warning" if action == "monitor" else "critical")
    if "gpu" in kwargs:
        assert event.component is not None and event.component.index == kwargs["gpu"]


def test_what_a_boot_makes_before_the_fabric_is_up_is_sent_only_once_the_node_has_settled(bus, sim, make_agent):
    """Right after a boot NVLinks train and Fabric Manager registers the GPUs: a check that reads
    them then sees a healthy node as broken (NVSentinel #1701). Read until the node has been up
    boot_settle_seconds, then sent if still so; a GPU failure is sent at once all the same."""
    agent = make_agent(thresholds={"boot_settle_seconds": 300}, intervals={"poll_seconds": 0.1})
    sim.inject("nvlink-down", gpu=3)
    sim.inject("fabric-manager-down")
    sim.inject("fabric-degraded", gpu=2)  # registered, its bandwidth not yet full
    sim.inject("ecc-dbe", gpu=1)
    assert [e["fault_code"] for e in bus.wait_health(1, settle=1.0)] == ["ECC_DBE"]
    sim.boot(time.time() - 301)  # the same node, five minutes on: still down
    codes = sorted(e["fault_code"] for e in bus.wait_health(4, settle=0.5))
    assert codes == ["ECC_DBE", "GPU_FABRIC_DEGRADED", "GPU_FABRIC_NOT_READY", "NVLINK_DOWN"]
    [fabric] = [e for e in bus.health_events() if e["fault_code"] == "GPU_FABRIC_NOT_READY"]
    assert fabric["component"] == {"kind": "node"} and fabric["evidence"]["gpus"] == "0,1,3,4,5,6,7"
    assert "nvidia-fabricmanager" in fabric["evidence"]["summary"] and agent.published == 4


def test_a_recovery_action_the_driver_asked_for_before_the_agent_started_is_still_sent(bus, sim, make_agent):
    """Xid 154 says once, in the kernel log, what a GPU needs; the ring may have overwritten it, or
    the log not be read (here: off), by the time an agent (re)starts. It reads NVML's recovery
    action at its first poll. (With the log on, the replayed line and the poll race to report it
    first: one event either way, the dedupe folds the other.)"""
    sim.boot(time.time() - 3600)
    sim.inject("recovery-action", gpu=2)
    make_agent(kernel_log={"source": "off"})
    [event] = bus.wait_health(1)
    assert (event["fault_code"], event["check"], event["component"]["index"]) == ("XID154_NODE_REBOOT", "nvml", 2)
    assert event["evidence"]["recovery_action"] == 2 and "node reboot required" in event["evidence"]["summary"]


def test_gpu_count_lower_than_expected(bus, make_agent):
    make_agent(expected={"gpus": 16})
    events = bus.wait_health(1)
    assert [e["fault_code"] for e in events] == ["GPU_COUNT_LOW"]
    assert events[0]["evidence"]["visible"] == 8 and events[0]["evidence"]["expected"] == 16


def test_healthy_node_sends_heartbeats_and_no_health_events(bus, make_agent):
    agent = make_agent(intervals={"heartbeat_seconds": 0.2})
    bus.wait_health(0, settle=1.0)
    agent.stop(graceful=True)
    beats = bus.heartbeats()
    assert bus.health_events() == []
    assert len(beats) >= 3
    assert beats[-1]["status"] == "stopping" and all(b["status"] == "running" for b in beats[:-1])
    assert beats[0]["interval_seconds"] == 0.2 and beats[0]["node"]["slurm_node"] == "gpu-1"


class SizelessDisk:
    """A file system that states no size (statvfs gives 0 blocks, as pseudo and some FUSE file
    systems do), writable and mounted."""

    @staticmethod
    def disk_usage(path: str) -> tuple[int, int]:
        return 0, 0

    @staticmethod
    def mount_read_only(path: str) -> bool:
        return False


def test_a_file_system_that_states_no_size_is_not_full(sim, tmp_path):
    cfg = agent_config(sim, tmp_path / "spool", storage={"shared_mounts": []})
    result = PolledChecks(SizelessDisk(), cfg).storage()  # type: ignore[arg-type]
    assert result.findings == []
    assert "states no size" in result.detail


def test_a_kernel_message_whose_handling_fails_is_skipped_and_the_log_goes_on(bus, sim, make_agent, monkeypatch):
    """An exception while handling one message stopped the kernel log watcher: it was reported as
    the check's error, and after a pause the watcher read again from its cursor, so a /dev/kmsg
    record that fails failed again at every restart and held back every message after it."""
    from nodemedic_agent import agent as agent_module

    real = agent_module.message_finding

    def finding(message, *args):
        if "poison" in message:
            raise ValueError("a parser bug")
        return real(message, *args)

    monkeypatch.setattr(agent_module, "message_finding", finding)
    agent = make_agent(intervals={"poll_seconds": 5})
    sim.kmsg("poison: a message this parser cannot handle")
    sim.kmsg("NVRM: Xid (PCI:0000:3b:00): 48, pid=4242, name=python3, An uncorrectable double bit error")
    events = bus.wait_health(1, timeout=3)
    assert [e["fault_code"] for e in events] == ["XID 48"]  # at once, and no check error
    assert agent.kernel_log.stats.failed == 1


def test_every_event_says_which_gpu_driver_and_kernel_the_node_runs(bus, sim, make_agent):
    """What the safety gate names when many nodes fail at once after a rollout: each event carries
    the node's driver and kernel versions, whatever its fault says besides."""
    sim.boot(time.time() - 3600)
    sim.install(gpu_driver="575.51.03")
    make_agent()
    sim.inject("xid", xid=79, gpu=2)
    sim.inject("disk-full")
    events = [NodeHealthEvent.model_validate(e) for e in bus.wait_health(2)]
    assert {e.fault_code for e in events} == {"XID 79", "DISK_FULL"}
    for event in events:
        assert event.evidence["gpu_driver"] == "575.51.03" and event.evidence["kernel"] == os.uname().release
    sim.inject("clear")
    assert sim.state()["software"] == {"gpu_driver": "575.51.03"}  # a rollout is no fault to clear


@pytest.mark.parametrize(("written", "read"), [
    ("570.172.08\n", "570.172.08"),
    ("", None),  # the module has no version
    ("5" * 65, None),  # no version is that long
    ("570\x00\x01", None),  # not text
    (None, None),  # no nvidia module loaded
])
def test_the_driver_version_is_the_loaded_modules_own(tmp_path: Path, written: str | None, read: str | None) -> None:
    if written is not None:
        (tmp_path / "module" / "nvidia").mkdir(parents=True)
        (tmp_path / "module" / "nvidia" / "version").write_text(written)
    found = host_software(str(tmp_path))
    assert found.get("gpu_driver") == read and found["kernel"] == os.uname().release
