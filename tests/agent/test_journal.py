"""The kernel log watcher's journal source against the real journalctl, reading a real journal.

No journald runs here, so the journal is written as journald would write it: Debian's
``systemd-journal-remote`` turns entries in the journal export format (systemd.io,
"Journal Export Formats") into journal files, and a ``journalctl`` on PATH runs the real one on
that directory (``--directory``). Everything else is journalctl's own: the ``-k`` (this boot's
kernel messages) filter, the JSON output, ``--cursor`` and ``--since``, following the file
as it grows, and what it refuses."""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nodemedic_agent.checks.kernel_log import KernelLogEndedError, KernelLogFollower
from nodemedic_agent.checks.log_cursor import current_boot_id

from tests.agent.test_kernel_log_follower import codes, follow, take
from tests.conftest import require

JOURNAL_REMOTE = Path("/lib/systemd/systemd-journal-remote")
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2749, name=python3, GPU has fallen off the bus."
XID_154 = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"


@dataclass(frozen=True)
class Entry:
    message: str | bytes
    at: float  # when journald received it (seconds since the epoch)
    boot: str = ""  # this boot's when empty
    transport: str = "kernel"


class Journal:
    """A journal directory, written through systemd-journal-remote, read through journalctl."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.boot = current_boot_id().replace("-", "")
        self._monotonic = 1_000_000

    def write(self, *entries: Entry, file: str = "remote.journal") -> None:
        """Append ``entries`` to a journal file, as journald appends what it receives (a file of
        another name: as journald starts a new one when it rotates)."""
        export = b"".join(self._export(e) for e in entries)
        done = subprocess.run([str(JOURNAL_REMOTE), f"--output={self.directory / file}", "-"],
                              input=export, capture_output=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr.decode(errors="replace")

    def _export(self, e: Entry) -> bytes:
        self._monotonic += 1000
        fields = [f"__REALTIME_TIMESTAMP={int(e.at * 1e6)}", f"__MONOTONIC_TIMESTAMP={self._monotonic}",
                  f"_BOOT_ID={e.boot or self.boot}", f"_TRANSPORT={e.transport}", "SYSLOG_IDENTIFIER=kernel"]
        text = b"".join(f.encode() + b"\n" for f in fields)
        data = e.message if isinstance(e.message, bytes) else e.message.encode()
        if not all(32 <= b < 127 for b in data):
            # a binary field: its name, a newline, its length (64-bit little-endian), the bytes
            return text + b"MESSAGE\n" + struct.pack("<Q", len(data)) + data + b"\n\n"
        return text + b"MESSAGE=" + data + b"\n\n"


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Journal:
    real = shutil.which("journalctl")
    require("systemd-journal-remote (make journal)",
            None if JOURNAL_REMOTE.exists() and real else f"no {JOURNAL_REMOTE} or journalctl here")
    directory = tmp_path / "journal"
    directory.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "journalctl"
    shim.write_text(f'#!/bin/sh\nexec {real} --directory={directory} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return Journal(directory)


@pytest.fixture
def stopped() -> Iterator[threading.Event]:
    stop = threading.Event()
    yield stop
    stop.set()


def test_the_backlog_is_this_boots_kernel_messages_of_the_replay_window_each_read_whole(
        journal: Journal, stopped: threading.Event, tmp_path: Path) -> None:
    """At a start without a cursor the agent reads the last ``replay_seconds``: not an older
    message, not another boot's, not a service's (``-k``). A message that is not valid UTF-8 comes
    as an array of bytes, one over 4 KB only with ``--all``: both are read, not lost."""
    now = time.time()
    long = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=" + "x" * 5000 + ", GPU has fallen off the bus."
    journal.write(Entry(XID_79, now - 7200),  # older than the window
                  Entry(XID_79, now - 60, boot=uuid.uuid4().hex),  # another boot's
                  Entry(XID_79, now - 50, transport="stdout"),  # a service's, not the kernel's
                  Entry(b"usb 1-1: Manufacturer: Caf\xe9 \xff", now - 40),
                  Entry(long, now - 30),
                  Entry(XID_154, now - 20))
    follower = KernelLogFollower("journal", "", stopped, cursor_file=tmp_path / "cursor.json", replay_seconds=3600)
    seen, reader = follow(follower)
    got = take(seen, 3)
    stopped.set()
    reader.join(timeout=10)
    assert got[0] == "usb 1-1: Manufacturer: Caf\ufffd \ufffd" and got[1] == long
    assert codes(got) == [None, "XID 79", "XID154_NODE_REBOOT"]  # type: ignore[arg-type]
    assert seen.empty() and not reader.is_alive() and follower.stats.skipped == 0


def test_a_restart_reads_what_came_while_the_agent_was_down_once_and_follows_what_comes_after(
        journal: Journal, tmp_path: Path) -> None:
    cursor = tmp_path / "cursor.json"
    journal.write(Entry("before", time.time() - 10))
    first = KernelLogFollower("journal", "", threading.Event(), cursor_file=cursor, replay_seconds=3600)
    seen, reader = follow(first)
    assert take(seen, 1) == ["before"]
    journal.write(Entry(XID_79, time.time()), Entry("a burst's second", time.time()))
    assert take(seen, 2) == [XID_79, "a burst's second"]  # followed, the burst at once
    first.stop.set()
    reader.join(timeout=10)
    assert json.loads(cursor.read_text())["cursor"].startswith("s=")  # journalctl's own cursor

    journal.write(Entry(XID_154, time.time()))  # while the agent was down
    second = KernelLogFollower("journal", "", threading.Event(), cursor_file=cursor, replay_seconds=3600)
    seen, reader = follow(second)
    assert take(seen, 1) == [XID_154]
    journal.write(Entry("after the restart", time.time()))
    assert take(seen, 1) == ["after the restart"]
    second.stop.set()
    reader.join(timeout=10)
    assert seen.empty()  # nothing read twice


def test_a_cursor_from_the_last_boot_reads_this_boots_messages_its_first_too(
        journal: Journal, tmp_path: Path) -> None:
    """The agent stopped with the node, which booted again: ``-k`` is this boot's messages only,
    and the agent reads them (those of the replay window). It passed the cursor of the last boot's entry
    with ``--after-cursor``, and journalctl 252 skips one entry after the place it seeks to, taking
    it for the cursor's own: this boot's first message was lost (on a whole journal the kernel's
    banner; where the journal starts later in the boot, any message)."""
    cursor = tmp_path / "cursor.json"
    last_boot = uuid.uuid4().hex
    journal.write(Entry("last boot's", time.time() - 600, boot=last_boot))
    first = KernelLogFollower("journal", "", threading.Event(), cursor_file=cursor, replay_seconds=3600)
    journal_cursor = subprocess.run(["journalctl", "-o", "json", "-n", "1"], capture_output=True, check=True,
                                    text=True, timeout=30).stdout
    cursor.write_text(json.dumps({"cursor": json.loads(journal_cursor)["__CURSOR"]}))
    banner = "Linux version 6.1.158-180.294.amzn2023.x86_64 (mockbuild@ip-10-0-1-17) #1 SMP"
    journal.write(Entry(banner, time.time() - 6), Entry(XID_79, time.time() - 5))
    seen, reader = follow(first)
    assert take(seen, 2) == [banner, XID_79]
    first.stop.set()
    reader.join(timeout=10)
    assert seen.empty()


def test_a_cursor_whose_entry_journald_vacuumed_loses_nothing_written_after_it(
        journal: Journal, tmp_path: Path) -> None:
    """journald deletes its oldest files for space or age (``SystemMaxUse``, ``MaxRetentionSec``);
    the cursor the agent saved may name an entry of such a file. journalctl 252 then seeks to the
    next entry and, with ``--after-cursor``, skips it too, taking it for the cursor's own: the first
    message written while the agent was down was lost (here the Xid)."""
    cursor = tmp_path / "cursor.json"
    journal.write(Entry("before", time.time() - 10), file="old.journal")
    first = KernelLogFollower("journal", "", threading.Event(), cursor_file=cursor, replay_seconds=3600)
    seen, reader = follow(first)
    assert take(seen, 1) == ["before"]
    first.stop.set()
    reader.join(timeout=10)

    journal.write(Entry(XID_79, time.time()), Entry("the next", time.time()))  # while the agent was down
    (journal.directory / "old.journal").unlink()  # vacuumed
    second = KernelLogFollower("journal", "", threading.Event(), cursor_file=cursor, replay_seconds=3600)
    seen, reader = follow(second)
    assert take(seen, 2) == [XID_79, "the next"]
    second.stop.set()
    reader.join(timeout=10)
    assert seen.empty()


def test_a_cursor_journalctl_refuses_is_forgotten_and_the_journal_read_by_age(
        journal: Journal, tmp_path: Path) -> None:
    """journalctl exits at once on a cursor it cannot seek to ("Failed to seek to cursor"). The
    agent restarted its source with the same cursor every 30 s, and the kernel log went unread for
    good (until a person deleted the file). Now the cursor is forgotten, and the next start reads
    the last ``replay_seconds``."""
    cursor = tmp_path / "cursor.json"
    cursor.write_text(json.dumps({"cursor": f"b={journal.boot};not a journal cursor"}))
    journal.write(Entry(XID_79, time.time() - 5))
    follower = KernelLogFollower("journal", "", threading.Event(), cursor_file=cursor, replay_seconds=3600)
    seen, reader = follow(follower)
    [ended] = take(seen, 1)
    reader.join(timeout=10)
    assert isinstance(ended, KernelLogEndedError) and "exit status 1" in str(ended)
    assert not cursor.exists()

    seen, reader = follow(follower)  # the agent's loop starts the source again
    assert take(seen, 1) == [XID_79]
    follower.stop.set()
    reader.join(timeout=10)
    assert json.loads(cursor.read_text())["cursor"].startswith("s=")  # a cursor of journalctl's own again
