"""Planned events NodeMedic acts on later: a notice that comes long before its deadline waits
until ``PlannedLeadTimeHours`` before it (the job runs on meanwhile, and a fault on the node in
between is handled as any fault, since no incident is open for the notice).

One item per cluster, ``DEFERRED#<cluster>``; each waiting event is one attribute of it (its
event id), holding when to act and the event itself, so writers never overwrite each other (one
``SET`` or ``REMOVE`` of one attribute each). An item holds at most 400 KB (about 300 events):
an event that does not fit is not deferred but acted on at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from nodemedic.contracts.events import NodeHealthEvent


@dataclass(frozen=True)
class Deferred:
    act_at: datetime
    event: NodeHealthEvent


class DeferredPlans:
    def __init__(self, client: Any, table: str, cluster: str) -> None:
        self._db = client
        self._table = table
        self._key = {"pk": {"S": f"DEFERRED#{cluster}"}}

    def defer(self, event: NodeHealthEvent, act_at: datetime) -> bool:
        """Keep ``event`` until ``act_at``; False when the item is full (act on it now)."""
        try:
            self._db.update_item(TableName=self._table, Key=self._key, UpdateExpression="SET #e = :e",
                                 ExpressionAttributeNames={"#e": f"e:{event.event_id}"},
                                 ExpressionAttributeValues={":e": {"M": {
                                     "act_at": {"S": act_at.isoformat()},
                                     "event": {"S": event.model_dump_json(exclude_none=True)}}}})
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ValidationException" and "size" in str(exc).lower():
                return False
            raise
        return True

    def waiting(self) -> list[Deferred]:
        item = self._db.get_item(TableName=self._table, Key=self._key, ConsistentRead=True).get("Item", {})
        found = [Deferred(datetime.fromisoformat(v["M"]["act_at"]["S"]),
                          NodeHealthEvent.model_validate(json.loads(v["M"]["event"]["S"])))
                 for name, v in item.items() if name.startswith("e:")]
        return sorted(found, key=lambda d: d.act_at)

    def forget(self, event_ids: list[str]) -> None:
        """Drop these events (published, or their window is over)."""
        for start in range(0, len(event_ids), 100):  # an expression names at most a few hundred attributes
            chunk = event_ids[start:start + 100]
            names = {f"#e{n}": f"e:{event_id}" for n, event_id in enumerate(chunk)}
            self._db.update_item(TableName=self._table, Key=self._key, UpdateExpression="REMOVE " + ", ".join(names),
                                 ExpressionAttributeNames=names)
