"""Planned events NodeMedic acts on later: a notice that comes long before its deadline waits
until ``PlannedLeadTimeHours`` before it (the job runs on meanwhile, and a fault on the node in
between is handled as any fault, since no incident is open for the notice).

``SHARDS`` items per cluster, ``DEFERRED#<cluster>`` and ``DEFERRED#<cluster>#<n>`` (n = 1..15),
an event in the one its id hashes to; each waiting event is one attribute of its item (its event
id), holding when to act and the event itself, so writers never overwrite each other (one ``SET``
or ``REMOVE`` of one attribute each). An item holds at most 400 KB (about 300 events), so a
cluster keeps about 4,800: a maintenance campaign AWS schedules across a large fleet waits whole.
An event whose item is full is not deferred but acted on at once. (One item, the first, held
them all before: it is still read.)
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from nodemedic.contracts.events import NodeHealthEvent


@dataclass(frozen=True)
class Deferred:
    act_at: datetime
    event: NodeHealthEvent


SHARDS = 16


class DeferredPlans:
    def __init__(self, client: Any, table: str, cluster: str) -> None:
        self._db = client
        self._table = table
        self._keys = [{"pk": {"S": f"DEFERRED#{cluster}" + (f"#{n}" if n else "")}} for n in range(SHARDS)]

    def _key(self, event_id: str) -> dict[str, dict[str, str]]:
        return self._keys[zlib.crc32(event_id.encode()) % SHARDS]

    def defer(self, event: NodeHealthEvent, act_at: datetime) -> bool:
        """Keep ``event`` until ``act_at``; False when its item is full (act on it now)."""
        try:
            self._db.update_item(TableName=self._table, Key=self._key(event.event_id), UpdateExpression="SET #e = :e",
                                 ExpressionAttributeNames={"#e": f"e:{event.event_id}"},
                                 ExpressionAttributeValues={":e": {"M": {
                                     "act_at": {"S": act_at.isoformat()},
                                     "event": {"S": event.model_dump_json(exclude_none=True)}}}})
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ValidationException" and "size" in str(exc).lower():
                return False
            raise
        if self._key(event.event_id) is not self._keys[0]:  # a copy the first item kept for an earlier version
            self.forget_from(self._keys[0], [event.event_id])
        return True

    def waiting(self) -> list[Deferred]:
        """Every waiting event, the nearest first (one consistent read per item)."""
        found = []
        for key in self._keys:
            item = self._db.get_item(TableName=self._table, Key=key, ConsistentRead=True).get("Item", {})
            found += [Deferred(datetime.fromisoformat(v["M"]["act_at"]["S"]),
                               NodeHealthEvent.model_validate(json.loads(v["M"]["event"]["S"])))
                      for name, v in item.items() if name.startswith("e:")]
        return sorted(found, key=lambda d: d.act_at)

    def forget(self, event_ids: list[str]) -> None:
        """Drop these events (published, or their window is over), from the item each hashes to
        and from the first (where one item held them all)."""
        ids = list(dict.fromkeys(event_ids))
        for key in self._keys:
            self.forget_from(key, [i for i in ids if key is self._keys[0] or self._key(i) is key])

    def forget_from(self, key: dict[str, dict[str, str]], event_ids: list[str]) -> None:
        for start in range(0, len(event_ids), 100):  # an expression names at most a few hundred attributes
            names = {f"#e{n}": f"e:{event_id}" for n, event_id in enumerate(event_ids[start:start + 100])}
            self._db.update_item(TableName=self._table, Key=key, UpdateExpression="REMOVE " + ", ".join(names),
                                 ExpressionAttributeNames=names)
