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
from datetime import datetime, timezone
from typing import Any

from nodemedic_agent.hardware.base import DCGMI_TIMEOUT_S, EfaDevice, GpuState, HardwareError, SourceUnavailableError, XidEvent
from nodemedic_agent.hardware.dcgm import HOST_ENGINE_DOWN, DcgmHealth, parse_health
from nodemedic_agent.hardware.host import OsStorage, SysfsEfa, host_software

log = logging.getLogger(__name__)

try:  # nvidia-ml-py; its absence is reported by the GPU checks, not at import
    import pynvml
except ImportError:  # pragma: no cover - the agent package depends on nvidia-ml-py
    pynvml = None


# NVML_GPU_FABRIC_STATE_*; NOT_SUPPORTED (0) is no fabric to register with
FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}
VERSION_MISMATCH = 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH: a struct version this driver does not know

# The fabric's health of one GPU, nvmlGpuFabricInfo_v3_t (NVML API reference, "Fabric definitions").
# healthMask holds one field per condition, NVML_GPU_FABRIC_HEALTH_GET(mask, X) = (mask >> SHIFT_X) &
# WIDTH_X, each 0 where not supported. Written out here: nvidia-ml-py before 12.550 has none of them.
# Route recovery and access timeout recovery (shifts 2 and 6) are recoveries in progress, not faults.
_DEGRADED_BW = (0, 0x3, 1)  # shift, width, the value that is the condition (..._DEGRADED_BW_TRUE)
_ROUTE_UNHEALTHY = (4, 0x3, 1)
_INCORRECT_CONFIGURATION = (8, 0xF)  # 0 not supported, 1 none, else the reason below
INCORRECT_CONFIGURATION = {2: "incorrect SysGUID", 3: "incorrect chassis serial number", 4: "no partition",
                           5: "insufficient NVLinks", 6: "incompatible GPU firmware", 7: "invalid location",
                           8: "GPU state invalid"}
# healthSummary: NVML_GPU_FABRIC_HEALTH_SUMMARY_*; 0 not supported, 1 healthy
HEALTH_SUMMARY = {2: "unhealthy", 3: "limited capacity"}


# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (driver R550+; nvidia-ml-py before 12.550 does not name it)
RECOVERY_ACTION_FIELD = 230
# nvmlValueType_t -> the member of nvmlValue_t that holds the value
_FIELD_VALUE = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def fabric_health(mask: int, summary: int) -> tuple[str, ...]:
    """What a GPU's fabric health mask and summary report, in words; () for a healthy GPU or one
    whose driver reports neither."""
    found = []
    if (mask >> _DEGRADED_BW[0]) & _DEGRADED_BW[1] == _DEGRADED_BW[2]:
        found.append("bandwidth degraded")
    if (mask >> _ROUTE_UNHEALTHY[0]) & _ROUTE_UNHEALTHY[1] == _ROUTE_UNHEALTHY[2]:
        found.append("route unhealthy")
    config = (mask >> _INCORRECT_CONFIGURATION[0]) & _INCORRECT_CONFIGURATION[1]
    if config > 1:
        found.append(f"incorrect configuration: {INCORRECT_CONFIGURATION.get(config, f'reason {config}')}")
    if summary in HEALTH_SUMMARY:
        found.append(HEALTH_SUMMARY[summary])
    return tuple(found)


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
        self._sysfs_root = sysfs_root
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
    def _fabric_info(h: Any) -> Any:
        """NVML's ``nvmlGpuFabricInfo`` of the GPU, the newest this driver and nvidia-ml-py both
        have: v3 (health mask and summary), v2 (health mask; R550), else the first form (state and
        status only; R525). A driver older than the struct asked for answers
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH (NVML API reference, nvmlDeviceGetGpuFabricInfoV).
        None where NVML does not report the fabric."""
        if hasattr(pynvml, "nvmlDeviceGetGpuFabricInfoV"):
            for name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t"):
                struct = getattr(pynvml, name, None)
                if struct is None:
                    continue
                info = struct()  # nvidia-ml-py sets its version
                try:
                    if _supported(lambda i=info: pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(i)), None) is None:
                        break  # not this GPU's, or not this driver's: the first form may answer
                    return info
                except pynvml.NVMLError as exc:
                    if exc.value != VERSION_MISMATCH:
                        raise
        struct = getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)
        if struct is None:  # an nvidia-ml-py older than the call
            return None
        info = struct()
        if _supported(lambda: pynvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info)), None) is None:
            return None
        return info

    @staticmethod
    def _fabric(h: Any) -> tuple[str, str, tuple[str, ...]]:
        """(state, error, health) of the GPU's registration with the NVLink fabric. ``status`` and
        the health count only once ``state`` is completed (NVML API reference; the same test
        TensorRT-LLM makes before it uses the fabric). ("", "", ()) where NVML does not report it."""
        info = NvmlHardware._fabric_info(h)
        if info is None:
            return "", "", ()
        state = FABRIC_STATES.get(int(info.state), "")
        if state != "completed":
            return state, "", ()
        error = str(pynvml.NVMLError(int(info.status))) if int(info.status) != pynvml.NVML_SUCCESS else ""
        return state, error, fabric_health(int(getattr(info, "healthMask", 0)), int(getattr(info, "healthSummary", 0)))

    @staticmethod
    def _recovery_action(h: Any) -> int:
        """The action the driver says the GPU needs, read every poll (nvmlDeviceGetFieldValues,
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): Xid 154 announces it once, in a kernel log record the
        ring may overwrite (or a file the agent reads only from its start), so a GPU that
        came to need it while the agent was down is still seen. 0 where this driver or GPU does not
        report it (the field's own status says so)."""
        values = _supported(lambda: pynvml.nvmlDeviceGetFieldValues(h, [RECOVERY_ACTION_FIELD]), None)
        if not values or int(values[0].nvmlReturn) != pynvml.NVML_SUCCESS:
            return 0
        value = values[0]
        return int(getattr(value.value, _FIELD_VALUE.get(int(value.valueType), "uiVal")))

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
        fabric_state, fabric_error, fabric = NvmlHardware._fabric(h)
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
            fabric_state=fabric_state, fabric_error=fabric_error, fabric_health=fabric,
            recovery_action=NvmlHardware._recovery_action(h),
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
        return [XidEvent(int(data.eventData), index, pci, datetime.now(timezone.utc))]

    @staticmethod
    def _dcgmi(*args: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(["dcgmi", *args], capture_output=True, text=True, timeout=DCGMI_TIMEOUT_S, check=False)
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

    def software(self) -> dict[str, str]:
        return host_software(self._sysfs_root)

    def close(self) -> None:
        if self._ready:
            try:
                pynvml.nvmlEventSetFree(self._events)
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass
