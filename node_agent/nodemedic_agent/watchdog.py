"""Which of the agent's readings has not returned, and for how long.

A driver call can block and never return: NVML on a wedged GPU or driver (``nvidia-smi`` stuck in
the kernel, in D state: NVIDIA gpu-monitoring-tools issue #46), a stat of a file system that hangs.
The loop that made the call then reports nothing, while the heartbeat, on a thread of its own,
keeps telling the cloud that the node is fine (NVSentinel issue #1576: "Because the poll loop
itself is blocked, it cannot publish a health event"). So each reading says when it starts and
when it is done, and the heartbeat's thread asks which one has been running too long.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Stall:
    what: str  # the reading, as a person names it: "the gpu check"
    check: str  # the contract's Check that the reading serves: nvml, dcgm, efa, storage
    seconds: float  # how long it has run


class Watchdog:
    """The readings running now, each with the time it started (monotonic). Safe across threads:
    each reading is one dict entry, set and removed by the thread that runs it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._running: dict[str, tuple[str, float]] = {}

    @contextmanager
    def watching(self, what: str, check: str) -> Iterator[None]:
        self._running[what] = (check, self._clock())
        try:
            yield
        finally:
            self._running.pop(what, None)

    def stalls(self, longer_than: float) -> list[Stall]:
        """The readings that have run longer than ``longer_than`` seconds, longest first."""
        now = self._clock()
        running = list(self._running.items())  # a snapshot: the readings' threads change the dict
        return sorted((Stall(what, check, now - since) for what, (check, since) in running if now - since > longer_than),
                      key=lambda s: -s.seconds)


class Worker(Generic[T]):
    """``call`` on a daemon thread of its own, so that a call that never returns is left behind
    (it ends with the process) instead of holding up the thread that waits for it."""

    def __init__(self, call: Callable[[], T], name: str) -> None:
        self._outcome: list[T | BaseException] = []
        self._call = call
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._outcome.append(self._call())
        except BaseException as exc:  # noqa: BLE001 - raised again on the waiting thread
            self._outcome.append(exc)

    def wait(self, seconds: float) -> bool:
        """Whether the call has returned (or raised) within ``seconds``."""
        self._thread.join(seconds)
        return bool(self._outcome)

    def result(self) -> T:
        """What the call returned; what it raised is raised here. Only once :meth:`wait` is True."""
        outcome = self._outcome[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
