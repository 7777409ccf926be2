"""When did the fault happen, by a clock we can trust? And is the event too old to act on?

Every duration NodeMedic reports is measured from the fault's origin. The agent stamps
``observed_at`` and ``sent_at`` with the node's clock, which can be wrong (an RTC reset to 1970,
NTP not yet synchronised after boot, a node 10 minutes fast). EventBridge stamps ``time`` when
the event enters the bus: the server's clock. So:

- the node's clock is *plausible* when ``sent_at`` is within ``max_skew`` of the bus's ``time``;
  then the origin is ``observed_at`` (never later than the bus time);
- otherwise the node's own delay (``sent_at - observed_at``, which its clock measures correctly
  even when it is off) is taken back from the bus time: origin = ``time - delay``.

An event is *stale* when it entered the bus longer than ``max_age`` ago (a redelivery, a dead-letter
redrive or an archive replay of an old event), or when its fault predates the node's last
completed repair. A stale event is rejected with its reason: it never remediates a node twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

MAX_SKEW = timedelta(minutes=5)


@dataclass(frozen=True)
class Origin:
    at: datetime  # the fault's time on the server's clock: every duration starts here
    clock_skew_s: float  # node clock minus server clock (0 when the node was not asked)
    corrected: bool  # the node's clock was implausible and the origin was rebuilt from the bus time


def fault_origin(observed_at: datetime, sent_at: datetime | None, received_at: datetime,
                 max_skew: timedelta = MAX_SKEW) -> Origin:
    """The fault's origin on the server's clock (see the module doc)."""
    if sent_at is None:  # an alarm, a sweeper or an operator: server-side times already
        return Origin(min(observed_at, received_at), 0.0, False)
    skew = sent_at - received_at
    if abs(skew) <= max_skew:
        return Origin(min(observed_at, received_at), skew.total_seconds(), False)
    delay = max(timedelta(0), sent_at - observed_at)
    return Origin(received_at - delay, skew.total_seconds(), True)


def staleness(received_at: datetime, now: datetime, max_age: timedelta, origin: datetime,
              repaired_at: datetime | None) -> str | None:
    """Why the event must not act (None when it may): too old, or older than the last repair."""
    age = now - received_at
    if age > max_age:
        return (f"stale: the event entered the bus {age.total_seconds():.0f} s ago (limit "
                f"{max_age.total_seconds():.0f} s): a redelivery or replay, not a new fault")
    if repaired_at is not None and origin < repaired_at:
        return (f"stale: the fault ({origin.isoformat()}) predates the node's last completed repair "
                f"({repaired_at.isoformat()})")
    if received_at - now > MAX_SKEW:
        return f"the event's bus time {received_at.isoformat()} is in the future"
    return None
