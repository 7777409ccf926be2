"""Where the kernel log reader left off, kept across agent restarts, so that a restarted agent
reads the messages written while it was down, not only the ones written after it started:

- ``/dev/kmsg``: the sequence number of the last record handed on, and the boot it was read in
  (the kernel numbers its records from 0 again at every boot, Documentation/ABI/testing/dev-kmsg);
- the journal: the last entry's cursor, which journalctl seeks to (``--cursor``; that entry is passed over);
- a log file: which file (its device and inode: logrotate moves a file away and creates a new
  one under its name) and the byte offset after the last line handed on."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from nodemedic.contracts.problems import read_json

log = logging.getLogger("nodemedic_agent.kernel_log")

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class KmsgCursor:
    boot_id: str
    seq: int

    @classmethod
    def from_json(cls, saved: dict[str, Any]) -> KmsgCursor:
        if not isinstance(saved["seq"], int) or saved["seq"] < 0:
            raise ValueError(f"seq {saved['seq']!r} is no record's sequence number")
        return cls(str(saved["boot_id"]), saved["seq"])


@dataclass(frozen=True)
class JournalCursor:
    cursor: str

    @classmethod
    def from_json(cls, saved: dict[str, Any]) -> JournalCursor:
        if not isinstance(saved["cursor"], str) or not saved["cursor"] or "\n" in saved["cursor"]:
            raise ValueError("no journal cursor")
        return cls(saved["cursor"])

    @property
    def _items(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.cursor.split(";") if "=" in item)

    @property
    def boot_id(self) -> str:
        """The boot of the entry it names (its ``b=`` item, 32 hex digits), "" where it says none."""
        return self._items.get("b", "").replace("-", "").lower()

    def names(self, position: str) -> bool:
        """Whether ``position`` (an entry's ``__CURSOR``) is the entry this cursor names: the same
        text, or the same sequence number in the same journal file series (its ``s=`` and ``i=``
        items, sd_journal_get_cursor(3)), however the rest is written."""
        if position == self.cursor:
            return True
        mine, theirs = self._items, JournalCursor(position)._items
        return bool(mine.get("s") and mine.get("i")) and (mine.get("s"), mine.get("i")) == (theirs.get("s"), theirs.get("i"))


@dataclass(frozen=True)
class FileCursor:
    device: int
    inode: int
    offset: int

    @classmethod
    def from_json(cls, saved: dict[str, Any]) -> FileCursor:
        values = (saved["device"], saved["inode"], saved["offset"])
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ValueError(f"{values!r} is no position in a file")
        return cls(*values)

    def names(self, st: os.stat_result) -> bool:
        """Whether the file ``st`` describes is the one this cursor is in."""
        return (self.device, self.inode) == (st.st_dev, st.st_ino)


Cursor = KmsgCursor | JournalCursor | FileCursor
C = TypeVar("C", KmsgCursor, JournalCursor, FileCursor)


def current_boot_id() -> str:
    """This boot's id (random, new at every boot); "" where the kernel does not say."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def load_cursor(path: Path, parse: Callable[[dict[str, Any]], C]) -> C | None:
    """The saved cursor; None when there is none or it is unreadable (then the messages are read
    by their age alone)."""
    try:
        return parse(read_json(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("the kernel log cursor %s is unreadable (%s): reading the messages by their age", path, exc)
        return None


def save_cursor(path: Path, cursor: Cursor) -> None:
    """Write the cursor atomically (OSError when the disk refuses)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(cursor)))
    os.replace(tmp, path)
