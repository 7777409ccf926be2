"""Fold a fault that repeats: the first occurrence is published at once; repeats within the
window are counted, and the next event for that fault after the window carries the count.

The window is measured on the node's wall clock, so that it survives a restart. A clock that
stepped back (NTP correcting a clock that ran fast, an RTC set wrong) puts a remembered send in
the future: that memory is no longer evidence of anything, and the fault is published again
rather than folded until the clock catches up, which could be years.

With a state file the memory survives an agent restart, so a restarted agent does not report
again a condition that is still present (an ECC counter, a port that is still down)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from nodemedic.contracts.events import MAX_COUNT
from nodemedic.contracts.problems import read_json

log = logging.getLogger("nodemedic_agent.dedupe")


@dataclass
class _Seen:
    sent_at: float
    suppressed: int = 0


class Deduper:
    def __init__(self, window_s: float, clock: Callable[[], float] = time.time, state_file: Path | None = None) -> None:
        self.window_s = window_s
        self._clock = clock
        self._state_file = state_file
        self._seen: dict[str, _Seen] = {}
        self._lock = threading.Lock()
        self.suppressed_total = 0
        if state_file and state_file.exists():
            try:
                saved = read_json(state_file.read_text())
            except (OSError, ValueError):
                saved = {}  # a corrupt memory only costs one repeated event
            now = clock()
            for key, seen in (saved.items() if isinstance(saved, dict) else ()):
                sent_at, suppressed = (seen.get("sent_at"), seen.get("suppressed", 0)) if isinstance(seen, dict) else (0, 0)
                if (isinstance(sent_at, int | float) and type(suppressed) is int and suppressed >= 0
                        and self._within_window(now - sent_at)):
                    self._seen[key] = _Seen(float(sent_at), suppressed)

    def _within_window(self, elapsed: float) -> bool:
        return 0 <= elapsed < self.window_s  # negative: the clock stepped back since

    def _save(self) -> None:
        """Write the memory; a disk that refuses (read-only, full) only costs the memory across a
        restart: never the event being admitted, which may be the one that says the disk failed."""
        if self._state_file is None:
            return
        tmp = self._state_file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({k: asdict(v) for k, v in self._seen.items()}))
            os.replace(tmp, self._state_file)
        except OSError as exc:
            log.warning("the dedupe memory was not saved (%s): a restart may send a present fault again", exc)

    def admit(self, key: str) -> int | None:
        """``None`` if ``key`` was published within the window (counted), else the count to publish."""
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and self._within_window(now - seen.sent_at):
                seen.suppressed += 1
                self.suppressed_total += 1
                return None
            # a storm folds more than one event may say (an AER or Xid storm over a day's window): it
            # says the most, rather than fail the contract and be lost
            count = min(MAX_COUNT, 1 + (seen.suppressed if seen else 0))
            self._seen[key] = _Seen(now)
            if len(self._seen) > 4096:  # forget quiet faults; keep memory flat on a noisy node
                self._seen = {k: v for k, v in self._seen.items() if self._within_window(now - v.sent_at) or v.suppressed}
            self._save()
            return count
