"""Node-side commands of the local mode, run on "an instance" through SSM Run Command.

``join NODE``: the instance joins the scheduler as NODE (starts its slurmd).
``gpu-reset``: reset the instance's GPUs (clears a fault that a GPU reset fixes).
``health-check``: the deep health check, against the simulated GPUs of this instance and the
scheduler's view of the node; prints one JSON line and exits 1 when unhealthy. ``--level full``
adds what the full level runs on a real node (DCGM level 3, multi-node NCCL), simulated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from nodemedic_sandbox import faults as faults_file
from nodemedic_sandbox import scheduler

EXPECTED_GPUS = 8


def burn_in_marker(state: Path, node: str) -> Path:
    """Where the node's burn-in hold leaves its marker (on a real node in /run, emptied at boot)."""
    return state / "agents" / node / "run" / "burn-in-hold.json"


def join(state: Path, node: str, instance_id: str) -> int:
    from nodemedic_agent.burn_in import hold  # only here: the other commands start without the agent's models

    with faults_file.change(state) as faults:
        faults_file.take_bad_replacement(faults, node, instance_id)  # injected: this replacement is bad hardware
        faults["members"] = {**faults.get("members", {}), instance_id: node}
    sched = scheduler.load(state)
    # as slurmd's drop-in does on a real node: the burn-in hold first (an incident's own
    # replacement finds the node drained by that incident: kept, no marker)
    result = hold(node, instance_id, prefix="nodemedic", marker=burn_in_marker(state, node), env=sched.env,
                  retry_s=10)
    print(result.message)
    sched.start_node(node)
    # as a booting node's slurmd does, wait until the controller has heard from it
    deadline = time.monotonic() + 30
    while "NOT_RESPONDING" in sched.node(node).get("State", "") and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"{instance_id} joined as {node} ({sched.node(node).get('State')})")
    return 0


def gpu_reset(state: Path, instance_id: str) -> int:
    with faults_file.change(state) as faults:
        broken = dict(faults.get("broken", {}))
        if broken.get(instance_id) == "gpu_reset":
            del broken[instance_id]
            faults["broken"] = broken
    print(f"GPUs of {instance_id} reset (simulated)")
    return 0


def health_check(state: Path, instance_id: str, level: str) -> int:
    faults = faults_file.read(state)
    broken = dict(faults.get("broken", {})).get(instance_id)
    gpus = EXPECTED_GPUS - 1 if broken else EXPECTED_GPUS
    checks = [{"name": "gpu_count", "ok": gpus >= EXPECTED_GPUS,
               "detail": f"{gpus}/{EXPECTED_GPUS} GPUs visible (simulated)"},
              {"name": "dcgm_diag", "ok": not broken,
               "detail": f"level {1 if level == 'quick' else 3}: {'fail' if broken else 'pass'} (simulated)"}]
    if level == "full":
        checks.append({"name": "nccl_all_reduce", "ok": not broken,
                       "detail": "2-node all_reduce with a healthy neighbour (simulated)"})
    node = dict(faults.get("members", {})).get(instance_id)
    if node:
        info = scheduler.load(state).node(node)
        responding = not any(s in info.get("State", "") for s in ("DOWN", "NOT_RESPONDING", "*"))
        checks.append({"name": "slurmd", "ok": responding, "detail": f"{node} is {info.get('State')}"})
    healthy = all(c["ok"] for c in checks)
    print(json.dumps({"healthy": healthy, "level": level, "instance_id": instance_id, "checks": checks}))
    return 0 if healthy else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nodemedic_sandbox.node", description=__doc__)
    parser.add_argument("--state", type=Path, required=True, help="the local cluster's state dir")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("join").add_argument("node")
    sub.add_parser("gpu-reset")
    sub.add_parser("health-check").add_argument("--level", default="quick", choices=["quick", "full"])
    args = parser.parse_args(argv)
    instance_id = os.environ.get("NODEMEDIC_INSTANCE_ID", "")
    if not instance_id:
        parser.error("NODEMEDIC_INSTANCE_ID is not set (the local SSM host sets it)")
    if args.command == "join":
        return join(args.state, args.node, instance_id)
    if args.command == "gpu-reset":
        return gpu_reset(args.state, instance_id)
    return health_check(args.state, instance_id, args.level)


if __name__ == "__main__":
    sys.exit(main())
