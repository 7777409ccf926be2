"""The incident ledger in DynamoDB.

Items (partition key ``pk``):
- ``INCIDENT#<id>``: the :class:`~nodemedic.contracts.incident.Incident`.
- ``NODE#<cluster>#<instance>``: the lock that allows one active incident per node, written
  in the same transaction as the incident with ``attribute_not_exists(pk)``. A closed incident
  releases it; a failed one keeps it, so later events for that node are deduplicated until an
  operator has dealt with the node.
- ``CLAIM#<kind>#<key>``: a replacement instance or a hot spare taken by one incident, so two
  concurrent incidents never take the same one.
- ``CHECK#<command id>``: a deep health check waiting for its SSM command to end, with the
  Step Functions task token that its result completes.
- ``DRAINHOLD#<cluster>#<node>``: NodeMedic keeps this node drained (an incident drained it and
  has not returned it); the reconciler drains it again if the drain was lost (a controller
  restarted without saving it). Dropped right before the node is returned to service, by the
  incident or by an operator's ``nodemedic remediate <node> --action resume``.
- ``RECHECK#<cluster>#<node>#<fault code>``: a fault the cooldown held, which the reconciler
  offers Detect again once the cooldown ends (:class:`~nodemedic.contracts.incident.Recheck`).
- ``EVENT#<source>/<event id>``: Detect's decision on an event and the incident that took it,
  kept ``EVENT_MEMORY``: a redelivery changes nothing, and the agent that sent it reads it as
  the acknowledgement that stops it sending the event again.

What the reconciler checks (locks, claims, drain holds, open incidents, rechecks) carries ``books``: its
cluster (``CLAIMS_BOOK`` for a claim, which names no cluster), the key of the table's sparse index
``Bookkeeping``. The reconciler reads that index, not the whole table: the table keeps every
incident and every event of the last 15 days, and a scan of it every 5 minutes grew with both. An
ended incident leaves the index in the write that ends it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from threading import Lock
from typing import Any

from botocore.exceptions import ClientError
from pydantic import ValidationError

from nodemedic.contracts.events import ACKNOWLEDGEMENT_PREFIX
from nodemedic.contracts.incident import (
    ENDED_STATUSES,
    FOLDED_KEPT,
    Bookkeeping,
    Claim,
    DrainHold,
    FoldedFault,
    Incident,
    IncidentRef,
    IncidentStatus,
    NodeLock,
    Recheck,
    Stage,
    StageRecord,
    UnwatchedNodes,
)
from nodemedic.errors import IncidentStateError


def _incident_key(incident_id: str) -> dict[str, Any]:
    return {"pk": {"S": f"INCIDENT#{incident_id}"}}


def _lock_key(cluster: str, instance_id: str) -> dict[str, Any]:
    return {"pk": {"S": f"NODE#{cluster}#{instance_id}"}}


def _rebalance_key(cluster: str, job_id: str) -> dict[str, Any]:
    return {"pk": {"S": f"REBALANCE#{cluster}#{job_id}"}}


def _repaired_key(cluster: str, slurm_node: str) -> dict[str, Any]:
    return {"pk": {"S": f"REPAIRED#{cluster}#{slurm_node}"}}


def _claim_key(kind: str, key: str) -> dict[str, Any]:
    return {"pk": {"S": f"CLAIM#{kind}#{key}"}}


def _interrupted_key(cluster: str, slurm_node: str) -> dict[str, Any]:
    return {"pk": {"S": f"INTERRUPTED#{cluster}#{slurm_node}"}}


BOOKS_INDEX = "Bookkeeping"  # template.yaml: IncidentsTable's GlobalSecondaryIndexes
CLAIMS_BOOK = "CLAIM#"  # the index key of every claim (a claim names an incident, not a cluster)
BOOKS_SWEEP = timedelta(hours=24)  # how often the whole table is scanned for items the index lacks
LIST_SEGMENTS = 8  # parallel scans that list the incidents (the CLI's incidents and report)
SWEEP_PAGES = 20  # pages (1 MB each at most) a reconciler run sweeps: a large table takes several runs


def _books(cluster: str) -> dict[str, Any]:
    """The attribute that puts an item in the ``Bookkeeping`` index, under ``cluster``."""
    return {"books": {"S": cluster}}


def _ttl(at: datetime) -> dict[str, str]:
    """``expires_at``, the table's TTL attribute: DynamoDB deletes the item some time after ``at``."""
    return {"N": str(int(at.timestamp()))}


def _hold_key(cluster: str, slurm_node: str) -> dict[str, Any]:
    return {"pk": {"S": f"DRAINHOLD#{cluster}#{slurm_node}"}}


def _recheck_key(cluster: str, slurm_node: str, fault_code: str) -> dict[str, Any]:
    return {"pk": {"S": f"RECHECK#{cluster}#{slurm_node}#{fault_code}"}}


def _sweep_key(cluster: str) -> dict[str, Any]:
    return {"pk": {"S": f"BOOKSWEPT#{cluster}"}}


def _outbox_key(cluster: str) -> dict[str, Any]:
    return {"pk": {"S": f"OUTBOX#{cluster}"}}


def _unwatched_key(cluster: str) -> dict[str, Any]:
    return {"pk": {"S": f"UNWATCHED#{cluster}"}}


OUTBOX_PAGES = 100  # pages kept while SNS cannot be reached (a DynamoDB item holds 400 KB)
OUTBOX_PAGE_CHARS = 2000
EVENT_MEMORY = timedelta(days=15)
INTERRUPTION_MEMORY = timedelta(hours=1)
RECHECK_KEPT = timedelta(days=1)


def unchanged_since(version: int) -> dict[str, Any]:
    """The condition of a write over an item read at ``version`` (0: it was not there): refused
    when another writer came between (:func:`condition_failed`)."""
    if version:
        return {"ConditionExpression": "version = :v", "ExpressionAttributeValues": {":v": {"N": str(version)}}}
    return {"ConditionExpression": "attribute_not_exists(pk)"}


def condition_failed(exc: ClientError) -> bool:
    code = exc.response["Error"]["Code"]
    if code == "ConditionalCheckFailedException":
        return True
    if code == "TransactionCanceledException":
        reasons = exc.response.get("CancellationReasons", [])
        return any(r.get("Code") == "ConditionalCheckFailed" for r in reasons)
    return False


# the ids of the events folded into an incident, kept so that a retried Detect counts nothing twice:
# an id is an execution name (80 characters at most), so they take at most 160 KB of the 400 KB a
# DynamoDB item holds, beside the incident and its stages
MAX_FOLDED_IDS = 2000


class Ledger:
    """All reads and writes of incidents; nothing else touches the table."""

    def __init__(self, client: Any, table: str) -> None:
        self._db = client
        self._table = table

    # -- opening -------------------------------------------------------------------------
    def open_incident(self, incident: Incident) -> str | None:
        """Write the incident and its node lock atomically.

        Returns ``None`` when opened (also when an earlier attempt of this same incident opened it:
        a retried Detect is idempotent), or the id of another incident already active for the node.
        """
        item = {
            "pk": {"S": f"INCIDENT#{incident.incident_id}"},
            "doc": {"S": incident.model_dump_json(exclude={"stages"})},
            "status": {"S": incident.status},
            "stages": {"M": {k: {"S": v.model_dump_json()} for k, v in incident.stages.items()}},
            **(_books(incident.cluster) if incident.status == "open" else {}),
        }
        lock = {
            **_lock_key(incident.cluster, incident.instance_id),
            "incident_id": {"S": incident.incident_id},
            "slurm_node": {"S": incident.slurm_node},
            **_books(incident.cluster),
        }
        try:
            self._db.transact_write_items(
                TransactItems=[
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": lock,
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": item,
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                ]
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            existing = self.active_incident_id(incident.cluster, incident.instance_id)
            if existing is None:  # the lock was released between our write and our read
                return self.open_incident(incident)
            if existing == incident.incident_id:  # our own earlier attempt (Detect retried)
                return None
            return existing
        return None

    def lock(self, ref: IncidentRef, instance_id: str) -> bool:
        """Also lock ``instance_id`` (a replacement now backing the node) for this incident, so
        its events fold into it; False if another incident holds it."""
        return self._conditional("put_item", Item={
            **_lock_key(ref.cluster, instance_id), "incident_id": {"S": ref.incident_id},
            "slurm_node": {"S": ref.slurm_node}, **_books(ref.cluster)},
            ConditionExpression="attribute_not_exists(pk) OR incident_id = :id",
            ExpressionAttributeValues={":id": {"S": ref.incident_id}})

    def _conditional(self, operation: str, **kwargs: Any) -> bool:
        """Run one conditional write on the table; False when its condition did not hold."""
        try:
            getattr(self._db, operation)(TableName=self._table, **kwargs)
        except ClientError as exc:
            if condition_failed(exc):
                return False
            raise
        return True

    def active_incident_id(self, cluster: str, instance_id: str) -> str | None:
        lock = self.node_lock(cluster, instance_id)
        return lock[0] if lock else None

    def node_lock(self, cluster: str, instance_id: str) -> tuple[str, str] | None:
        """(incident id, Slurm node) of the incident holding the instance's lock, if any."""
        resp = self._db.get_item(
            TableName=self._table, Key=_lock_key(cluster, instance_id), ConsistentRead=True
        )
        item = resp.get("Item")
        return (item["incident_id"]["S"], item.get("slurm_node", {}).get("S", "")) if item else None

    def release_held(self, cluster: str) -> list[Incident]:
        """Release the node locks that held incidents keep (after a breaker reset or a resume of
        automation): the next event for those nodes opens a new incident. Returns those incidents.
        The locks are found through the bookkeeping index, not a scan of every incident kept (a lock
        an older version wrote is found once the reconciler's daily sweep has indexed it)."""
        locks = self.locks(cluster)
        statuses = self.statuses(sorted({lock.incident_id for lock in locks})) if locks else {}
        released: dict[str, Incident] = {}
        for lock in locks:
            if statuses.get(lock.incident_id) == "held" and self.release_lock(lock, cluster):
                released.setdefault(lock.incident_id, self.get(lock.incident_id))
        return list(released.values())

    def count_duplicate(self, incident_id: str, event_id: str) -> None:
        """Count one more event folded into the incident, once per ``event_id`` (a retried Detect
        counts nothing twice). The ids are kept up to ``MAX_FOLDED_IDS``; beyond, the count goes on
        without them (a retried Detect may then count its event twice). Before, every id was added
        past the cap too: an incident held for days (quarantined, waiting for an operator) grew
        until DynamoDB refused its item, and Detect failed on every event for the node."""
        key, cap = _incident_key(incident_id), {":cap": {"N": str(MAX_FOLDED_IDS)}}
        if self._conditional("update_item", Key=key, UpdateExpression="ADD duplicate_events :one, folded :ids",
                             ConditionExpression="attribute_exists(pk) AND NOT contains(folded, :id) "
                                                 "AND (attribute_not_exists(folded) OR size(folded) < :cap)",
                             ExpressionAttributeValues={":one": {"N": "1"}, ":ids": {"SS": [event_id]},
                                                        ":id": {"S": event_id}, **cap}):
            return
        self._conditional("update_item", Key=key, UpdateExpression="ADD duplicate_events :one",
                          ConditionExpression="attribute_exists(pk) AND size(folded) >= :cap "
                                              "AND NOT contains(folded, :id)",
                          ExpressionAttributeValues={":one": {"N": "1"}, ":id": {"S": event_id}, **cap})

    def note_folded(self, incident_id: str, fault: FoldedFault) -> bool:
        """Note ``fault`` on the open incident (one per fault code, ``FOLDED_KEPT`` at most), each
        code its own key of one map: two notes at once both land (a read, then a write of the
        whole list, lost one of them). False when it was not noted: the incident is no longer
        open, has the code, or is full."""
        key = _incident_key(incident_id)
        self._conditional("update_item", Key=key, UpdateExpression="SET folded_faults = :none",
                          ConditionExpression="attribute_exists(pk) AND attribute_not_exists(folded_faults)",
                          ExpressionAttributeValues={":none": {"M": {}}})
        return self._conditional(
            "update_item", Key=key, UpdateExpression="SET folded_faults.#code = :fault",
            ConditionExpression="#status = :open AND attribute_not_exists(folded_faults.#code) "
                                "AND size(folded_faults) < :cap",
            ExpressionAttributeNames={"#code": fault.fault_code, "#status": "status"},
            ExpressionAttributeValues={":fault": {"S": fault.model_dump_json()}, ":open": {"S": "open"},
                                       ":cap": {"N": str(FOLDED_KEPT)}})

    # -- reading -------------------------------------------------------------------------
    def get(self, incident_id: str) -> Incident:
        resp = self._db.get_item(
            TableName=self._table, Key=_incident_key(incident_id), ConsistentRead=True
        )
        item = resp.get("Item")
        if not item:
            raise IncidentStateError(f"incident {incident_id} is not in the ledger")
        return _from_item(item)

    def list_incidents(self, progress: Callable[[int], None] | None = None) -> list[Incident]:
        """Every incident the table keeps, read in ``LIST_SEGMENTS`` parallel scans (DynamoDB's
        parallel scan: a table of years of incidents is hundreds of 1 MB pages, which one scan
        reads one after the other); ``progress`` hears the number read so far after each page."""
        read: list[list[Incident]] = [[] for _ in range(LIST_SEGMENTS)]
        lock = Lock()

        def segment(n: int) -> None:
            pages = self._db.get_paginator("scan").paginate(
                TableName=self._table, FilterExpression="begins_with(pk, :p)",
                ExpressionAttributeValues={":p": {"S": "INCIDENT#"}}, ConsistentRead=True,
                Segment=n, TotalSegments=LIST_SEGMENTS)
            for page in pages:
                read[n] += [_from_item(item) for item in page.get("Items", [])]
                if progress is not None:
                    with lock:
                        progress(sum(map(len, read)))

        with ThreadPoolExecutor(LIST_SEGMENTS) as pool:
            list(pool.map(segment, range(LIST_SEGMENTS)))  # an error of one segment is raised here
        return [incident for part in read for incident in part]

    # -- stages --------------------------------------------------------------------------
    def start_stage(self, ref: IncidentRef, stage: Stage, now: datetime) -> StageRecord:
        """Record that ``stage`` started (once); return its record, possibly completed earlier."""
        record = StageRecord(started_at=now)
        try:
            self._db.update_item(
                TableName=self._table,
                Key=_incident_key(ref.incident_id),
                UpdateExpression="SET stages.#s = :rec",
                ConditionExpression="attribute_exists(pk) AND #status = :open "
                "AND attribute_not_exists(stages.#s)",
                ExpressionAttributeNames={"#s": stage, "#status": "status"},
                ExpressionAttributeValues={
                    ":rec": {"S": record.model_dump_json()},
                    ":open": {"S": "open"},
                },
            )
            return record
        except ClientError as exc:
            if not condition_failed(exc):
                raise
        incident = self.get(ref.incident_id)
        found = incident.stages.get(stage)
        if found is not None and (found.completed_at or incident.status == "open"):
            return found  # a retried invocation: finish, or report, what was started
        raise IncidentStateError(f"incident {ref.incident_id} is {incident.status}, not open")

    def complete_stage(
        self, ref: IncidentRef, stage: Stage, now: datetime, result: dict[str, Any]
    ) -> StageRecord:
        record = self.get(ref.incident_id).stages[stage]
        record.completed_at = record.completed_at or now
        record.result = result
        self._put_stage(ref, stage, record)
        return record

    def record_progress(self, ref: IncidentRef, stage: Stage, result: dict[str, Any]) -> None:
        """Save what a stage has done so far, so that a retried invocation does not redo it."""
        record = self.get(ref.incident_id).stages[stage]
        record.result = {**record.result, **result}
        self._put_stage(ref, stage, record)

    def swap_stage(self, ref: IncidentRef, stage: Stage,
                   change: Callable[[StageRecord], StageRecord | None]) -> StageRecord | None:
        """Replace the stage's record with ``change(record as stored)``, in one write conditional on
        the stored record being what was read: None when ``change`` says no (returns None) or another
        writer changed it in between (two operators answering one approval at once: the first wins)."""
        item = self._db.get_item(TableName=self._table, Key=_incident_key(ref.incident_id), ConsistentRead=True,
                                 ProjectionExpression="stages.#s", ExpressionAttributeNames={"#s": stage}).get("Item")
        raw = (item or {}).get("stages", {}).get("M", {}).get(stage, {}).get("S")
        if raw is None:
            raise IncidentStateError(f"incident {ref.incident_id} has no {stage} stage")
        record = change(StageRecord.model_validate_json(raw))
        if record is None or not self._conditional(
                "update_item", Key=_incident_key(ref.incident_id), UpdateExpression="SET stages.#s = :rec",
                ConditionExpression="stages.#s = :was", ExpressionAttributeNames={"#s": stage},
                ExpressionAttributeValues={":rec": {"S": record.model_dump_json()}, ":was": {"S": raw}}):
            return None
        return record

    def _put_stage(self, ref: IncidentRef, stage: Stage, record: StageRecord) -> None:
        self._db.update_item(
            TableName=self._table,
            Key=_incident_key(ref.incident_id),
            UpdateExpression="SET stages.#s = :rec",
            ExpressionAttributeNames={"#s": stage},
            ExpressionAttributeValues={":rec": {"S": record.model_dump_json()}},
        )

    # -- ending --------------------------------------------------------------------------
    def close(self, ref: IncidentRef, now: datetime, outcome: str = "") -> None:
        """Mark the incident closed, release the node lock and remember when the node was
        repaired (an event about an older fault is stale), atomically."""
        self.end(ref, "closed", now, outcome, release_node=True, extra=[{"Put": {
            "TableName": self._table, "Item": {**_repaired_key(ref.cluster, ref.slurm_node), "at": {"S": now.isoformat()},
                                               "incident_id": {"S": ref.incident_id}}}}])

    def end(self, ref: IncidentRef, status: IncidentStatus, now: datetime, outcome: str,
            *, release_node: bool, extra: list[dict[str, Any]] | None = None,
            failure: dict[str, str] | None = None) -> None:
        """End an open incident with ``status`` and why. ``release_node=False`` keeps the node lock,
        so later events for the node are folded into this incident until an operator acts."""
        update: dict[str, Any] = {
            "TableName": self._table,
            "Key": _incident_key(ref.incident_id),
            "UpdateExpression": "SET #status = :end, closed_at = :now, outcome = :why",
            "ConditionExpression": "#status IN (:open, :end)",
            "ExpressionAttributeNames": {"#status": "status"},
            "ExpressionAttributeValues": {
                ":end": {"S": status}, ":open": {"S": "open"},
                ":now": {"S": now.isoformat()}, ":why": {"S": outcome},
            },
        }
        if failure is not None:
            update["UpdateExpression"] += ", failed_at = :now, failure = :failure"
            update["ExpressionAttributeValues"][":failure"] = {"M": {k: {"S": v} for k, v in failure.items()}}
        update["UpdateExpression"] += " REMOVE books"  # out of the reconciler's index
        items: list[dict[str, Any]] = [{"Update": update}, *(extra or [])]
        if release_node:
            items.append({"Delete": {
                "TableName": self._table,
                "Key": _lock_key(ref.cluster, ref.instance_id),
                "ConditionExpression": "attribute_not_exists(pk) OR incident_id = :id",
                "ExpressionAttributeValues": {":id": {"S": ref.incident_id}},
            }})
        try:
            self._db.transact_write_items(TransactItems=items)
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            current = self.get(ref.incident_id).status
            raise IncidentStateError(f"incident {ref.incident_id} is {current}; cannot mark it {status}") from exc

    def fail(self, ref: IncidentRef, now: datetime, failure: dict[str, str], outcome: str,
             hold_reason: str | None, recheck_due: datetime | None = None) -> None:
        """End an open incident ``failed`` with where and why, release its node lock (the next
        fault, or a runbook, opens a new incident) and, with ``hold_reason``, keep its node held
        drained, or with ``recheck_due``, keep its fault to be decided again from then (as
        :meth:`hold_for_recheck`); atomically."""
        extra: list[dict[str, Any]] = []
        if hold_reason is not None:
            extra.append({"Put": {"TableName": self._table, "Item": self._hold_item(ref, hold_reason, now)}})
        if recheck_due is not None:
            extra.append(self._recheck_put(ref, recheck_due))
        self.end(ref, "failed", now, outcome, release_node=True, extra=extra, failure=failure)

    # -- faults the cooldown held, decided again when it ends ---------------------------
    def hold_for_recheck(self, ref: IncidentRef, now: datetime, outcome: str, due: datetime) -> None:
        """End ``ref`` held (its node lock released) and keep its fault to be decided again from
        ``due``, atomically. One recheck per node and fault code: a polled check that reports the
        fault again meanwhile adds none, and the latest held incident is the one offered, never
        offered yet. (Kept, the first would be dropped as decided once its own offer was: a fault
        held after that offer, in a later cooldown, would be lost.) Kept at most ``RECHECK_KEPT``
        past ``due`` (the table's TTL)."""
        self.end(ref, "held", now, outcome, release_node=True, extra=[self._recheck_put(ref, due)])

    def _recheck_put(self, ref: IncidentRef, due: datetime) -> dict[str, Any]:
        return {"Put": {"TableName": self._table, "Item": {
            **_recheck_key(ref.cluster, ref.slurm_node, ref.fault_code), "incident_id": {"S": ref.incident_id},
            "cluster": {"S": ref.cluster}, "slurm_node": {"S": ref.slurm_node}, "fault_code": {"S": ref.fault_code},
            "due": {"S": due.isoformat()}, **_books(ref.cluster), "expires_at": _ttl(due + RECHECK_KEPT)}}}

    def recheck(self, cluster: str, slurm_node: str, fault_code: str) -> Recheck | None:
        item = self._db.get_item(TableName=self._table, Key=_recheck_key(cluster, slurm_node, fault_code),
                                 ConsistentRead=True).get("Item")
        return _recheck_from(item) if item else None

    def offered(self, recheck: Recheck) -> bool:
        """Count one more offer of ``recheck``; False when it changed or went meanwhile."""
        return self._conditional("update_item", Key=_recheck_key(recheck.cluster, recheck.slurm_node, recheck.fault_code),
                                 UpdateExpression="SET offers = :n", ConditionExpression="incident_id = :id",
                                 ExpressionAttributeValues={":n": {"N": str(recheck.offers + 1)},
                                                            ":id": {"S": recheck.incident_id}})

    def drop_recheck(self, recheck: Recheck) -> bool:
        """The recheck was decided (or given up): gone, unless another incident's replaced it."""
        return self._conditional("delete_item", Key=_recheck_key(recheck.cluster, recheck.slurm_node, recheck.fault_code),
                                 ConditionExpression="incident_id = :id",
                                 ExpressionAttributeValues={":id": {"S": recheck.incident_id}})

    # -- drains NodeMedic holds ----------------------------------------------------------
    def _hold_item(self, ref: IncidentRef, reason: str, now: datetime) -> dict[str, Any]:
        return {**_hold_key(ref.cluster, ref.slurm_node), "incident_id": {"S": ref.incident_id},
                "instance_id": {"S": ref.instance_id}, "reason": {"S": reason}, "since": {"S": now.isoformat()},
                **_books(ref.cluster)}

    def hold_drain(self, ref: IncidentRef, reason: str, now: datetime) -> None:
        """NodeMedic keeps ``ref``'s node drained with ``reason`` (the latest incident's hold wins)."""
        self._db.put_item(TableName=self._table, Item=self._hold_item(ref, reason, now))

    def drop_hold(self, cluster: str, slurm_node: str, incident_id: str | None = None) -> None:
        """Stop holding the node drained (only ``incident_id``'s hold, when given)."""
        kwargs: dict[str, Any] = {}
        if incident_id is not None:
            kwargs = {"ConditionExpression": "incident_id = :id",
                      "ExpressionAttributeValues": {":id": {"S": incident_id}}}
        self._conditional("delete_item", Key=_hold_key(cluster, slurm_node), **kwargs)

    def hold_of(self, cluster: str, slurm_node: str) -> DrainHold | None:
        item = self._db.get_item(TableName=self._table, Key=_hold_key(cluster, slurm_node),
                                 ConsistentRead=True).get("Item")
        return _hold_from(cluster, slurm_node, item) if item else None

    # -- what the reconciler checks -----------------------------------------------------
    def bookkeeping(self, cluster: str, now: datetime | None = None) -> Bookkeeping:
        """Every lock and drain hold of ``cluster``, every claim, and the open incidents of
        ``cluster``: found through the ``Bookkeeping`` index, each read consistently. An index
        is eventually consistent: an item written a moment ago may be missing (the next run finds
        it), one changed may still be listed (its consistent read shows what it is now: an incident
        that ended is left out, a lock or claim released is gone). Once every ``BOOKS_SWEEP``, a
        scan puts in the index what an older version wrote without it (:meth:`index_unindexed`), at
        most ``SWEEP_PAGES`` pages a run: a large table is swept over several runs, and a run's time
        does not grow with the table."""
        self._sweep(cluster, now or datetime.now(UTC))
        keys = [pk for book in (cluster, CLAIMS_BOOK) for pk in self._indexed(book)]
        found = Bookkeeping()
        for item in self._read_consistently(keys):
            kind, _, rest = item["pk"]["S"].partition("#")
            if kind == "NODE" and rest.startswith(f"{cluster}#"):
                found.locks.append(_lock_from(item))
            elif kind == "CLAIM":
                claim_kind, _, key = rest.partition("#")
                found.claims.append(Claim(kind=claim_kind, key=key, incident_id=item["incident_id"]["S"]))
            elif kind == "DRAINHOLD" and rest.startswith(f"{cluster}#"):
                found.holds.append(_hold_from(cluster, rest.split("#", 1)[1], item))
            elif kind == "RECHECK" and item.get("cluster", {}).get("S") == cluster:
                found.rechecks.append(_recheck_from(item))
            elif kind == "INCIDENT" and item["status"]["S"] == "open":
                incident = _from_item(item)
                if incident.cluster == cluster:
                    found.open_incidents.append(incident)
        return found

    def locks(self, cluster: str) -> list[NodeLock]:
        """The node locks of ``cluster``, through the index, each read consistently."""
        keys = [k for k in self._indexed(cluster) if k.startswith(f"NODE#{cluster}#")]
        return [_lock_from(item) for item in self._read_consistently(keys)]

    def _indexed(self, book: str) -> list[str]:
        """The keys the ``Bookkeeping`` index lists under ``book``."""
        pages = self._db.get_paginator("query").paginate(
            TableName=self._table, IndexName=BOOKS_INDEX, KeyConditionExpression="books = :b",
            ExpressionAttributeValues={":b": {"S": book}})
        return [item["pk"]["S"] for page in pages for item in page.get("Items", [])]

    def _read_consistently(self, keys: list[str], **projection: Any) -> list[dict[str, Any]]:
        """The items with these keys, as they are now (batch reads of 100, each key once; those gone
        are left out). ``projection``: BatchGetItem's ProjectionExpression and its names."""
        found: list[dict[str, Any]] = []
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 100):
            request: dict[str, Any] = {self._table: {"Keys": [{"pk": {"S": k}} for k in unique[start:start + 100]],
                                                     "ConsistentRead": True, **projection}}
            while request:
                resp = self._db.batch_get_item(RequestItems=request)
                found += resp["Responses"].get(self._table, [])
                request = resp.get("UnprocessedKeys") or {}
        return found

    def _sweep(self, cluster: str, now: datetime) -> None:
        """The daily sweep's part in this run: started when the last one ended more than
        ``BOOKS_SWEEP`` ago (or never, or in the future), continued where the last run left it."""
        item = self._db.get_item(TableName=self._table, Key=_sweep_key(cluster), ConsistentRead=True).get("Item") or {}
        ended = datetime.fromisoformat(item["at"]["S"]) if "at" in item else None
        cursor = json.loads(item["cursor"]["S"]) if "cursor" in item else None
        if cursor is None and ended is not None and now - BOOKS_SWEEP < ended <= now:
            return
        cursor = self.index_unindexed(cluster, cursor, SWEEP_PAGES)
        marker: dict[str, Any] = _sweep_key(cluster)
        if cursor is not None:  # not through yet: the next run goes on from there
            marker = {**marker, "cursor": {"S": json.dumps(cursor)}, **({"at": item["at"]} if "at" in item else {})}
        else:
            marker = {**marker, "at": {"S": now.isoformat()}}
        self._db.put_item(TableName=self._table, Item=marker)

    def index_unindexed(self, cluster: str, start: dict[str, Any] | None = None,
                        pages_at_most: int = SWEEP_PAGES) -> dict[str, Any] | None:
        """Scan the table (from ``start``, at most ``pages_at_most`` pages) for what the reconciler
        checks but the index lacks (written by a version before the index: an upgrade, a restored
        backup) and put it there; take out of it an incident that ended without leaving it. Where to
        go on (None: the end of the table)."""
        scan = {"TableName": self._table, "ConsistentRead": True, "ProjectionExpression": "pk, #s, books, doc",
                "FilterExpression": "((begins_with(pk, :lock) OR begins_with(pk, :claim) OR begins_with(pk, :hold) "
                                    "OR (begins_with(pk, :inc) AND #s = :open)) AND attribute_not_exists(books)) "
                                    "OR (begins_with(pk, :inc) AND #s <> :open AND attribute_exists(books))",
                "ExpressionAttributeNames": {"#s": "status"},
                "ExpressionAttributeValues": {":lock": {"S": f"NODE#{cluster}#"}, ":claim": {"S": "CLAIM#"},
                                              ":hold": {"S": f"DRAINHOLD#{cluster}#"}, ":inc": {"S": "INCIDENT#"},
                                              ":open": {"S": "open"}}}
        key = start
        for _ in range(pages_at_most):
            page = self._db.scan(**scan, **({"ExclusiveStartKey": key} if key else {}))
            for item in page.get("Items", []):
                self._index(item, cluster)
            key = page.get("LastEvaluatedKey")
            if not key:
                return None
        return key

    def _index(self, item: dict[str, Any], cluster: str) -> None:
        """Put one item the sweep found in the index (or take an ended incident out of it), unless
        it changed since the scan read it (each write is conditional)."""
        pk = item["pk"]["S"]
        if "books" in item:  # an incident that ended
            self._conditional("update_item", Key={"pk": {"S": pk}}, UpdateExpression="REMOVE books",
                              ConditionExpression="#s <> :open", ExpressionAttributeNames={"#s": "status"},
                              ExpressionAttributeValues={":open": {"S": "open"}})
            return
        condition: dict[str, Any] = {"ConditionExpression": "attribute_exists(pk)"}
        book = CLAIMS_BOOK if pk.startswith("CLAIM#") else cluster
        if pk.startswith("INCIDENT#"):  # in its own cluster's book, only while it is still open
            book = Incident.model_validate_json(item["doc"]["S"]).cluster
            condition = {"ConditionExpression": "#s = :open", "ExpressionAttributeNames": {"#s": "status"}}
        values = {":b": {"S": book}, **({":open": {"S": "open"}} if pk.startswith("INCIDENT#") else {})}
        self._conditional("update_item", Key={"pk": {"S": pk}}, UpdateExpression="SET books = :b",
                          ExpressionAttributeValues=values, **condition)

    def release_lock(self, lock: NodeLock, cluster: str) -> bool:
        """Release a lock still held by ``lock.incident_id``; False if it changed meanwhile."""
        return self._conditional("delete_item", Key=_lock_key(cluster, lock.instance_id),
                                 ConditionExpression="incident_id = :id",
                                 ExpressionAttributeValues={":id": {"S": lock.incident_id}})

    def lock_holder(self, cluster: str, instance_id: str) -> Incident | None:
        """The incident holding the instance's lock; None when none does (or it is gone meanwhile)."""
        lock = self.node_lock(cluster, instance_id)
        try:
            return self.get(lock[0]) if lock else None
        except IncidentStateError:
            return None

    def release_ended(self, cluster: str, instance_id: str) -> str | None:
        """Release the instance's lock if an incident that has ended holds it (a quarantine, an
        escalation, a retirement: they keep it on purpose until someone acts); the id of that
        incident, or None. An open incident's lock is never released here."""
        return self.release_holder(cluster, instance_id, self.lock_holder(cluster, instance_id))

    def release_holder(self, cluster: str, instance_id: str, holder: Incident | None) -> str | None:
        """:meth:`release_ended` with the holder already read (:meth:`lock_holder`): an incident
        that has ended never opens again, and each release is conditional on the lock still being
        that incident's."""
        if holder is None or holder.status == "open":
            return None
        # its locks on the instances it left behind go too (the one a replacement terminated):
        # nothing else would ever release them
        released = [self.release_lock(NodeLock(instance_id=i, incident_id=holder.incident_id,
                                               slurm_node=holder.slurm_node), cluster)
                    for i in dict.fromkeys([instance_id, *holder.instances])]
        return holder.incident_id if released[0] else None

    def release_claim(self, claim: Claim) -> bool:
        """Release a claim still held by ``claim.incident_id``; False if it changed meanwhile."""
        return self._conditional("delete_item", Key=_claim_key(claim.kind, claim.key),
                                 ConditionExpression="incident_id = :id",
                                 ExpressionAttributeValues={":id": {"S": claim.incident_id}})

    def release_claims(self, incident_id: str) -> list[Claim]:
        """Release what an ended incident claimed (its hot spare, its replacement instances), each
        only while still its own; an open incident keeps them. Those released. The reconciler
        releases any claim of an ended incident this misses (an incident's records name only the
        claims it kept)."""
        incident = self.get(incident_id)
        return [] if incident.status == "open" else [c for c in incident.claims if self.release_claim(c)]

    def still_open(self, incident_ids: list[str]) -> set[str]:
        """Those of ``incident_ids`` that have not ended (one missing from the ledger counts as open)."""
        statuses = self.statuses(incident_ids)
        return {i for i in incident_ids if statuses.get(i, "open") not in ENDED_STATUSES}

    def statuses(self, incident_ids: list[str]) -> dict[str, str]:
        """The status of each incident (batch read; missing ones are left out)."""
        items = self._read_consistently([_incident_key(i)["pk"]["S"] for i in incident_ids],
                                        ProjectionExpression="pk, #s", ExpressionAttributeNames={"#s": "status"})
        return {item["pk"]["S"].removeprefix("INCIDENT#"): item["status"]["S"] for item in items}

    # -- events already acted on, and nodes repaired: what makes a redelivery harmless -----
    def event_handled_by(self, event_key: str) -> str | None:
        """The incident that took an event (it opened one, or was folded into one) within
        ``EVENT_MEMORY`` (longer than any redelivery: EventBridge retries for 24 h, a dead-letter
        queue keeps 14 days)."""
        item = self._db.get_item(TableName=self._table, Key={"pk": {"S": ACKNOWLEDGEMENT_PREFIX + event_key}},
                                 ConsistentRead=True).get("Item")
        return str(item["incident_id"]["S"]) if item and "incident_id" in item else None

    def acknowledge_event(self, event_key: str, decision: str, incident_id: str | None, now: datetime) -> None:
        """Record Detect's decision on an event (``remediate``, ``deduplicated``, ``monitor``,
        ``rejected``) and the incident that took it, if one did: the item an agent reads to stop
        sending the event again (``acknowledgement_key``). The incident an event opened stays its
        taker: a later delivery folded into another incident of the node (or refused as stale)
        does not overwrite it, so :meth:`event_handled_by` names the incident that acted on it."""
        self._conditional("put_item", Item={
            "pk": {"S": ACKNOWLEDGEMENT_PREFIX + event_key}, "decision": {"S": decision},
            **({"incident_id": {"S": incident_id}} if incident_id else {}),
            "at": {"S": now.isoformat()}, "expires_at": _ttl(now + EVENT_MEMORY)},
            ConditionExpression="attribute_not_exists(pk) OR decision <> :opened",
            ExpressionAttributeValues={":opened": {"S": "remediate"}})

    def first_announcement(self, key: str, now: datetime) -> bool:
        """True the first time ``key`` is announced within ``EVENT_MEMORY``: a redelivered event
        (EventBridge delivers at least once) says nothing twice. One conditional write, so two
        deliveries at the same moment announce once."""
        return self._conditional("put_item", Item={
            "pk": {"S": f"ANNOUNCED#{key}"}, "at": {"S": now.isoformat()},
            "expires_at": _ttl(now + EVENT_MEMORY)},
            ConditionExpression="attribute_not_exists(pk)")

    def forget_announcement(self, key: str) -> None:
        """Undo :meth:`first_announcement` for ``key``: what was to be said could not be sent,
        so the next delivery says it."""
        self._db.delete_item(TableName=self._table, Key={"pk": {"S": f"ANNOUNCED#{key}"}})

    # -- jobs asked to checkpoint for a rebalance recommendation (nodemedic.rebalance) -------
    def claim_rebalance_checkpoint(self, cluster: str, job_id: str, now: datetime, quiet: timedelta) -> bool:
        """True when the job was not asked within ``quiet`` before ``now``: it is claimed now. One
        conditional write, so two deliveries at the same moment ask it once."""
        return self._conditional(
            "put_item", Item={**_rebalance_key(cluster, job_id), "at": {"N": f"{now.timestamp():.3f}"},
                              "expires_at": _ttl(now + quiet)},
            ConditionExpression="attribute_not_exists(pk) OR #at < :since",
            ExpressionAttributeNames={"#at": "at"},
            ExpressionAttributeValues={":since": {"N": f"{(now - quiet).timestamp():.3f}"}})

    def release_rebalance_checkpoint(self, cluster: str, job_id: str) -> None:
        """Undo the claim: the job could not be signalled, so the next delivery asks it."""
        self._db.delete_item(TableName=self._table, Key=_rebalance_key(cluster, job_id))

    # -- pages the reconciler could not send: sent with its next run ---------------------
    def unsent_pages(self, cluster: str) -> list[str]:
        item = self._db.get_item(TableName=self._table, Key=_outbox_key(cluster), ConsistentRead=True).get("Item")
        return [p["S"] for p in item["pages"]["L"]] if item and "pages" in item else []

    def keep_unsent_pages(self, cluster: str, pages: list[str]) -> None:
        """Keep ``pages`` for the next run (at most ``OUTBOX_PAGES``, the oldest dropped first)."""
        kept = self.unsent_pages(cluster)
        start = max(0, len(kept) + len(pages) - OUTBOX_PAGES)
        self._db.put_item(TableName=self._table, Item={**_outbox_key(cluster), "pages": {"L": [
            {"S": p[:OUTBOX_PAGE_CHARS]} for p in (kept + pages)[start:]]}})

    def sent_pages(self, cluster: str, count: int) -> None:
        """The first ``count`` kept pages were sent (others kept meanwhile stay)."""
        if count:
            self._db.update_item(TableName=self._table, Key=_outbox_key(cluster),
                                 UpdateExpression="REMOVE " + ", ".join(f"pages[{i}]" for i in range(count)))

    # -- nodes in service NodeMedic cannot watch (the reconciler's record) ---------------
    def unwatched_nodes(self, cluster: str) -> UnwatchedNodes:
        """The record, or an empty one where there is none or this version cannot read it (written
        by another version, damaged): the next save starts it afresh instead of failing every run."""
        item = self._db.get_item(TableName=self._table, Key=_unwatched_key(cluster), ConsistentRead=True).get("Item")
        try:
            return UnwatchedNodes.model_validate_json(item["nodes"]["S"]) if item else UnwatchedNodes()
        except (KeyError, TypeError, ValidationError):
            return UnwatchedNodes()

    def save_unwatched_nodes(self, cluster: str, unwatched: UnwatchedNodes) -> None:
        self._db.put_item(TableName=self._table, Item={**_unwatched_key(cluster), "nodes": {"S": unwatched.model_dump_json()}})

    def newest_notice(self, key: str, version: datetime, keep_until: datetime) -> bool:
        """True unless a later version of the notice ``key`` was seen (until ``keep_until``). AWS
        sends an updated notice (a new status, a new window) under the same key, and EventBridge
        may deliver an older version after it: a failed delivery is retried for up to an hour, an
        archive is replayed. The same version again is True: a redelivery (Detect deduplicates
        it), or the retry of an invocation that failed. One conditional write."""
        stamp = str(int(version.timestamp() * 1_000_000))
        return self._conditional("put_item", Item={
            "pk": {"S": f"NOTICE#{key}"}, "version_us": {"N": stamp}, "expires_at": _ttl(keep_until)},
            ConditionExpression="attribute_not_exists(pk) OR version_us <= :v",
            ExpressionAttributeValues={":v": {"N": stamp}})

    def repaired_at(self, cluster: str, slurm_node: str) -> datetime | None:
        """When the node's last incident closed (it was back in service or in the spare pool)."""
        item = self._db.get_item(TableName=self._table, Key=_repaired_key(cluster, slurm_node),
                                 ConsistentRead=True).get("Item")
        return datetime.fromisoformat(item["at"]["S"]) if item else None

    # -- jobs a drain interrupted on other nodes: one job's several failed nodes each take a spare
    def mark_interrupted(self, cluster: str, slurm_node: str, job_id: str, incident_id: str, now: datetime) -> None:
        """``job_id``, which also ran on ``slurm_node``, was requeued by ``incident_id``."""
        self._db.update_item(
            TableName=self._table, Key=_interrupted_key(cluster, slurm_node),
            UpdateExpression="ADD jobs :job SET incident_id = :id, expires_at = :exp",
            ExpressionAttributeValues={":job": {"SS": [job_id]}, ":id": {"S": incident_id},
                                       ":exp": _ttl(now + INTERRUPTION_MEMORY)})

    def interrupted_on(self, cluster: str, slurm_node: str, now: datetime) -> list[str]:
        """Jobs that ran on ``slurm_node`` and another incident's drain requeued, within the hour."""
        item = self._db.get_item(TableName=self._table, Key=_interrupted_key(cluster, slurm_node),
                                 ConsistentRead=True).get("Item")
        if not item or int(item["expires_at"]["N"]) < now.timestamp():  # TTL deletes late: check it here
            return []
        return sorted(item["jobs"]["SS"])

    def claim(self, kind: str, key: str, incident_id: str) -> bool:
        """Take ``key`` (a replacement instance, a hot spare) for an incident; False if another
        incident has it. The claim holds until :meth:`release`."""
        return self._conditional("put_item", Item={**_claim_key(kind, key), "incident_id": {"S": incident_id},
                                                   **_books(CLAIMS_BOOK)},
                                 ConditionExpression="attribute_not_exists(pk) OR incident_id = :id",
                                 ExpressionAttributeValues={":id": {"S": incident_id}})

    def release(self, kind: str, key: str) -> None:
        self._db.delete_item(TableName=self._table, Key=_claim_key(kind, key))

    # -- deep health checks waiting for their SSM result ---------------------------------
    def save_check(self, command_id: str, incident_id: str, task_token: str, detail: dict[str, Any]) -> None:
        self._db.put_item(TableName=self._table, Item={
            "pk": {"S": f"CHECK#{command_id}"}, "incident_id": {"S": incident_id},
            "task_token": {"S": task_token}, "doc": {"S": json.dumps(detail)}})

    def waiting_check(self, command_id: str) -> tuple[str, str, dict[str, Any]] | None:
        """The check waiting on ``command_id`` (incident id, task token, detail); None if none.
        It stays until :meth:`forget_check`, after its task was answered: an error in between
        (SSM or Step Functions throttled, the function timed out) leaves it for the retry."""
        resp = self._db.get_item(TableName=self._table, Key={"pk": {"S": f"CHECK#{command_id}"}},
                                 ConsistentRead=True)
        item = resp.get("Item")
        if not item:
            return None
        return item["incident_id"]["S"], item["task_token"]["S"], json.loads(item["doc"]["S"])

    def forget_check(self, command_id: str) -> None:
        self._db.delete_item(TableName=self._table, Key={"pk": {"S": f"CHECK#{command_id}"}})

def _lock_from(item: dict[str, Any]) -> NodeLock:
    """A node lock from its item (``NODE#<cluster>#<instance>``)."""
    return NodeLock(instance_id=item["pk"]["S"].split("#", 2)[2], incident_id=item["incident_id"]["S"],
                    slurm_node=item.get("slurm_node", {}).get("S", ""))


def _recheck_from(item: dict[str, Any]) -> Recheck:
    return Recheck(cluster=item["cluster"]["S"], slurm_node=item["slurm_node"]["S"], fault_code=item["fault_code"]["S"],
                   incident_id=item["incident_id"]["S"], due=datetime.fromisoformat(item["due"]["S"]),
                   offers=int(item.get("offers", {}).get("N", "0")))


def _hold_from(cluster: str, slurm_node: str, item: dict[str, Any]) -> DrainHold:
    return DrainHold(cluster=cluster, slurm_node=slurm_node, instance_id=item["instance_id"]["S"],
                     incident_id=item["incident_id"]["S"], reason=item["reason"]["S"],
                     since=datetime.fromisoformat(item["since"]["S"]))


def _from_item(item: dict[str, Any]) -> Incident:
    incident = Incident.model_validate_json(item["doc"]["S"])
    incident.status = item["status"]["S"]
    incident.stages = {
        name: StageRecord.model_validate_json(value["S"])
        for name, value in item.get("stages", {}).get("M", {}).items()
    }
    incident.duplicate_events = int(item.get("duplicate_events", {}).get("N", "0"))
    if "closed_at" in item:
        incident.closed_at = datetime.fromisoformat(item["closed_at"]["S"])
    if "outcome" in item:
        incident.outcome = item["outcome"]["S"]
    if "failed_at" in item:
        incident.failed_at = datetime.fromisoformat(item["failed_at"]["S"])
    if "failure" in item:
        incident.failure = {k: v["S"] for k, v in item["failure"]["M"].items()}
    incident.folded_faults = sorted(_folded(item), key=lambda f: f.observed_at)
    return incident


def _folded(item: dict[str, Any]) -> list[FoldedFault]:
    """The folded faults noted on an incident's item; one that no longer reads is left out (the
    incident itself must always read)."""
    found = []
    for value in item.get("folded_faults", {}).get("M", {}).values():
        try:
            found.append(FoldedFault.model_validate_json(value.get("S", "")))
        except ValidationError:
            continue
    return found
