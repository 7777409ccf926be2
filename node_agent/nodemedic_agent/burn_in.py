"""The burn-in hold: a node that joins the cluster stays out of scheduling until the pipeline's
full deep health check passes.

``nodemedic-agent burn-in-hold`` runs before slurmd starts (the systemd drop-in
``slurmd.service.d/nodemedic-burn-in.conf``: ``ExecStartPre=``). It drains the node in Slurm
with the reason ``<prefix>:burn-in <instance> joined`` and leaves a marker in ``/run`` (gone at
the next boot). A node drained already is left as it is, and no marker is left: an open
incident's own reboot or replacement (that incident checks the node itself), or an operator's
drain (never touched). The running agent publishes ``NODE_JOINED`` for the marker once; the
pipeline's Drain takes the hold over, the full check runs, and only a pass lifts the drain. A
failure climbs the ladder (GPU reset, reboot, replace); until then the node stays out.

The hold fails closed: when the controller cannot be reached it retries, then exits non-zero,
so slurmd does not start and the node takes no work unchecked (systemd restarts slurmd).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from nodemedic.contracts.problems import read_json
from nodemedic.domain.scontrol import burn_in_reason, drain_reason, parse_scontrol_record

from nodemedic_agent.checks.base import Finding


class HoldError(Exception):
    """Slurm could not be asked or told (scontrol failed until the retry window ended)."""


@dataclass(frozen=True)
class HoldResult:
    held: bool  # True: this boot drained the node and left the marker
    reason: str  # the drain reason the node has now
    message: str


def _scontrol(scontrol: str, args: list[str], env: dict[str, str] | None) -> str:
    out = subprocess.run([scontrol, *args], capture_output=True, text=True, timeout=30,
                         env={**os.environ, **(env or {})})
    if out.returncode != 0:
        raise HoldError(f"{scontrol} {' '.join(args[:2])}: {(out.stderr or out.stdout).strip()[:300]}")
    return out.stdout


def _node(scontrol: str, node: str, env: dict[str, str] | None) -> tuple[str, str]:
    """(state, reason) of ``node`` from ``scontrol show node NODE -o``."""
    text = _scontrol(scontrol, ["show", "node", node, "-o"], env)
    fields = parse_scontrol_record(text.strip().splitlines()[-1] if text.strip() else "")
    if fields.get("NodeName") != node:
        raise HoldError(f"scontrol does not know node {node}: {text.strip()[:200]}")
    return fields.get("State", ""), drain_reason(fields)


def hold(node: str, instance_id: str, *, prefix: str, marker: Path, scontrol: str = "scontrol",
         env: dict[str, str] | None = None, retry_s: float = 60.0,
         sleep: Callable[[float], None] = time.sleep) -> HoldResult:
    """Drain ``node`` for its burn-in unless it is drained already; leave the marker if it was."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            state, reason = _node(scontrol, node, env)
            if "DRAIN" in state:
                return HoldResult(False, reason, f"{node} is drained already ({reason or 'no reason'}): "
                                                 "left as it is, no burn-in hold")
            reason = burn_in_reason(prefix, instance_id)
            _scontrol(scontrol, ["update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"], env)
            break
        except (HoldError, OSError, subprocess.TimeoutExpired) as exc:
            if time.monotonic() >= deadline:
                raise HoldError(f"cannot hold {node} for its burn-in: {exc}") from exc
            sleep(2.0)
    marker.parent.mkdir(parents=True, exist_ok=True)
    held_at = datetime.now(timezone.utc).isoformat()
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps({"slurm_node": node, "instance_id": instance_id, "reason": reason,
                               "held_at": held_at}))
    os.replace(tmp, marker)
    return HoldResult(True, reason, f"{node} drained for its burn-in ({reason}); the pipeline lifts it "
                                    "once the full deep health check passes")


def joined(marker: Path) -> Finding | None:
    """The ``NODE_JOINED`` finding for a hold this boot left, or None when there is none."""
    try:
        data = read_json(marker.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):  # not the hold's marker (a torn write, a hand edit)
        return None
    held_at = str(data.get("held_at", ""))
    try:
        observed = datetime.fromisoformat(held_at)
    except ValueError:
        observed = datetime.now(timezone.utc)
    return Finding("burn_in", "NODE_JOINED", "degraded",
                   f"joined the cluster and held out of scheduling for its burn-in ({data.get('reason', '')})",
                   {"kind": "node"}, {"held_at": held_at, "drain_reason": str(data.get("reason", ""))},
                   observed_at=observed, once=held_at)
