"""NodeMedic's own health events (a silent or slow node, a planned change, a held node's burn-in)
put on its bus, each under the source of the function that saw it; Detect opens the incident."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from nodemedic.contracts.events import HEALTH_DETAIL_TYPE, NodeHealthEvent
from nodemedic.errors import PublishFailedError

PUT_EVENTS_BATCH = 10  # PutEvents takes at most 10 entries per call


def put_health_events(events_client: Any, bus: str, source: str, events: Sequence[NodeHealthEvent]) -> list[str | None]:
    """Put ``events`` on ``bus``: for each, in order, None when EventBridge took it, else why not.

    PutEvents can take some entries of a call and fail others (each failed entry carries an
    ``ErrorCode``: ``ThrottlingException`` and ``InternalFailure`` are retryable; EventBridge API
    reference, PutEventsResultEntry), and a whole call can fail once the SDK's retries are spent:
    the caller resends what failed, nothing else (https://docs.aws.amazon.com/eventbridge/latest/
    userguide/eb-putevents.html, "Handling failures with PutEvents")."""
    entries = [{"Source": source, "DetailType": HEALTH_DETAIL_TYPE, "EventBusName": bus,
                "Detail": e.model_dump_json(exclude_none=True)} for e in events]
    errors: list[str | None] = []
    for start in range(0, len(entries), PUT_EVENTS_BATCH):
        batch = entries[start:start + PUT_EVENTS_BATCH]
        try:
            results = events_client.put_events(Entries=batch)["Entries"]
        except (ClientError, BotoCoreError) as exc:
            errors += [f"PutEvents failed: {exc}"] * len(batch)
            continue
        errors += [f"{r['ErrorCode']}: {r.get('ErrorMessage', '')}" if r.get("ErrorCode") else None for r in results]
    return errors


def publish_health_events(events_client: Any, bus: str, source: str, events: Sequence[NodeHealthEvent]) -> None:
    """Put ``events`` on ``bus``; raises :class:`PublishFailedError` when EventBridge refuses any
    (a retried call is safe: Detect deduplicates what was put already)."""
    errors = [e for e in put_health_events(events_client, bus, source, events) if e]
    if errors:
        raise PublishFailedError(f"{len(errors)} of {len(events)} {source} events were not put on the bus: {errors[0]}")
