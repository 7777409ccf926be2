"""Node-side commands of the local mode, run on "an instance" through SSM Run Command.

``join NODE``: the instance joins the scheduler as NODE (starts its slurmd).
``health-check``: the deep health check, against the simulated GPUs of this instance and the
scheduler's view of the node; prints one JSON line and exits 1 when unhealthy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from nodemedic_sandbox import scheduler

EXPECTED_GPUS = 8


def _faults(state: Path) -> dict[str, object]:
    return dict(json.loads((state / "faults.json").read_text()))


def join(state: Path, node: str, instance_id: str) -> int:
    faults = _faults(state)
    if int(faults.get("unhealthy_replacements", 0)) > 0:  # injected: this one is bad hardware
        faults["unhealthy_replacements"] = int(faults["unhealthy_replacements"]) - 1  # type: ignore[call-overload]
        faults["unhealthy"] = [*faults.get("unhealthy", []), instance_id]  # type: ignore[misc]
    members = dict(faults.get("members", {}))  # type: ignore[call-overload]
    members[instance_id] = node
    faults["members"] = members
    (state / "faults.json").write_text(json.dumps(faults))
    scheduler.load(state).start_node(node)
    print(f"{instance_id} joined as {node}")
    return 0


def health_check(state: Path, instance_id: str, level: str) -> int:
    faults = _faults(state)
    gpus = EXPECTED_GPUS - 1 if instance_id in faults.get("unhealthy", []) else EXPECTED_GPUS  # type: ignore[operator]
    checks = [{"name": "gpu_count", "ok": gpus >= EXPECTED_GPUS,
               "detail": f"{gpus}/{EXPECTED_GPUS} GPUs visible (simulated)"}]
    node = dict(faults.get("members", {})).get(instance_id)  # type: ignore[call-overload]
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
    sub.add_parser("health-check").add_argument("--level", default="quick", choices=["quick", "full"])
    args = parser.parse_args(argv)
    instance_id = os.environ.get("NODEMEDIC_INSTANCE_ID", "")
    if not instance_id:
        parser.error("NODEMEDIC_INSTANCE_ID is not set (the local SSM host sets it)")
    if args.command == "join":
        return join(args.state, args.node, instance_id)
    return health_check(args.state, instance_id, args.level)


if __name__ == "__main__":
    sys.exit(main())
