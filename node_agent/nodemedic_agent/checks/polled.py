"""Checks that read counters and state every poll interval: GPU (NVML), DCGM, EFA, storage."""

from __future__ import annotations

import time
from collections.abc import Callable

from nodemedic.domain.xid import RECOVERY_NAMES, recovery_value_code

from nodemedic_agent.checks.base import CheckResult, Finding, check_error, status_of
from nodemedic_agent.config import AgentConfig
from nodemedic_agent.hardware.base import EfaDevice, GpuState, Hardware, HardwareError, SourceUnavailableError
from nodemedic_agent.watchdog import Stall, Watchdog

# the operational states (RFC 2863, the kernel's Documentation/networking/operstates.rst) in which
# an interface carries no traffic; "unknown" is a driver that does not set it, and "must be
# considered for user data": its carrier decides
LINK_DOWN = frozenset({"down", "lowerlayerdown", "notpresent", "dormant", "testing"})
# what a healthy node reads right after it boots, until its NVLinks train and Fabric Manager has
# registered its GPUs with the NVLink fabric: the agent sends these only once the node has been up
# thresholds.boot_settle_seconds (a check run too early flagged 214 healthy GB200 nodes, NVSentinel
# issue #1701); the deep check after a rung has its own settle rule. The fabric's health is read
# the same way: its routes and bandwidth settle as the fabric comes up
AFTER_BOOT = frozenset({"NVLINK_DOWN", "GPU_FABRIC_NOT_READY", "GPU_FABRIC_UNHEALTHY", "GPU_FABRIC_DEGRADED"})
# what the fabric's health reports of a GPU that works, slower (nvmlGpuFabricInfo_v3_t); anything
# else it reports means the GPU cannot use the fabric as it should
FABRIC_DEGRADED = frozenset({"bandwidth degraded", "limited capacity"})



def _new_errors(now: dict[str, int], before: dict[str, int]) -> int:
    """The errors counted since ``before``, counter by counter: one that went down (a driver
    reload zeroes them) counts none and hides no other's rise; one not read before (its file
    appeared) counts none, not its whole history."""
    return sum(max(0, value - before.get(name, value)) for name, value in now.items())


def reading(name: str) -> str:
    """How the watchdog names the polled check ``name`` (gpu, dcgm, efa, storage)."""
    return f"the {name} check"


def _gpu(index: int, uuid: str = "") -> dict[str, object]:
    return {"kind": "gpu", "index": index, **({"uuid": uuid} if uuid else {})}


class PolledChecks:
    """Runs every polled check once; remembers counters so that a jump is reported once."""

    def __init__(self, hardware: Hardware, config: AgentConfig) -> None:
        self.hw = hardware
        self.config = config
        self.watchdog = Watchdog()  # each check runs under it: one that never returns is seen
        self.gpus: list[GpuState] = []  # what the last GPU check read (the agent maps PCI ids from it)
        self._nvlink: dict[int, int] = {}
        self._efa_seen: dict[str, tuple[float, dict[str, int]]] = {}  # device -> (monotonic, counters) last poll
        self._efa_streak: dict[str, int] = {}  # device -> polls in a row above a rate threshold

    def _found(self, check: str, code: str, summary: str, component: dict[str, object] | None = None,
               evidence: dict[str, object] | None = None) -> Finding:
        return Finding(check, code, status_of(code, self.config.fault_overrides), summary, component, evidence or {})

    def run_all(self) -> list[CheckResult]:
        checks: list[tuple[str, str, Callable[[], CheckResult]]] = [
            ("nvml", "gpu", self.gpu), ("dcgm", "dcgm", self.dcgm),
            ("efa", "efa", self.efa), ("storage", "storage", self.storage),
        ]
        results = []
        for check, name, run in checks:
            try:
                with self.watchdog.watching(reading(name), check):
                    results.append(run())
            except (HardwareError, OSError, ValueError) as exc:
                results.append(check_error(check, name, exc))
        return results

    def stalls(self) -> list[Stall]:
        """The readings running past ``thresholds.check_stall_seconds`` (none when it is 0)."""
        limit = self.config.thresholds.check_stall_seconds
        return self.watchdog.stalls(limit) if limit else []

    def stalled(self, stall: Stall) -> Finding:
        """CHECK_STALLED: a reading that has not returned for ``stall.seconds``. It holds up every
        check after it in its loop, and a driver call that hangs is itself the fault (a GPU or driver
        that no longer answers; a file system that hangs)."""
        limit = self.config.thresholds.check_stall_seconds
        return self._found(stall.check, "CHECK_STALLED",
                           f"{stall.what} has not returned for {stall.seconds:.0f}s (limit {limit:g}s): a driver "
                           "call or a file system that does not answer; nothing after it in its loop is read meanwhile",
                           {"kind": "node"}, {"check": stall.what, "stalled_seconds": round(stall.seconds),
                                              "limit_seconds": limit})

    def gpu(self) -> CheckResult:
        gpus = self.gpus = self.hw.gpus()
        expected = self.config.expected.gpus
        found: list[Finding] = []
        if len(gpus) < expected:
            found.append(self._found("nvml", "GPU_COUNT_LOW", f"{len(gpus)} of {expected} GPUs visible",
                                 {"kind": "node"}, {"visible": len(gpus), "expected": expected}))
        thr = self.config.thresholds.nvlink_errors_per_poll
        for g in gpus:
            comp = _gpu(g.index, g.uuid)
            if g.lost:
                found.append(self._found("nvml", "GPU_LOST", f"GPU {g.index} is lost (fell off the bus)",
                                         _gpu(g.index), {"pci_bus_id": g.pci_bus_id}))
                continue
            if g.unreadable:
                found.append(Finding("nvml", "CHECK_ERROR", "error", f"GPU {g.index} could not be read: {g.unreadable}"[:500],
                                     _gpu(g.index), {"check": "gpu", "error": g.unreadable[:500]}))
                continue
            if g.reset_required:
                found.append(self._found("nvml", "GPU_RESET_REQUIRED", f"GPU {g.index} needs a reset: NVML answers "
                                         "'GPU requires reset'", _gpu(g.index)))
                continue
            if g.ecc_dbe_volatile > 0:
                found.append(self._found("nvml", "ECC_DBE", f"GPU {g.index}: {g.ecc_dbe_volatile} double-bit ECC errors",
                                         comp, {"ecc_dbe_volatile": g.ecc_dbe_volatile}))
            if g.remap_failure:
                found.append(self._found("nvml", "ROW_REMAP_FAILURE", f"GPU {g.index}: row remapping failed", comp))
            elif g.remap_pending or g.retired_pages_pending:
                found.append(self._found("nvml", "RETIRED_PAGES_PENDING",
                                         f"GPU {g.index}: page retirement / row remap pending a reset", comp))
            if g.nvlink_links_down:
                found.append(self._found("nvml", "NVLINK_DOWN", f"GPU {g.index}: {g.nvlink_links_down} NVLinks "
                                         "not active", comp, {"links_down": g.nvlink_links_down}))
            if 0 < g.pcie_width < g.pcie_max_width:
                found.append(self._found("nvml", "PCIE_DEGRADED", f"GPU {g.index}: PCIe link trained at x{g.pcie_width} "
                                         f"of x{g.pcie_max_width}", comp,
                                         {"pcie_width": g.pcie_width, "pcie_max_width": g.pcie_max_width}))
            if g.recovery_action:
                code = recovery_value_code(g.recovery_action)
                said = RECOVERY_NAMES.get(code, f"recovery action {g.recovery_action}")
                found.append(self._found("nvml", code, f"GPU {g.index}: the driver says {said}", comp,
                                         {"recovery_action": g.recovery_action, "read_from": "NVML"}))
            if g.thermal_violation:
                found.append(self._found("nvml", "THERMAL_VIOLATION", f"GPU {g.index}: thermal slowdown", comp))
            if g.power_violation:
                found.append(self._found("nvml", "POWER_VIOLATION", f"GPU {g.index}: power brake slowdown", comp))
            before = self._nvlink.get(g.index, g.nvlink_errors)
            self._nvlink[g.index] = g.nvlink_errors
            if g.nvlink_errors - before >= thr:
                found.append(self._found("nvml", "NVLINK_ERRORS",
                                         f"GPU {g.index}: {g.nvlink_errors - before} NVLink errors since the last poll", comp,
                                         {"new_errors": g.nvlink_errors - before, "threshold": thr}))
        found += self._fabric(gpus)
        lost = sum(g.lost for g in gpus)
        unread = sum(bool(g.unreadable) for g in gpus)
        return CheckResult("gpu", f"{len(gpus) - lost}/{expected} GPUs visible" + (f", {unread} unreadable" if unread else ""),
                           found)

    def _fabric(self, gpus: list[GpuState]) -> list[Finding]:
        """The GPUs' standing in the NVLink fabric, one finding per kind for the node:
        - not registered (Fabric Manager not running, or still at it): CUDA cannot use the node's
          NVLinks and the GPUs look healthy to every other reading (NVSentinel issues #883, #889:
          a Fabric Manager down for 20 days, undetected);
        - registration failed;
        - registered, and the fabric's health says a route is unhealthy, the configuration is
          wrong or the GPU is unhealthy: it cannot use the fabric as it should;
        - registered, with bandwidth degraded or limited capacity: the node works, slower (a
          trunk link lost on a GB200 rack, NVIDIA NMX-M "Partition Health")."""
        found = []
        waiting = [g for g in gpus if g.fabric_state in ("not_started", "in_progress")]
        if waiting:
            states = ", ".join(f"GPU {g.index} {g.fabric_state.replace('_', ' ')}" for g in waiting)
            found.append(self._found("nvml", "GPU_FABRIC_NOT_READY",
                                     f"{len(waiting)} of {len(gpus)} GPUs not registered with the NVLink fabric "
                                     f"(is nvidia-fabricmanager running?): {states}"[:500], {"kind": "node"},
                                     {"gpus": ",".join(str(g.index) for g in waiting), "fabric_states": states[:1000]}))
        failed = [(g, g.fabric_error) for g in gpus if g.fabric_state == "completed" and g.fabric_error]
        reported = [g for g in gpus if g.fabric_state == "completed" and not g.fabric_error and g.fabric_health]
        unhealthy = [(g, ", ".join(g.fabric_health)) for g in reported if set(g.fabric_health) - FABRIC_DEGRADED]
        degraded = [(g, ", ".join(g.fabric_health)) for g in reported if set(g.fabric_health) <= FABRIC_DEGRADED]
        for code, by_gpu, what in (("GPU_FABRIC_ERROR", failed, "failed to register with the NVLink fabric"),
                                   ("GPU_FABRIC_UNHEALTHY", unhealthy, "unhealthy in the NVLink fabric"),
                                   ("GPU_FABRIC_DEGRADED", degraded, "with degraded NVLink fabric bandwidth")):
            if by_gpu:
                found.append(self._fabric_gpus(code, f"{len(by_gpu)} of {len(gpus)} GPUs {what}", by_gpu))
        return found

    def _fabric_gpus(self, code: str, summary: str, by_gpu: list[tuple[GpuState, str]]) -> Finding:
        """One finding for the GPUs in ``by_gpu`` (each with what NVML says of it): the GPU's, or the
        node's when there are several."""
        said = ", ".join(f"GPU {g.index}: {text}" for g, text in by_gpu)
        first = by_gpu[0][0]
        return self._found("nvml", code, f"{summary}: {said}"[:500],
                           {"kind": "node"} if len(by_gpu) > 1 else _gpu(first.index, first.uuid),
                           {"gpus": ",".join(str(g.index) for g, _ in by_gpu), "errors": said[:1000]})

    def dcgm(self) -> CheckResult:
        """DCGM's health watches: a Failure is DCGM_HEALTH, a Warning (PCIe replays, an InfoROM
        checksum...) is DCGM_HEALTH_WARNING, which the fault table only records, and a host engine
        that is not running is DCGM_UNAVAILABLE, recorded too: the check could not run, which
        must not fail a node's deep check (and climb its ladder) while its GPUs are fine."""
        try:
            health = self.hw.dcgm_health()
        except SourceUnavailableError as exc:  # said, but never fails a node: DCGM is down, not the GPUs
            return CheckResult("dcgm", f"not run: {exc}"[:300], [self._found(
                "dcgm", "DCGM_UNAVAILABLE", str(exc)[:300], {"kind": "node"})])
        if health is None:
            return CheckResult("dcgm", "DCGM not installed; skipped")
        found = []
        for code, incidents, verb in (("DCGM_HEALTH", health.failures, "report a failure"),
                                      ("DCGM_HEALTH_WARNING", health.warnings, "warn")):
            if incidents:
                gpu = health.gpu(incidents)
                found.append(self._found("dcgm", code, f"DCGM health watches {verb}: {incidents[0]}",
                                         {"kind": "node"} if gpu is None else _gpu(gpu),
                                         {"dcgm": "; ".join(map(str, incidents))[:1000]}))
        said = [f"{len(health.failures)} failures"] * bool(health.failures) + \
            [f"{len(health.warnings)} warnings"] * bool(health.warnings)
        return CheckResult("dcgm", ", ".join(said) or "health watches clean", found)

    def efa(self) -> CheckResult:
        devices = self.hw.efa_devices()
        expected = self.config.expected.efa_devices
        found: list[Finding] = []
        if len(devices) < expected:
            found.append(self._found("efa", "EFA_COUNT_LOW", f"{len(devices)} of {expected} EFA devices",
                                 {"kind": "node"}, {"visible": len(devices), "expected": expected}))
        thr = self.config.thresholds.efa_errors_per_poll
        now = time.monotonic()
        for i, dev in enumerate(devices):
            comp = {"kind": "nic", "index": i, "name": dev.name}
            before = self._efa_seen.get(dev.name)
            self._efa_seen[dev.name] = (now, dict(dev.counters))
            if dev.port_state != "ACTIVE":
                found.append(self._found("efa", "EFA_DOWN", f"{dev.name} port 1 is {dev.port_state}", comp,
                                         {"port_state": dev.port_state}))
            elif dev.netdev is not None and (dev.operstate in LINK_DOWN or dev.carrier is False):
                found.append(self._found("efa", "EFA_DOWN", f"{dev.name} link is down ({dev.netdev} "
                                         f"{dev.operstate}, carrier {'on' if dev.carrier else 'off'})", comp,
                                         {"netdev": dev.netdev, "operstate": dev.operstate, "carrier": dev.carrier}))
            if storm := self._efa_rate_storm(dev, before, now):
                found.append(self._found("efa", "EFA_ERROR_RATE", f"{dev.name}: " + ", ".join(
                    f"{k} {v['per_s']:.1f}/s > {v['threshold']:g}/s" for k, v in storm.items()), comp,
                    {"polls": self.config.thresholds.efa_debounce_polls,
                     **{f"{k}_per_s": v["per_s"] for k, v in storm.items()},
                     **{f"{k}_threshold": v["threshold"] for k, v in storm.items()}}))
            jump = _new_errors(dev.counters, before[1]) if before else 0
            if jump >= thr:
                found.append(self._found("efa", "EFA_HW_ERRORS", f"{dev.name}: {jump} new hardware errors",
                                         comp, {**dev.counters, "new_errors": jump}))
        return CheckResult("efa", f"{len(devices)}/{expected} EFA devices", found)

    def _efa_rate_storm(self, dev: EfaDevice, before: tuple[float, dict[str, int]] | None,
                        now: float) -> dict[str, dict[str, float]]:
        """The counters whose rate since the last poll (``before``) has been above its threshold for
        ``efa_debounce_polls`` polls in a row (a counter that went down, e.g. after a driver reload,
        counts as no errors)."""
        if before is None or now <= before[0]:
            return {}
        elapsed = now - before[0]
        rules = self.config.thresholds.efa_error_rates
        rates = {name: max(0, value - before[1].get(name, value)) / elapsed
                 for name, value in dev.counters.items() if name in rules}
        over = {name: {"per_s": round(rate, 3), "threshold": rules[name]}
                for name, rate in rates.items() if rate > rules[name]}
        streak = self._efa_streak[dev.name] = self._efa_streak.get(dev.name, 0) + 1 if over else 0
        return over if streak >= self.config.thresholds.efa_debounce_polls else {}

    def storage(self) -> CheckResult:
        cfg = self.config.storage
        found: list[Finding] = []
        notes = []
        for path in cfg.paths:
            total, free = self.hw.disk_usage(path)
            if total <= 0:  # a pseudo or network file system that states no size: nothing to judge
                notes.append(f"{path} states no size")
                pct = 100.0
            else:
                pct = 100.0 * free / total
                notes.append(f"{path} {pct:.0f}% free")
            if pct < cfg.min_free_percent:
                found.append(self._found("storage", "DISK_FULL", f"{path} has {pct:.1f}% free",
                                         {"kind": "disk", "name": path},
                                         {"free_percent": round(pct, 2), "min": cfg.min_free_percent}))
            if self.hw.mount_read_only(path):
                found.append(self._found("storage", "FS_READONLY", f"{path} is read-only",
                                         {"kind": "filesystem", "name": path}))
        for mount in cfg.shared_mounts:
            if not self.hw.mount_responsive(mount, cfg.probe_timeout_seconds):
                found.append(self._found("storage", "FS_UNRESPONSIVE",
                                         f"{mount} did not answer within {cfg.probe_timeout_seconds:g}s",
                                         {"kind": "filesystem", "name": mount}, {"timeout_s": cfg.probe_timeout_seconds}))
            else:
                notes.append(f"{mount} responsive")
        return CheckResult("storage", ", ".join(notes) or "no paths configured", found)
