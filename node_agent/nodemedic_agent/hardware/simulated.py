"""A simulated GPU node, kept in a directory so that another process can inject faults into it.

Layout of the directory:
- ``state.json``: GPUs (the fields of :class:`GpuState`), DCGM health, disks, mounts;
- ``kmsg``: the kernel log, one ``/dev/kmsg`` record per line (the agent follows it);
- ``xids.jsonl``: XID events as NVML would deliver them;
- ``sys/class/infiniband/...``: EFA devices laid out as in sysfs (read by the real sysfs reader).

The agent reads it through :class:`SimulatedHardware`; tests, the demo and
``nodemedic-agent simulate`` write to it through :class:`SimulatedNode`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nodemedic_agent.hardware.base import EfaDevice, GpuState, HardwareError, XidEvent
from nodemedic_agent.hardware.dcgm import DcgmHealth, parse_health
from nodemedic_agent.hardware.host import EFA_COUNTERS, SysfsEfa, kernel_release

FAULTS = {
    "xid": "XID N on GPU k (kernel log line and NVML event; --text sets the message after the code)",
    "ecc-dbe": "a double-bit ECC error on GPU k",
    "remap-failure": "a failed row remap on GPU k",
    "gpu-lost": "GPU k falls off the bus (no XID)",
    "reset-required": "NVML answers 'GPU requires reset' for GPU k",
    "nvlink": "NVLink error counters of GPU k jump",
    "nvlink-down": "2 NVLinks of GPU k are not active (as right after a boot, before they train)",
    "fabric-manager-down": "no GPU is registered with the NVLink fabric (nvidia-fabricmanager is not running)",
    "fabric-error": "GPU k's registration with the NVLink fabric failed",
    "fabric-unhealthy": "the NVLink fabric reports a route of GPU k unhealthy",
    "fabric-degraded": "the NVLink fabric reports GPU k's bandwidth degraded (a lost trunk link)",
    "recovery-action": "the driver says GPU k needs a node reboot (Xid 154 in the kernel log, and NVML's recovery action)",
    "thermal": "GPU k throttles for temperature",
    "busy": "every GPU at 95 % utilization (a training job runs)",
    "slow": "GPU k runs at 80 % of its maximum SM clock (a hardware slowdown: the node is slow, not dead)",
    "pcie-degraded": "GPU k's PCIe link trained at x8 instead of x16",
    "efa-down": "EFA device k's link drops (its interface loses carrier; the port still says ACTIVE, as on real EFA)",
    "efa-errors": "EFA device k's hardware error counters jump once",
    "efa-storm": "EFA device k's write-request errors and retransmit timeouts keep rising (an error storm)",
    "efa-driver": "an EFA driver error in the kernel log",
    "disk-full": "the root file system has 1 % free",
    "fs-readonly": "the root file system is remounted read-only",
    "fs-hang": "the shared file system stops answering",
    "hang": "a hung task in the kernel log",
    "memory-ue": "an uncorrectable host memory error in the kernel log (EDAC)",
    "pcie-fatal": "a fatal uncorrected PCIe error (AER) from GPU k in the kernel log",
    "soft-lockup": "a CPU soft lockup in the kernel log",
    "oom": "an OOM kill in the kernel log",
    "sxid": "a non-fatal NVSwitch SXID in the kernel log",
    "sxid-fatal": "a fatal NVSwitch SXID in the kernel log",
    "nvml-error": "NVML itself fails (the GPU checks cannot read counters)",
    "nvml-hang": "NVML stops answering: a GPU reading blocks until the fault is cleared (a wedged driver)",
    "dcgm": "DCGM health watches report a failure on GPU k (a volatile double-bit ECC error)",
    "dcgm-warning": "DCGM health watches warn of GPU k (PCIe replays): recorded, not acted on",
    "clear": "undo every injected fault",
}


SIMULATED_DRIVER = "570.133.20"  # a released R570 data-center driver
IDLE_GPU: dict[str, Any] = {"sm_clock_mhz": 1980, "max_sm_clock_mhz": 1980, "utilization_pct": 0.0, "pcie_width": 16,
            "pcie_max_width": 16}  # an H100 SXM's maximum SM clock and PCIe Gen5 x16


def _pci(index: int) -> str:
    return f"00000000:{0x10 + index:02X}:00.0"


def dcgm_health_report(gpu: int | None = None, value: str = "Healthy", system: str = "", message: str = "",
                       ) -> dict[str, Any]:
    """What ``dcgmi health -c -j`` prints (:mod:`nodemedic_agent.hardware.dcgm` has the shape):
    healthy, or ``value`` for one GPU's ``system``, its message cut in parts as dcgmi cuts it."""
    body: dict[str, Any] = {"Overall Health": {"value": value}}
    if gpu is not None:
        parts = textwrap.wrap(message, 54) or [value]
        body["GPU"] = {"children": {str(gpu): {"value": value, "children": {"Errors": {"children": {
            system: {"value": value, "overflow": parts}}}}}}}
    return {"header": ["Health Monitor Report"], "body": body}


class SimulatedNode:
    """Create a simulated node's directory and inject faults into it."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self._lock = threading.Lock()

    @property
    def kmsg_path(self) -> Path:
        return self.dir / "kmsg"

    def create(self, gpus: int = 8, efa: int = 0, shared_mounts: tuple[str, ...] = ()) -> SimulatedNode:
        self.dir.mkdir(parents=True, exist_ok=True)
        state = {
            "gpus": [dataclasses.asdict(GpuState(index=i, uuid=f"GPU-sim-{i}", pci_bus_id=_pci(i), **IDLE_GPU))
                     for i in range(gpus)],
            "dcgm": None, "nvml_error": None, "nvml_hang": False, "disks": {},
            "mounts": {m: {"hung": False, "read_only": False} for m in ("/", *shared_mounts)},
            "booted_at": time.time(),  # the node boots as it is created
        }
        self._write(state)
        for path in (self.kmsg_path, self.dir / "xids.jsonl"):
            path.touch()
        for i in range(efa):
            port = self.dir / "sys" / "class" / "infiniband" / f"rdmap{i}s0" / "ports" / "1"
            (port / "hw_counters").mkdir(parents=True, exist_ok=True)
            _replace(port / "state", "4: ACTIVE\n")
            for name in EFA_COUNTERS:
                _replace(port / "hw_counters" / name, "0\n")
            self._set_link(i, up=True)
        _replace(self.dir / "efa_rates.json", "{}")  # a "clear" runs under a reading agent: never an empty file
        return self

    def _set_link(self, index: int, up: bool) -> None:
        net = self.dir / "sys" / "class" / "infiniband" / f"rdmap{index}s0" / "device" / "net" / f"eth{index + 1}"
        net.mkdir(parents=True, exist_ok=True)
        _replace(net / "operstate", "up\n" if up else "down\n")
        _replace(net / "carrier", "1\n" if up else "0\n")

    def state(self) -> dict[str, Any]:
        return dict(json.loads((self.dir / "state.json").read_text()))

    def _write(self, state: dict[str, Any]) -> None:
        _replace(self.dir / "state.json", json.dumps(state))

    def _update_gpu(self, index: int, **changes: Any) -> None:
        state = self.state()
        gpu = state["gpus"][index]
        for key, value in changes.items():
            gpu[key] = gpu[key] + value if isinstance(value, int) and not isinstance(value, bool) else value
        self._write(state)

    def _update_every_gpu(self, **values: Any) -> None:
        state = self.state()
        for gpu in state["gpus"]:
            gpu.update(values)
        self._write(state)

    def kmsg(self, message: str, priority: int = 3) -> None:
        """Append one kernel log record (``/dev/kmsg`` format)."""
        with self._lock, self.kmsg_path.open("a") as f:
            f.write(f"{priority},{time.monotonic_ns() // 1000 % 10**9},{time.monotonic_ns() // 1000},-;{message}\n")
            f.flush()

    def _efa_port(self, index: int) -> Path:
        return self.dir / "sys" / "class" / "infiniband" / f"rdmap{index}s0" / "ports" / "1"

    def inject(self, fault: str, gpu: int = 0, xid: int = 79, efa: int = 0,  # noqa: C901 - a dispatch table
               text: str = "pid=4242, name=python3, Ch 00000008") -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of: {', '.join(FAULTS)}")
        if fault == "xid":
            self.kmsg(f"NVRM: Xid (PCI:{_pci(gpu)[4:]}): {xid}, {text}")
            with (self.dir / "xids.jsonl").open("a") as f:
                f.write(json.dumps({"xid": xid, "gpu": gpu, "at": datetime.now(timezone.utc).isoformat()}) + "\n")
        elif fault == "ecc-dbe":
            self._update_gpu(gpu, ecc_dbe_volatile=1)
        elif fault == "remap-failure":
            self._update_gpu(gpu, remap_failure=True)
        elif fault == "gpu-lost":
            self._update_gpu(gpu, lost=True)
            self.kmsg(f"NVRM: GPU {_pci(gpu)[4:]}: GPU has fallen off the bus.")
        elif fault == "reset-required":
            self._update_gpu(gpu, reset_required=True)
        elif fault == "nvlink":
            self._update_gpu(gpu, nvlink_errors=10_000)
        elif fault == "nvlink-down":
            self._update_gpu(gpu, nvlink_links_down=2)
        elif fault == "fabric-manager-down":
            self._update_every_gpu(fabric_state="not_started")
        elif fault == "fabric-error":
            self._update_gpu(gpu, fabric_state="completed", fabric_error="Unknown Error")
        elif fault == "fabric-unhealthy":
            self._update_gpu(gpu, fabric_state="completed", fabric_health=["route unhealthy", "unhealthy"])
        elif fault == "fabric-degraded":
            self._update_gpu(gpu, fabric_state="completed", fabric_health=["bandwidth degraded", "limited capacity"])
        elif fault == "recovery-action":
            self._update_gpu(gpu, recovery_action=2)
            self.kmsg(f"NVRM: Xid (PCI:{_pci(gpu)[4:]}): 154, GPU recovery action changed from 0x0 (None) to "
                      "0x2 (Node Reboot Required)")
        elif fault == "thermal":
            self._update_gpu(gpu, thermal_violation=True)
        elif fault == "busy":
            self._update_every_gpu(utilization_pct=95.0)
        elif fault == "slow":
            self._update_gpu(gpu, sm_clock_mhz=-round(0.2 * IDLE_GPU["sm_clock_mhz"]))
        elif fault == "pcie-degraded":
            self._update_gpu(gpu, pcie_width=-8)
        elif fault == "efa-down":
            self._set_link(efa, up=False)
        elif fault == "efa-storm":
            rates = json.loads((self.dir / "efa_rates.json").read_text())
            rates[f"rdmap{efa}s0"] = {"since": time.time(), "per_s": {"rdma_write_wr_err": 50, "retrans_timeout_events": 200}}
            _replace(self.dir / "efa_rates.json", json.dumps(rates))
        elif fault == "efa-errors":
            counter = self._efa_port(efa) / "hw_counters" / "retrans_timeout_events"
            _replace(counter, f"{int(counter.read_text()) + 10_000}\n")
        elif fault == "efa-driver":
            # as ibdev_err() writes it on kernels >= 5.2: the PCI device, then the RDMA device
            self.kmsg(f"efa 0000:{0x30 + efa:02x}:00.0 rdmap{efa}s0: Failed to process command CREATE_QP (opcode 1) "
                      "comp_status 0 err -62")
        elif fault == "disk-full":
            self._set("disks", "/", [100 * 2**30, 2**30])
        elif fault == "fs-readonly":
            self.kmsg("EXT4-fs (nvme0n1p1): Remounting filesystem read-only")
            self._set("mounts", "/", {"hung": False, "read_only": True})
        elif fault == "fs-hang":
            for mount in self.state()["mounts"]:
                if mount != "/":
                    self._set("mounts", mount, {"hung": True, "read_only": False})
        elif fault == "hang":
            self.kmsg("INFO: task python3:4242 blocked for more than 120 seconds.")
        elif fault == "memory-ue":
            self.kmsg("EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (channel:1 slot:0 "
                      "page:0x7e025e offset:0x400 grain:32)", priority=0)
        elif fault == "pcie-fatal":
            self.kmsg(f"pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: {_pci(gpu)}")
        elif fault == "soft-lockup":
            self.kmsg("watchdog: BUG: soft lockup - CPU#12 stuck for 23s! [python3:4242]")
        elif fault == "oom":
            self.kmsg("Out of memory: Killed process 4242 (python3) total-vm:123456kB, anon-rss:65432kB")
        elif fault == "sxid":
            self.kmsg("nvidia-nvswitch3: SXid (PCI:0000:c5:00.0): 12028, Non-fatal, Link 40 egress non-posted PRIV error")
        elif fault == "sxid-fatal":
            self.kmsg("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up")
        elif fault == "nvml-error":
            self._set_top("nvml_error", "NVML_ERROR_UNKNOWN: simulated driver failure")
        elif fault == "nvml-hang":
            self._set_top("nvml_hang", True)
        elif fault == "dcgm":
            self._set_top("dcgm", dcgm_health_report(gpu, "Failure", "Memory system",
                                                     f"A volatile double-bit ECC error has occurred on GPU {gpu}."))
        elif fault == "dcgm-warning":
            self._set_top("dcgm", dcgm_health_report(gpu, "Warning", "PCIe system",
                                                     f"Detected more than 8 PCIe replays per minute for GPU {gpu}: 12"))
        else:  # clear
            keep = self.state()
            self.create(gpus=len(keep["gpus"]), efa=0, shared_mounts=tuple(m for m in keep["mounts"] if m != "/"))
            self.boot(keep.get("booted_at", time.time()))  # cleared, not rebooted
            if "software" in keep:  # what the node runs is no fault
                self.install(**keep["software"])
            for port in (self.dir / "sys" / "class" / "infiniband").glob("rdmap*s0/ports/1"):
                _replace(port / "state", "4: ACTIVE\n")
                self._set_link(int(port.parent.parent.name[len("rdmap"):-len("s0")]), up=True)

    def install(self, **versions: str) -> None:
        """The node runs these versions from now on (``gpu_driver``, ``kernel``): a rollout."""
        self._set_top("software", {**self.state().get("software", {}), **versions})

    def boot(self, at: float | None = None) -> None:
        """The node booted at ``at`` (epoch seconds; now by default)."""
        self._set_top("booted_at", time.time() if at is None else at)

    def _set(self, section: str, key: str, value: Any) -> None:
        state = self.state()
        state[section][key] = value
        self._write(state)

    def _set_top(self, key: str, value: Any) -> None:
        state = self.state()
        state[key] = value
        self._write(state)


class SimulatedHardware:
    """The agent's view of a :class:`SimulatedNode` (same interface as the NVML backend)."""

    def __init__(self, directory: str | Path, poll_s: float = 0.1) -> None:
        self._node = SimulatedNode(directory)
        self._efa = SysfsEfa(str(self._node.dir / "sys"))
        self._xids = self._node.dir / "xids.jsonl"
        self._offset = self._xids.stat().st_size if self._xids.exists() else 0
        self._poll_s = poll_s

    def _state(self) -> dict[str, Any]:
        try:
            return self._node.state()
        except (OSError, ValueError) as exc:
            raise HardwareError(f"simulated node state unreadable: {exc}") from exc

    def gpus(self) -> list[GpuState]:
        state = self._state()
        while state.get("nvml_hang"):  # blocked in the driver: returns once the fault is cleared
            time.sleep(self._poll_s)
            state = self._state()
        if state.get("nvml_error"):
            raise HardwareError(str(state["nvml_error"]))
        return [GpuState(**{**g, "fabric_health": tuple(g.get("fabric_health", ()))}) for g in state["gpus"]]

    def wait_xid(self, timeout_s: float) -> list[XidEvent]:
        """Simulated NVML event wait: watches ``xids.jsonl`` (the real backend blocks in the driver)."""
        deadline = time.monotonic() + timeout_s
        while True:
            size = self._xids.stat().st_size if self._xids.exists() else 0
            if size > self._offset:
                with self._xids.open() as f:
                    f.seek(self._offset)
                    chunk = f.read()
                complete = chunk[: chunk.rfind("\n") + 1]
                self._offset += len(complete.encode())
                events = [json.loads(line) for line in complete.splitlines() if line.strip()]
                return [XidEvent(e["xid"], e["gpu"], _pci(e["gpu"]), datetime.fromisoformat(e["at"])) for e in events]
            if time.monotonic() >= deadline:
                return []
            time.sleep(self._poll_s)

    def dcgm_health(self) -> DcgmHealth | None:
        """What the node's dcgmi prints, read as the real one is read."""
        return parse_health(json.dumps(self._state().get("dcgm") or dcgm_health_report()))

    def efa_devices(self) -> list[EfaDevice]:
        """sysfs as written, plus the counters an injected storm has added since it started."""
        path = self._node.dir / "efa_rates.json"
        rates = json.loads(path.read_text()) if path.exists() else {}
        devices = []
        for dev in self._efa.devices():
            storm = rates.get(dev.name)
            if storm:
                elapsed = time.time() - storm["since"]
                counters = {k: v + int(storm["per_s"].get(k, 0) * elapsed) for k, v in dev.counters.items()}
                dev = dataclasses.replace(dev, counters=counters)
            devices.append(dev)
        return devices

    def disk_usage(self, path: str) -> tuple[int, int]:
        total, free = self._state()["disks"].get(path, [100 * 2**30, 60 * 2**30])
        return int(total), int(free)

    def mount_responsive(self, path: str, timeout_s: float) -> bool:
        mount = self._state()["mounts"].get(path)
        if mount is None:
            raise HardwareError(f"cannot read {path}: not mounted")
        return not mount["hung"]

    def mount_read_only(self, path: str) -> bool:
        mount = self._state()["mounts"].get(path)
        if mount is None:
            raise HardwareError(f"cannot read {path}: not mounted")
        return bool(mount["read_only"])

    def uptime(self) -> float:
        return time.time() - float(self._state().get("booted_at", 0.0))

    def software(self) -> dict[str, str]:
        """What :meth:`SimulatedNode.install` set, else a released R570 driver on this host's kernel."""
        versions = {"gpu_driver": SIMULATED_DRIVER, "kernel": kernel_release(), **self._state().get("software", {})}
        return {k: str(v) for k, v in versions.items() if v}

    def close(self) -> None:
        pass


def _replace(path: Path, text: str) -> None:
    """Write ``path`` whole at once, as the kernel serves a sysfs file: a check reading it while a
    fault is injected sees the old value or the new one, never an empty file (written in place,
    a counter read mid-write was a CHECK_ERROR)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
