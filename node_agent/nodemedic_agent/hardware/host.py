"""Real host facts without a GPU library: EFA devices from sysfs, file systems from the OS."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from nodemedic.contracts.events import SOFTWARE_VERSION_MAX

from nodemedic_agent.hardware.base import EfaDevice, HardwareError

# the EFA hardware counters (ports/1/hw_counters) that only rise when something goes wrong
EFA_COUNTERS = ("rdma_read_wr_err", "rdma_write_wr_err", "rx_drops", "retrans_timeout_events",
                "impaired_remote_conn_events", "unresponsive_remote_events")


def _version(text: str) -> str:
    text = text.strip()
    return text if 0 < len(text) <= SOFTWARE_VERSION_MAX and text.isprintable() else ""


def host_software(sysfs_root: str) -> dict[str, str]:
    """The node's GPU driver and kernel versions (:meth:`Hardware.software`). The driver's is the
    loaded module's own (``<sysfs>/module/nvidia/version``, as ``modinfo`` and nvidia-smi report
    it): a file read, so a wedged driver cannot hang it, and it is there while NVML fails."""
    try:
        driver = _version((Path(sysfs_root) / "module" / "nvidia" / "version").read_text(errors="replace"))
    except OSError:
        driver = ""
    found = {"gpu_driver": driver, "kernel": kernel_release()}
    return {k: v for k, v in found.items() if v}


def kernel_release() -> str:
    """The running kernel's release (``uname -r``), "" when it is no version."""
    return _version(os.uname().release)


def _link(dev: Path) -> tuple[str | None, str | None, bool | None]:
    """(netdev, operstate, carrier) of the network interface of an EFA device's PCI function.
    Reading ``carrier`` of an interface that is down fails with EINVAL: no carrier."""
    nets = sorted((dev / "device" / "net").glob("*")) if (dev / "device" / "net").is_dir() else []
    if not nets:
        return None, None, None
    net = nets[0]
    operstate = (net / "operstate").read_text().strip()
    try:
        carrier: bool | None = (net / "carrier").read_text().strip() == "1"
    except OSError:
        carrier = False
    return net.name, operstate, carrier


class SysfsEfa:
    """EFA devices under ``<sysfs>/class/infiniband`` (driver ``efa``), port 1 state and counters."""

    def __init__(self, sysfs_root: str) -> None:
        self._root = Path(sysfs_root) / "class" / "infiniband"

    def devices(self) -> list[EfaDevice]:
        if not self._root.is_dir():
            return []
        found = []
        for dev in sorted(self._root.iterdir()):
            driver = dev / "device" / "driver"
            if driver.exists() and Path(os.path.realpath(driver)).name != "efa":
                continue
            port = dev / "ports" / "1"
            try:
                state = (port / "state").read_text().strip()  # e.g. "4: ACTIVE"
                counters = {
                    name: int((port / "hw_counters" / name).read_text().strip())
                    for name in EFA_COUNTERS if (port / "hw_counters" / name).exists()
                }
                netdev, operstate, carrier = _link(dev)
            except (OSError, ValueError) as exc:
                raise HardwareError(f"cannot read EFA device {dev.name}: {exc}") from exc
            found.append(EfaDevice(dev.name, state.split(":")[-1].strip(), counters, netdev, operstate, carrier))
        return found


class OsStorage:
    """Disk usage and mount probes. A hung mount's probe thread stays blocked; no second probe of
    that mount starts until it returns, so a hang never piles up threads."""

    def __init__(self) -> None:
        self._probes: dict[str, threading.Thread] = {}
        self._errors: dict[str, OSError] = {}

    def _probe(self, path: str) -> None:
        try:
            os.statvfs(path)
            os.listdir(path)
        except OSError as exc:
            self._errors[path] = exc

    @staticmethod
    def disk_usage(path: str) -> tuple[int, int]:
        try:
            usage = shutil.disk_usage(path)
        except OSError as exc:
            raise HardwareError(f"cannot stat {path}: {exc.strerror}") from exc
        return usage.total, usage.free

    def mount_responsive(self, path: str, timeout_s: float) -> bool:
        probe = self._probes.get(path)
        if probe is None or not probe.is_alive():
            self._errors.pop(path, None)
            probe = threading.Thread(target=self._probe, args=(path,), name=f"probe {path}", daemon=True)
            self._probes[path] = probe
            probe.start()
        probe.join(timeout_s)
        if probe.is_alive():
            return False
        if path in self._errors:
            raise HardwareError(f"cannot read {path}: {self._errors[path].strerror}")
        return True

    @staticmethod
    def mount_read_only(path: str) -> bool:
        try:
            return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
        except OSError as exc:
            raise HardwareError(f"cannot stat {path}: {exc.strerror}") from exc
