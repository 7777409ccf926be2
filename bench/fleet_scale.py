"""Fleet scale (issue 15): a 10,000-node fleet's heartbeats and the silence sweep.

Every node's heartbeat arrives in the sweeper's queue at the agent's interval (15 s), as the
heartbeat rule's SQS target delivers it (the EventBridge envelope), for ``--minutes`` of real
time. The sweeper's own code (``nodemedic.silence_sweeper``) sweeps every 10 s, as the deployed
function does: the roster in moto's DynamoDB, the queue answered in-process (moto's SQS is far
slower than AWS's; see MemoryQueue), so what is timed is the sweeper's own work and its DynamoDB
reads and writes, not SQS's latency. ``--silent`` nodes stop beating halfway. Measured per sweep: its duration, the heartbeats it
drained, the backlog left in the queue, the peak memory it allocated (tracemalloc, one sweep in six,
which are not timed); per silent
node, the time from its last heartbeat to its report; and every node reported that was beating
(a false silence: it must be 0). The AWS calls counted over the run, at us-east-1 list prices,
give the monthly cost of heartbeats and sweeps at that fleet size.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import threading
import time
import tracemalloc
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from nodemedic.providers.base import Member
from nodemedic.silence_sweeper import SilenceSweeper
from nodemedic.store.roster import SHARD_BYTES, RosterStore
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from bench.results import record, summarize

SWEEP_EVERY_S = 10.0  # SilenceSweepsPerInvocation 6: one sweep every 10 s
THRESHOLD_S = 45.0  # HeartbeatSilenceSeconds default
MONTH_MIN = 43_800  # minutes in an average month
PRICES = {  # us-east-1 list prices
    "event": 1.00 / 1_000_000,  # EventBridge custom event (a heartbeat PutEvents entry)
    "sqs_request": 0.40 / 1_000_000,  # SQS standard (the rule's delivery, each receive, each delete batch)
    "dynamodb_write_unit": 1.25 / 1_000_000,  # on-demand write request unit (1 KB)
    "dynamodb_read_unit": 0.25 / 1_000_000,  # on-demand read request unit (4 KB, strongly consistent)
    "lambda_gb_s_arm": 0.0000133334,
    "lambda_request": 0.20 / 1_000_000,
}
SWEEPER_GB = 0.125  # MemorySize 128 in template.yaml


class Fleet:
    """Every node is a member of the cluster, running (what the sweeper asks of the provider)."""

    kind = "bench"

    def member(self, instance_id: str) -> Member | None:
        return Member(instance_id=instance_id, slurm_node=None, state="running")


def _instance(n: int) -> str:
    return f"i-{n:017x}"


def _body(cluster: str, n: int, now: datetime, interval: float) -> str:
    detail = {"schema_version": "1", "cluster": cluster, "sent_at": now.isoformat(), "interval_seconds": interval,
              "node": {"instance_id": _instance(n), "hostname": f"gpu-{n}.local", "slurm_node": f"gpu-{n}"}}
    return json.dumps({"version": "0", "detail-type": "Node Heartbeat", "source": "nodemedic.agent",
                       "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "detail": detail})


class MemoryQueue:
    """The heartbeat queue, answered in-process: moto's SQS answers ReceiveMessage far more slowly
    than AWS with a thousand messages queued, which would measure moto, not the sweeper. It
    counts the calls, which the cost is computed from."""

    def __init__(self) -> None:
        self._ready: collections.deque[dict[str, Any]] = collections.deque()
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self._handles = itertools.count()

    def send(self, bodies: list[str]) -> None:
        with self._lock:
            sent = str(int(time.time() * 1000))  # SQS's SentTimestamp, which dates a heartbeat
            self._ready.extend({"Body": b, "ReceiptHandle": str(next(self._handles)),
                                "Attributes": {"SentTimestamp": sent}} for b in bodies)

    def receive_message(self, QueueUrl: str, MaxNumberOfMessages: int, WaitTimeSeconds: int,  # noqa: N803
                        MessageSystemAttributeNames: list[str]) -> dict[str, Any]:  # noqa: N803
        with self._lock:
            self.calls["sqs.ReceiveMessage"] += 1
            out = [self._ready.popleft() for _ in range(min(MaxNumberOfMessages, len(self._ready)))]
        return {"Messages": out} if out else {}

    def delete_message_batch(self, QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, Any]:  # noqa: N803
        with self._lock:
            self.calls["sqs.DeleteMessageBatch"] += 1
        return {"Successful": [{"Id": e["Id"]} for e in Entries]}

    def backlog(self) -> int:
        with self._lock:
            return len(self._ready)


class Calls:
    """Counts the AWS calls the sweeper makes (and their request units)."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.lock = threading.Lock()

    def hook(self, event_name: str, **_: Any) -> None:
        with self.lock:
            self.count[event_name.split(".", 1)[1]] += 1


def run(nodes: int, minutes: float, interval: float, silent: int) -> list[dict[str, Any]]:
    cluster = "scale"
    with EmbeddedAWS() as aws:
        db = aws.client("dynamodb")
        queue, url = MemoryQueue(), "heartbeats"
        aws.client("events").create_event_bus(Name="bench")  # no rule: the reports go nowhere further
        db.create_table(TableName="ledger", BillingMode="PAY_PER_REQUEST",
                        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
        sweeper_db, events = aws.client("dynamodb"), aws.client("events")
        calls = Calls()
        for client in (sweeper_db, events):
            client.meta.events.register("before-call", calls.hook)
        reported: dict[str, float] = {}
        events.meta.events.register("before-parameter-build.events.PutEvents", lambda params, **_: [
            reported.setdefault(json.loads(e["Detail"])["node"]["instance_id"], time.monotonic())
            for e in params["Entries"]])
        sweeper = SilenceSweeper(sqs=queue, events=events, roster=RosterStore(sweeper_db, "ledger", cluster),
                                 provider=Fleet(), queue_url=url, bus="bench", cluster=cluster,
                                 threshold_s=THRESHOLD_S)

        stop = threading.Event()
        silent_from = time.monotonic() + minutes * 30  # halfway
        last_beat: dict[int, float] = {}
        delivered = Counter[str]()

        def beat() -> None:  # each node at its own phase of the interval, as a real fleet
            start = time.monotonic()
            sent = 0
            while not stop.is_set():
                due = int((time.monotonic() - start) / interval * nodes)  # beats due by now, all nodes
                batch = []
                while sent < due and len(batch) < 10:
                    n = sent % nodes
                    sent += 1
                    if n < silent and time.monotonic() >= silent_from:
                        continue
                    last_beat[n] = time.monotonic()
                    batch.append(_body(cluster, n, datetime.now(UTC), interval))
                if batch:
                    queue.send(batch)
                    delivered["heartbeats"] += len(batch)
                else:
                    time.sleep(0.01)

        feeder = threading.Thread(target=beat, daemon=True)
        # the fleet is beating before the sweeper starts: one interval of heartbeats
        feeder.start()
        time.sleep(interval)
        durations, drained, backlog, memory = [], [], [], []
        end = time.monotonic() + minutes * 60
        next_sweep = time.monotonic()
        while time.monotonic() < end:
            time.sleep(max(0.0, next_sweep - time.monotonic()))
            next_sweep += SWEEP_EVERY_S
            traced = len(drained) % 6 == 1  # tracemalloc slows a sweep many times: one in six is traced
            if traced:
                tracemalloc.start()
            started = time.perf_counter()
            result = sweeper.sweep(datetime.now(UTC))
            if traced:
                memory.append(tracemalloc.get_traced_memory()[1] / 2**20)
                tracemalloc.stop()
            else:
                durations.append(time.perf_counter() - started)
            drained.append(float(result.heartbeats))
            backlog.append(float(queue.backlog()))
            print(f"sweep {len(drained)}: {time.perf_counter() - started:.2f} s{' (traced)' if traced else ''}, "
                  f"{result.heartbeats} heartbeats, backlog {int(backlog[-1])}, watched {result.watched}, "
                  f"reported {len(result.reported)}", flush=True)
        stop.set()
        feeder.join()
        elapsed_min = minutes
        false = sorted(i for i in reported if int(i[2:], 16) >= silent)
        detect = [reported[_instance(n)] - last_beat[n] for n in range(silent) if _instance(n) in reported]

    # the bill at this fleet size, per month: what the run counted, scaled to a month
    per_min = {k: v / elapsed_min for k, v in (calls.count + queue.calls).items()}
    heartbeats_min = nodes * 60 / interval
    roster_kb = 0.19 * nodes  # this run's entries (short names, no perf samples) take about 190 bytes a node
    shards = -(-int(roster_kb * 1000) // SHARD_BYTES)
    shard_kb = roster_kb / shards
    sweeps_min = 60 / SWEEP_EVERY_S
    cost = {
        "EventBridge heartbeat events": heartbeats_min * PRICES["event"],
        "SQS delivery, receives, deletes": (heartbeats_min + per_min.get("sqs.ReceiveMessage", 0)
                                            + per_min.get("sqs.DeleteMessageBatch", 0)) * PRICES["sqs_request"],
        "DynamoDB roster reads": sweeps_min * shards * -(-shard_kb // 4) * PRICES["dynamodb_read_unit"],
        "DynamoDB roster writes": sweeps_min * shards * -(-shard_kb // 1) * PRICES["dynamodb_write_unit"],
        "Lambda (sweeper, 60 s per invocation)": (60 * SWEEPER_GB * PRICES["lambda_gb_s_arm"]
                                                  + PRICES["lambda_request"]),
    }
    monthly = {k: round(v * MONTH_MIN, 2) for k, v in cost.items()}
    command = f"make bench (python -m bench.fleet_scale --nodes {nodes} --minutes {minutes:g})"
    common = {"nodes": nodes, "heartbeat_interval_s": interval, "heartbeats_delivered": delivered["heartbeats"]}
    results = [
        summarize(f"{nodes:,} nodes: silence sweep duration", "s", durations, command, **common,
                  target=f"< {SWEEP_EVERY_S:g} s (the sweep interval)",
                  notes="One sweep: drain the queued heartbeats (8 receive loops, 6 s budget), load and save the "
                        "sharded roster (moto DynamoDB), report the silent. The queue answers in-process: SQS's own "
                        "latency is not in this figure."),
        summarize(f"{nodes:,} nodes: heartbeats drained per sweep", "heartbeats", drained, command, **common,
                  arriving_per_sweep=round(heartbeats_min / sweeps_min)),
        summarize(f"{nodes:,} nodes: heartbeat backlog after a sweep", "messages", backlog, command, **common,
                  target="bounded (no growth over the run)"),
        summarize(f"{nodes:,} nodes: sweep peak memory", "MiB", memory, command, **common,
                  target=f"< {SWEEPER_GB * 1024:g} MiB (the sweeper's MemorySize)"),
        summarize(f"{nodes:,} nodes: silent node reported after its last heartbeat", "s", detect or [float("nan")],
                  command, **common, silent_nodes=silent, false_silences=len(false),
                  target=f"threshold {THRESHOLD_S:g} s + one sweep; 0 false silences"),
        summarize(f"{nodes:,} nodes: heartbeats and silence sweep, cost per month", "USD",
                  [round(sum(monthly.values()), 2)], command, **common, breakdown=monthly,
                  notes="us-east-1 list prices: the heartbeats as EventBridge events and SQS deliveries, the "
                        "sweeper's receives and deletes as counted in this run, the roster's reads and writes "
                        "(6 sweeps a minute), one Lambda of 128 MB running all minute."),
    ]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--minutes", type=float, default=4.0, help="real time the fleet beats and is swept")
    parser.add_argument("--interval", type=float, default=15.0, help="the agent's heartbeat interval")
    parser.add_argument("--silent", type=int, default=5, help="nodes that stop beating halfway")
    args = parser.parse_args()
    record(run(args.nodes, args.minutes, args.interval, args.silent))


if __name__ == "__main__":
    main()
