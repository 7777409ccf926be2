"""The NVML backend against GPUs that answer as NVML documents, with no GPU here: nvidia-ml-py's
own error classes and constants, and NVML's functions played per GPU.

- NVML answers only for the NVLinks a GPU has; a higher link index is NVML_ERROR_INVALID_ARGUMENT
  (NVML API reference, nvmlDeviceGetNvLinkState), and nvidia-ml-py 13 sets NVML_NVLINK_MAX_LINKS
  to 36: an A100 has 12 links, an H100 18. A GPU without NVLink says NOT_SUPPORTED.
- A GPU can answer NVML_ERROR_GPU_IS_LOST or NVML_ERROR_RESET_REQUIRED to any read.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")

from nodemedic_agent.checks.polled import PolledChecks  # noqa: E402
from nodemedic_agent.hardware import nvml  # noqa: E402
from nodemedic_agent.hardware.nvml import NvmlHardware  # noqa: E402

from tests.agent.conftest import agent_config  # noqa: E402


class FakeNvml:
    """nvidia-ml-py with its device functions answering for ``gpus`` (per index: ``links``, the
    NVLinks it has, None for no NVLink; ``down``, links not active; ``fails``, an NVML error code
    every read after the handle answers)."""

    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        self.gpus = gpus
        self.asked: list[int] = []  # the fabric struct versions NVML answered

    def __getattr__(self, name: str) -> Any:  # constants and error classes: nvidia-ml-py's own
        return getattr(pynvml, name)

    def _gpu(self, h: int) -> dict[str, Any]:
        gpu = self.gpus[h]
        if gpu.get("fails"):
            raise pynvml.NVMLError(gpu["fails"])
        return gpu

    def _read(self, h: int, value: Any) -> Any:
        """``value``, once the GPU answers at all."""
        self._gpu(h)
        return value

    def nvmlInit(self) -> None: ...  # noqa: N802 - NVML's names
    def nvmlShutdown(self) -> None: ...  # noqa: N802
    def nvmlEventSetCreate(self) -> object: return object()  # noqa: N802
    def nvmlEventSetFree(self, _: object) -> None: ...  # noqa: N802
    def nvmlDeviceGetCount(self) -> int: return len(self.gpus)  # noqa: N802

    def nvmlDeviceRegisterEvents(self, h: int, *_: object) -> None:  # noqa: N802 - GPU_IS_LOST for a lost GPU
        self._gpu(h)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802 - ``handle_fails``: the handle is refused too
        if self.gpus[i].get("handle_fails"):
            raise pynvml.NVMLError(self.gpus[i]["handle_fails"])
        return i
    def nvmlDeviceGetUUID(self, h: int) -> str: return self._read(h, f"GPU-{h:08d}")  # noqa: N802
    def nvmlDeviceGetPciInfo(self, h: int) -> Any: return SimpleNamespace(busId=f"00000000:{h + 16:02X}:00.0")  # noqa: N802
    def nvmlDeviceGetTotalEccErrors(self, h: int, *_: object) -> int: return self._gpu(h).get("dbe", 0)  # noqa: N802

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:  # noqa: N802 - Ampere and later
        self._gpu(h)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, ...]: return self._read(h, (0, 0, 0, 0))  # noqa: N802
    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:  # noqa: N802 - driver 535 and later
        if self._gpu(h).get("driver", 535) < 535:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._gpu(h).get("reasons", 0)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int: return self._gpu(h).get("reasons", 0)  # noqa: N802
    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any: return self._read(h, SimpleNamespace(gpu=0))  # noqa: N802
    def nvmlDeviceGetClockInfo(self, h: int, _: int) -> int: return self._read(h, 1980)  # noqa: N802
    def nvmlDeviceGetMaxClockInfo(self, h: int, _: int) -> int: return self._read(h, 1980)  # noqa: N802
    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int: return self._read(h, 16)  # noqa: N802
    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int: return self._read(h, 16)  # noqa: N802

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:  # noqa: N802
        gpu = self._gpu(h)
        if gpu.get("links") is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= gpu["links"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link in gpu.get("down", ()) else 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:  # noqa: N802
        return self._gpu(h).get("errors", 0) if counter == pynvml.NVML_NVLINK_ERROR_DL_REPLAY else 0

    def nvmlDeviceGetGpuFabricInfo(self, h: int, info: Any) -> int:  # noqa: N802 - ``fabric``: (state, status)
        fabric = self._gpu(h).get("fabric")
        if fabric is None:  # no NVSwitch (an A100 says so too)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info._obj.state, info._obj.status = fabric[:2]  # filled through the pointer, as NVML fills it
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetFieldValues(self, h: int, fields: list[int]) -> Any:  # noqa: N802
        """``recovery``: the GPU's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), an unsigned
        int; None: a driver before R550, which answers the field NOT_SUPPORTED in its own status."""
        gpu = self._gpu(h)
        assert fields == [nvml.RECOVERY_ACTION_FIELD] == [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        values = (pynvml.c_nvmlFieldValue_t * 1)()
        values[0].fieldId, values[0].valueType = fields[0], pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        if gpu.get("recovery") is None:
            values[0].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        else:
            values[0].nvmlReturn, values[0].value.uiVal = pynvml.NVML_SUCCESS, gpu["recovery"]
        return values

    def nvmlDeviceGetGpuFabricInfoV(self, h: int, info: Any) -> int:  # noqa: N802
        """``fabric``: (state, status, healthMask, healthSummary); ``fabric_versions``: the struct
        versions this GPU's driver knows (R535: none, the function is missing; R550: v2)."""
        versions = self._gpu(h).get("fabric_versions", (pynvml.nvmlGpuFabricInfo_v2, pynvml.nvmlGpuFabricInfo_v3))
        if not versions:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if info._obj.version not in versions:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        self.asked.append(info._obj.version)
        fabric = self._gpu(h).get("fabric")
        if fabric is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        state, status, mask, summary = (*fabric, 0, 0)[:4]
        info._obj.state, info._obj.status, info._obj.healthMask = state, status, mask
        if info._obj.version == pynvml.nvmlGpuFabricInfo_v3:
            info._obj.healthSummary = summary
        return pynvml.NVML_SUCCESS


@pytest.fixture
def fake(monkeypatch):
    def make(gpus: list[dict[str, Any]]) -> NvmlHardware:
        monkeypatch.setattr(nvml, "pynvml", FakeNvml(gpus))
        return NvmlHardware(dcgm=False)
    return make


def test_nvidia_ml_py_asks_for_more_links_than_any_gpu_has():
    assert pynvml.NVML_NVLINK_MAX_LINKS > 18  # the premise of the next tests


@pytest.mark.parametrize("links", [12, 18, None], ids=["a100-12-links", "h100-18-links", "no-nvlink"])
def test_a_healthy_gpu_reads_healthy_whatever_its_nvlink_count(fake, links):
    gpus = fake([{"links": links}] * 8).gpus()
    assert len(gpus) == 8 and not any(g.lost or g.reset_required or g.nvlink_links_down for g in gpus)


def test_a_link_down_and_link_errors_are_still_read_below_the_gpus_link_count(fake):
    gpus = fake([{"links": 12, "down": (3, 11), "errors": 5}, {"links": 12}]).gpus()
    assert gpus[0].nvlink_links_down == 2 and gpus[0].nvlink_errors == 5 * 10  # ten active links
    assert gpus[1].nvlink_links_down == 0


def test_a_gpu_lost_or_needing_a_reset_at_any_read_is_a_finding_not_a_check_error(fake, sim, tmp_path):
    hardware = fake([{"links": 18}, {"links": 18, "fails": pynvml.NVML_ERROR_GPU_IS_LOST},
                     {"links": 18, "fails": pynvml.NVML_ERROR_RESET_REQUIRED}])
    gpus = hardware.gpus()
    assert [(g.lost, g.reset_required) for g in gpus] == [(False, False), (True, False), (False, True)]
    config = agent_config(sim, tmp_path / "spool", expected={"gpus": 3})
    result = PolledChecks(hardware, config).gpu()
    assert sorted((f.fault_code, f.component["index"]) for f in result.findings) == [
        ("GPU_LOST", 1), ("GPU_RESET_REQUIRED", 2)]
    assert all(f.status == "failed" for f in result.findings)


@pytest.mark.parametrize("lost", [{"fails": pynvml.NVML_ERROR_GPU_IS_LOST},
                                  {"fails": pynvml.NVML_ERROR_GPU_IS_LOST, "handle_fails": pynvml.NVML_ERROR_GPU_IS_LOST}],
                         ids=["events-refused", "handle-refused"])
def test_a_gpu_lost_before_the_agent_started_is_a_finding_and_the_others_are_watched(fake, sim, tmp_path, lost):
    """An agent restarted after a GPU fell off the bus: NVML refuses to register the lost GPU for
    events. That failed NVML's start, so every read was a check error and no GPU_LOST was sent."""
    hardware = fake([{"links": 18}, {"links": 18, **lost}, {"links": 18, "dbe": 2}])
    config = agent_config(sim, tmp_path / "spool", expected={"gpus": 3})
    result = PolledChecks(hardware, config).gpu()
    assert sorted(f.fault_code for f in result.findings if f.component.get("index") == 1) == ["GPU_LOST"]
    assert any(f.component.get("index") == 2 and f.status == "failed" for f in result.findings)  # the DBE is read too
    assert not any(f.fault_code == "CHECK_ERROR" for f in result.findings)


def test_a_gpu_nvml_cannot_read_is_its_own_check_error_and_the_others_are_read(fake, sim, tmp_path):
    """nvidia-smi's "Unable to determine the device handle for GPU ...: Unknown Error": one GPU's
    error failed the whole read, so a double-bit ECC error on another GPU went unseen."""
    hardware = fake([{"links": 18, "handle_fails": pynvml.NVML_ERROR_UNKNOWN, "fails": pynvml.NVML_ERROR_UNKNOWN},
                     {"links": 18, "dbe": 2}])
    config = agent_config(sim, tmp_path / "spool", expected={"gpus": 2})
    result = PolledChecks(hardware, config).gpu()
    assert sorted((f.fault_code, f.status, f.component["index"]) for f in result.findings) == [
        ("CHECK_ERROR", "error", 0), ("ECC_DBE", "failed", 1)]
    assert "Unknown Error" in result.findings[0].summary + result.findings[1].summary
    assert "1 unreadable" in result.detail


def test_a_driver_older_than_nvidia_ml_py_is_read_through_the_names_it_has(fake):
    """nvidia-ml-py 13 calls ClocksEventReasons, which drivers before 535 do not have."""
    thermal = pynvml.nvmlClocksEventReasonHwThermalSlowdown
    gpus = fake([{"links": 12, "driver": 525, "reasons": thermal}, {"links": 12, "driver": 535}]).gpus()
    assert [g.thermal_violation for g in gpus] == [True, False]


def test_a_gpu_held_at_its_power_cap_is_busy_not_faulty(fake, sim, tmp_path):
    """What a healthy H100 at full load reads (a lent H100, 45 s of dense GEMMs, 2026-11-26): NVML's
    clock event reasons were 0x4 (SW power cap) in every sample, at 694-699 W of its 700 W limit, SM
    clocks 1,365-1,440 MHz. Power capping is a busy GPU's normal state: no finding; a power brake
    (0x80, an external signal to slow down) or a thermal slowdown is one."""
    busy = pynvml.nvmlClocksEventReasonSwPowerCap
    assert busy == 0x4
    brake = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    hardware = fake([{"links": 18, "reasons": busy}, {"links": 18, "reasons": busy | brake}])
    config = agent_config(sim, tmp_path / "spool", expected={"gpus": 2})
    result = PolledChecks(hardware, config).gpu()
    assert [(f.fault_code, f.component["index"]) for f in result.findings] == [("POWER_VIOLATION", 1)]


def test_xids_are_waited_for_on_a_driver_without_the_v2_event_wait(fake):
    hardware = fake([{"links": 12}])
    api = nvml.pynvml

    def no_v2(*_: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    api.nvmlEventSetWait_v2 = no_v2
    api.nvmlEventSetWait = lambda events, ms: SimpleNamespace(eventData=79, device=0)
    api.nvmlDeviceGetIndex = lambda device: device
    [event] = hardware.wait_xid(0.1)
    assert (event.xid, event.gpu_index, event.pci_bus_id) == (79, 0, "00000000:10:00.0")


def test_the_gpus_registration_with_the_nvlink_fabric_is_read_and_judged(fake, sim, tmp_path):
    """nvmlGpuFabricInfo_t: ``status`` counts only once ``state`` is completed (NVML API reference)."""
    done, started, running = (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
                              pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS)
    hardware = fake([{"links": 18, "fabric": (done, pynvml.NVML_SUCCESS)},
                     {"links": 18, "fabric": (started, pynvml.NVML_ERROR_UNKNOWN)},  # not yet: the status means nothing
                     {"links": 18, "fabric": (running, pynvml.NVML_SUCCESS)},
                     {"links": 18, "fabric": (done, pynvml.NVML_ERROR_UNKNOWN)},
                     {"links": 12}])  # an A100: no fabric state
    gpus = hardware.gpus()
    assert [(g.fabric_state, bool(g.fabric_error)) for g in gpus] == [
        ("completed", False), ("not_started", False), ("in_progress", False), ("completed", True), ("", False)]
    assert "Unknown Error" in gpus[3].fabric_error
    config = agent_config(sim, tmp_path / "spool", expected={"gpus": 5})
    found = {f.fault_code: f for f in PolledChecks(hardware, config).gpu().findings}
    assert sorted(found) == ["GPU_FABRIC_ERROR", "GPU_FABRIC_NOT_READY"]
    assert found["GPU_FABRIC_NOT_READY"].evidence["gpus"] == "1,2" and found["GPU_FABRIC_NOT_READY"].status == "failed"
    assert found["GPU_FABRIC_ERROR"].component == {"kind": "gpu", "index": 3, "uuid": "GPU-00000003"}


def _mask(degraded_bw: int = 2, route_recovery: int = 2, route_unhealthy: int = 2, timeout_recovery: int = 2,
          config: int = 1) -> int:
    """A fabric health mask as NVML packs it (NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*, nvidia-ml-py's
    own constants); every field's default is its healthy value."""
    return (degraded_bw << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
            | route_recovery << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY
            | route_unhealthy << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
            | timeout_recovery << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY
            | config << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION)


def test_the_fabrics_health_of_each_registered_gpu_is_read_and_judged(fake, sim, tmp_path):
    """nvmlGpuFabricInfo_v3_t (GB200): the health mask and summary of a registered GPU. A route
    unhealthy, a wrong configuration or an unhealthy summary is GPU_FABRIC_UNHEALTHY; bandwidth
    degraded or limited capacity, GPU_FABRIC_DEGRADED (slow, not dead); a recovery in progress,
    and the health of a GPU not yet registered, are nothing."""
    done, running, ok = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_SUCCESS
    healthy, unhealthy, limited = (pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY, pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
                                   pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY)
    no_partition = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NO_PARTITION
    hardware = fake([{"links": 18, "fabric": (done, ok, _mask(), healthy)},
                     {"links": 18, "fabric": (done, ok, _mask(degraded_bw=1), limited)},
                     {"links": 18, "fabric": (done, ok, _mask(route_unhealthy=1), unhealthy)},
                     {"links": 18, "fabric": (done, ok, _mask(config=no_partition), unhealthy)},
                     {"links": 18, "fabric": (done, ok, _mask(route_recovery=1, timeout_recovery=1), healthy)},
                     {"links": 18, "fabric": (running, ok, _mask(route_unhealthy=1), unhealthy)},
                     {"links": 18, "fabric": (done, ok, 0, 0)}])  # a driver that reports no health: nothing judged
    gpus = hardware.gpus()
    assert [g.fabric_health for g in gpus] == [
        (), ("bandwidth degraded", "limited capacity"), ("route unhealthy", "unhealthy"),
        ("incorrect configuration: no partition", "unhealthy"), (), (), ()]
    assert set(nvml.pynvml.asked) == {pynvml.nvmlGpuFabricInfo_v3}
    config = agent_config(sim, tmp_path / "spool", expected={"gpus": 7})
    found = {f.fault_code: f for f in PolledChecks(hardware, config).gpu().findings}
    assert sorted(found) == ["GPU_FABRIC_DEGRADED", "GPU_FABRIC_NOT_READY", "GPU_FABRIC_UNHEALTHY"]
    assert found["GPU_FABRIC_UNHEALTHY"].component == {"kind": "node"}
    assert found["GPU_FABRIC_UNHEALTHY"].evidence["gpus"] == "2,3" and "no partition" in found["GPU_FABRIC_UNHEALTHY"].summary
    assert found["GPU_FABRIC_DEGRADED"].component == {"kind": "gpu", "index": 1, "uuid": "GPU-00000001"}
    assert "bandwidth degraded" in found["GPU_FABRIC_DEGRADED"].evidence["errors"]


@pytest.mark.parametrize(("versions", "reads_health"), [
    ((pynvml.nvmlGpuFabricInfo_v2,), True),  # R550: v2, the health mask without the summary
    ((), False)],  # R535: no nvmlDeviceGetGpuFabricInfoV, the first form: state and status only
    ids=["v2-driver", "v1-driver"])
def test_an_older_driver_is_read_in_the_newest_form_it_knows(fake, versions, reads_health):
    """A driver older than the struct asked for answers NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    one older than the call has no such function (NVML API reference)."""
    done = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    [gpu] = fake([{"links": 18, "fabric_versions": versions,
                   "fabric": (done, pynvml.NVML_SUCCESS, _mask(route_unhealthy=1), 0)}]).gpus()
    assert gpu.fabric_state == "completed" and gpu.fabric_health == (("route unhealthy",) if reads_health else ())
    assert nvml.pynvml.asked == list(versions)


def test_a_node_without_an_nvlink_fabric_reads_healthy(fake, sim, tmp_path):
    hardware = fake([{"links": 12}, {"links": None}])
    config = agent_config(sim, tmp_path / "spool", expected={"gpus": 2})
    assert PolledChecks(hardware, config).gpu().findings == []


def test_the_recovery_action_the_driver_states_is_read_each_poll(fake, sim, tmp_path):
    """NVML's recovery action (nvmlDeviceGpuRecoveryAction_t), the state Xid 154 announces: each
    action is the Xid 154 code of the same name, so the two readings fold into one event; none,
    or a driver that does not report it, is nothing; an action this catalog does not know is
    recorded."""
    hardware = fake([{"links": 18, "recovery": pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET},
                     {"links": 18, "recovery": pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT},
                     {"links": 18, "recovery": pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P},
                     {"links": 18, "recovery": pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET},
                     {"links": 18, "recovery": pynvml.NVML_GPU_RECOVERY_ACTION_NONE},
                     {"links": 18},  # R535: the field is not supported
                     {"links": 18, "recovery": 99}])
    assert [g.recovery_action for g in hardware.gpus()] == [1, 2, 3, 4, 0, 0, 99]
    config = agent_config(sim, tmp_path / "spool", expected={"gpus": 7})
    found = {f.component["index"]: f for f in PolledChecks(hardware, config).gpu().findings}
    assert {i: f.fault_code for i, f in found.items()} == {
        0: "XID154_GPU_RESET", 1: "XID154_NODE_REBOOT", 2: "XID154_DRAIN_P2P", 3: "XID154_DRAIN_AND_RESET",
        6: "XID154_UNKNOWN"}
    assert found[1].summary == "GPU 1: the driver says node reboot required" and found[1].status == "failed"
    assert found[6].status == "degraded"  # recorded, not acted on
