"""Silent-node detection through the cloud path, in the local mode, at production settings.

Every node runs the real agent (simulated GPUs) heartbeating every 15 s to the embedded bus;
the template's heartbeat rule queues them; the silence sweeper (HeartbeatSilenceSeconds 45)
runs every 10 s: the schedule fires once per 10 s with one sweep per run, the cadence that
SilenceSweepsPerInvocation 6 gives on AWS. Nodes die (agent stopped with no goodbye) at times
spread over one minute, out of phase with heartbeats and sweeps. Latency = the state machine
execution for that node starting - the moment the node died. HEARTBEAT_MISSING is overridden to
"monitor" so that only detection is measured, not a remediation.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import UTC, datetime

from nodemedic_sandbox.local import LocalMode

from bench.results import record, summarize

COMMAND = "make bench (python -m bench.silent_node --nodes 8)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--spread", type=float, default=60.0, help="seconds over which the nodes die")
    args = parser.parse_args()
    rng = random.Random(7)
    with LocalMode(nodes=args.nodes + 1, scheduler="simulated", schedule_scale=10 / 60,
                   extra_parameters={"FaultActionOverrides": json.dumps({"HEARTBEAT_MISSING": "monitor"})}) as local:
        agents = local.start_agents(heartbeat_s=15, poll_s=10)
        print(f"{args.nodes + 1} agents heartbeating; waiting 25 s for the sweeper to know them", flush=True)
        time.sleep(25)
        victims = local.node_names[: args.nodes]
        offsets = sorted(rng.uniform(0, args.spread) for _ in victims)
        died: dict[str, datetime] = {}
        start = time.monotonic()
        for node, offset in zip(victims, offsets, strict=True):
            time.sleep(max(0.0, start + offset - time.monotonic()))
            died[local.cluster.instance_of(node)] = datetime.now(UTC)
            agents.kill(node)
            print(f"  {node} died at +{offset:.1f}s", flush=True)
        deadline = time.monotonic() + 120
        while len(local.executions()) < args.nodes and time.monotonic() < deadline:
            time.sleep(1)
        sfn = local.aws.client("stepfunctions")
        latencies = []
        for e in local.executions():
            detail = json.loads(sfn.describe_execution(executionArn=e["executionArn"])["input"])["detail"]
            instance = detail["node"]["instance_id"]
            if instance in died:
                latencies.append((e["startDate"] - died[instance]).total_seconds())
        false_alarms = len(local.executions()) - len(latencies)
    record([summarize("silent node -> state machine execution (local mode)", "s", latencies, COMMAND,
                      target="<= 60 s", false_alarms=false_alarms, heartbeat_s=15, silence_threshold_s=45,
                      sweep_interval_s=10, notes=__doc__.split("\n\n", 1)[1].strip())])
    if len(latencies) < args.nodes or false_alarms:
        raise SystemExit(f"detected {len(latencies)}/{args.nodes} silent nodes, {false_alarms} false alarms")


if __name__ == "__main__":
    main()
