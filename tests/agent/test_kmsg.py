"""The /dev/kmsg reader against this machine's real kernel log (needs root to write a record). The
records written are plain markers, never fault-like text: a real agent on this machine must not see
a fault."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nodemedic_agent.checks.kernel_log import KMSG_RECORD, KernelLogFollower
from nodemedic_agent.checks.log_cursor import current_boot_id

pytestmark = pytest.mark.skipif(not os.access("/dev/kmsg", os.W_OK), reason="writing /dev/kmsg needs root")


def marker(name: str) -> str:
    return f"nodemedic agent test record {name} {uuid.uuid4()}"


def write(text: str) -> None:
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(text + "\n")


class Reader:
    """A follower read on a thread until it hands on ``until``."""

    def __init__(self, follower: KernelLogFollower) -> None:
        self.follower = follower
        self.seen: list[tuple[str, datetime]] = []
        self.until = ""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for message, observed in self.follower.messages():
            self.seen.append((message, observed))
            if self.until and self.until in message:
                self.follower.stop.set()
        self.done.set()

    def read_until(self, text: str) -> list[str]:
        """Write ``text`` (once the reader has caught up) and read until it comes."""
        time.sleep(0.3)
        self.until = text
        write(text)
        self.thread.join(timeout=10)
        self.follower.stop.set()
        assert self.done.is_set(), "the reader did not stop"
        return [m for m, _ in self.seen]


def kernel_lag() -> float:
    """How far the kernel's record clock runs behind CLOCK_MONOTONIC on this machine (seconds;
    negative: ahead): the two drift apart with uptime (the kernel's is not slewed by NTP), and a
    replayed record's age is read against the one from the other."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.lseek(fd, 0, os.SEEK_END)
        probe = marker("clock probe")
        before = time.monotonic()
        write(probe)
        after = time.monotonic()
        while True:
            m = KMSG_RECORD.match(os.read(fd, 8192).decode(errors="replace"))
            if m and probe in m.group(4):
                return (before + after) / 2 - int(m.group(3)) / 1e6
    finally:
        os.close(fd)


def follower(cursor: Path | None = None, replay_seconds: float = 0) -> KernelLogFollower:
    return KernelLogFollower("kmsg", "/dev/kmsg", threading.Event(), cursor_file=cursor, replay_seconds=replay_seconds)


def test_the_kmsg_reader_without_a_cursor_sees_a_new_kernel_record_and_not_the_old_ones() -> None:
    reader = Reader(follower())
    seen = reader.read_until(marker("new"))
    assert not any("Linux version" in m for m in seen)  # history before the start is skipped
    assert reader.follower.stats.skipped == 0 and reader.follower.stats.replayed == 0


def test_a_record_written_while_the_agent_was_down_is_read_at_its_restart_dated_when_it_was_written(
        tmp_path: Path) -> None:
    """The one-off message of a fault (an Xid) written while the agent restarted was lost: the
    reader skipped to the end of the log."""
    cursor = tmp_path / "kmsg-cursor.json"
    before = marker("before")
    first = Reader(follower(cursor, 3600))
    assert before in first.read_until(before)
    saved = json.loads(cursor.read_text())
    assert saved["boot_id"] == current_boot_id()

    down = marker("while down")
    written = datetime.now(UTC)
    write(down)
    time.sleep(1.5)  # the agent is still down
    second = Reader(follower(cursor, 3600))
    after = marker("after")
    seen = second.read_until(after)
    assert down in seen and after in seen
    assert before not in seen  # handed on before the restart: not again
    observed = next(at for m, at in second.seen if down in m)
    # when it was written (as the kernel's clock has it), not when it was read 1.5 s later
    assert abs((observed - written).total_seconds() + kernel_lag()) < 0.5
    assert second.follower.stats.replayed >= 1


def test_a_record_older_than_replay_seconds_is_counted_not_read(tmp_path: Path) -> None:
    """A cursor from another boot (or none) replays this boot's records by their age alone."""
    cursor = tmp_path / "kmsg-cursor.json"
    cursor.write_text(json.dumps({"boot_id": "another boot", "seq": 10**12}))
    lag = kernel_lag()
    replay_seconds = max(0.1, 1.0 + lag)  # a record's age as the reader sees it is its true age + lag
    old = marker("old")
    write(old)
    time.sleep(replay_seconds - lag + 1.0)
    recent = marker("recent")
    write(recent)
    reader = Reader(follower(cursor, replay_seconds))
    live = marker("live")
    seen = reader.read_until(live)
    assert recent in seen and live in seen and old not in seen
    assert reader.follower.stats.expired >= 1


def test_an_idle_kernel_log_does_not_rewrite_the_cursor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cursor is written when the reader has gone on, at most once a second: not at every idle
    second of a quiet node (a disk write a second on every node, for nothing)."""
    import nodemedic_agent.checks.kernel_log as kernel_log

    saves: list[int] = []
    real_save = kernel_log.save_cursor

    def counting(path: Path, cursor: kernel_log.KmsgCursor) -> None:
        saves.append(cursor.seq)
        real_save(path, cursor)

    monkeypatch.setattr(kernel_log, "save_cursor", counting)
    reader = Reader(follower(tmp_path / "kmsg-cursor.json", 3600))
    time.sleep(3.5)  # the backlog read, then idle seconds
    reader.read_until(marker("end"))
    assert saves, "the cursor was never saved"
    assert all(a != b for a, b in zip(saves, saves[1:], strict=False)), saves  # each save is a new position
