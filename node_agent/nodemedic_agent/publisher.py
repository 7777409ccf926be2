"""PutEvents with batching (10 entries / 256 KB), jittered exponential backoff and the spool.

Delivery is at least once: an entry leaves the spool only after EventBridge returned an
EventId for it. Every health event carries a unique ``event_id`` for consumers to dedupe.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from nodemedic_agent.spool import Spool

log = logging.getLogger("nodemedic_agent.publisher")

MAX_ENTRIES = 10
MAX_BATCH_BYTES = 256 * 1024
RETRYABLE_ENTRY_ERRORS = {"InternalFailure", "ThrottlingException", "ServiceUnavailable", "InternalException"}


def entry_size(entry: dict[str, Any]) -> int:
    """EventBridge's size of one PutEvents entry (its published calculation)."""
    size = 14 if entry.get("Time") else 0
    for key in ("Source", "DetailType", "Detail"):
        size += len(str(entry.get(key, "")).encode())
    return size + sum(len(r.encode()) for r in entry.get("Resources", []))


def batches(entries: list[tuple[str, dict[str, Any]]]) -> list[list[tuple[str, dict[str, Any]]]]:
    out: list[list[tuple[str, dict[str, Any]]]] = [[]]
    size = 0
    for item in entries:
        n = entry_size(item[1])
        if out[-1] and (len(out[-1]) == MAX_ENTRIES or size + n > MAX_BATCH_BYTES):
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return [b for b in out if b]


@dataclass
class PublishStats:
    sent: int = 0
    calls: int = 0
    failed_calls: int = 0
    dead: int = 0


class Publisher:
    def __init__(self, client: Any, spool: Spool, max_backoff_s: float = 30.0, base_backoff_s: float = 0.2,
                 on_sent: Callable[[list[dict[str, Any]]], None] | None = None,
                 sending: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self.client = client
        self.spool = spool
        self.sending = sending or (lambda entry: entry)  # a spooled entry as it leaves now (its send time)
        self.max_backoff_s = max_backoff_s
        self.base_backoff_s = base_backoff_s
        self.on_sent = on_sent
        self.stats = PublishStats()
        self.last_error = ""
        self._wake = threading.Condition()
        self._attempt = 0

    def submit(self, entry: dict[str, Any], key: str) -> None:
        """Spool the entry durably, then wake the sender."""
        self.spool.put(entry, key)
        with self._wake:
            self._wake.notify()

    def send_direct(self, entries: list[dict[str, Any]]) -> bool:
        """One attempt, no spool (heartbeats: a late heartbeat is worth nothing)."""
        try:
            resp = self._put(entries)
        except (BotoCoreError, ClientError) as exc:
            self.last_error = str(exc)
            return False
        return not resp.get("FailedEntryCount")

    def _put(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        self.stats.calls += 1
        try:
            return dict(self.client.put_events(Entries=entries))
        except (BotoCoreError, ClientError):
            self.stats.failed_calls += 1
            raise

    def deliver_once(self) -> bool:
        """Send what the spool holds, in order. True when the spool is now empty."""
        pending = [(name, self.sending(entry)) for name, entry in self.spool.oldest(MAX_ENTRIES * 10)]
        for batch in batches(pending):
            names = [name for name, _ in batch]
            entries = [entry for _, entry in batch]
            try:
                resp = self._put(entries)
            except (BotoCoreError, ClientError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("PutEvents failed (%s); %d events kept in the spool", self.last_error, len(self.spool))
                return False
            done, retry = [], False
            for name, entry, result in zip(names, entries, resp.get("Entries", []), strict=False):
                code = result.get("ErrorCode")
                if not code:
                    done.append((name, entry))
                elif code in RETRYABLE_ENTRY_ERRORS:
                    retry = True
                else:
                    log.error("EventBridge rejected a spooled event for good (%s: %s); moved to %s",
                              code, result.get("ErrorMessage"), self.spool.dead_dir)
                    self.spool.dead([name], f"{code}: {result.get('ErrorMessage')}")
                    self.stats.dead += 1
            self.spool.remove([name for name, _ in done])
            self.stats.sent += len(done)
            if done and self.on_sent:
                self.on_sent([entry for _, entry in done])
            if retry:
                self.last_error = "some entries failed with a retryable error"
                return False
        return len(self.spool) == 0

    def backoff(self) -> float:
        """Full-jitter exponential backoff for the next attempt."""
        self._attempt += 1
        return random.uniform(0, min(self.max_backoff_s, self.base_backoff_s * 2 ** self._attempt))

    def run(self, stop: threading.Event) -> None:
        """The sender loop: deliver as soon as something is spooled; back off while failing."""
        while not stop.is_set():
            with self._wake:
                if len(self.spool) == 0:
                    self._wake.wait(1.0)
            if len(self.spool) == 0:
                continue
            if self.deliver_once():
                self._attempt = 0
            elif len(self.spool):
                stop.wait(self.backoff())

    def wake(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def flush(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while len(self.spool):
            if self.deliver_once():
                return True
            if time.monotonic() + 0.5 > deadline:
                return False
            time.sleep(min(0.5, self.backoff()))
        return True
