"""The kernel log follower on each source as a real node writes it: /dev/kmsg records with their
device dictionary, a syslog file that logrotate moves away, and journalctl's bursts."""

from __future__ import annotations

import os
import queue
import re
import stat
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from nodemedic_agent.checks.kernel_log import (
    KMSG_RECORD,
    MAX_LINE_BYTES,
    KernelLogEndedError,
    KernelLogFollower,
    LogStats,
    kmsg_message,
    message_finding,
)

# records as /dev/kmsg gives them, one per read(): a dev_err()/ibdev_err() message carries its
# device dictionary as continuation lines (Documentation/ABI/testing/dev-kmsg)
EFA_ADMIN_CLOSED = "3,2211,8817230911,-;efa 0000:10:1b.0: Admin queue is closed\n SUBSYSTEM=pci\n DEVICE=+pci:0000:10:1b.0\n"
EFA_TIMEOUT = ("3,2212,8817230999,-;infiniband rdmap16s27: Wait for completion (polling) timeout\n"
               " SUBSYSTEM=infiniband\n DEVICE=+infiniband:rdmap16s27\n")


def codes(messages: list[str]) -> list[str | None]:
    return [f.fault_code if (f := message_finding(m, datetime.now(), lambda _: 0)) else None for m in messages]


@pytest.mark.parametrize(("record", "code"), [(EFA_ADMIN_CLOSED, "EFA_DRIVER_FATAL"), (EFA_TIMEOUT, "EFA_DRIVER_FATAL")])
def test_a_kmsg_record_with_a_device_dictionary_is_read_as_its_message(record: str, code: str) -> None:
    stats = LogStats()
    parsed = kmsg_message(record, stats)
    assert parsed is not None and "SUBSYSTEM" not in parsed[0]
    assert codes([parsed[0]]) == [code]
    assert stats.skipped == 0


def test_what_is_no_kmsg_record_is_skipped_and_counted() -> None:
    stats = LogStats()
    assert [kmsg_message(r, stats) for r in ("not a record\n", "3,1,x,-;text\n", " SUBSYSTEM=pci\n")] == [None] * 3
    assert stats.skipped == 2  # the continuation line is no record, and no error either


def test_a_kmsg_record_text_is_unescaped() -> None:
    parsed = kmsg_message("4,17,1000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=7, name=a\\x5cb\\x09c, GPU has fallen off the bus.\n",
                          LogStats())
    assert parsed is not None and "name=a\\b\tc," in parsed[0]


def follow(follower: KernelLogFollower) -> tuple[queue.Queue[str | BaseException], threading.Thread]:
    seen: queue.Queue[str | BaseException] = queue.Queue()

    def read() -> None:
        try:
            for message, _ in follower.messages():
                seen.put(message)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            seen.put(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return seen, reader


def take(seen: queue.Queue[str | BaseException], n: int, timeout: float = 5.0) -> list[str | BaseException]:
    return [seen.get(timeout=timeout) for _ in range(n)]


@pytest.fixture
def stopped() -> Iterator[threading.Event]:
    stop = threading.Event()
    yield stop
    stop.set()


def test_a_syslog_file_is_followed_across_logrotate(tmp_path: Path, stopped: threading.Event) -> None:
    log = tmp_path / "kern.log"
    log.write_text("Nov 22 10:00:00 ip-10-0-1-17 kernel: [    0.000000] Linux version 6.1.0\n")
    follower = KernelLogFollower("file", str(log), stopped)
    seen, reader = follow(follower)
    threading.Event().wait(0.3)  # it has opened the file and skipped to its end
    with log.open("a") as f:
        f.write("Nov 22 10:11:12 ip-10-0-1-17 kernel: [ 8817.230911] NVRM: Xid (PCI:0000:3b:00): 79, pid=2749, "
                "name=python3, GPU has fallen off the bus.\n")
    first = take(seen, 1)
    log.rename(tmp_path / "kern.log.1")  # logrotate's default: move away, create anew
    log.write_text("Nov 22 10:20:00 ip-10-0-1-17 kernel: [ 9305.1] efa 0000:10:1b.0: Admin queue is closed\n")
    second = take(seen, 1)
    stopped.set()
    reader.join(timeout=5)
    assert codes([*first, *second]) == ["XID 79", "EFA_DRIVER_FATAL"]  # type: ignore[list-item]
    assert follower.stats.skipped == 0 and not reader.is_alive()


def test_a_syslog_file_with_bytes_that_are_not_utf8_or_an_endless_line_is_still_followed(
        tmp_path: Path, stopped: threading.Event) -> None:
    """rsyslog passes a device's 8-bit text through as it is, and a torn or corrupt file can hold a
    run of bytes with no end of line: the watcher read the file as UTF-8 text, so the first stopped
    it (the XID after it was lost), and the second was held whole in memory."""
    log = tmp_path / "kern.log"
    log.write_bytes(b"")
    follower = KernelLogFollower("file", str(log), stopped)
    seen, reader = follow(follower)
    threading.Event().wait(0.3)  # it has opened the file and skipped to its end
    with log.open("ab") as f:
        f.write(b"Nov 22 10:11:11 ip-10-0-1-17 kernel: usb 1-1: Manufacturer: Caf\xe9 \xff\xfe\n")
        f.write(b"\x01" * (MAX_LINE_BYTES * 3) + b"\n")
        f.write(b"Nov 22 10:11:12 ip-10-0-1-17 kernel: [ 8817.230911] NVRM: Xid (PCI:0000:3b:00): 79, pid=2749, "
                b"name=python3, GPU has fallen off the bus.\n")
    got = take(seen, 2)
    stopped.set()
    reader.join(timeout=5)
    assert got[0] == "Nov 22 10:11:11 ip-10-0-1-17 kernel: usb 1-1: Manufacturer: Caf\ufffd \ufffd\ufffd"
    assert codes(got) == [None, "XID 79"]  # type: ignore[arg-type]
    assert follower.stats.skipped == 1 and seen.empty() and not reader.is_alive()


@pytest.fixture
def journalctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A journalctl on PATH that writes what ``script`` says (no journald runs here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir / "journalctl"


def script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_a_journal_burst_is_read_whole_at_once(journalctl: Path, stopped: threading.Event, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script(journalctl, f"echo $$ > {pid_file}\n"
                       "printf 'NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\\n"
                       "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed "
                       "from 0x0 (None) to 0x2 (Node Reboot Required)\\n'\n"
                       "exec sleep 60")
    follower = KernelLogFollower("journal", "", stopped)
    seen, reader = follow(follower)
    burst = take(seen, 2)  # both, without waiting for a later message
    stopped.set()
    reader.join(timeout=5)
    assert codes(burst) == ["XID 79", "XID154_NODE_REBOOT"]  # type: ignore[arg-type]
    pid = int(pid_file.read_text())
    assert not reader.is_alive() and not Path(f"/proc/{pid}").exists()  # journalctl is stopped and reaped


def test_journalctl_that_stops_is_an_error_not_a_quiet_end(journalctl: Path, stopped: threading.Event) -> None:
    script(journalctl, "echo 'Failed to open journal' >&2; exit 1")
    seen, reader = follow(KernelLogFollower("journal", "", stopped))
    [ended] = take(seen, 1)
    reader.join(timeout=5)
    assert isinstance(ended, KernelLogEndedError) and "exit status 1" in str(ended)


def test_records_overwritten_while_the_agent_was_down_are_counted_as_lost_and_the_rest_replayed(tmp_path: Path) -> None:
    """The ring buffer holds a few hundred kilobytes: a long downtime on a chatty node loses the
    oldest records. At the restart the reader says how many, from the gap after its cursor."""
    follower = KernelLogFollower("kmsg", "/dev/kmsg", threading.Event(), cursor_file=tmp_path / "cursor.json",
                                 replay_seconds=60)
    now_usec = int(time.monotonic() * 1e6)

    def record(seq: int, age_s: float) -> re.Match[str]:
        m = KMSG_RECORD.match(f"6,{seq},{now_usec - int(age_s * 1e6)},-;text\n")
        assert m is not None
        return m

    replays = [follower._replays(record(seq, age), seq, after=100) for seq, age in ((99, 5), (100, 5), (105, 5), (106, 90))]
    assert replays == [False, False, True, False]  # handed on before; the first after the gap; too old
    assert (follower.stats.lost, follower.stats.replayed, follower.stats.expired) == (4, 1, 1)
