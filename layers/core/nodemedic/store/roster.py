"""The heartbeat roster of one cluster, in the ledger table.

A head item ``HEARTBEATS#<cluster>`` holds a version and the number of shards; each shard
``HEARTBEATS#<cluster>#<n>`` holds up to 1,000 nodes (about 190 KB, under the 400 KB item limit).
A sweep reads the roster once and writes it once, so the DynamoDB bill grows with the number of
sweeps, not with the number of heartbeats. The head is written first, conditional on the version
read, so a second sweeper that lost the race writes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from nodemedic.domain.silence import Roster

SHARD_NODES = 1000


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
        ids = sorted(roster)
        shards = [ids[i:i + SHARD_NODES] for i in range(0, len(ids), SHARD_NODES)]
        try:
            self._db.put_item(
                TableName=self._table,
                Item={**self._key(), "version": {"N": str(version + 1)}, "shards": {"N": str(len(shards))}},
                ConditionExpression="attribute_not_exists(pk) OR version = :v",
                ExpressionAttributeValues={":v": {"N": str(version)}},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                raise RosterConflictError("the heartbeat roster changed while this sweep ran") from exc
            raise
        for n, members in enumerate(shards):
            nodes = {i: roster[i] for i in members}
            self._db.put_item(TableName=self._table,
                              Item={**self._key(n), "nodes": {"S": json.dumps(nodes, separators=(",", ":"))}})
