"""The kernel log watcher: follows ``/dev/kmsg`` (or the journal, or a file) as it grows and turns
the lines that matter into findings. A line it cannot parse is skipped and counted."""

from __future__ import annotations

import errno
import os
import re
import select
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from threading import Event

from nodemedic.domain.xid import decode_nvlink5, recovery_action_code

from nodemedic_agent.checks.base import Finding, status_of

KMSG_RECORD = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus." and its
# variants: no "PCI:" (older drivers), an 8-digit domain, pid without name, pid='<unknown>'
XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):?\s*(\d{1,5})\b,?\s*(.*)$")
PID_NAME = re.compile(r"^(?:pid=(?:'[^']*'|[^,\s]*),\s*)?(?:name=[^,]*,\s*)?")
SXID = re.compile(r"SXid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)")
OFF_BUS = re.compile(r"fallen off the bus")
GPU_PCI = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)")
# the efa driver's admin queue stops (it clears its RUNNING bit) on these: the device is unusable until reset
EFA_FATAL = re.compile(r"(?:\befa [0-9A-Fa-f:.]+|infiniband \S+): .*(?:Wait for completion \((?:polling|interrupts)\) "
                       r"timeout|Admin queue is closed|Command was aborted)")
EFA_ERROR = re.compile(r"\befa [0-9A-Fa-f:.]+: .*(?:[Ff]ail|[Ee]rror|err -\d+)")
HUNG = re.compile(r"INFO: task (\S+) blocked for more than (\d+) seconds")
LOCKUP = re.compile(r"soft lockup - CPU#(\d+) stuck")
READ_ONLY = re.compile(r"(?:Remounting filesystem read-only|remounted read-only|switching to read-only)", re.I)
OOM = re.compile(r"Out of memory: Killed process (\d+) \(([^)]*)\)")


def bus_key(pci: str) -> str:
    """``0000:10:00``, ``00000000:10:00.0`` -> ``10:00`` (the same GPU in NVML and in the log)."""
    return ":".join(pci.split(".")[0].lower().split(":")[-2:])


def xid_code(xid: int, detail: str) -> tuple[str, dict[str, object]]:
    """The fault code of an Xid message and what its text adds: Xid 154 names the recovery action
    the driver wants, and an NVLink5 Xid (144-150) is decoded with the catalog's table; every
    other Xid is ``XID <n>``, classified by its catalog bucket."""
    if xid == 154 and (code := recovery_action_code(detail)):
        return code, {"xid": 154}
    if nvlink5 := decode_nvlink5(xid, detail):
        words = {name: f"0x{value:08x}" for name, value in (("intr_info", nvlink5.intr_info),
                                                            ("error_status", nvlink5.error_status)) if value is not None}
        return nvlink5.fault_code, {"xid": xid, "nvlink5_unit": nvlink5.unit, "nvlink5_fatal": nvlink5.fatal,
                                    "nvlink5_bucket": nvlink5.bucket, "decode": nvlink5.basis, **words}
    return f"XID {xid}", {}


def xid_finding(xid: int, pci: str, index: int | None, observed_at: datetime, evidence: dict[str, object],
                check: str = "kernel_log", overrides: dict[str, str] | None = None, detail: str = "") -> Finding:
    """An XID, from the kernel log or from NVML's event (same component, so dedupe folds the pair)."""
    code, decoded = xid_code(xid, detail)
    component = {"kind": "gpu", "index": index} if index is not None else {"kind": "gpu", "name": pci}
    return Finding(check, code, status_of(code, overrides), f"XID {xid} on GPU {pci}",  # type: ignore[arg-type]
                   component, {**evidence, **decoded}, observed_at)


def message_finding(message: str, observed_at: datetime, gpu_index: Callable[[str], int | None],
                    overrides: dict[str, str] | None = None) -> Finding | None:
    """The finding a kernel log message is evidence of, if any."""
    overrides = overrides or {}
    text = message[:1024]
    evidence = {"kmsg": text}

    def found(code: str, summary: str, component: dict[str, object] | None) -> Finding:
        return Finding("kernel_log", code, status_of(code, overrides), summary, component, evidence, observed_at)  # type: ignore[arg-type]

    if m := XID.search(message):
        return xid_finding(int(m.group(2)), m.group(1), gpu_index(m.group(1)), observed_at, evidence,
                           overrides=overrides, detail=PID_NAME.sub("", m.group(3)))
    if m := SXID.search(message):
        return found(f"SXID {int(m.group(2))}", f"NVSwitch SXID {m.group(2)}", {"kind": "node", "name": f"nvswitch {m.group(1)}"})
    if OFF_BUS.search(message):
        pci = m.group(1) if (m := GPU_PCI.search(message)) else ""
        index = gpu_index(pci) if pci else None
        return found("GPU_LOST", f"GPU {pci or '?'} fell off the bus (no XID)",
                     {"kind": "gpu", "index": index} if index is not None else {"kind": "gpu", **({"name": pci} if pci else {})})
    if EFA_FATAL.search(message):
        return found("EFA_DRIVER_FATAL", "the EFA driver's admin queue stopped", {"kind": "nic"})
    if EFA_ERROR.search(message):
        return found("EFA_DRIVER_ERROR", "EFA driver error", {"kind": "nic"})
    if m := HUNG.search(message):
        return found("HUNG_TASK", f"task {m.group(1)} hung for {m.group(2)}s", {"kind": "node"})
    if m := LOCKUP.search(message):
        return found("SOFT_LOCKUP", f"soft lockup on CPU {m.group(1)}", {"kind": "node"})
    if READ_ONLY.search(message):
        return found("FS_READONLY", "a file system was remounted read-only", {"kind": "filesystem"})
    if m := OOM.search(message):
        return found("OOM_KILL", f"OOM killed {m.group(2)} (pid {m.group(1)})", {"kind": "node"})
    return None


@dataclass
class LogStats:
    lines: int = 0
    skipped: int = 0  # lines that are not kernel log records
    lost: int = 0  # records overwritten before we read them (/dev/kmsg EPIPE)


def kmsg_message(line: str, stats: LogStats) -> tuple[str, datetime] | None:
    """(message, observed_at) of one ``/dev/kmsg`` record; continuation lines are ignored."""
    if not line.strip() or line.startswith(" "):
        return None
    m = KMSG_RECORD.match(line)
    if not m:
        stats.skipped += 1
        return None
    age = time.monotonic() - int(m.group(3)) / 1e6
    now = datetime.now(UTC)
    observed = now - timedelta(seconds=age) if 0 <= age < 300 else now
    return m.group(4), observed


class KernelLogFollower:
    """Yields kernel log messages written after it started, until ``stop`` is set."""

    def __init__(self, source: str, path: str, stop: Event) -> None:
        self.source = source
        self.path = path
        self.stop = stop
        self.stats = LogStats()

    def messages(self) -> Iterator[tuple[str, datetime]]:
        if self.source == "journal":
            yield from self._journal()
            return
        raw = self._kmsg() if self.source == "kmsg" else self._file()
        for line in raw:
            self.stats.lines += 1
            parsed = kmsg_message(line, self.stats)
            if parsed:
                yield parsed

    def _kmsg(self) -> Iterator[str]:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.lseek(fd, 0, os.SEEK_END)  # only what happens from now on
            while not self.stop.is_set():
                ready, _, _ = select.select([fd], [], [], 1.0)
                if not ready:
                    continue
                try:
                    record = os.read(fd, 8192)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # ring buffer overwrote records we had not read
                        self.stats.lost += 1
                        continue
                    raise
                yield record.decode(errors="replace")
        finally:
            os.close(fd)

    def _file(self, idle_s: float = 0.05) -> Iterator[str]:
        path = Path(self.path)
        f = path.open()
        f.seek(0, os.SEEK_END)
        buffer = ""
        try:
            while not self.stop.is_set():
                chunk = f.readline()
                if chunk:
                    buffer += chunk
                    if buffer.endswith("\n"):
                        yield buffer
                        buffer = ""
                    continue
                if path.exists() and path.stat().st_size < f.tell():  # rotated / truncated
                    f.close()
                    f = path.open()
                self.stop.wait(idle_s)
        finally:
            f.close()

    def _journal(self) -> Iterator[tuple[str, datetime]]:
        proc = subprocess.Popen(["journalctl", "-k", "-f", "-n", "0", "-o", "cat"],
                                stdout=subprocess.PIPE, text=True, bufsize=1)
        assert proc.stdout is not None
        try:
            while not self.stop.is_set():
                ready, _, _ = select.select([proc.stdout], [], [], 1.0)
                if not ready:
                    continue
                line = proc.stdout.readline()
                if not line:
                    break
                self.stats.lines += 1
                yield line.rstrip("\n"), datetime.now(UTC)
        finally:
            proc.terminate()
