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
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from nodemedic.domain.silence import Roster

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
    """Another sweeper saved the roster since we read it."""


class RosterStore:
    def __init__(self, client: Any, table: str, cluster: str) -> None:
        self._db = client
        self._table = table
        self._pk = f"HEARTBEATS#{cluster}"

    def _key(self, shard: int | None = None) -> dict[str, Any]:
        return {"pk": {"S": self._pk if shard is None else f"{self._pk}#{shard}"}}

    def load(self) -> tuple[Roster, int]:
        head = self._db.get_item(TableName=self._table, Key=self._key(), ConsistentRead=True).get("Item")
        if not head:
            return {}, 0
        roster: Roster = {}
        keys = [self._key(n) for n in range(int(head["shards"]["N"]))]
        for i in range(0, len(keys), 100):
            request = {self._table: {"Keys": keys[i:i + 100], "ConsistentRead": True}}
            while request:
                resp = self._db.batch_get_item(RequestItems=request)
                for item in resp["Responses"].get(self._table, []):
                    roster.update(json.loads(item["nodes"]["S"]))
                request = resp.get("UnprocessedKeys") or {}
        return roster, int(head["version"]["N"])

    def save(self, roster: Roster, version: int) -> None:
        parts = shards(roster)
        try:
            self._db.put_item(
                TableName=self._table,
                Item={**self._key(), "version": {"N": str(version + 1)}, "shards": {"N": str(len(parts))}},
                ConditionExpression="attribute_not_exists(pk) OR version = :v",
                ExpressionAttributeValues={":v": {"N": str(version)}},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                raise RosterConflictError("the heartbeat roster changed while this sweep ran") from exc
            raise
        for n, nodes in enumerate(parts):
            self._db.put_item(TableName=self._table, Item={**self._key(n), "nodes": {"S": nodes}})
