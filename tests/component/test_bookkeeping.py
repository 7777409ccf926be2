"""What the reconciler checks every 5 minutes is read through the table's sparse index, not a
scan of the whole table: the table keeps every incident and 15 days of events, so the scan grew
with both (at 10,000 incidents, some 50 MB read every 5 minutes). The index is eventually
consistent on AWS; these tests play its lag at the API boundary (moto's index is always current)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nodemedic.contracts.incident import Incident
from nodemedic.store.ledger import Ledger
from nodemedic_sandbox.deploy import create_table_as_declared
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from tests.stages.conftest import index_lag
from tests.stages.memory_slurm import MemorySlurm

NOW = datetime.now(UTC)


class Table:
    def __init__(self, db: Any) -> None:
        self.db, self.ledger = db, Ledger(db, create_table_as_declared(db, "incidents"))
        self.calls: Counter[str] = Counter()
        self.keys_read = 0
        db.meta.events.register("provide-client-params.dynamodb", self._count)

    def _count(self, model: Any, params: dict[str, Any], **_: Any) -> None:
        self.calls[model.name] += 1
        if model.name == "BatchGetItem":
            self.keys_read += sum(len(r["Keys"]) for r in params["RequestItems"].values())

    def unindexed(self, pk: str) -> None:
        """The item as a version before the index wrote it."""
        self.db.update_item(TableName="incidents", Key={"pk": {"S": pk}}, UpdateExpression="REMOVE books")


@pytest.fixture
def table() -> Iterator[Table]:
    with EmbeddedAWS() as aws:
        yield Table(aws.client("dynamodb"))


def incident(incident_id: str, node: str, cluster: str = "c1") -> Incident:
    return Incident(incident_id=incident_id, cluster=cluster, instance_id=f"i-{node}", slurm_node=node,
                    fault_code="XID 79", fault_class="gpu_lost", action="replace", source="test",
                    observed_at=NOW, status="open", detected_at=NOW, reason="test")


def test_the_bookkeeping_reads_what_it_checks_not_every_incident_and_event_kept(table: Table) -> None:
    ledger = table.ledger
    for n in range(300):  # history: incidents that ended, and the events Detect remembers
        ended = incident(f"old-{n}", f"gpu-{n}")
        ledger.open_incident(ended)
        ledger.close(ended, NOW)
        ledger.acknowledge_event(f"agent/event-{n}", "remediate", f"old-{n}", NOW)
    running = incident("open-1", "gpu-1")
    ledger.open_incident(running)
    ledger.hold_drain(running, "nodemedic:open-1 XID 79", NOW)
    ledger.claim("spare", "spare-1", "open-1")
    ledger.open_incident(incident("other-1", "gpu-1", cluster="c2"))  # another cluster's, in the same table

    ledger.bookkeeping("c1", NOW)  # the first read sweeps the table once for items written before the index
    table.calls.clear()
    table.keys_read = 0
    books = ledger.bookkeeping("c1", NOW + timedelta(minutes=5))
    assert [i.incident_id for i in books.open_incidents] == ["open-1"]
    assert [(lock.slurm_node, lock.incident_id) for lock in books.locks] == [("gpu-1", "open-1")]
    assert [(h.slurm_node, h.incident_id) for h in books.holds] == [("gpu-1", "open-1")]
    assert [(c.kind, c.key, c.incident_id) for c in books.claims] == [("spare", "spare-1", "open-1")]
    assert table.calls["Scan"] == 0
    assert table.keys_read == 4  # the incident, its lock, its hold, its claim: nothing of the history


def test_what_a_version_before_the_index_wrote_is_found_by_the_daily_sweep(table: Table) -> None:
    ledger = table.ledger
    running = incident("open-1", "gpu-1")
    ledger.open_incident(running)
    ledger.hold_drain(running, "nodemedic:open-1 XID 79", NOW)
    ledger.claim("replacement", "i-0aaaaaaaaaaaaaaaa", "open-1")
    ended = incident("old-1", "gpu-2")
    ledger.open_incident(ended)
    for pk in ("INCIDENT#open-1", "NODE#c1#i-gpu-1", "DRAINHOLD#c1#gpu-1", "CLAIM#replacement#i-0aaaaaaaaaaaaaaaa"):
        table.unindexed(pk)
    # an older version ended this one without taking it out of the index
    table.db.update_item(TableName="incidents", Key={"pk": {"S": "INCIDENT#old-1"}},
                         UpdateExpression="SET #s = :closed", ExpressionAttributeNames={"#s": "status"},
                         ExpressionAttributeValues={":closed": {"S": "closed"}})

    books = ledger.bookkeeping("c1", NOW)  # after an upgrade: the first run sweeps
    assert [i.incident_id for i in books.open_incidents] == ["open-1"]
    assert sorted(lock.incident_id for lock in books.locks) == ["old-1", "open-1"]  # old-1's: the reconciler frees it
    assert [h.incident_id for h in books.holds] == ["open-1"] and [c.incident_id for c in books.claims] == ["open-1"]
    indexed = table.db.query(TableName="incidents", IndexName="Bookkeeping", KeyConditionExpression="books = :b",
                             ExpressionAttributeValues={":b": {"S": "c1"}})["Items"]
    assert "INCIDENT#old-1" not in {i["pk"]["S"] for i in indexed}  # the sweep took it out
    assert "INCIDENT#open-1" in {i["pk"]["S"] for i in indexed}

    table.unindexed("DRAINHOLD#c1#gpu-1")  # written by an older version during a rolling update
    assert ledger.bookkeeping("c1", NOW + timedelta(hours=1)).holds == []  # the index alone until the next sweep
    assert table.calls["Scan"] == 1
    assert [h.incident_id for h in ledger.bookkeeping("c1", NOW + timedelta(hours=25)).holds] == ["open-1"]
    assert table.calls["Scan"] == 2


def test_an_index_that_lags_never_shows_what_is_gone_and_misses_the_new_only_until_the_next_run(
        table: Table) -> None:
    ledger = table.ledger
    ended = incident("ended-1", "gpu-1")
    ledger.open_incident(ended)
    ledger.claim("spare", "spare-1", "ended-1")
    ledger.bookkeeping("c1", NOW)
    ledger.close(ended, NOW)  # its lock released, and out of the index: which still lists them
    ledger.release("spare", "spare-1")
    with index_lag(table.db, listed=["INCIDENT#ended-1", "NODE#c1#i-gpu-1", "CLAIM#spare#spare-1"]):
        books = ledger.bookkeeping("c1", NOW + timedelta(minutes=5))
    assert (books.open_incidents, books.locks, books.claims) == ([], [], [])

    fresh = incident("fresh-1", "gpu-2")
    ledger.open_incident(fresh)
    with index_lag(table.db, unlisted=["INCIDENT#fresh-1", "NODE#c1#i-gpu-2"]):  # not in the index yet
        assert ledger.bookkeeping("c1", NOW + timedelta(minutes=10)).open_incidents == []
    assert [i.incident_id for i in ledger.bookkeeping("c1", NOW + timedelta(minutes=15)).open_incidents] == ["fresh-1"]


def test_the_reconciler_does_not_fail_an_incident_the_index_still_lists_as_open(table: Table) -> None:
    """Its execution ended and closed it; the index has not caught up. The reconciler's read of the
    incident itself says closed: nothing is failed, nothing drained, nobody paged."""
    from nodemedic.reconciler import reconcile

    ledger = table.ledger
    slurm = MemorySlurm(["gpu-1", "gpu-2"])
    done = incident("done-1", "gpu-1")
    ledger.open_incident(done)
    ledger.close(done, NOW)
    with index_lag(table.db, listed=["INCIDENT#done-1"]):
        report = reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "SUCCEEDED",
                           prefix="nodemedic", now=NOW + timedelta(minutes=5), publish=lambda _: None)
    assert (report.incidents_failed, report.pages, report.errors) == ([], [], [])
    assert ledger.get("done-1").status == "closed" and not slurm.n["gpu-1"].drained



def test_a_large_table_is_swept_over_several_runs(table: Table, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep reads at most SWEEP_PAGES pages a run and goes on at the next: a reconciler run
    (5 min timeout) never grows with the table. Pages of 5 items stand for DynamoDB's 1 MB pages."""
    import nodemedic.store.ledger as ledger_module

    def small_pages(params: dict[str, Any], **_: Any) -> None:
        params["Limit"] = 5

    table.db.meta.events.register("provide-client-params.dynamodb.Scan", small_pages)
    monkeypatch.setattr(ledger_module, "SWEEP_PAGES", 2)
    ledger = table.ledger
    for n in range(30):
        ledger.open_incident(incident(f"old-{n}", f"gpu-{n}"))
        table.unindexed(f"NODE#c1#i-gpu-{n}")  # written before the index
    found = [len(ledger.bookkeeping("c1", NOW + timedelta(minutes=5 * run)).locks) for run in range(8)]
    assert found[0] < 30 and found[-1] == 30 and found == sorted(found)  # a few more each run
    assert table.calls["Scan"] <= 2 * 8
    sweeps = table.calls["Scan"]
    ledger.bookkeeping("c1", NOW + timedelta(hours=1))
    assert table.calls["Scan"] == sweeps  # through: none until the next day
