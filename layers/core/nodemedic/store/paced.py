"""The planned work released lately, per cluster: what the planned-events function counts against
its share of the breaker's room (:mod:`nodemedic.safety.pacing`) before the gate has admitted it.

One item, ``PACED#<cluster>``: event id -> the node and when it was released, and a version. Many
notices of one campaign are delivered at once (AWS Health sends one event per instance, each its
own invocation): each takes its room by writing the item conditional on the version it read, so
two invocations never both take the last of it. An entry is dropped once older than the breaker's
window (the gate counts the node from its admission on).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from nodemedic.errors import RetryableError
from nodemedic.store.ledger import condition_failed, unchanged_since


class PacingConflictError(RetryableError):
    """Another invocation took room for planned work since this one read it."""


class Release(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: str
    at: AwareDatetime


class Releases(BaseModel):
    model_config = ConfigDict(extra="forbid")
    releases: dict[str, Release] = Field(default_factory=dict, description="event id -> its release")
    version: int = 0

    def recent(self, now: datetime, window: timedelta) -> dict[str, datetime]:
        """node -> its latest release within ``window``."""
        out: dict[str, datetime] = {}
        for r in self.releases.values():
            if now - r.at <= window:
                out[r.node] = max(r.at, out.get(r.node, r.at))
        return out

    def prune(self, now: datetime, window: timedelta) -> None:
        self.releases = {i: r for i, r in self.releases.items() if now - r.at <= window}


class PacedReleases:
    def __init__(self, client: Any, table: str, cluster: str) -> None:
        self._db = client
        self._table = table
        self._key = {"pk": {"S": f"PACED#{cluster}"}}

    def read(self) -> Releases:
        item = self._db.get_item(TableName=self._table, Key=self._key, ConsistentRead=True).get("Item")
        if not item:
            return Releases()
        return Releases.model_validate_json(item["doc"]["S"]).model_copy(update={"version": int(item["version"]["N"])})

    def save(self, releases: Releases) -> None:
        """Write ``releases`` if nobody wrote since they were read; else :class:`PacingConflictError`."""
        read = releases.version
        try:
            self._db.put_item(TableName=self._table, Item={
                **self._key, "doc": {"S": releases.model_dump_json(exclude={"version"})},
                "version": {"N": str(read + 1)}}, **unchanged_since(read))
        except ClientError as exc:
            if condition_failed(exc):
                raise PacingConflictError("planned work was released meanwhile") from exc
            raise
        releases.version = read + 1
