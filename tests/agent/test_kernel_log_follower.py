"""The kernel log follower on each source as a real node writes it: /dev/kmsg records with their
device dictionary, a syslog file that logrotate moves away, and journalctl's bursts."""

from __future__ import annotations

import json
import os
import queue
import re
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nodemedic_agent.checks import kernel_log
from nodemedic_agent.checks.kernel_log import (
    KMSG_RECORD,
    MAX_LINE_BYTES,
    KernelLogEndedError,
    KernelLogFollower,
    LogStats,
    journal_entry,
    kmsg_message,
    line_date,
    message_finding,
)
from nodemedic_agent.checks.log_cursor import current_boot_id

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


def entry(message: object, at: float, cursor: str) -> str:
    """One line of ``journalctl -o json --output-fields=MESSAGE``: the message and the fields
    journalctl always writes (journalctl(1), --output-fields)."""
    return json.dumps({"__CURSOR": cursor, "__REALTIME_TIMESTAMP": str(int(at * 1e6)),
                       "__MONOTONIC_TIMESTAMP": "8817230911", "_BOOT_ID": "0f3c9a", "MESSAGE": message})


def here(i: int) -> str:
    """A cursor of this boot's ``i``-th entry, as journalctl writes one (its ``b=`` item: the boot)."""
    return f"s=3f8e2a6c4b1d4e0f9a7b5c3d1e2f4a6b;i={i:x};b={current_boot_id().replace('-', '')};m=1;t=1;x=1"


def fake_journal(path: Path, lines: list[str], tmp_path: Path) -> Path:
    """journalctl writing ``lines``, then following (sleeping); its arguments go to a file."""
    (tmp_path / "entries").write_text("".join(line + "\n" for line in lines))
    argv = tmp_path / "argv.json"
    path.write_text(f"#!{sys.executable}\nimport json, os, sys, time\n"
                    f"open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
                    f"json.dump(sys.argv[1:], open({str(argv)!r}, 'w'))\n"
                    f"sys.stdout.write(open({str(tmp_path / 'entries')!r}).read()); sys.stdout.flush()\n"
                    "time.sleep(60)\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return argv


def test_a_journal_burst_is_read_whole_at_once(journalctl: Path, stopped: threading.Event, tmp_path: Path) -> None:
    now = time.time()
    fake_journal(journalctl, [entry("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.", now, "c1"),
                              entry("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed "
                                    "from 0x0 (None) to 0x2 (Node Reboot Required)", now, "c2")], tmp_path)
    follower = KernelLogFollower("journal", "", stopped)
    seen, reader = follow(follower)
    burst = take(seen, 2)  # both, without waiting for a later message
    stopped.set()
    reader.join(timeout=5)
    assert codes(burst) == ["XID 79", "XID154_NODE_REBOOT"]  # type: ignore[arg-type]
    pid = int((tmp_path / "pid").read_text())
    assert not reader.is_alive() and not Path(f"/proc/{pid}").exists()  # journalctl is stopped and reaped


def test_journal_entries_written_while_the_agent_was_down_are_read_at_its_restart(
        journalctl: Path, tmp_path: Path) -> None:
    """The journal source read only what came after the start (``-n 0``): a one-off message
    written during a restart was lost. Now the first start reads ``replay_seconds`` back, each entry
    dated when journald received it, and a restart goes on after the last entry handed on."""
    cursor = tmp_path / "journal-cursor.json"
    now = time.time()
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    argv = fake_journal(journalctl, [entry("old", now - 7200, here(1)), entry(xid, now - 60, here(2)),
                                     entry(list(b"caf\xe9 bytes"), now - 30, here(3)), entry(None, now - 20, here(4)),
                                     "no entry", entry("live", now + 1, here(5))], tmp_path)
    first = KernelLogFollower("journal", "", threading.Event(), cursor_file=cursor, replay_seconds=3600)
    seen, reader = follow(first)
    got = take(seen, 3)
    first.stop.set()
    reader.join(timeout=5)
    assert got == [xid, "caf\ufffd bytes", "live"]  # the old one counted, not read
    args = json.loads(argv.read_text())
    since = next(a for a in args if a.startswith("--since=@"))
    assert abs(int(since.removeprefix("--since=@")) - (now - 3600)) < 5 and "--no-tail" in args and "-n" not in args
    assert (first.stats.replayed, first.stats.expired, first.stats.skipped) == (2, 1, 2)
    assert json.loads(cursor.read_text()) == {"cursor": here(5)}

    # from the cursor's own entry (journalctl --cursor), which is not handed on again
    fake_journal(journalctl, [entry("live", now + 1, here(5)), entry("after the restart", time.time(), here(6))], tmp_path)
    second = KernelLogFollower("journal", "", threading.Event(), cursor_file=cursor, replay_seconds=3600)
    seen, reader = follow(second)
    assert take(seen, 1) == ["after the restart"]
    second.stop.set()
    reader.join(timeout=5)
    assert f"--cursor={here(5)}" in json.loads(argv.read_text()) and seen.empty()


def test_without_replay_the_journal_is_read_from_the_start_on(journalctl: Path, stopped: threading.Event,
                                                               tmp_path: Path) -> None:
    argv = fake_journal(journalctl, [entry("live", time.time(), "c1")], tmp_path)
    seen, reader = follow(KernelLogFollower("journal", "", stopped, cursor_file=tmp_path / "c.json", replay_seconds=0))
    assert take(seen, 1) == ["live"]
    stopped.set()
    reader.join(timeout=5)
    args = json.loads(argv.read_text())
    assert args[args.index("-n") + 1] == "0" and not any(a.startswith(("--since", "--cursor", "--after-cursor")) for a in args)


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


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=512),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                              lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                                  st.sampled_from(["MESSAGE", "__REALTIME_TIMESTAMP", "__CURSOR", "x"]), inner, max_size=4),
                              max_leaves=12).map(lambda v: json.dumps(v).encode())))
def test_any_journal_line_is_an_entry_or_skipped_and_counted(line: bytes) -> None:
    """Whatever journalctl (or a corrupt journal) writes: an entry, or a line counted as skipped."""
    stats = LogStats()
    parsed = journal_entry(line, stats)
    assert (parsed is None) == (stats.skipped == 1)
    if parsed is not None:
        message, received, cursor = parsed
        assert isinstance(message, str) and received.tzinfo is not None and "\n" not in cursor


def test_a_journal_line_nested_past_the_parsers_depth_is_skipped() -> None:
    stats = LogStats()
    assert journal_entry(b"[" * 100_000 + b"]" * 100_000, stats) is None and stats.skipped == 1


# a kernel log file as rsyslog writes it: each line starts with its date
def rfc3339_line(at: datetime, text: str) -> str:
    return f"{at.isoformat()} ip-10-0-1-17 kernel: [ 8817.230911] {text}\n"


def traditional_line(at: datetime, text: str) -> str:
    return f"{at.astimezone().strftime('%b %e %H:%M:%S')} ip-10-0-1-17 kernel: {text}\n"


def append(log: Path, text: str) -> None:
    with log.open("a") as f:
        f.write(text)


def ago(**delta: float) -> datetime:
    return datetime.now(UTC) - timedelta(**delta)


XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2749, name=python3, GPU has fallen off the bus."
XID_48 = "NVRM: Xid (PCI:0000:3b:00): 48, pid=2749, name=python3, An uncorrectable double bit error (DBE) has been detected"
XID_94 = "NVRM: Xid (PCI:0000:3b:00): 94, pid=2749, name=python3, Contained ECC error."


def read_file_log(follower: KernelLogFollower, n: int, then: Callable[[], None] | None = None) -> list[tuple[str, datetime]]:
    """The first ``n`` messages ``follower`` reads; then, 0.3 s later (it has read what the file
    held when it started), ``then`` runs and one more message is awaited; then the follower is
    stopped."""
    seen: queue.Queue[tuple[str, datetime]] = queue.Queue()

    def read() -> None:
        for message in follower.messages():
            seen.put(message)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    got = [seen.get(timeout=5) for _ in range(n)]
    if then is not None:
        threading.Event().wait(0.3)
        then()
        got.append(seen.get(timeout=5))
    follower.stop.set()
    reader.join(timeout=5)
    assert not reader.is_alive() and seen.empty()
    return got


def file_follower(log: Path, cursor: Path, replay_seconds: float = 3600) -> KernelLogFollower:
    return KernelLogFollower("file", str(log), threading.Event(), cursor_file=cursor, replay_seconds=replay_seconds)


def test_file_lines_written_while_the_agent_was_down_are_read_at_its_restart_dated_by_their_own_date(
        tmp_path: Path) -> None:
    """A kernel log file was read from its end at every start: an Xid logged while the agent was
    down (an upgrade, a crash, the boot before it started) was lost. Now the file source keeps a
    cursor like /dev/kmsg and the journal: the first start reads the lines of the last
    ``replay_seconds`` by the date each starts with, a restart resumes after the last line read."""
    log, cursor = tmp_path / "kern.log", tmp_path / "file-cursor.json"
    written = ago(minutes=10)
    log.write_text(rfc3339_line(ago(hours=2), XID_48)  # older than replay_seconds
                   + "a line without a date\n"
                   + traditional_line(written, XID_79))
    first = file_follower(log, cursor)
    got = read_file_log(first, 1, then=lambda: append(log, rfc3339_line(ago(), "live")))
    assert codes([m for m, _ in got]) == ["XID 79", None] and got[1][0].endswith("kernel: [ 8817.230911] live")
    assert abs((got[0][1] - written).total_seconds()) < 1.5  # when it was written, not when it was read
    assert (first.stats.replayed, first.stats.expired, first.stats.undated) == (1, 1, 1)
    assert json.loads(cursor.read_text())["offset"] == log.stat().st_size

    append(log, rfc3339_line(ago(seconds=30), XID_94))  # while the agent is down
    second = file_follower(log, cursor)
    [(message, at)] = read_file_log(second, 1)
    assert codes([message]) == ["XID 94"] and second.stats.replayed == 1  # the lines before the cursor: not again
    assert abs((ago() - at).total_seconds() - 30) < 5


def test_a_file_logrotate_moved_away_while_the_agent_was_down_is_read_to_its_end_then_the_new_one(
        tmp_path: Path) -> None:
    log, cursor = tmp_path / "kern.log", tmp_path / "file-cursor.json"
    log.write_text(rfc3339_line(ago(minutes=5), "before the stop"))
    read_file_log(file_follower(log, cursor), 1)
    append(log, rfc3339_line(ago(), XID_79))  # while the agent is down: a line, then logrotate moves the file away
    log.rename(tmp_path / "kern.log.1")
    log.write_text(rfc3339_line(ago(), XID_48))
    restarted = file_follower(log, cursor)
    assert codes([m for m, _ in read_file_log(restarted, 2)]) == ["XID 79", "XID 48"]
    assert restarted.stats.replayed == 2


@pytest.mark.parametrize("cursor_text", [None, "{not json", '{"device": true, "inode": 1, "offset": 0}'])
def test_a_file_truncated_while_the_agent_was_down_or_an_unreadable_cursor_reads_the_young_lines_at_its_end(
        tmp_path: Path, cursor_text: str | None) -> None:
    """copytruncate empties the file in place (the cursor is past its end); a cursor that is
    garbage names no file: either way the file's young lines are read by their dates."""
    log, cursor = tmp_path / "kern.log", tmp_path / "file-cursor.json"
    log.write_text(rfc3339_line(ago(), "x" * 200) * 3)
    read_file_log(file_follower(log, cursor), 3)
    if cursor_text is not None:
        cursor.write_text(cursor_text)
    log.write_text(rfc3339_line(ago(hours=3), XID_48) + rfc3339_line(ago(seconds=5), XID_79))
    restarted = file_follower(log, cursor)
    assert codes([m for m, _ in read_file_log(restarted, 1)]) == ["XID 79"]
    assert (restarted.stats.replayed, restarted.stats.expired) == (1, 1)


def test_without_replay_a_file_is_read_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(rfc3339_line(ago(), XID_48))
    follower = file_follower(log, tmp_path / "file-cursor.json", replay_seconds=0)
    got = read_file_log(follower, 0, then=lambda: append(log, rfc3339_line(ago(), XID_79)))
    assert codes([m for m, _ in got]) == ["XID 79"] and follower.stats.replayed == 0


@pytest.fixture
def kolkata(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The host's local time is UTC+05:30 (rsyslog writes a traditional date in it)."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(("line", "now", "written"), [
    ("2026-11-27T05:09:04.123456+00:00 h kernel: x", "2026-11-27T06:00:00+00:00", "2026-11-27T05:09:04.123456+00:00"),
    ("2026-11-27T05:09:04.123456789Z h kernel: x", "2026-11-27T06:00:00+00:00", "2026-11-27T05:09:04.123456+00:00"),
    ("2026-11-27 10:39:04,5-0530 h kernel: x", "2026-11-27T17:00:00+00:00", "2026-11-27T16:09:04.5+00:00"),
    # local time (UTC+05:30), no year: this year's, or last year's where this year's is ahead
    ("Nov 27 10:39:04 h kernel: x", "2026-11-27T06:00:00+00:00", "2026-11-27T05:09:04+00:00"),
    ("Dec 31 23:59:59 h kernel: x", "2027-01-01T00:00:00+00:00", "2026-12-31T18:29:59+00:00"),
    ("Jan  1 05:29:59 h kernel: x", "2026-12-31T23:59:00+00:00", "2026-12-31T23:59:59+00:00"),  # the node's clock a second behind
    ("Feb 29 12:00:00 h kernel: x", "2028-03-01T00:00:00+00:00", "2028-02-29T06:30:00+00:00"),
])
def test_a_log_file_line_is_dated_by_the_date_it_starts_with(kolkata: None, line: str, now: str, written: str) -> None:
    assert line_date(line, datetime.fromisoformat(now)) == datetime.fromisoformat(written)


@pytest.mark.parametrize("line", ["a line without a date", "2026-13-45T99:00:00Z h kernel: x",
                                  "2026-11-27T05:09:04+99:00 h kernel: x", "0000-01-01T00:00:00Z h kernel: x",
                                  "4,1,99999999999999999999999999,-;a kmsg record of no time",
                                  "Foo 27 10:39:04 h kernel: x", "Feb 30 12:00:00 h kernel: x", "Nov 27 10:39 h kernel: x"])
def test_a_log_file_line_without_a_date_that_tells_has_none(line: str) -> None:
    assert line_date(line, datetime.now(UTC)) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80) | st.from_regex(kernel_log.RFC3339_DATE) | st.from_regex(kernel_log.TRADITIONAL_DATE)
       | st.from_regex(kernel_log.KMSG_RECORD))
def test_any_log_file_line_has_a_date_or_none(line: str) -> None:
    dated = line_date(line, datetime.now(UTC))
    assert dated is None or dated.tzinfo is not None


def test_file_lines_from_before_this_boot_are_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log file outlives a boot; /dev/kmsg and the journal source read this boot alone, and so
    does a file: an Xid of the boot before (the GPU has been reset since) is no fault now."""
    monkeypatch.setattr(kernel_log, "boot_started", lambda: ago(minutes=5))
    log = tmp_path / "kern.log"
    log.write_text(rfc3339_line(ago(minutes=10), XID_79) + rfc3339_line(ago(minutes=1), XID_48))
    follower = file_follower(log, tmp_path / "file-cursor.json")
    assert codes([m for m, _ in read_file_log(follower, 1)]) == ["XID 48"]
    assert (follower.stats.replayed, follower.stats.expired) == (1, 1)


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_a_file_source_that_is_no_file_is_a_clear_error(tmp_path: Path, kind: str) -> None:
    """``source = "file"`` on /dev/kmsg failed on its first seek (a device cannot), and on a FIFO
    blocked in open() until something wrote to it: the watcher hung, and said nothing."""
    path = {"device": Path("/dev/null"), "fifo": tmp_path / "kern.pipe", "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    follower = file_follower(path, tmp_path / "file-cursor.json")
    with pytest.raises(ValueError, match=r'is not a log file: for /dev/kmsg set kernel_log.source = "kmsg"'):
        next(follower.messages())
