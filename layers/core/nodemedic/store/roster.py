"""The heartbeat roster of one cluster, in the ledger table.

A head item ``HEARTBEATS#<cluster>`` holds a version and the number of shards; each shard
``HEARTBEATS#<cluster>#<n>`` holds as many nodes as fit in ``SHARD_BYTES`` of JSON, under
DynamoDB's 400 KB item limit. A node takes 200 to 1,400 bytes: its names (an EKS host name of 42
characters, used as its node name too, takes twice that) and up to ten performance samples. A
count of nodes per shard (it was 1,000) put a fleet with long names over the limit: DynamoDB
refused the shard, and every sweep failed, so no silent node was found at all.
A sweep reads the roster once and writes it once, so the DynamoDB bill grows with the number of
sweeps, not with the number of heartbeats. The head is written first, conditional on the version
read, so a second sweeper that lost the race writes nothing.

The head also holds when the heartbeat queue was last read dry (``read_until``: silence is judged
up to then, never past heartbeats still unread) and the lease of the sweep under way
(``sweeping_until``): a sweep that finds another one under way skips, rather than take half of
the queue's heartbeats and judge silence without the other half.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from nodemedic.domain.silence import Roster
from nodemedic.store.ledger import condition_failed

SHARD_BYTES = 350_000  # a shard's JSON: 400 KB (409,600 bytes) less room for its key and attribute names


def shards(roster: Roster) -> list[str]:
    """The roster as JSON objects of at most ``SHARD_BYTES`` each (UTF-8), cut in instance id order.
    Each node's entry is serialized once: the text that is measured is the text that is stored."""
    texts: list[str] = []
    members: list[str] = []
    size = 2  # the braces
    for instance in sorted(roster):
        member = f"{json.dumps(instance)}:{json.dumps(roster[instance], separators=(',', ':'))}"
        cost = len(member.encode()) + 1  # with its comma
        if members and size + cost > SHARD_BYTES:
            texts.append("{" + ",".join(members) + "}")
            members, size = [], 2
        members.append(member)
        size += cost
    return [*texts, "{" + ",".join(members) + "}"] if members else texts


class RosterConflictError(Exception):
    """Another sweeper saved the roster since we read it, or is sweeping now."""


@dataclass(frozen=True)
class RosterHead:
    version: int = 0
    read_until: datetime | None = None  # the start of the last sweep that read the heartbeat queue dry


class RosterStore:
    def __init__(self, client: Any, table: str, cluster: str) -> None:
        self._db = client
        self._table = table
        self._pk = f"HEARTBEATS#{cluster}"

    def _key(self, shard: int | None = None) -> dict[str, Any]:
        return {"pk": {"S": self._pk if shard is None else f"{self._pk}#{shard}"}}

    def claim(self, now: datetime, hold: timedelta) -> datetime:
        """Take the lease of the sweep (until ``now + hold``, or until :meth:`save`); raise
        :class:`RosterConflictError` while another sweep holds it. Returns the lease, for :meth:`release`."""
        until = now + hold
        try:
            self._db.update_item(
                TableName=self._table, Key=self._key(), UpdateExpression="SET sweeping_until = :until",
                ConditionExpression="attribute_not_exists(sweeping_until) OR sweeping_until < :now",
                ExpressionAttributeValues={":until": {"S": until.isoformat()}, ":now": {"S": now.isoformat()}})
        except ClientError as exc:
            if condition_failed(exc):
                raise RosterConflictError("another sweep is under way") from exc
            raise
        return until

    def release(self, lease: datetime) -> None:
        """Give the lease back (a sweep that ended without :meth:`save`), if it is still ours."""
        try:
            self._db.update_item(TableName=self._table, Key=self._key(), UpdateExpression="REMOVE sweeping_until",
                                 ConditionExpression="sweeping_until = :until",
                                 ExpressionAttributeValues={":until": {"S": lease.isoformat()}})
        except ClientError as exc:
            if not condition_failed(exc):
                raise

    def load(self) -> tuple[Roster, RosterHead]:
        head = self._db.get_item(TableName=self._table, Key=self._key(), ConsistentRead=True).get("Item")
        if not head or "version" not in head:  # none yet, or only a lease
            return {}, RosterHead()
        roster: Roster = {}
        keys = [self._key(n) for n in range(int(head["shards"]["N"]))]
        for i in range(0, len(keys), 100):
            request = {self._table: {"Keys": keys[i:i + 100], "ConsistentRead": True}}
            while request:
                resp = self._db.batch_get_item(RequestItems=request)
                for item in resp["Responses"].get(self._table, []):
                    roster.update(json.loads(item["nodes"]["S"]))
                request = resp.get("UnprocessedKeys") or {}
        read_until = head.get("read_until", {}).get("S")
        return roster, RosterHead(int(head["version"]["N"]), datetime.fromisoformat(read_until) if read_until else None)

    def save(self, roster: Roster, head: RosterHead) -> None:
        """Write the roster read at ``head`` (its version), and ``head.read_until``; it ends the lease."""
        parts = shards(roster)
        item = {**self._key(), "version": {"N": str(head.version + 1)}, "shards": {"N": str(len(parts))},
                **({"read_until": {"S": head.read_until.isoformat()}} if head.read_until else {})}
        try:
            self._db.put_item(
                TableName=self._table, Item=item,
                ConditionExpression="attribute_not_exists(version) OR version = :v",
                ExpressionAttributeValues={":v": {"N": str(head.version)}},
            )
        except ClientError as exc:
            if condition_failed(exc):
                raise RosterConflictError("the heartbeat roster changed while this sweep ran") from exc
            raise
        for n, nodes in enumerate(parts):
            self._db.put_item(TableName=self._table, Item={**self._key(n), "nodes": {"S": nodes}})
