"""EC2's scheduled events for this instance (a retirement, a stop, a reboot or a maintenance),
read from instance metadata and sent to the pipeline's planned-events function.

``events/maintenance/scheduled`` holds the active ones and ``events/maintenance/history`` those
completed or canceled (EC2 User Guide, "Instance metadata categories"; "View scheduled events"),
each as ``{"Code", "Description", "EventId", "NotBefore", "NotAfter", "State"}`` with dates like
``21 Jan 2019 09:00:43 GMT``; a path with none answers 404. EC2 posts an event days to weeks
ahead. The pipeline hears of the same events from AWS Health and its own sweep of
``DescribeInstanceStatus``, except on a HyperPod node: its instance is in the service's account,
so only the node itself can read them.

The agent sends what it read (``EC2 Scheduled Events``, :mod:`nodemedic.contracts.scheduled_notice`)
when it differs from what it last sent (after it starts, when there is any), and again every
``intervals.scheduled_events_resend_seconds`` while an event is active: the planned-events function
plans the active events like its sweep's (the same event ids, deduplicated) and forgets a waiting
one that is completed or canceled since.
"""

from __future__ import annotations

import urllib.error
from collections.abc import Callable
from datetime import datetime, timezone

from nodemedic.contracts.problems import read_json
from nodemedic.contracts.scheduled_notice import MAX_EVENTS, ScheduledEvent

SCHEDULED = "events/maintenance/scheduled"
HISTORY = "events/maintenance/history"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def metadata_time(text: str) -> datetime:
    """``21 Jan 2019 09:00:43 GMT`` (instance metadata's dates), read without the locale's month
    names. Anything else is a ``ValueError``."""
    parts = text.split()
    if len(parts) != 5 or parts[4] != "GMT" or parts[1] not in _MONTHS:
        raise ValueError(f"not a date as instance metadata writes it: {text[:64]!r}")
    hour, minute, second = (int(p) for p in parts[3].split(":"))
    return datetime(int(parts[2]), _MONTHS.index(parts[1]) + 1, int(parts[0]), hour, minute, second, tzinfo=timezone.utc)


def _event(e: dict[str, object]) -> ScheduledEvent:
    return ScheduledEvent(code=str(e["Code"]), event_id=str(e["EventId"]), description=str(e.get("Description", "")),
                          not_before=metadata_time(str(e["NotBefore"])),
                          not_after=metadata_time(str(e["NotAfter"])) if e.get("NotAfter") else None,
                          state=str(e["State"]))


def _read(get: Callable[[str], str], path: str,
          event: Callable[[dict[str, object]], ScheduledEvent | None]) -> list[ScheduledEvent]:
    """The events at ``path``, each read by ``event`` (None: left out)."""
    try:
        text = get(path)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # no event of the kind
            return []
        raise
    if not text.strip():
        return []
    try:
        data = read_json(text)
        if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
            raise TypeError("not a list of objects")
        return [e for e in map(event, data) if e is not None]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # pydantic's ValidationError is a ValueError
        raise ValueError(f"{path} is not EC2's answer ({exc.__class__.__name__}): {text[:200]!r}") from exc


def _ended(e: dict[str, object]) -> ScheduledEvent | None:
    """An event of the history, or None for one that cannot be read (from before 2020, say): it
    only withdraws a copy still waiting, and an old one has none."""
    try:
        return _event(e)
    except (ValueError, TypeError, KeyError):
        return None


def read_scheduled(get: Callable[[str], str]) -> list[ScheduledEvent]:
    """This instance's active scheduled events, then its completed or canceled ones (the newest
    first, as many as a notice carries). ``get`` reads one metadata path; an answer that is not
    what EC2 documents is a ``ValueError``, an unreachable IMDS an ``OSError``."""
    active = _read(get, SCHEDULED, _event)  # every active event must be read: one that is not, is not EC2's answer
    ended = sorted(_read(get, HISTORY, _ended), key=lambda e: e.not_before, reverse=True)
    seen = {e.event_id for e in active}
    return (active + [e for e in ended if e.event_id not in seen])[:MAX_EVENTS]
