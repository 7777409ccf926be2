"""A real GPU node: NVML (nvidia-ml-py) for GPUs and XID events, sysfs for EFA, the OS for disks.

XIDs come from NVML's event set (``nvmlEventSetWait``): the thread blocks in the driver until an
event arrives, nothing polls. A counter NVML does not support on this GPU reads as healthy; an
error for one GPU is that GPU's check error (the others are read); any other NVML error becomes
:class:`HardwareError`, which the agent reports as a check error.
"""

from __future__ import annotations

import ctypes
import logging
import shutil
import subprocess
import threading
import time
from datetime import UTC, datetime
from typing import Any

from nodemedic_agent.hardware.base import EfaDevice, GpuState, HardwareError, SourceUnavailableError, XidEvent
from nodemedic_agent.hardware.dcgm import HOST_ENGINE_DOWN, DcgmHealth, parse_health
from nodemedic_agent.hardware.host import OsStorage, SysfsEfa

log = logging.getLogger(__name__)

try:  # nvidia-ml-py; its absence is reported by the GPU checks, not at import
    import pynvml
except ImportError:  # pragma: no cover - the agent package depends on nvidia-ml-py
    pynvml = None


# NVML_GPU_FABRIC_STATE_*; NOT_SUPPORTED (0) is no fabric to register with
FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}


def _supported(call: Any, default: Any) -> Any:
    """``call()``, or ``default`` where this GPU does not support it or this driver's NVML does
    not have the function (nvidia-ml-py is newer than many drivers)."""
    try:
        return call()
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return default


def _newest(names: tuple[str, ...], *args: Any) -> Any:
    """The first of NVML's ``names`` for one call (newest first) that this driver has: NVML
    renamed some (ClocksThrottleReasons became ClocksEventReasons in driver 535)."""
    for name in names[:-1]:
        try:
            return getattr(pynvml, name)(*args)
        except pynvml.NVMLError_FunctionNotFound:
            continue
    return getattr(pynvml, names[-1])(*args)


class NvmlHardware:
    def __init__(self, sysfs_root: str = "/sys", dcgm: bool = True) -> None:
        self._efa = SysfsEfa(sysfs_root)
        self._storage = OsStorage()
        self._dcgm = dcgm
        self._watches_set = False  # the agent set DCGM's health watches (once)
        self._lock = threading.Lock()
        self._ready = False
        self._events: Any = None

    # NVML starts lazily so that a missing driver is a check error, not an agent crash
    def _start(self) -> None:
        with self._lock:
            if self._ready:
                return
            if pynvml is None:
                raise HardwareError("nvidia-ml-py is not installed")
            try:
                pynvml.nvmlInit()
                self._events = pynvml.nvmlEventSetCreate()
                for i in range(pynvml.nvmlDeviceGetCount()):
                    self._watch_xids(i)
            except pynvml.NVMLError as exc:
                raise HardwareError(f"NVML: {exc}") from exc
            self._ready = True

    def _watch_xids(self, index: int) -> None:
        """Register GPU ``index`` for XID events. A GPU that fell off the bus before the agent
        started answers GPU_IS_LOST here (NVML API reference, nvmlDeviceRegisterEvents); it must
        not keep NVML from starting: the polled check reads it, and reports it lost."""
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            _supported(lambda: pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._events),
                       None)
        except pynvml.NVMLError as exc:
            log.warning("GPU %d: no XID events from NVML (%s); its polled reads go on", index, exc)

    def gpus(self) -> list[GpuState]:
        self._start()
        try:
            return [self._gpu(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            raise HardwareError(f"NVML: {exc}") from exc

    @staticmethod
    def _gpu(index: int) -> GpuState:
        """One GPU as NVML reads it. A GPU NVML says is lost, or needs a reset, at any of the reads
        is that (a finding), not an error of the check. Any other error is this GPU's alone
        (nvidia-smi's "Unable to determine the device handle for GPU ...: Unknown Error"): it must
        not keep the other GPUs from being read."""
        try:
            return NvmlHardware._read(index)
        except pynvml.NVMLError_GpuIsLost:
            return GpuState(index=index, lost=True)
        except pynvml.NVMLError_ResetRequired:
            return GpuState(index=index, reset_required=True)
        except pynvml.NVMLError as exc:
            return GpuState(index=index, unreadable=f"NVML: {exc}")

    @staticmethod
    def _links(h: Any) -> tuple[int, int]:
        """(error counters summed over the active links, links down). NVML answers only for the
        links a GPU has: a higher link index is NVML_ERROR_INVALID_ARGUMENT (an A100 has 12 links,
        an H100 18, and NVML_NVLINK_MAX_LINKS is 36 in nvidia-ml-py 13), a GPU without NVLink says
        NOT_SUPPORTED."""
        errors = down = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = pynvml.nvmlDeviceGetNvLinkState(h, link)
            except pynvml.NVMLError_InvalidArgument:
                break  # past the GPU's last link
            except pynvml.NVMLError_NotSupported:
                continue
            if not state:
                down += 1
                continue
            for counter in (pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
                            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA):
                errors += _supported(lambda lk=link, c=counter: pynvml.nvmlDeviceGetNvLinkErrorCounter(h, lk, c), 0)
        return errors, down

    @staticmethod
    def _fabric(h: Any) -> tuple[str, str]:
        """(state, error) of the GPU's registration with the NVLink fabric: ``nvmlGpuFabricInfo_t``,
        whose ``status`` counts only once ``state`` is completed (NVML API reference; the same
        test TensorRT-LLM makes before it uses the fabric). ("", "") where NVML does not report it."""
        struct = getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)
        if struct is None:  # an nvidia-ml-py older than the call
            return "", ""
        info = struct()
        if _supported(lambda: pynvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info)), None) is None:
            return "", ""
        state = FABRIC_STATES.get(int(info.state), "")
        error = ""
        if state == "completed" and int(info.status) != pynvml.NVML_SUCCESS:
            error = str(pynvml.NVMLError(int(info.status)))
        return state, error

    @staticmethod
    def _read(index: int) -> GpuState:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        pci = pynvml.nvmlDeviceGetPciInfo(h).busId
        pci = pci.decode() if isinstance(pci, bytes) else str(pci)
        dbe = _supported(lambda: pynvml.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC), 0)
        pending = _supported(lambda: pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h), 0)
        _, _, remap_pending, remap_failure = _supported(lambda: pynvml.nvmlDeviceGetRemappedRows(h), (0, 0, 0, 0))
        reasons = _supported(lambda: _newest(("nvmlDeviceGetCurrentClocksEventReasons",
                                               "nvmlDeviceGetCurrentClocksThrottleReasons"), h), 0)
        thermal = pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonSwThermalSlowdown
        nvlink, links_down = NvmlHardware._links(h)
        fabric_state, fabric_error = NvmlHardware._fabric(h)
        util = _supported(lambda: pynvml.nvmlDeviceGetUtilizationRates(h).gpu, 0)
        return GpuState(
            sm_clock_mhz=int(_supported(lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM), 0)),
            max_sm_clock_mhz=int(_supported(lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM), 0)),
            utilization_pct=float(util),
            # the width, not the generation: an idle GPU drops its link to a lower generation to save power
            pcie_width=int(_supported(lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h), 0)),
            pcie_max_width=int(_supported(lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(h), 0)),
            index=index, uuid=str(uuid), pci_bus_id=pci, ecc_dbe_volatile=int(dbe),
            retired_pages_pending=bool(pending), remap_pending=bool(remap_pending),
            remap_failure=bool(remap_failure), thermal_violation=bool(reasons & thermal),
            power_violation=bool(reasons & pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown),
            nvlink_errors=int(nvlink), nvlink_links_down=links_down,
            fabric_state=fabric_state, fabric_error=fabric_error,
        )

    def wait_xid(self, timeout_s: float) -> list[XidEvent]:
        try:
            self._start()
        except HardwareError:
            time.sleep(timeout_s)  # reported by the polled GPU check; do not spin
            return []
        try:
            data = _newest(("nvmlEventSetWait_v2", "nvmlEventSetWait"), self._events, int(timeout_s * 1000))
        except pynvml.NVMLError_Timeout:
            return []
        except pynvml.NVMLError as exc:
            raise HardwareError(f"NVML event wait: {exc}") from exc
        index: int | None = None
        pci = ""
        try:
            index = pynvml.nvmlDeviceGetIndex(data.device)
            pci = pynvml.nvmlDeviceGetPciInfo(data.device).busId
            pci = pci.decode() if isinstance(pci, bytes) else str(pci)
        except pynvml.NVMLError:
            pass
        return [XidEvent(int(data.eventData), index, pci, datetime.now(UTC))]

    @staticmethod
    def _dcgmi(*args: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(["dcgmi", *args], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HardwareError(f"dcgmi {args[0]}: {exc}") from exc

    def dcgm_health(self) -> DcgmHealth | None:
        """``dcgmi health -c -j``. DCGM watches nothing until told: where no watch is set
        ("Health watches not enabled"), the agent sets them all (``dcgmi health -s a``) once, as
        NVSentinel's monitor does, and reads again."""
        if not self._dcgm or shutil.which("dcgmi") is None:
            return None
        out = self._dcgmi("health", "-c", "-j")
        if out.returncode != 0 and "watches not enabled" in out.stdout.lower() and not self._watches_set:
            self._watches_set = True
            enabled = self._dcgmi("health", "-s", "a")
            if enabled.returncode != 0:
                raise HardwareError(f"DCGM has no health watch set and dcgmi health -s a exited "
                                    f"{enabled.returncode}: {(enabled.stderr or enabled.stdout).strip()[:200]}")
            out = self._dcgmi("health", "-c", "-j")
        if out.returncode != 0:
            said = " ".join((out.stderr.strip() or out.stdout.strip()).split())[:200]
            if HOST_ENGINE_DOWN.search(said):  # nv-hostengine (nvidia-dcgm.service) is not running
                raise SourceUnavailableError(f"DCGM's host engine is not reachable: {said}")
            raise HardwareError(f"dcgmi health exited {out.returncode}: {said}")
        try:
            return parse_health(out.stdout)
        except ValueError as exc:
            raise HardwareError(str(exc)[:300]) from exc

    def efa_devices(self) -> list[EfaDevice]:
        return self._efa.devices()

    def disk_usage(self, path: str) -> tuple[int, int]:
        return self._storage.disk_usage(path)

    def mount_responsive(self, path: str, timeout_s: float) -> bool:
        return self._storage.mount_responsive(path, timeout_s)

    def mount_read_only(self, path: str) -> bool:
        return self._storage.mount_read_only(path)

    @staticmethod
    def uptime() -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)  # suspended time included, as a boot's age

    def close(self) -> None:
        if self._ready:
            try:
                pynvml.nvmlEventSetFree(self._events)
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass
