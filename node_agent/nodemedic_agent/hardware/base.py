"""The one interface every hardware backend implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from nodemedic_agent.hardware.dcgm import DcgmHealth

DCGMI_TIMEOUT_S = 30  # the longest one dcgmi call may run; the DCGM check makes up to three

class HardwareError(Exception):
    """A counter or device could not be read (NVML error, unreadable sysfs file)."""


class SourceUnavailableError(HardwareError):
    """A monitoring daemon the check reads through is not running (DCGM's host engine): the check
    cannot run, which says nothing about the hardware."""


@dataclass(frozen=True)
class GpuState:
    index: int
    uuid: str = ""
    pci_bus_id: str = ""
    lost: bool = False
    reset_required: bool = False  # NVML answers NVML_ERROR_RESET_REQUIRED: the GPU needs a reset to be used again
    unreadable: str = ""  # the error NVML answered for this GPU alone (the other GPUs are read)
    ecc_dbe_volatile: int = 0
    retired_pages_pending: bool = False
    remap_pending: bool = False
    remap_failure: bool = False
    thermal_violation: bool = False
    power_violation: bool = False
    nvlink_errors: int = 0  # cumulative replay + recovery + CRC counters over active links
    nvlink_links_down: int = 0  # links that exist on this GPU but are not active (they train after boot)
    # speed (fail-slow): 0 = not known
    sm_clock_mhz: int = 0
    max_sm_clock_mhz: int = 0
    utilization_pct: float = 0.0
    pcie_width: int = 0  # lanes the link trained at
    pcie_max_width: int = 0
    # an NVSwitch system (HGX H100/H200/B200): the GPU's registration with the NVLink fabric, which
    # Fabric Manager makes after each boot (nvmlDeviceGetGpuFabricInfo). "" where NVML does not
    # report it (no NVSwitch, an A100, a driver before 525); else not_started, in_progress, completed
    fabric_state: str = ""
    fabric_error: str = ""  # completed: NVML's error status of the registration ("" is NVML_SUCCESS)
    # completed: what the fabric's health mask and summary report of this GPU (nvmlGpuFabricInfo_v3_t,
    # driver R550 and later; GB200), e.g. "bandwidth degraded", "route unhealthy"; () where healthy
    # or not reported
    fabric_health: tuple[str, ...] = ()
    # the action the driver says the GPU needs (NVML's nvmlDeviceGpuRecoveryAction_t, driver R550+:
    # 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset), which Xid 154 announces once;
    # 0: none, or not reported
    recovery_action: int = 0

    @property
    def sm_clock_ratio(self) -> float | None:
        return self.sm_clock_mhz / self.max_sm_clock_mhz if self.sm_clock_mhz and self.max_sm_clock_mhz else None


@dataclass(frozen=True)
class XidEvent:
    xid: int
    gpu_index: int | None
    pci_bus_id: str
    observed_at: datetime


@dataclass(frozen=True)
class EfaDevice:
    """An EFA device. The efa driver reports its port ACTIVE whatever the link does, so the link's
    health is its network interface's ``operstate``/``carrier`` (None: no interface found)."""

    name: str
    port_state: str
    counters: dict[str, int] = field(default_factory=dict)
    netdev: str | None = None
    operstate: str | None = None
    carrier: bool | None = None


class Hardware(Protocol):
    def gpus(self) -> list[GpuState]:
        """Every GPU the driver sees (fewer than expected means some are lost)."""

    def wait_xid(self, timeout_s: float) -> list[XidEvent]:
        """Block until XID events arrive or ``timeout_s`` passes (event-driven where supported)."""

    def dcgm_health(self) -> DcgmHealth | None:
        """DCGM health watches' failures and warnings; ``None`` when DCGM is not installed."""

    def efa_devices(self) -> list[EfaDevice]: ...

    def disk_usage(self, path: str) -> tuple[int, int]:
        """(total, free) bytes of the file system holding ``path``."""

    def mount_responsive(self, path: str, timeout_s: float) -> bool: ...

    def mount_read_only(self, path: str) -> bool: ...

    def uptime(self) -> float:
        """Seconds since the node booted."""

    def software(self) -> dict[str, str]:
        """What the node runs that a rollout changes on many nodes at once: ``gpu_driver`` (the
        loaded NVIDIA kernel module's version) and ``kernel`` (the running kernel's release); a
        version that cannot be read is left out. Never blocks on the GPUs."""

    def close(self) -> None: ...
