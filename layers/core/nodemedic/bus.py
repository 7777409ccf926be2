"""NodeMedic's own health events (a planned change, a held node's burn-in) put on its bus, each
under the source of the function that saw it; Detect opens the incident."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nodemedic.contracts.events import HEALTH_DETAIL_TYPE, NodeHealthEvent
from nodemedic.errors import PublishFailedError

PUT_EVENTS_BATCH = 10  # PutEvents takes at most 10 entries per call


def publish_health_events(events_client: Any, bus: str, source: str, events: Sequence[NodeHealthEvent]) -> None:
    """Put ``events`` on ``bus``; raises :class:`PublishFailedError` when EventBridge refuses any
    (a retried call is safe: Detect deduplicates what was put already)."""
    entries = [{"Source": source, "DetailType": HEALTH_DETAIL_TYPE, "EventBusName": bus,
                "Detail": e.model_dump_json(exclude_none=True)} for e in events]
    for start in range(0, len(entries), PUT_EVENTS_BATCH):
        batch = entries[start:start + PUT_EVENTS_BATCH]
        failed = events_client.put_events(Entries=batch).get("FailedEntryCount", 0)
        if failed:
            raise PublishFailedError(f"{failed} of {len(batch)} {source} entries were not put on the bus")
