"""A durable on-disk queue of PutEvents entries: one file per event, written atomically, removed
only after EventBridge accepted the event. It survives network outages and agent restarts."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from nodemedic.contracts.problems import read_json

log = logging.getLogger("nodemedic_agent.spool")


class Spool:
    def __init__(self, directory: str | Path, max_events: int = 10000, max_dead: int = 1000) -> None:
        self.dir = Path(directory)
        self.dead_dir = self.dir / "dead"
        self.dead_dir.mkdir(parents=True, exist_ok=True)
        self.max_events = max_events
        self.max_dead = max_dead
        self.dropped = 0
        self._lock = threading.Lock()
        for tmp in self.dir.glob("*.tmp"):  # a write cut short by a crash never became an event
            try:
                tmp.unlink(missing_ok=True)
            except OSError as exc:  # a disk gone read-only: harmless, it is never read
                log.warning("could not delete %s (%s)", tmp, exc.strerror)
        self._names = sorted(p.name for p in self.dir.glob("ev-*.json"))
        self._last_stamp = max((_stamp(name) for name in self._names), default=0)

    def __len__(self) -> int:
        with self._lock:
            return len(self._names)

    def put(self, entry: dict[str, Any], key: str) -> None:
        with self._lock:  # names sort in the order of the puts, even after the clock stepped back
            self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
            name = f"ev-{self._last_stamp:020d}-{key}.json"
        tmp = self.dir / f"{name}.tmp"
        with tmp.open("w") as f:
            json.dump(entry, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / name)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with self._lock:
            self._names.append(name)
            while len(self._names) > self.max_events:  # bounded disk: the oldest go first
                oldest = self._names.pop(0)
                (self.dir / oldest).unlink(missing_ok=True)
                self.dropped += 1
                log.error("spool full (%d events): dropped the oldest, %s (%d dropped since start)",
                          self.max_events, oldest, self.dropped)

    def oldest(self, limit: int) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            names = self._names[:limit]
        out = []
        for name in names:
            try:
                entry = read_json((self.dir / name).read_text())
            except (OSError, ValueError):  # unreadable: set aside, never block the queue
                self.dead([name], "unreadable spool file")
                continue
            if not is_entry(entry):  # PutEvents would refuse the whole batch it is in, every time
                self.dead([name], "not a PutEvents entry")
                continue
            out.append((name, entry))
        return out

    def remove(self, names: list[str]) -> None:
        """Forget entries EventBridge accepted. A file the disk will not delete (it went read-only
        after the event was spooled) is forgotten all the same: sending it again at every attempt
        would never end. A restart sends it once more (at least once, deduplicated by its id)."""
        with self._lock:
            for name in names:
                try:
                    (self.dir / name).unlink(missing_ok=True)
                except OSError as exc:
                    log.error("sent, but its spool file could not be deleted (%s): %s", exc.strerror, name)
                if name in self._names:
                    self._names.remove(name)

    def dead(self, names: list[str], reason: str) -> None:
        """Move entries EventBridge will never accept aside, kept for inspection: the newest
        ``max_dead`` of them, so a source of bad entries cannot fill the disk."""
        with self._lock:
            for name in names:
                src = self.dir / name
                try:
                    if src.exists():
                        os.replace(src, self.dead_dir / name)
                        (self.dead_dir / f"{name}.reason").write_text(reason)
                except OSError as exc:  # a disk gone read-only: it is not sent again all the same
                    log.error("could not set %s aside (%s): %s", name, exc.strerror, reason)
                if name in self._names:
                    self._names.remove(name)
            try:
                set_aside = sorted(self.dead_dir.glob("ev-*.json"))
                for old in set_aside[:max(0, len(set_aside) - self.max_dead)]:  # bounded disk: the oldest go first
                    old.unlink(missing_ok=True)
                    old.with_name(f"{old.name}.reason").unlink(missing_ok=True)
            except OSError as exc:
                log.error("could not trim %s (%s)", self.dead_dir, exc.strerror)


ENTRY_FIELDS = ("Source", "DetailType", "Detail", "EventBusName")


def is_entry(entry: object) -> bool:
    """Whether ``entry`` is a PutEvents entry as the agent writes them (``events.entry``)."""
    return isinstance(entry, dict) and all(isinstance(entry.get(k), str) and entry[k] for k in ENTRY_FIELDS)


def _stamp(name: str) -> int:
    """The order stamp in a spool file's name (``ev-<stamp>-<key>.json``)."""
    stamp = name.split("-", 2)[1]
    return int(stamp) if stamp.isdigit() else 0
