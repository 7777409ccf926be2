"""Pipeline benchmarks on the local stack (the deployed template.yaml in the embedded AWS).

``overhead``: XID 79 health events put on the bus one at a time, each remediated end to end
(drain, no spare, replace through the Auto Scaling group, deep health check as a callback, resume). Measured per
incident: event put -> drain command issued on the controller, and -> incident closed. The time
spent in simulated waits - commands on the simulated nodes (joining Slurm, the deep health
check) and Step Functions retry backoff (scaled x0.01) - is reported on its own and taken out
of the overhead. Also per incident, from the execution history: state transitions (states
entered + retries, as Step Functions bills them), Lambda invocations, and their local durations.

``burst``: 1,000 health events put on the bus within one second (PutEvents batches of 10) for
N nodes. Time to absorb = from the first put until every event has an execution, every node
has its one incident and every duplicate execution has ended. Correct = exactly N incidents,
one per node, and no node drained twice.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from nodemedic_sandbox.local import TERMINAL, LocalMode

from bench.results import record, summarize

PRICES = {  # us-east-1 list prices
    "transition": 0.025 / 1000,  # Step Functions Standard, per state transition
    "lambda_request": 0.20 / 1_000_000,
    "lambda_gb_s_arm": 0.0000133334,
    "event": 1.00 / 1_000_000,  # EventBridge custom event
}
LAMBDA_GB = 0.25  # MemorySize 256 in template.yaml Globals


def history_counts(sfn: Any, arn: str) -> dict[str, float]:
    events = sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    entered = sum(e["type"].endswith("StateEntered") for e in events)
    invocations = sum(e["type"] == "LambdaFunctionScheduled" for e in events)
    failed = [e for e in events if e["type"] == "LambdaFunctionFailed"]
    retries = 0
    waited = 0.0
    for f in failed:  # a failure followed by another scheduling of the same task is a retry
        later = [e for e in events if e["id"] > f["id"] and e["type"] == "LambdaFunctionScheduled"]
        if later and not any(f["id"] < e["id"] < later[0]["id"] and e["type"].endswith("StateExited") for e in events):
            retries += 1
            waited += (later[0]["timestamp"] - f["timestamp"]).total_seconds()
    return {"transitions": entered + retries, "invocations": invocations, "retry_wait_s": waited}


# the overhead run remediates the same 4 nodes 25 times each, one at a time: the safety rails
# that would rightly stop that (breaker, cooldown, lemon) are opened wide; the Gate still runs
PERMISSIVE_POLICY = {"BreakerMaxPercent": "100", "BreakerMaxNodes": "1000", "NodeCooldownMinutes": "0",
                     "LemonIncidents": "100"}
OVERHEAD_NODES = 4
# the lemon rule counts at most 100 incidents a node (LemonIncidents' maximum): 99 a node stay under it
MAX_OVERHEAD_INCIDENTS = OVERHEAD_NODES * 99


def _overhead_incidents(text: str) -> int:
    n = int(text)
    if not 1 <= n <= MAX_OVERHEAD_INCIDENTS:
        raise argparse.ArgumentTypeError(f"1 to {MAX_OVERHEAD_INCIDENTS}: more would make the lemon rule quarantine "
                                         f"the {OVERHEAD_NODES} nodes")
    return n


def overhead(incidents: int, scheduler: str) -> None:
    with LocalMode(nodes=OVERHEAD_NODES, scheduler=scheduler, retry_time_scale=0.01,
                   extra_parameters=PERMISSIVE_POLICY) as local:
        print(f"{local.scheduler_note}; {incidents} incidents, one at a time", flush=True)
        sfn = local.aws.client("stepfunctions")
        to_drain, to_closed, waits, transitions, invocations, gb_s = [], [], [], [], [], []
        for i in range(incidents):
            node = local.node_names[i % len(local.node_names)]
            commands_before = len(local.cluster.commands)
            invocations_before = len(local.aws.invocations)
            before = {e["name"] for e in local.executions()}
            put = time.time()
            local.put_event(local.health_event(node, "XID 79", observed_at=datetime.fromtimestamp(put, UTC)))
            [execution] = [e for e in local.wait_for_executions(i + 1, timeout=120) if e["name"] not in before]
            if execution["status"] != "SUCCEEDED":
                raise SystemExit(f"incident {i} on {node} ended {execution['status']}: {execution.get('cause')}")
            incident = local.incident(execution["name"])
            commands = local.cluster.commands[commands_before:]
            drain = next(c for c in commands if "state=drain" in c.script and node in c.script)
            counts = history_counts(sfn, execution["executionArn"])
            simulated = sum(c.seconds for c in commands if c.instance_id != local.cluster.controller_id)
            simulated += counts["retry_wait_s"]
            assert incident.closed_at is not None
            to_drain.append(drain.started_at - put)
            to_closed.append(incident.closed_at.timestamp() - put - simulated)
            waits.append(simulated)
            transitions.append(counts["transitions"])
            # every Lambda run for the incident (the deep check's HealthCheckResult, invoked by the
            # SSM status event rather than by Step Functions, included)
            invocations.append(len(local.aws.invocations) - invocations_before)
            gb_s.append(LAMBDA_GB * sum(v.seconds for v in local.aws.invocations[invocations_before:]))
            if (i + 1) % 10 == 0:
                print(f"  {i + 1}/{incidents} incidents closed", flush=True)
        note = local.scheduler_note
    cmd = f"make bench (python -m bench.pipeline overhead --incidents {incidents})"
    cost = [PRICES["transition"] * t + PRICES["lambda_request"] * n + PRICES["lambda_gb_s_arm"] * g + PRICES["event"]
            for t, n, g in zip(transitions, invocations, gb_s, strict=True)]
    common = {"scheduler": note, "fault": "XID 79 -> replace", "safety_policy": PERMISSIVE_POLICY}
    record([
        summarize("pipeline: event on the bus -> drain command issued", "s", to_drain, cmd, **common),
        summarize("pipeline: event on the bus -> incident closed, excluding simulated waits", "s", to_closed, cmd, **common),
        summarize("pipeline: simulated waits per incident (node commands, scaled retry backoff)", "s", waits, cmd, **common),
        summarize("per incident: Step Functions state transitions", "transitions", transitions, cmd, target="<= 30"),
        summarize("per incident: Lambda invocations", "invocations", invocations, cmd),
        summarize("per incident: PutEvents calls", "calls", [1.0] * incidents, cmd,
                  notes="the triggering event; the pipeline itself publishes none"),
        summarize("per incident: Lambda GB-seconds (local durations)", "GB-s", gb_s, cmd,
                  notes="local handler durations at 256 MB; on AWS the SSM waits inside Drain/Resume add to them"),
        summarize("AWS cost per 1,000 incidents at list prices (local durations)", "USD",
                  [1000 * c for c in cost], cmd, prices=PRICES),
    ])


TASK_TIMEOUT_SCALE = 10  # the emulator runs Lambda one at a time: a queued Detect must not time out


def burst(nodes: int, events: int, wait: bool) -> None:
    with LocalMode(nodes=nodes, scheduler="simulated", retry_time_scale=0.01,
                   task_timeout_scale=TASK_TIMEOUT_SCALE) as local:
        print(f"{nodes} nodes, {events} events in one second", flush=True)
        details = [local.health_event(local.node_names[i % nodes], "XID 79") for i in range(events)]
        client = local.aws.client("events")
        start = time.monotonic()
        for b in range(0, events, 10):
            client.put_events(Entries=[{"Source": "nodemedic.agent", "DetailType": "Node Health Event",
                                        "EventBusName": local.stack.bus_name, "Detail": json.dumps(d)}
                                       for d in details[b:b + 10]])
            time.sleep(max(0.0, start + (b + 10) / events - time.monotonic()))
        put_s = time.monotonic() - start
        shown = 0.0
        while True:
            execs = local.executions()
            ended = sum(e["status"] in TERMINAL for e in execs)
            opened = len(local.incidents())
            if len(execs) >= events and opened >= nodes and ended >= events - nodes:
                break
            if time.monotonic() - shown > 15:
                shown = time.monotonic()
                print(f"  +{shown - start:.0f}s: {len(execs)} executions, {ended} ended, {opened} incidents", flush=True)
            if time.monotonic() - start > 1800:
                raise SystemExit(f"not absorbed after 30 min: {len(execs)} executions, {opened} incidents")
            time.sleep(0.5)
        absorbed = time.monotonic() - start
        incidents = local.incidents()
        dedup = len(execs) - len(incidents)
        finished = None
        if wait:
            print(f"  absorbed in {absorbed:.1f}s; waiting for the {nodes} remediations to finish", flush=True)
            local.wait_for_executions(events, timeout=3600)
            finished = round(time.monotonic() - start, 1)
            incidents = local.incidents()  # their final statuses
        per_node = {n: sum(i.slurm_node == n for i in incidents) for n in local.node_names}
        drains = {n: local.drains().count(n)
                  for n in local.node_names}
        statuses = dict(Counter(i.status for i in incidents))
        correct = len(incidents) == nodes and set(per_node.values()) == {1} and max(drains.values()) <= 1
        cmd = f"make bench (python -m bench.pipeline burst --nodes {nodes} --events {events}{' --wait' * wait})"
        record([summarize(f"burst: {events} events in 1 s for {nodes} nodes, time to absorb", "s", [absorbed], cmd,
                          incidents_opened=len(incidents), deduplicated=dedup, correct=correct,
                          drains_issued=sum(drains.values()), incident_statuses=statuses,
                          put_seconds=round(put_s, 2),
                          all_remediations_done_s=finished, task_timeout_scale=TASK_TIMEOUT_SCALE,
                          notes="local mode: one Python process runs every execution and Lambda (Lambda invocations "
                                "serialised), so the time is the emulator's; correctness is what carries over"
                                + ("" if wait else "; remediations were not awaited: drains counted up to absorption"))])
        if not correct:
            raise SystemExit(f"burst incorrect: incidents per node {per_node}, drains per node {drains}")
        if not wait:  # hundreds of remediations still running in this process: do not wait for them
            sys.stdout.flush()
            os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--incidents", type=_overhead_incidents, default=100, help=f"1 to {MAX_OVERHEAD_INCIDENTS}")
    o.add_argument("--scheduler", default="auto", choices=["auto", "slurm", "simulated"])
    b = sub.add_parser("burst")
    b.add_argument("--nodes", type=int, default=10)
    b.add_argument("--events", type=int, default=1000)
    b.add_argument("--wait", action=argparse.BooleanOptionalAction, default=None,
                   help="wait for every remediation to finish (default: only up to 50 nodes)")
    args = parser.parse_args()
    if args.what == "overhead":
        overhead(args.incidents, args.scheduler)
    else:
        burst(args.nodes, args.events, args.wait if args.wait is not None else args.nodes <= 50)


if __name__ == "__main__":
    main()
