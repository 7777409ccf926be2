"""Fold a fault that repeats: the first occurrence is published at once; repeats within the
window are counted, and the next event for that fault after the window carries the count."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Seen:
    sent_at: float
    suppressed: int = 0


class Deduper:
    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[str, _Seen] = {}
        self._lock = threading.Lock()
        self.suppressed_total = 0

    def admit(self, key: str) -> int | None:
        """``None`` if ``key`` was published within the window (counted), else the count to publish."""
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen.sent_at < self.window_s:
                seen.suppressed += 1
                self.suppressed_total += 1
                return None
            count = 1 + (seen.suppressed if seen else 0)
            self._seen[key] = _Seen(now)
            if len(self._seen) > 4096:  # forget quiet faults; keep memory flat on a noisy node
                self._seen = {k: v for k, v in self._seen.items() if now - v.sent_at < self.window_s or v.suppressed}
            return count
