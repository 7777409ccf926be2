"""The kernel log watcher: follows ``/dev/kmsg`` (or the journal, or a file) as it grows and turns
the lines that matter into findings. A line it cannot parse is skipped and counted."""

from __future__ import annotations

import errno
import glob
import logging
import os
import re
import select
import subprocess
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from threading import Event
from typing import BinaryIO

from nodemedic.contracts.problems import read_json
from nodemedic.domain.xid import decode_nvlink5, recovery_action_code

from nodemedic_agent.checks.base import Finding, status_of
from nodemedic_agent.checks.log_cursor import (
    Cursor,
    FileCursor,
    JournalCursor,
    KmsgCursor,
    current_boot_id,
    load_cursor,
    save_cursor,
)

log = logging.getLogger("nodemedic_agent.kernel_log")

# one /dev/kmsg record: "pri,seq,usec,flags[,...];text\n", then the message's device dictionary as
# continuation lines (" SUBSYSTEM=pci\n DEVICE=+pci:0000:10:1b.0\n"): every dev_err()/ibdev_err()
# message, the EFA driver's included, has one (Documentation/ABI/testing/dev-kmsg)
KMSG_RECORD = re.compile(r"^(\d+),(\d+),(\d+),[^;\n]*;([^\n]*)(?:\n|$)", re.ASCII)
# the kernel writes a non-printable byte and "\" itself as "\xNN" in a record's text
KMSG_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus." and its
# variants: no "PCI:" (older drivers), an 8-digit domain, pid without name, pid='<unknown>', and on
# a GPU in MIG mode the GPU instance and compute instance the driver attributes it to,
# "(PCI:0000:01:00 GPU-I:05 GPU-CI:01)" (open-gpu-kernel-modules, kernel_rc.c krcReportXid)
XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
                 r"(?:\s+GPU-I:(?P<gi>\d{1,3}))?(?:\s+GPU-CI:(?P<ci>\d{1,3}))?\):?\s*(?P<xid>\d{1,5})\b,?\s*(?P<detail>.*)$",
                 re.ASCII)
PID_NAME = re.compile(r"^(?:pid=(?:'[^']*'|[^,\s]*),\s*)?(?:name=[^,]*,\s*)?", re.ASCII)
# "nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 24007, Fatal, Link 30 sourcetrack timeout error": the
# switch driver states the severity; the lines that follow (", Severity 1 Engine instance ...",
# ", Data {...}") repeat the code without it
SXID = re.compile(r"SXid \(PCI:([0-9A-Fa-f:.]+)\): (\d{1,5})\b(?:,\s*(Fatal|Non-fatal)\b)?", re.ASCII)
OFF_BUS = re.compile(r"fallen off the bus")
GPU_PCI = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)", re.ASCII)
# who an efa driver message is from: ibdev_err() on kernels >= 5.2 writes the PCI device and the RDMA
# device, "efa 0000:10:1b.0 rdmap16s27: " (drivers/infiniband/core/device.c __ibdev_printk); the
# driver's fallback on older kernels writes the RDMA device alone, "infiniband efa_0: "; dev_err()
# writes the PCI device, "efa 0000:10:1b.0: "
# a PCI device as the kernel names it (domain:bus:device.function)
PCI_DEVICE = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
EFA_SOURCE = rf"(?:\befa {PCI_DEVICE}(?: [\w-]+)?|\binfiniband [\w-]+): "
# the efa driver's admin queue stops (it clears its RUNNING bit) on these: the device is unusable
# until reset (amzn-drivers kernel/linux/efa efa_com.c)
EFA_FATAL = re.compile(EFA_SOURCE + r".*(?:Wait for completion \((?:polling|interrupts)\) timeout|Admin queue is closed"
                       r"|Command was aborted|The device didn't send any completion for admin cmd"
                       r"|didn't receive any MSI-X interrupt for admin cmd|Changing the admin queue running state)", re.ASCII)
EFA_ERROR = re.compile(EFA_SOURCE + r".*(?:[Ff]ail|[Ee]rror|err -\d+|timed out)", re.ASCII)
HUNG = re.compile(r"INFO: task (\S+) blocked for more than (\d+) seconds", re.ASCII)
LOCKUP = re.compile(r"soft lockup - CPU#(\d+) stuck", re.ASCII)
READ_ONLY = re.compile(r"(?:Remounting filesystem read-only|remounted read-only|switching to read-only)", re.I)
# XFS does not remount read-only: it shuts the file system down and every I/O fails, "XFS (nvme1n1):
# Log I/O Error (0x2) detected at xlog_ioend_work+0x6e/0x70 [xfs] (fs/xfs/xfs_log.c:1378).  Shutting
# down filesystem." (fs/xfs/xfs_fsops.c xfs_do_force_shutdown), before 5.x "... Filesystem has been
# shut down due to log error (0x2)."
XFS_SHUTDOWN = re.compile(r"\bXFS \(([^)\s]+)\): .*(?:Shutting down filesystem|[Ff]ilesystem has been shut down)", re.ASCII)
# the Lustre client (FSx for Lustre) evicted by a server: its in-flight I/O fails, then it reconnects
# (lustre/ptlrpc/import.c, LCONSOLE_ERROR_MSG 0x167: "LustreError: 167-0: <device>: This client was
# evicted by <target>; in progress operations using this service will fail.")
LUSTRE_EVICTED = re.compile(r"(?:(\S+): )?This client was evicted by ([^;\s]+)", re.ASCII)
OOM = re.compile(r"Out of memory: Killed process (\d+) \(([^)]*)\)", re.ASCII)
# the host's memory lost data it cannot correct: the EDAC driver's "EDAC MC0: 1 UE memory read error on
# CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (channel:0 slot:0 page:0x7e025e ...)" (UE, or Fatal; a corrected
# error is CE and not a fault: drivers/edac/edac_mc.c), the kernel taking a poisoned page away,
# "Memory failure: 0x7740c0: recovery action for dirty page: Recovered" (mm/memory-failure.c; in a
# VM too, where the hypervisor forwards the machine check), and x86's "mce: Uncorrected hardware
# memory error in user-access at 1a2b3c" (arch/x86/kernel/cpu/mce/core.c)
HOST_MEMORY_UE = re.compile(r"EDAC (?P<mc>MC\d+): [1-9]\d* (?:UE|Fatal) .*?error on (?P<dimm>\S+)"
                            r"|Memory failure: (?P<page>0x[0-9A-Fa-f]+)|Uncorrected hardware memory error", re.ASCII)
# a PCIe error the link cannot recover from by itself (drivers/pci/pcie/aer.c, severity "Uncorrected
# (Fatal)"): the port's "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0"
# (kernels >= 6.x: "... error message received from 0000:3b:00.0") names the device that sent it,
# the device's own "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=..." is
# from it; "(Non-Fatal)" and "Corrected" the link recovers from
PCIE_FATAL = re.compile(rf"Uncorrected \(Fatal\)(?: error (?:message )?received(?::| from) (?P<source>{PCI_DEVICE}))?", re.ASCII)
DEVICE_PREFIX = re.compile(rf"\b[\w-]+ ({PCI_DEVICE}): ", re.ASCII)  # "<driver> <device>: ", as dev_printk writes it
MAX_LINE_BYTES = 65536
NOT_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# the date a syslog line starts with: rsyslog's RSYSLOG_FileFormat, RFC 3339 ("2026-11-27T05:09:04.123456+00:00
# ip-10-0-1-17 kernel: ...", rsyslog's own default, which Debian 12 keeps), or RSYSLOG_TraditionalFileFormat
# ("Nov 27 05:09:04 ip-10-0-1-17 kernel: ...", local time without a year: Ubuntu 22.04, Amazon Linux 2)
RFC3339_DATE = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)\s", re.ASCII)
TRADITIONAL_DATE = re.compile(r"^(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([ \d]?\d) (\d\d):(\d\d):(\d\d)\s", re.ASCII)
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
# at a start, how far back from its end a log file is read at most: lines further back are older
# than any replay_seconds on a node that logs much, and reading them would delay the start
REPLAY_MAX_BYTES = 32 << 20


class KernelLogEndedError(RuntimeError):
    """The kernel log source stopped giving messages (journalctl exited)."""


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
    return Finding(check, code, status_of(code, overrides), f"XID {xid} on GPU {pci}",
                   component, {**evidence, **decoded}, observed_at)


def message_finding(message: str, observed_at: datetime, gpu_index: Callable[[str], int | None],
                    overrides: dict[str, str] | None = None) -> Finding | None:
    """The finding a kernel log message is evidence of, if any."""
    overrides = overrides or {}
    text = message[:1024]
    evidence: dict[str, object] = {"kmsg": text}

    def found(code: str, summary: str, component: dict[str, object] | None) -> Finding:
        return Finding("kernel_log", code, status_of(code, overrides), summary, component, evidence, observed_at)

    if m := XID.search(message):
        mig = {key: int(m.group(group)) for key, group in (("mig_gpu_instance", "gi"), ("mig_compute_instance", "ci"))
               if m.group(group) is not None}
        return xid_finding(int(m.group("xid")), m.group("pci"), gpu_index(m.group("pci")), observed_at,
                           {**evidence, **mig}, overrides=overrides, detail=PID_NAME.sub("", m.group("detail")))
    if m := SXID.search(message):
        switch: dict[str, object] = {"kind": "node", "name": f"nvswitch {m.group(1)}"}
        if m.group(3) == "Fatal":
            evidence["sxid"] = int(m.group(2))
            return found("NVSWITCH_FATAL", f"NVSwitch {m.group(1)}: fatal SXID {int(m.group(2))}", switch)
        return found(f"SXID {int(m.group(2))}", f"NVSwitch SXID {m.group(2)}", switch)
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
    if m := XFS_SHUTDOWN.search(message):
        return found("FS_SHUTDOWN", f"XFS shut down the file system on {m.group(1)}", {"kind": "filesystem", "name": m.group(1)})
    if "Lustre" in message and (m := LUSTRE_EVICTED.search(message)):
        evidence["evicted_by"] = m.group(2)[:128]
        return found("LUSTRE_EVICTED", f"the Lustre client was evicted by {m.group(2)[:128]}",
                     {"kind": "filesystem", "name": (m.group(1) or m.group(2))[:256]})
    if READ_ONLY.search(message):
        return found("FS_READONLY", "a file system was remounted read-only", {"kind": "filesystem"})
    if m := HOST_MEMORY_UE.search(message):
        where = m.group("dimm") or (f"page {m.group('page')}" if m.group("page") else "")
        evidence.update({k: v for k, v in (("memory_controller", m.group("mc")), ("dimm", m.group("dimm")),
                                          ("page", m.group("page"))) if v})
        return found("HOST_MEMORY_UE", f"uncorrectable host memory error{' on ' + where if where else ''}"[:300],
                     {"kind": "node"})
    if m := PCIE_FATAL.search(message):
        device = m.group("source") or ((d := DEVICE_PREFIX.search(message[:m.start()])) and d.group(1)) or ""
        index = gpu_index(device) if device else None
        evidence["pci_device"] = device
        return found("PCIE_AER_FATAL", f"fatal uncorrected PCIe error{' from ' + device if device else ''}",
                     {"kind": "gpu", "index": index} if index is not None else
                     {"kind": "node", **({"name": f"pcie {device}"} if device else {})})
    if m := OOM.search(message):
        return found("OOM_KILL", f"OOM killed {m.group(2)} (pid {m.group(1)})", {"kind": "node"})
    return None


@dataclass
class LogStats:
    lines: int = 0
    skipped: int = 0  # lines that are not kernel log records
    lost: int = 0  # records overwritten before we read them (/dev/kmsg EPIPE, or while the agent was down)
    replayed: int = 0  # records written while the agent was down, read when it started
    expired: int = 0  # records written while the agent was down, older than kernel_log.replay_seconds (or, in a file,
    # than this boot): not read
    undated: int = 0  # lines of a log file written while the agent was down with no date to tell their age: not read
    failed: int = 0  # messages whose handling failed (a bug, not the log's fault): skipped, each logged


def record_age(m: re.Match[str]) -> float:
    """Seconds since the kernel wrote a matched kmsg record: its timestamp is microseconds of the
    kernel's clock since boot, which like CLOCK_MONOTONIC stops during suspend."""
    return time.monotonic() - int(m.group(3)) / 1e6


def _record(m: re.Match[str], replayed: bool = False) -> tuple[str, datetime]:
    """(message, observed_at) of a matched kmsg record: its text unescaped, dated by its age. A
    record read as it is written is seconds old: an age over 5 minutes there means the two clocks
    disagree (a file copied from another boot), and it is dated now. A replayed record is as old as
    it says (journald dates the kernel's records the same way)."""
    age = record_age(m)
    now = datetime.now(timezone.utc)
    observed = now - timedelta(seconds=age) if 0 <= age and (replayed or age < 300) else now
    return KMSG_ESCAPE.sub(lambda e: chr(int(e.group(1), 16)), m.group(4)), observed


def kmsg_record(record: str, stats: LogStats) -> re.Match[str] | None:
    """One ``/dev/kmsg`` record matched (priority, sequence number, timestamp, text); its
    dictionary lines are not the message. What is no record is counted."""
    if not record.strip() or record.startswith(" "):
        return None
    if m := KMSG_RECORD.match(record):
        return m
    stats.skipped += 1
    return None


def kmsg_message(record: str, stats: LogStats) -> tuple[str, datetime] | None:
    """(message, observed_at) of one ``/dev/kmsg`` record read as it is written."""
    return _record(m) if (m := kmsg_record(record, stats)) else None


def log_file_message(line: str, stats: LogStats) -> tuple[str, datetime] | None:
    """(message, observed_at) of one line of a kernel log file: a kmsg record, or a line as dmesg,
    syslog or journald writes it (the patterns find the message after any prefix), seen now."""
    if not line.strip() or line.startswith(" "):
        return None
    if m := KMSG_RECORD.match(line):
        return _record(m)
    text = line.rstrip("\n")
    if NOT_TEXT.search(text):  # binary junk (a torn write, a corrupt file): no log line
        stats.skipped += 1
        return None
    return text, datetime.now(timezone.utc)


def line_date(line: str, now: datetime) -> datetime | None:
    """When a line of a log file was written, by its own date (an RFC 3339 or a traditional syslog
    date, or a kmsg record's timestamp); None when it has none. A traditional date has no year and
    is the host's local time (as rsyslog writes it): the latest such date not after tomorrow."""
    if m := RFC3339_DATE.match(line):
        year, month, day, hour, minute, second, fraction, zone = m.groups()
        try:
            offset = timezone.utc if zone == "Z" else timezone(
                (-1 if zone[0] == "-" else 1) * timedelta(hours=int(zone[1:3]), minutes=int(zone[-2:])))
            return datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                            int((fraction or "0")[:6].ljust(6, "0")), tzinfo=offset)
        except ValueError:  # no such day, time or zone
            return None
    if m := TRADITIONAL_DATE.match(line):
        month, day, hour, minute, second = MONTHS.index(m[1]) + 1, int(m[2]), int(m[3]), int(m[4]), int(m[5])
        this_year = now.astimezone().year
        for year in (this_year + 1, this_year, this_year - 1):
            try:
                written = datetime(year, month, day, hour, minute, second).astimezone()  # naive: local time
            except ValueError:  # Feb 29 of a year that has none, or no such time
                continue
            if written <= now + timedelta(days=1):
                return written
        return None
    if m := KMSG_RECORD.match(line):
        try:
            return now - timedelta(seconds=record_age(m))
        except OverflowError:  # a timestamp no clock reaches
            return None
    return None


def boot_started() -> datetime:
    """When this boot began, by the wall clock (CLOCK_BOOTTIME counts the time suspended too)."""
    return datetime.now(timezone.utc) - timedelta(seconds=time.clock_gettime(time.CLOCK_BOOTTIME))


def seek_line(f: BinaryIO, offset: int) -> None:
    """Position ``f`` at the first line that starts at or after ``offset``."""
    if offset <= 0:
        f.seek(0)
        return
    f.seek(offset - 1)
    if f.read(1) != b"\n":
        f.readline()  # the rest of the line ``offset`` is in


def moved_away(path: Path, cursor: FileCursor) -> BinaryIO | None:
    """The file ``cursor`` is in, opened, where logrotate moved it beside ``path`` ("kern.log.1",
    "kern.log-20261127"; a compressed one is another file); None where there is none."""
    for sibling in path.parent.glob(glob.escape(path.name) + "?*"):
        try:
            if cursor.names(sibling.stat()):
                return sibling.open("rb")
        except OSError:
            continue
    return None


class LineReader:
    """The complete lines of a binary file as it grows, each decoded with the bytes that are not
    UTF-8 replaced (rsyslog passes a device's 8-bit text through): never a decoding error that stops
    the watcher. A line is bounded: a run of bytes with no end of line in sight (a corrupt file) is
    skipped and counted, never held in memory."""

    def __init__(self, f: BinaryIO, stats: LogStats) -> None:
        self.f = f
        self.stats = stats
        self.pending = b""
        self.too_long = False
        st = os.fstat(f.fileno())  # which file: an open file stays the same one, whatever its name
        self._file = (st.st_dev, st.st_ino)

    @property
    def cursor(self) -> FileCursor:
        """Where the line after the last one returned starts."""
        return FileCursor(*self._file, self.f.tell() - len(self.pending))

    def line(self) -> str | None:
        """The next complete line; None when there is none yet."""
        while chunk := self.f.readline(MAX_LINE_BYTES + 1):
            self.pending += chunk
            if self.pending.endswith(b"\n"):
                line, self.pending = self.pending, b""
                if self.too_long:  # the end of a line that was too long
                    self.too_long = False
                    continue
                return line.decode(errors="replace")
            if len(self.pending) > MAX_LINE_BYTES:
                self.stats.skipped += 0 if self.too_long else 1
                self.pending, self.too_long = b"", True
        return None


def rotated(path: Path, f: BinaryIO) -> bool:
    """Whether the file at ``path`` is no longer the one ``f`` reads to its end: truncated
    (copytruncate), or moved away and a new one created (logrotate's default)."""
    try:
        now = path.stat()
    except FileNotFoundError:  # moved away, the new one not created yet
        return False
    return now.st_ino != os.fstat(f.fileno()).st_ino or now.st_size < f.tell()


def kmsg_cursor(boot: str, seq: int | None) -> KmsgCursor | None:
    """Where the kmsg reader is: nowhere yet, or in a boot the kernel does not name."""
    return KmsgCursor(boot, seq) if boot and seq is not None else None


class KernelLogFollower:
    """Yields kernel log messages, until ``stop`` is set: those written after it started and, with
    ``cursor_file``, also those written while the agent was down (from ``/dev/kmsg`` or the journal,
    when the cursor is from another boot or missing, since boot; from a file, see :meth:`_file`)
    that are younger than ``replay_seconds``: a one-off message (an Xid, the EFA driver stopping)
    is not lost to a restart. One older than that is counted, not read: its fault is either dealt
    with or for a person to look at, not a new event."""

    def __init__(self, source: str, path: str, stop: Event, cursor_file: Path | None = None,
                 replay_seconds: float = 0) -> None:
        self.source = source
        self.path = path
        self.stop = stop
        self.stats = LogStats()
        self.cursor_file = cursor_file
        self.replay_seconds = replay_seconds if cursor_file is not None else 0
        self._cursor_unsaved = False  # a save failed: said once, not at every record
        self._saved: Cursor | None = None  # what the cursor file says: an idle log writes nothing
        self._cursor_refused = False  # journalctl refused the saved cursor: the journal is read by age

    def messages(self) -> Iterator[tuple[str, datetime]]:
        if self.source == "journal":
            yield from self._journal()
            return
        if self.source == "kmsg":
            yield from self._kmsg()
            return
        booted = boot_started()
        for line, backlog in self._file():
            self.stats.lines += 1
            parsed = log_file_message(line, self.stats)
            if parsed and backlog:
                parsed = self._file_replay(line, parsed[0], booted)
            if parsed:
                yield parsed

    def _file_replay(self, line: str, message: str, booted: datetime) -> tuple[str, datetime] | None:
        """A file's line written before the start, dated by its own date; None (counted) when it
        has no date that tells, or is older than ``replay_seconds`` or than this boot (``booted``):
        a file outlives a boot, and what a GPU logged before one is history (the boot reset it; the
        other sources read this boot alone)."""
        now = datetime.now(timezone.utc)
        written = line_date(line, now)
        if written is None:
            self.stats.undated += 1
            return None
        if written < booted:
            self.stats.expired += 1
            return None
        if not self._young_enough((now - written).total_seconds()):
            return None
        return message, min(written, now)

    def _kmsg(self) -> Iterator[tuple[str, datetime]]:
        """Read ``/dev/kmsg``, one record per read(). Opened, it stands at the oldest record the
        kernel still holds: those up to the first EAGAIN are the backlog, read only to replay."""
        boot = current_boot_id()
        cursor = load_cursor(self.cursor_file, KmsgCursor.from_json) if self.cursor_file and self.replay_seconds > 0 else None
        after = cursor.seq if cursor is not None and boot and cursor.boot_id == boot else None
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        backlog = self.replay_seconds > 0
        last: int | None = None  # the sequence number of the last record handed on or passed over
        saved_at = time.monotonic()
        try:
            if not backlog:
                os.lseek(fd, 0, os.SEEK_END)  # only what happens from now on
            while not self.stop.is_set():
                if not backlog:
                    ready, _, _ = select.select([fd], [], [], 1.0)
                    if not ready:
                        saved_at = self._save_cursor(kmsg_cursor(boot, last), saved_at, at_once=True)
                        continue
                try:
                    record = os.read(fd, 8192).decode(errors="replace")
                except BlockingIOError:
                    if backlog:  # caught up: from here on, records as they are written
                        log.info("kernel log: read %d records written before the start (%d older than %.0f s not read)",
                                 self.stats.replayed, self.stats.expired, self.replay_seconds)
                    backlog = False
                    continue
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # ring buffer overwrote records we had not read
                        self.stats.lost += 1
                        continue
                    raise
                self.stats.lines += 1
                if (m := kmsg_record(record, self.stats)) is None:
                    continue
                seq = int(m.group(2))
                if backlog and not self._replays(m, seq, after):
                    last = seq
                    continue
                yield _record(m, replayed=backlog)
                last = seq  # handed on and handled: the consumer asked for the next
                saved_at = self._save_cursor(kmsg_cursor(boot, last), saved_at)
        finally:
            self._save_cursor(kmsg_cursor(boot, last), saved_at, at_once=True)
            os.close(fd)

    def _replays(self, m: re.Match[str], seq: int, after: int | None) -> bool:
        """Whether a backlog record is read: not handed on before this restart, and young enough."""
        if after is not None and seq <= after:
            return False
        if after is not None and seq > after + 1 and self.stats.replayed + self.stats.expired == 0:
            self.stats.lost += seq - after - 1
            log.warning("%d kernel log records written while the agent was down were overwritten before it "
                        "started: their faults are seen only where a polled check reads them", seq - after - 1)
        return self._young_enough(record_age(m))

    def _young_enough(self, age: float) -> bool:
        """Whether a message written before the start is read (counted as replayed), or is older
        than ``replay_seconds`` (counted as expired)."""
        if age > self.replay_seconds:
            self.stats.expired += 1
            return False
        self.stats.replayed += 1
        return True

    def _save_cursor(self, cursor: Cursor | None, saved_at: float, at_once: bool = False) -> float:
        """Save the cursor when it moved, at most once a second (and ``at_once``): a restart reads
        again at most the messages of that second, whose findings the dedupe memory folds. When
        it was saved."""
        now = time.monotonic()
        if self.cursor_file is None or cursor is None or cursor == self._saved or (not at_once and now - saved_at < 1.0):
            return saved_at
        try:
            save_cursor(self.cursor_file, cursor)
        except OSError as exc:
            if not self._cursor_unsaved:
                log.warning("the kernel log cursor was not saved (%s): a restart may read some records again", exc)
            self._cursor_unsaved = True
            return now
        self._cursor_unsaved = False
        self._cursor_refused = False  # a cursor journalctl gave: it can seek to it
        self._saved = cursor
        return now

    def _file(self, idle_s: float = 0.05) -> Iterator[tuple[str, bool]]:
        """(line, written before the start) for each line of the file, followed across logrotate
        (moved away and created anew, or truncated). Without replay, from its end. With replay,
        first the lines written while the agent was down: those after the cursor; where logrotate
        moved the cursor's file away meanwhile, the rest of that file (found beside it by its
        inode), then the new file; with no cursor that names either, the file's last lines. Never
        more than ``REPLAY_MAX_BYTES`` of a file."""
        path = Path(self.path)
        if path.exists() and not path.is_file():  # opened, a FIFO waits for a writer; no device can seek
            raise ValueError(f"kernel_log.path {self.path} is not a log file: for /dev/kmsg set kernel_log.source = "
                             f'"kmsg", for journald "journal"')
        f = path.open("rb")
        lines = LineReader(f, self.stats)
        saved_at = time.monotonic()
        try:
            if self.replay_seconds > 0:
                cursor = load_cursor(self.cursor_file, FileCursor.from_json) if self.cursor_file else None
                older = self._replay_start(path, f, cursor)
                if older is not None:
                    with older:
                        saved_at = yield from self._read_to_end(LineReader(older, self.stats), True, saved_at)
                saved_at = yield from self._read_to_end(lines, True, saved_at)
                log.info("kernel log: read %d lines written before the start (%d older than %.0f s, %d without a "
                         "date, not read)", self.stats.replayed, self.stats.expired, self.replay_seconds, self.stats.undated)
            else:
                f.seek(0, os.SEEK_END)
            while not self.stop.is_set():
                saved_at = yield from self._read_to_end(lines, False, saved_at)
                saved_at = self._save_cursor(lines.cursor, saved_at, at_once=True)
                if rotated(path, f):
                    saved_at = yield from self._read_to_end(lines, False, saved_at)  # written before it was moved away
                    f.close()
                    f = path.open("rb")  # the new file, from its first line
                    lines = LineReader(f, self.stats)
                    continue
                self.stop.wait(idle_s)
        finally:
            if not f.closed:
                self._save_cursor(lines.cursor, saved_at, at_once=True)
            f.close()

    def _read_to_end(self, lines: LineReader, backlog: bool, saved_at: float) -> Generator[tuple[str, bool], None, float]:
        """(line, ``backlog``) for each complete line of the file up to its end for now, the cursor
        saved after each (at most once a second). When it was last saved."""
        while not self.stop.is_set() and (line := lines.line()) is not None:
            yield line, backlog
            saved_at = self._save_cursor(lines.cursor, saved_at)
        return saved_at

    @staticmethod
    def _replay_start(path: Path, f: BinaryIO, cursor: FileCursor | None) -> BinaryIO | None:
        """Position ``f`` where its replay starts. Returns the file ``cursor`` is in, positioned
        there, where logrotate moved it away while the agent was down (``f`` then from its start)."""
        st = os.fstat(f.fileno())
        if cursor is not None and cursor.names(st) and cursor.offset <= st.st_size:
            seek_line(f, max(cursor.offset, st.st_size - REPLAY_MAX_BYTES))
            return None
        older = moved_away(path, cursor) if cursor is not None else None
        if cursor is not None and older is not None:
            size = os.fstat(older.fileno()).st_size
            seek_line(older, max(min(cursor.offset, size), size - REPLAY_MAX_BYTES))
        seek_line(f, st.st_size - REPLAY_MAX_BYTES)  # all of a new file, the end of one the cursor is not in
        return older

    def _journal(self) -> Iterator[tuple[str, datetime]]:
        """The kernel's messages as journald has them, each dated when journald received it. With
        a cursor of this boot, the entries after the last one handed on before the restart;
        without one, or with one of an earlier boot, ``replay_seconds`` back (``-k``: this boot's).
        journalctl writes a burst of entries at once, so its pipe is read as bytes and split here: a
        line read ahead into a buffer that ``select`` cannot see would wait there for the next
        entry, however long that takes."""
        started = time.time()
        cursor = load_cursor(self.cursor_file, JournalCursor.from_json) \
            if self.cursor_file and self.replay_seconds > 0 and not self._cursor_refused else None
        # --all: a field over 4 KB or not printable is written, not null (journalctl(1), --all)
        args = ["journalctl", "-k", "-f", "-o", "json", "--output-fields=MESSAGE", "--all"]
        if cursor is not None and cursor.boot_id != current_boot_id().replace("-", ""):
            # the node booted since: this boot's messages of the replay window, as without a cursor.
            # Not --after-cursor: journalctl 252 (Amazon Linux 2023's, Debian 12's) skips the first
            # entry after the place it seeks to, taking it for the cursor's own, and -k never matches
            # an entry of another boot: this boot's first message was lost (systemd issue 30288)
            cursor = None
        if self.replay_seconds <= 0:
            args += ["-n", "0"]
        elif cursor is not None:
            # From the cursor's own entry, which is passed over below, not --after-cursor: where
            # journald has vacuumed that entry since (its file deleted for space or age), journalctl
            # 252 seeks to the next one and skips it too, taking it for the cursor's own: the first
            # message written while the agent was down was lost. --cursor shows it.
            args += [f"--cursor={cursor.cursor}", "--no-tail"]
        else:
            args += [f"--since=@{max(0, int(started - self.replay_seconds))}", "--no-tail"]  # a clock at 1970
        proc = subprocess.Popen(args, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        pending = b""
        last: JournalCursor | None = None
        own = cursor  # --cursor starts at the cursor's own entry where it is still there: the first only
        saved_at = time.monotonic()
        try:
            while not self.stop.is_set():
                ready, _, _ = select.select([fd], [], [], 1.0)
                if not ready:
                    saved_at = self._save_cursor(last, saved_at, at_once=True)
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    status = proc.wait(timeout=5)
                    if status and cursor is not None and last is None:
                        self._forget_cursor(f"journalctl refused it (exit status {status})")
                    raise KernelLogEndedError(f"journalctl stopped (exit status {status})")
                *lines, pending = (pending + chunk).split(b"\n")
                if len(pending) > MAX_LINE_BYTES:  # no end of line in sight: not an entry
                    self.stats.skipped += 1
                    pending = b""
                for line in lines:
                    self.stats.lines += 1
                    entry = journal_entry(line, self.stats)
                    if entry is None:
                        continue
                    message, observed, position = entry
                    first, own = own, None
                    if first is not None and first.names(position):
                        continue  # the entry the cursor names: handed on before the restart
                    if self._journal_replays(observed, started):
                        yield message, observed
                    last = JournalCursor(position) if position else last
                    saved_at = self._save_cursor(last, saved_at)
        finally:
            self._save_cursor(last, saved_at, at_once=True)
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()

    def _forget_cursor(self, why: str) -> None:
        """Delete the saved cursor: journalctl fails at once on one it cannot seek to ("Failed to
        seek to cursor"), and every restart would fail on it again, the kernel log unread for good.
        The next start reads the last ``replay_seconds`` instead (what the pipeline has seen already,
        the dedupe memory and Detect fold)."""
        assert self.cursor_file is not None
        log.warning("the kernel log cursor %s is forgotten: %s; the next start reads the last %g s",
                    self.cursor_file, why, self.replay_seconds)
        try:
            self.cursor_file.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("the kernel log cursor %s could not be deleted (%s)", self.cursor_file, exc)
        self._saved = None
        self._cursor_refused = True  # also when it could not be deleted: not used again by this agent

    def _journal_replays(self, observed: datetime, started: float) -> bool:
        """Whether a journal entry is read: one from before the start (the backlog) only while it
        is younger than ``replay_seconds``; every one after it."""
        age = started - observed.timestamp()
        return age <= 0 or self.replay_seconds <= 0 or self._young_enough(age)


def journal_entry(line: bytes, stats: LogStats) -> tuple[str, datetime, str] | None:
    """(message, received, cursor) of one line of ``journalctl -o json``. Its MESSAGE is a string,
    or an array of bytes where it is not valid UTF-8 (journald's JSON format); an entry without
    one, or a line that is no entry, is skipped and counted."""
    try:
        entry = read_json(line)
        message = entry["MESSAGE"]
        received = datetime.fromtimestamp(int(entry["__REALTIME_TIMESTAMP"]) / 1e6, timezone.utc)
    except (ValueError, TypeError, KeyError, OverflowError, OSError):
        stats.skipped += 1
        return None
    if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
        message = bytes(message).decode(errors="replace")
    if not isinstance(message, str):
        stats.skipped += 1
        return None
    position = entry.get("__CURSOR")
    return message, received, position if isinstance(position, str) and "\n" not in position else ""
