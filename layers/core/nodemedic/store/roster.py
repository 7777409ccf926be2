"""The heartbeat roster of one cluster: one ledger-table item ``HEARTBEATS#<cluster>``.

One item, read and written once per sweep, keeps the DynamoDB bill flat however many nodes
heartbeat (1,000 nodes is about 100 KB, well under the 400 KB item limit). Writes are
conditional on the version read, so two sweepers can never overwrite each other.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from nodemedic.domain.silence import Roster


class RosterConflictError(Exception):
    """Another sweeper saved the roster since we read it."""


class RosterStore:
    def __init__(self, client: Any, table: str, cluster: str) -> None:
        self._db = client
        self._table = table
        self._key = {"pk": {"S": f"HEARTBEATS#{cluster}"}}

    def load(self) -> tuple[Roster, int]:
        item = self._db.get_item(TableName=self._table, Key=self._key, ConsistentRead=True).get("Item")
        if not item:
            return {}, 0
        return json.loads(item["nodes"]["S"]), int(item["version"]["N"])

    def save(self, roster: Roster, version: int) -> None:
        try:
            self._db.put_item(
                TableName=self._table,
                Item={**self._key, "nodes": {"S": json.dumps(roster, separators=(",", ":"))},
                      "version": {"N": str(version + 1)}},
                ConditionExpression="attribute_not_exists(pk) OR version = :v",
                ExpressionAttributeValues={":v": {"N": str(version)}},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                raise RosterConflictError("the heartbeat roster changed while this sweep ran") from exc
            raise
