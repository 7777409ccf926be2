"""Where the ``/dev/kmsg`` reader left off, kept across agent restarts: the sequence number of the
last record it handed on, and the boot it was read in (the kernel numbers its records from 0 again
at every boot, Documentation/ABI/testing/dev-kmsg). A restarted agent reads the records written
while it was down, not only the ones written after it started."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("nodemedic_agent.kernel_log")

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class KmsgCursor:
    boot_id: str
    seq: int


def current_boot_id() -> str:
    """This boot's id (random, new at every boot); "" where the kernel does not say."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def load_cursor(path: Path) -> KmsgCursor | None:
    """The saved cursor; None when there is none or it is unreadable (then the records are read
    by their age alone)."""
    try:
        saved = json.loads(path.read_text())
        cursor = KmsgCursor(str(saved["boot_id"]), int(saved["seq"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("the kernel log cursor %s is unreadable (%s): reading the records by their age", path, exc)
        return None
    return cursor if cursor.seq >= 0 else None


def save_cursor(path: Path, cursor: KmsgCursor) -> None:
    """Write the cursor atomically (OSError when the disk refuses)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(cursor)))
    os.replace(tmp, path)
