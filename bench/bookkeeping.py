"""What the reconciler reads every 5 minutes, against the table's history (issue 14).

The incident table keeps every incident (the report reads them) and Detect's memory of every
event for 15 days. The reconciler needs only what is open: locks, claims, drain holds, open
incidents. This fills a table created as ``template.yaml`` declares it (moto's DynamoDB) with
``--ended`` incidents that ended and ``--events`` remembered events, then ``--open`` incidents with
their lock, drain hold and claim, and measures per reconciler read (``Ledger.bookkeeping``, after
its daily sweep, which takes a few runs on this table): the items DynamoDB reads (the index's keys
plus the items read by key) and the bytes they hold, as the responses carry them. For comparison,
the same table's items a scan reads (what the reconciler did before, every run; what the daily
sweep does once a day, over a few runs). Moto's time is not DynamoDB's: only counts and sizes are
recorded.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from nodemedic.contracts.incident import Incident, StageRecord
from nodemedic.store.ledger import Ledger
from nodemedic_sandbox.deploy import create_table_as_declared
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from bench.results import record, summarize

CLUSTER = "bench"


def _incident(n: int, status: str, now: datetime) -> Incident:
    return Incident(incident_id=f"inc-{n:06d}", cluster=CLUSTER, instance_id=f"i-{n:017x}", slurm_node=f"gpu-{n}",
                    fault_code="XID 79", fault_class="gpu_lost", action="replace", source="agent", observed_at=now,
                    status=status, detected_at=now, reason="XID 79: GPU has fallen off the bus",
                    stages={s: StageRecord(started_at=now, completed_at=now, result={"detail": "x" * 300})
                            for s in ("detect", "gate", "drain", "spare", "repair", "resume")})


class Reads:
    """Items and bytes read, from the responses (a query lists keys; a batch read returns items)."""

    def __init__(self) -> None:
        self.items: Counter[str] = Counter()
        self.bytes = 0

    def hook(self, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        name = model.name
        if name in ("Query", "Scan"):
            self.items[name] += int(parsed.get("ScannedCount", parsed.get("Count", 0)))
            self.bytes += sum(len(json.dumps(i)) for i in parsed.get("Items", []))
        elif name == "BatchGetItem":
            found = [i for items in parsed.get("Responses", {}).values() for i in items]
            self.items[name] += len(found)
            self.bytes += sum(len(json.dumps(i)) for i in found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ended", type=int, default=10_000, help="incidents that ended (history)")
    parser.add_argument("--events", type=int, default=50_000, help="events Detect remembers (15 days of them)")
    parser.add_argument("--open", type=int, default=20, help="open incidents, each with a lock, a hold and a claim")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    now = datetime.now(UTC)
    with EmbeddedAWS() as aws:
        db = aws.client("dynamodb")
        ledger = Ledger(db, create_table_as_declared(db, "incidents"))
        for n in range(args.ended):
            ended = _incident(n, "open", now)
            ledger.open_incident(ended)
            ledger.close(ended, now)
            if n % 1000 == 0:
                print(f"history: {n:,} of {args.ended:,} incidents", flush=True)
        for n in range(args.events):
            ledger.acknowledge_event(f"nodemedic.agent/event-{n}", "deduplicated", f"inc-{n % max(args.ended, 1):06d}",
                                     now)
            if n % 10_000 == 0:
                print(f"history: {n:,} of {args.events:,} events", flush=True)
        for n in range(args.ended, args.ended + args.open):
            running = _incident(n, "open", now)
            ledger.open_incident(running)
            ledger.hold_drain(running, f"nodemedic:{running.incident_id} XID 79", now)
            ledger.claim("spare", f"spare-{n}", running.incident_id)
        reads = Reads()
        db.meta.events.register("after-call.dynamodb", reads.hook)
        sweeps = 0
        while True:  # the daily sweep first (20 pages a run): measured is a run after it
            reads.items.clear()
            ledger.bookkeeping(CLUSTER, now + timedelta(seconds=sweeps))
            sweeps += 1
            if not reads.items["Scan"]:
                break
        print(f"the daily sweep took {sweeps - 1} run(s)", flush=True)
        now += timedelta(seconds=sweeps)
        index_items, index_bytes, scan_items, scan_bytes = [], [], [], []
        for run in range(args.runs):
            reads.items.clear()
            reads.bytes = 0
            books = ledger.bookkeeping(CLUSTER, now + timedelta(minutes=5 * (run + 1)))
            assert len(books.open_incidents) == args.open and len(books.locks) == args.open
            index_items.append(float(sum(reads.items.values())))
            index_bytes.append(float(reads.bytes))
            reads.items.clear()
            reads.bytes = 0
            pages = db.get_paginator("scan").paginate(TableName="incidents", ConsistentRead=True)
            for _ in pages:
                pass
            scan_items.append(float(reads.items["Scan"]))
            scan_bytes.append(float(reads.bytes))
    command = (f"python -m bench.bookkeeping --ended {args.ended} --events {args.events} --open {args.open} "
               f"--runs {args.runs}")
    table = f"{args.ended:,} ended incidents, {args.events:,} events, {args.open} open"
    before = "a scan of the whole table (every run before the index; now the daily sweep)"
    record([
        summarize(f"reconciler bookkeeping ({table}): items read per run", "items", index_items, command),
        summarize(f"reconciler bookkeeping ({table}): bytes read per run", "bytes", index_bytes, command),
        summarize(f"reconciler bookkeeping ({table}): items read by {before}", "items", scan_items, command),
        summarize(f"reconciler bookkeeping ({table}): bytes read by {before}", "bytes", scan_bytes, command),
    ])


if __name__ == "__main__":
    main()
