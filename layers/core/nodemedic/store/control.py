"""Cluster control state, node signals and node lineage, in the incident table.

Items (partition key ``pk``):
- ``CONTROL#<cluster>``: pause switch, circuit breaker, the admissions the gate granted
  (what the breaker and the concurrency limit count) and the incidents waiting for a slot
  (what the breaker counts too). Written only with a condition on the
  version read, so two gates deciding at once never both take the last slot.
- ``SIGNALS#<cluster>#<instance>``: the latest time each (source, fault code) was reported for
  an instance; corroboration looks for an independent second signal here.
- ``LINEAGE#<cluster>#<key>``: the incidents a node slot or an EC2 host had, the newest
  ``LINEAGE_KEPT``; lemon detection counts them. The key survives an instance replacement.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Literal

from botocore.exceptions import ClientError
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from nodemedic.errors import ControlConflictError
from nodemedic.safety.policy import MAX_LEMON_INCIDENTS
from nodemedic.store.ledger import condition_failed, unchanged_since

_SIGNAL = "s:"
# A lineage keeps its newest incidents only: the lemon rule counts at most MAX_LEMON_INCIDENTS and
# the cooldown reads the newest. Appended to without end, a node slot's item would pass DynamoDB's
# 400 KB after some 4,000 incidents, and from then on every Gate for the node would fail.
LINEAGE_KEPT = MAX_LEMON_INCIDENTS


def _lineage_entry(incident_id: str, at: datetime) -> dict[str, str]:
    return {"S": json.dumps({"incident": incident_id, "at": at.isoformat()})}


class Admission(BaseModel):
    """A remediation the gate let through: what the breaker and the rate limit count."""

    model_config = ConfigDict(extra="forbid")
    slurm_node: str
    instance_id: str
    at: AwareDatetime
    fault_code: str
    attributes: dict[str, str] = Field(default_factory=dict, description="rack, placement group, ...")
    burn_in: bool = Field(default=False, description="a joined node's check: not counted by the breaker")
    retire: bool = Field(default=False, description="capacity AWS takes back: not counted by the breaker")

    @property
    def counted(self) -> bool:
        """Whether the breaker and the concurrency cap count it (a remediation of a node in service)."""
        return not (self.burn_in or self.retire)


class Switch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    by: str
    reason: str
    at: AwareDatetime


class BreakerState(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: Literal["closed", "open"] = "closed"
    tripped: Switch | None = None
    reset: Switch | None = None
    trips: int = 0


class ControlState(BaseModel):
    model_config = ConfigDict(extra="forbid")
    paused: Switch | None = None
    breaker: BreakerState = Field(default_factory=BreakerState)
    admissions: dict[str, Admission] = Field(default_factory=dict, description="incident id -> admission")
    waiting: dict[str, Admission] = Field(
        default_factory=dict,
        description="incident id -> the admission it waits for (the concurrency cap made it wait): the breaker "
                    "counts its node, so a storm trips the breaker before the slots free up")
    version: int = 0

    def counted_by_breaker(self, now: datetime, window: timedelta, active: set[str]) -> dict[str, Admission]:
        """Admissions in the breaker's window (or still in progress), since the last reset."""
        since = self.breaker.reset.at if self.breaker.reset else None
        return {
            iid: a for iid, a in self.admissions.items()
            if a.counted and (iid in active or now - a.at <= window) and (since is None or a.at >= since)
        }

    def waiting_for_slot(self, active: set[str]) -> dict[str, Admission]:
        """Incidents still open that wait for a remediation slot, since the last reset."""
        since = self.breaker.reset.at if self.breaker.reset else None
        return {iid: a for iid, a in self.waiting.items() if iid in active and (since is None or a.at >= since)}


class ControlStore:
    def __init__(self, client: Any, table: str, cluster: str) -> None:
        self._db = client
        self._table = table
        self.cluster = cluster

    def _key(self) -> dict[str, Any]:
        return {"pk": {"S": f"CONTROL#{self.cluster}"}}

    # -- control state -----------------------------------------------------------------------
    def read(self) -> ControlState:
        item = self._db.get_item(TableName=self._table, Key=self._key(), ConsistentRead=True).get("Item")
        if not item:
            return ControlState()
        state = ControlState.model_validate_json(item["doc"]["S"])
        state.version = int(item["version"]["N"])
        return state

    def _put(self, state: ControlState, extra: list[dict[str, Any]] | None = None) -> None:
        """Write ``state`` if nobody wrote since it was read; else :class:`ControlConflictError`."""
        read_version = state.version
        item = {**self._key(), "doc": {"S": state.model_dump_json(exclude={"version"})},
                "version": {"N": str(read_version + 1)}}
        put: dict[str, Any] = {"TableName": self._table, "Item": item, **unchanged_since(read_version)}
        try:
            self._db.transact_write_items(TransactItems=[{"Put": put}, *(extra or [])])
        except ClientError as exc:
            if condition_failed(exc):
                raise ControlConflictError("the control state changed while deciding") from exc
            raise
        state.version = read_version + 1

    def save(self, state: ControlState, lineage: dict[str, tuple[str, datetime]] | None = None,
             read: dict[str, list[tuple[str, datetime]]] | None = None) -> None:
        """Write the state (and append ``incident, at`` to each lineage key) atomically. ``read``:
        each key's lineage as the caller read it; one that already holds LINEAGE_KEPT entries is
        rewritten to its newest, if it has not changed since (else ControlConflictError: retried)."""
        self._put(state, [{"Update": self._lineage_update(k, iid, at, (read or {}).get(k))}
                          for k, (iid, at) in (lineage or {}).items()])

    def _lineage_update(self, key: str, incident_id: str, at: datetime,
                        read: list[tuple[str, datetime]] | None = None) -> dict[str, Any]:
        update: dict[str, Any] = {"TableName": self._table, "Key": self._lineage_key(key)}
        if read is None or len(read) < LINEAGE_KEPT:
            return update | {
                "UpdateExpression": "SET incidents = list_append(if_not_exists(incidents, :empty), :one)",
                "ExpressionAttributeValues": {":empty": {"L": []}, ":one": {"L": [_lineage_entry(incident_id, at)]}}}
        kept = [_lineage_entry(i, a) for i, a in read[len(read) - LINEAGE_KEPT + 1:]] + [_lineage_entry(incident_id, at)]
        # unchanged since read: as long, and the same newest entry (a concurrent rewrite keeps the length)
        return update | {"UpdateExpression": "SET incidents = :kept",
                         "ConditionExpression": f"size(incidents) = :read AND incidents[{len(read) - 1}] = :newest",
                         "ExpressionAttributeValues": {":kept": {"L": kept}, ":read": {"N": str(len(read))},
                                                       ":newest": _lineage_entry(*read[-1])}}

    def append_lineage(self, keys: list[str], incident_id: str, at: datetime, attempts: int = 5) -> None:
        """Append ``incident, at`` to each key's lineage, keeping its newest LINEAGE_KEPT (re-read
        and tried again when another write came between)."""
        for key in keys:
            for attempt in range(attempts):
                try:
                    self._db.update_item(**self._lineage_update(key, incident_id, at, self.lineage(key)))
                    break
                except ClientError as exc:
                    if not condition_failed(exc):
                        raise
                    if attempt == attempts - 1:
                        raise ControlConflictError(f"the lineage {key} kept changing while appending") from exc

    def change(self, edit: Any, attempts: int = 5) -> ControlState:
        """Read, apply ``edit(state)`` and write, retrying on a concurrent change (operator actions)."""
        for attempt in range(attempts):
            state = self.read()
            edit(state)
            try:
                self._put(state)
                return state
            except ControlConflictError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    # -- signals -------------------------------------------------------------------------------
    # -- pages ---------------------------------------------------------------------------------
    def allow_page(self, kind: str, now: datetime, window: timedelta) -> bool:
        """True for the first page of ``kind`` in a window (and it opens the window); False for the
        others, which are counted on the window's item instead. Atomic: two at once page once."""
        key = {"pk": {"S": f"PAGES#{self.cluster}#{kind}"}}
        try:
            self._db.update_item(
                TableName=self._table, Key=key, UpdateExpression="SET opened = :now, suppressed = :zero",
                ConditionExpression="attribute_not_exists(pk) OR opened < :cutoff",
                ExpressionAttributeValues={":now": {"S": now.isoformat()}, ":zero": {"N": "0"},
                                           ":cutoff": {"S": (now - window).isoformat()}})
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            self._db.update_item(TableName=self._table, Key=key, UpdateExpression="ADD suppressed :one",
                                 ExpressionAttributeValues={":one": {"N": "1"}})
            return False
        return True

    def record_signal(self, instance_id: str, source: str, fault_code: str, at: datetime) -> None:
        """Remember that ``source`` reported ``fault_code`` for the instance at ``at`` (latest wins)."""
        self._db.update_item(
            TableName=self._table, Key=self._signals_key(instance_id),
            UpdateExpression="SET #k = :at",
            ExpressionAttributeNames={"#k": f"{_SIGNAL}{source}|{fault_code}"},
            ExpressionAttributeValues={":at": {"S": at.isoformat()}},
        )

    def signals(self, instance_id: str) -> dict[tuple[str, str], datetime]:
        """(source, fault code) -> when it was last reported for the instance."""
        item = self._db.get_item(TableName=self._table, Key=self._signals_key(instance_id),
                                 ConsistentRead=True).get("Item") or {}
        out = {}
        for name, value in item.items():
            if name.startswith(_SIGNAL):
                source, _, code = name.removeprefix(_SIGNAL).partition("|")
                out[(source, code)] = datetime.fromisoformat(value["S"])
        return out

    def _signals_key(self, instance_id: str) -> dict[str, Any]:
        return {"pk": {"S": f"SIGNALS#{self.cluster}#{instance_id}"}}

    # -- lineage -------------------------------------------------------------------------------
    def _lineage_key(self, key: str) -> dict[str, Any]:
        return {"pk": {"S": f"LINEAGE#{self.cluster}#{key}"}}

    def lineage(self, key: str) -> list[tuple[str, datetime]]:
        item = self._db.get_item(TableName=self._table, Key=self._lineage_key(key),
                                 ConsistentRead=True).get("Item") or {}
        entries = [json.loads(v["S"]) for v in item.get("incidents", {}).get("L", [])]
        return [(e["incident"], datetime.fromisoformat(e["at"])) for e in entries]
