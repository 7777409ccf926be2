"""Event storm (issue 15): 20,000 events within a minute for a 10,000-node fleet.

What a fabric or power event looks like to NodeMedic: ``--faulty`` nodes (20 % of the fleet by
default, in racks of 32) report a fault each; every agent re-asserts its event until an incident
acknowledges it; EventBridge redelivers some events (at least once); the faulty nodes report a
second fault; healthy nodes report application XIDs (monitor only); and the bus carries junk
(malformed, far-future, oversized events) and events naming instances that are no members.

Each event runs the pipeline's first two stages as the deployed state machine runs them: Detect
(``nodemedic.stages.detect``), then Gate (``nodemedic.stages.gate``) for what Detect opened, with
the ASL's retries for the Gate (ControlConflictError, ThrottledError; intervals scaled by
``--retry-scale``), the ledger and control items in moto's DynamoDB, the template's default safety
policy, and ``--concurrency`` workers standing for concurrent Lambda invocations. An admitted
incident stays in progress for the whole storm (a replacement takes minutes). Not included:
EventBridge -> Step Functions delivery and Lambda start-up (see the pipeline benchmarks).

Measured: event -> decision (Detect's rejection, fold or monitor; else the Gate's verdict), the
throughput, the process's resident memory over the storm, and the control item's size (the one
item every Gate reads and writes). Checked, and the run fails otherwise: every event decided
once; no invalid or unknown-node event opened an incident; one incident per faulty node; at most
``MaxConcurrentRemediations`` admitted; the breaker tripped exactly once; one page for unknown nodes.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nodemedic.contracts.incident import IncidentRef
from nodemedic.contracts.stages import DetectInput
from nodemedic.errors import (
    ControlConflictError,
    InvalidEventError,
    ThrottledError,
    UnknownNodeError,
    UnknownNodeQuietError,
)
from nodemedic.providers.base import Member
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.stages.detect import detect
from nodemedic.stages.gate import gate
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from bench.results import record, summarize

CLUSTER = "storm"
RACK = 32  # nodes per rack (the breaker's correlation names it)
ASL = Path(__file__).resolve().parents[1] / "statemachines" / "remediation.asl.json"


def gate_retries() -> dict[str, dict[str, Any]]:
    """The Gate state's Retry rules for the two errors a storm raises, read from the ASL."""
    rules = json.loads(ASL.read_text())["States"]["Gate"]["Retry"]
    return {e: r for r in rules for e in r["ErrorEquals"] if e in ("ControlConflictError", "ThrottledError")}


class Fleet:
    """The capacity provider's read side for ``nodes`` running members, racked by 32."""

    kind = "bench"
    knows_new_instances = True

    def __init__(self, nodes: int) -> None:
        self.by_id = {instance(n): Member(instance(n), f"gpu-{n}", "running", {}, {"rack": f"rack-{n // RACK}"})
                        for n in range(nodes)}
        self.by_node = {m.slurm_node: m for m in self.by_id.values()}

    def member(self, instance_id: str) -> Member | None:
        return self.by_id.get(instance_id)

    def member_by_node(self, slurm_node: str) -> Member | None:
        return self.by_node.get(slurm_node)

    def members(self) -> list[Member]:
        return list(self.by_id.values())

    def size(self) -> int:
        return len(self.by_id)


def instance(n: int) -> str:
    return f"i-{n:017x}"


def envelope(detail: dict[str, Any], at: datetime) -> dict[str, Any]:
    """The event as EventBridge delivers it to the state machine."""
    return {"version": "0", "id": str(uuid.uuid4()), "detail-type": "Node Health Event", "source": "nodemedic.agent",
            "account": "123456789012", "time": at.strftime("%Y-%m-%dT%H:%M:%SZ"), "region": "us-east-1",
            "resources": [], "detail": detail}


def health(n: int, code: str, at: datetime, event_id: str | None = None) -> dict[str, Any]:
    return {"schema_version": "1", "event_id": event_id or str(uuid.uuid4()), "cluster": CLUSTER,
            "node": {"instance_id": instance(n), "hostname": f"gpu-{n}.local", "slurm_node": f"gpu-{n}"},
            "check": "kernel_log", "component": {"kind": "gpu", "index": 0}, "fault_code": code,
            "severity": "critical", "observed_at": at.isoformat(), "sent_at": at.isoformat(),
            "evidence": {"kmsg": f"NVRM: Xid (PCI:0000:00:00): {code.split()[-1]}"}}


def junk(n: int, at: datetime, rng: random.Random) -> dict[str, Any]:
    """An invalid event (what the fuzzing of issue 15 found passing validation, and worse)."""
    d = health(n, "XID 79", at)
    kind = rng.randrange(6)
    if kind == 0:
        d["observed_at"] = "2099-01-01T00:00:00+00:00"
    elif kind == 1:
        d["fault_code"] = "X" * 5000
    elif kind == 2:
        d["component"] = {"kind": "gpu", "index": True}
    elif kind == 3:
        d["observed_at"] = at.timestamp()
    elif kind == 4:
        del d["node"]
    else:
        d["cluster"] = "someone-elses"
    return d


@dataclass(order=True)
class Task:
    due: float
    seq: int
    index: int = field(compare=False)  # the event
    stage: str = field(compare=False)  # "detect" or "gate"
    incident: IncidentRef | None = field(compare=False, default=None)
    attempts: Counter[str] = field(compare=False, default_factory=Counter)


@dataclass
class Storm:
    """The events, in arrival order, and what each is expected to be."""

    arrivals: list[float]  # seconds after the start
    events: list[dict[str, Any]]
    kinds: list[str]
    faulty: list[int]


def compose(nodes: int, faulty: int, events: int, seconds: float, seed: int, resend_s: float = 15.0) -> Storm:
    rng = random.Random(seed)
    start = datetime.now(UTC)
    sick = sorted(rng.sample(range(min(nodes, faulty * 4)), faulty))  # clustered in the first racks
    faulty_set = set(sick)
    healthy = [n for n in range(nodes) if n not in faulty_set]
    plan: list[tuple[float, str, dict[str, Any]]] = []

    def at(t: float) -> datetime:
        return start + timedelta(seconds=t)

    firsts = []
    for n in sick:  # the fault, then the agent's re-assertions of the same event (every 15 s)
        t = rng.uniform(0, seconds / 4)
        d = health(n, rng.choice(["XID 79", "XID 48", "NVLINK_DOWN"]), at(t))
        firsts.append((t, envelope(d, at(t))))
        plan.append((t, "fault", firsts[-1][1]))
        for k in range(1, 4):
            r = t + resend_s * k
            plan.append((r, "reasserted", envelope({**d, "sent_at": at(r).isoformat()}, at(r))))
        t2 = rng.uniform(t, seconds)
        plan.append((t2, "second_fault", envelope(health(n, "XID 95", at(t2)), at(t2))))
    rest = events - len(plan)
    quota = {"redelivered": rest // 5, "invalid": rest // 5, "unknown_node": rest // 5}
    quota["monitor"] = rest - sum(quota.values())
    for _ in range(quota["redelivered"]):  # EventBridge delivers the same envelope again
        t, e = rng.choice(firsts)
        plan.append((rng.uniform(t, seconds), "redelivered", e))
    for _ in range(quota["invalid"]):
        t = rng.uniform(0, seconds)
        plan.append((t, "invalid", envelope(junk(rng.choice(healthy), at(t), rng), at(t))))
    for _ in range(quota["unknown_node"]):
        t = rng.uniform(0, seconds)
        plan.append((t, "unknown_node", envelope(health(nodes + rng.randrange(1_000_000), "XID 79", at(t)), at(t))))
    for _ in range(quota["monitor"]):
        t = rng.uniform(0, seconds)
        plan.append((t, "monitor", envelope(health(rng.choice(healthy), rng.choice(["XID 13", "XID 31", "XID 43"]),
                                                   at(t)), at(t))))
    plan.sort(key=lambda p: p[0])
    return Storm([p[0] for p in plan], [p[2] for p in plan], [p[1] for p in plan], sick)


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Runner:
    """Workers standing for concurrent Lambda invocations; a Step Functions retry waits in the
    schedule (holding no worker), as the state machine waits without a running Lambda."""

    def __init__(self, storm: Storm, aws: EmbeddedAWS, fleet: Fleet, concurrency: int, retry_scale: float) -> None:
        db = aws.client("dynamodb")
        db.create_table(TableName="incidents", BillingMode="PAY_PER_REQUEST",
                        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
        self.db, self.ledger, self.control = db, Ledger(db, "incidents"), ControlStore(db, "incidents", CLUSTER)
        self.calls = Counter[str]()
        db.meta.events.register("before-call.dynamodb", self._count)
        self.storm, self.fleet, self.concurrency, self.retry_scale = storm, fleet, concurrency, retry_scale
        self.policy = SafetyPolicy()  # the template's defaults (tests/unit/test_template.py)
        self.retries = gate_retries()
        self.rng = random.Random(1)
        self.heap: list[Task] = []
        self.cv = threading.Condition()
        self.seq = itertools.count()
        self.decided: dict[int, tuple[str, float]] = {}  # event -> (decision, seconds after arrival)
        self.pending = len(storm.events)
        self.errors: list[str] = []
        self.opened: list[str] = []  # incidents Detect opened
        self.cpu = Counter[int]()  # event -> CPU seconds its Detect and Gate runs took (GIL waits excluded)

    def _count(self, **_: Any) -> None:
        self.calls["dynamodb"] += 1

    def _push(self, task: Task) -> None:
        with self.cv:
            heapq.heappush(self.heap, task)
            self.cv.notify()

    def _decide(self, index: int, decision: str) -> None:
        with self.cv:
            self.decided[index] = (decision, time.monotonic() - self.t0 - self.storm.arrivals[index])
            self.pending -= 1
            self.cv.notify_all()

    def _next(self) -> Task | None:
        with self.cv:
            while True:
                if self.pending == 0:
                    return None
                now = time.monotonic()
                if self.heap and self.heap[0].due <= now:
                    return heapq.heappop(self.heap)
                self.cv.wait(timeout=(self.heap[0].due - now) if self.heap else 0.05)

    def _run(self, task: Task) -> None:
        cpu = time.thread_time()
        try:
            if task.stage == "detect":
                self._detect(task)
            else:
                self._gate(task)
        except Exception as exc:  # noqa: BLE001 - counted: the run fails
            self.errors.append(f"{task.stage} of event {task.index} ({self.storm.kinds[task.index]}): {exc!r}")
            self._decide(task.index, "error")
        finally:
            with self.cv:
                self.cpu[task.index] += time.thread_time() - cpu

    def _detect(self, task: Task) -> None:
        request = DetectInput(event=self.storm.events[task.index], incident_id=str(uuid.uuid4()))
        try:
            out = detect(request, cluster=CLUSTER, overrides_json="", provider=self.fleet, ledger=self.ledger,
                         control=self.control, now=datetime.now(UTC))
        except InvalidEventError:
            return self._decide(task.index, "rejected: invalid")
        except UnknownNodeQuietError:
            return self._decide(task.index, "rejected: unknown node (counted)")
        except UnknownNodeError:
            return self._decide(task.index, "rejected: unknown node (paged)")
        if out.decision != "remediate" or out.incident is None:
            return self._decide(task.index, out.decision)
        with self.cv:
            self.opened.append(out.incident.incident_id)
        self._push(Task(time.monotonic(), next(self.seq), task.index, "gate", out.incident))

    def _gate(self, task: Task) -> None:
        assert task.incident is not None
        try:
            out = gate(task.incident, load_policy=lambda: self.policy, provider=self.fleet, control=self.control,
                       ledger=self.ledger, clock=lambda: datetime.now(UTC))
        except (ControlConflictError, ThrottledError) as exc:
            rule = self.retries[type(exc).__name__]
            n = task.attempts[type(exc).__name__]
            if n >= rule["MaxAttempts"]:
                return self._decide(task.index, f"gate failed: {type(exc).__name__}")
            task.attempts[type(exc).__name__] += 1
            wait = rule["IntervalSeconds"] * rule["BackoffRate"] ** n * self.retry_scale
            if rule.get("JitterStrategy") == "FULL":
                wait = self.rng.uniform(0, wait)
            return self._push(Task(time.monotonic() + wait, next(self.seq), task.index, "gate", task.incident,
                                   task.attempts))
        self._decide(task.index, f"gate: {out.verdict}")

    def run(self, samples: list[tuple[float, float, int]]) -> float:
        """Feed the events at their arrival times; returns the seconds until the last decision."""
        self.t0 = time.monotonic()
        for i, t in enumerate(self.storm.arrivals):
            heapq.heappush(self.heap, Task(self.t0 + t, next(self.seq), i, "detect"))
        workers = [threading.Thread(target=self._work, daemon=True) for _ in range(self.concurrency)]
        for w in workers:
            w.start()
        shown = time.monotonic()
        while any(w.is_alive() for w in workers):
            time.sleep(0.5)
            item = self.db.get_item(TableName="incidents", Key={"pk": {"S": f"CONTROL#{CLUSTER}"}}).get("Item")
            samples.append((rss_mib(), len(item["doc"]["S"]) / 1024 if item else 0.0, len(self.decided)))
            if time.monotonic() - shown > 10:
                shown = time.monotonic()
                print(f"  +{shown - self.t0:.0f}s: {len(self.decided)}/{len(self.storm.events)} decided, "
                      f"RSS {samples[-1][0]:.0f} MiB", flush=True)
        return time.monotonic() - self.t0

    def _work(self) -> None:
        while (task := self._next()) is not None:
            self._run(task)


def check(runner: Runner, storm: Storm) -> dict[str, Any]:
    """The invariants; raises SystemExit naming the first that does not hold."""
    decisions = {i: d for i, (d, _) in runner.decided.items()}
    problems = list(runner.errors[:5])
    if len(decisions) != len(storm.events):
        problems.append(f"{len(storm.events) - len(decisions)} events never decided")
    for i, kind in enumerate(storm.kinds):
        d = decisions.get(i, "")
        if kind in ("invalid", "unknown_node") and not d.startswith("rejected"):
            problems.append(f"a {kind} event was not rejected: {d}")
        if kind == "monitor" and d != "monitor":
            problems.append(f"an application XID was not only monitored: {d}")
        if kind in ("fault", "reasserted", "redelivered", "second_fault") and not d.startswith(("gate", "dedup")):
            problems.append(f"a {kind} event was neither opened nor folded: {d}")
    opened = [i for i, d in decisions.items() if d.startswith("gate")]
    # whichever copy of an event is decided first opens its incident; every other copy is folded
    copies = Counter(storm.events[i]["detail"]["event_id"] for i in opened)
    if any(v > 1 for v in copies.values()):
        problems.append(f"{sum(v > 1 for v in copies.values())} events opened more than one incident")
    nodes = Counter(storm.events[i]["detail"]["node"]["slurm_node"] for i in opened)
    if set(nodes.values()) != {1} or len(nodes) != len(storm.faulty):
        problems.append(f"{len(nodes)} nodes got an incident ({len(storm.faulty)} faulty), "
                        f"{sum(v > 1 for v in nodes.values())} more than one")
    admitted = sum(decisions[i] in ("gate: proceed", "gate: verify") for i in opened)
    state = runner.control.read()
    statuses = dict(Counter(runner.ledger.statuses(runner.opened).values()))
    if statuses != {"open": admitted, "held": len(opened) - admitted}:  # nothing failed, nothing stranded
        problems.append(f"incidents {statuses}: expected {admitted} open (admitted) and the rest held")
    if admitted > runner.policy.max_concurrent:
        problems.append(f"{admitted} incidents admitted, more than the {runner.policy.max_concurrent} slots")
    if state.breaker.trips != 1:
        problems.append(f"the breaker tripped {state.breaker.trips} times, not once")
    pages = Counter(decisions.values())["rejected: unknown node (paged)"]
    if pages != 1:
        problems.append(f"{pages} pages for unknown nodes, not 1")
    if problems:
        raise SystemExit("storm invariants broken:\n  " + "\n  ".join(problems))
    return {"admitted": admitted, "breaker_trips": state.breaker.trips,
            "breaker_reason": state.breaker.tripped.reason if state.breaker.tripped else "",
            "incident_statuses": statuses}


WINDOW_S = 10.0


def window_rates(times: list[float], until: float) -> list[float]:
    """Events per second in each WINDOW_S window from 0 to ``until``."""
    counts = Counter(int(t // WINDOW_S) for t in times)
    return [counts[w] / WINDOW_S for w in range(int(until // WINDOW_S) + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--faulty", type=int, default=2_000, help="nodes that fault (each sends 5 events)")
    parser.add_argument("--seconds", type=float, default=60.0, help="the storm's length")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent Lambda invocations")
    parser.add_argument("--retry-scale", type=float, default=0.01, help="Step Functions retry intervals x this")
    parser.add_argument("--seed", type=int, default=15)
    args = parser.parse_args()
    storm = compose(args.nodes, args.faulty, args.events, args.seconds, args.seed)
    print(f"{len(storm.events)} events in {args.seconds:g} s for {args.nodes} nodes ({args.faulty} faulty): "
          f"{dict(Counter(storm.kinds))}", flush=True)
    samples: list[tuple[float, float, int]] = []
    with EmbeddedAWS() as aws:
        runner = Runner(storm, aws, Fleet(args.nodes), args.concurrency, args.retry_scale)
        before = rss_mib()
        elapsed = runner.run(samples)
        facts = check(runner, storm)
    latencies = [s for _, s in runner.decided.values()]
    decided_at = [storm.arrivals[i] + s for i, (_, s) in runner.decided.items()]
    rates = window_rates(decided_at, elapsed)
    arriving = window_rates(storm.arrivals, elapsed)
    decisions = dict(Counter(d for d, _ in runner.decided.values()))
    command = (f"make bench (python -m bench.storm --nodes {args.nodes} --events {args.events} "
               f"--faulty {args.faulty} --seconds {args.seconds:g} --concurrency {args.concurrency})")
    name = f"event storm: {args.events:,} events in {args.seconds:g} s, {args.nodes:,} nodes"
    common = {"nodes": args.nodes, "faulty_nodes": args.faulty, "concurrency": args.concurrency,
              "events_by_kind": dict(Counter(storm.kinds)), "decisions": decisions, **facts}
    record([
        summarize(f"{name}: event -> decision", "s", latencies, command, **common,
                  notes="Detect (and Gate for what it opens) in-process on moto's DynamoDB; Step Functions retries "
                        f"of the Gate x{args.retry_scale:g}; no EventBridge delivery or Lambda start-up. One process on "
                        "this machine's cores runs every worker and the emulated DynamoDB: when events arrive faster "
                        "than it decides them, the wait in its queue is in this figure"),
        summarize(f"{name}: throughput (decisions per second, {WINDOW_S:g} s windows)", "events/s", rates, command,
                  **common, arrivals_per_s_by_window=[round(a, 1) for a in arriving],
                  decisions_per_s_by_window=[round(r, 1) for r in rates], last_decision_after_s=round(elapsed, 1),
                  notes="a window's rate is the arrivals' while the workers keep up; above it, the workers' capacity"),
        summarize(f"{name}: CPU per event (Detect, and Gate with its retries)", "ms",
                  [1000 * c for c in runner.cpu.values()], command, **common,
                  notes="thread CPU time of the handlers' code, moto's DynamoDB (in the same process) included: "
                        "what bounds the throughput on this machine"),
        summarize(f"{name}: process resident memory", "MiB", [r for r, _, _ in samples], command, **common,
                  rss_before_storm_mib=round(before, 1),
                  rss_at_quarter_and_end_mib=[round(next(r for r, _, d in samples if d >= len(latencies) / 4), 1),
                                              round(samples[-1][0], 1)],
                  notes="one process: the workers, and moto's DynamoDB holding every ledger item written"),
        summarize(f"{name}: control item size", "KiB", [k for _, k, _ in samples], command, **common,
                  target="bounded, far below DynamoDB's 400 KB item limit"),
        summarize(f"{name}: DynamoDB calls per event", "calls", [runner.calls["dynamodb"] / len(latencies)],
                  command, **common),
    ])


if __name__ == "__main__":
    main()
