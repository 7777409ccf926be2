"""Fail-slow: a node that keeps working, only slower than its peers, seen from its heartbeats.

A synchronous training job runs at the pace of its slowest GPU, so one node whose GPU clocks
throttle (a hardware slowdown, a failing fan, a power brake) slows every node of the job without
any fault being raised. Each heartbeat carries the node's :class:`PerfSample`: the SM clock of
its slowest GPU as a fraction of that GPU's maximum, and how busy its GPUs are. Each sweep
compares every busy node with the busy nodes of the same instance type (its peers): a node whose
last ``samples`` samples are all more than ``below`` under the peers' median is slow, and is
reported once as a ``FAIL_SLOW`` health event, with the evidence. The pipeline marks it DEGRADED
and drains it after its job instead of killing the job (see docs/health-checks.md).

Idle GPUs drop their clocks, so only busy samples count, on both sides of the comparison.
"""

from __future__ import annotations

import statistics
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from nodemedic.contracts.events import NodeHealthEvent, NodeIdentity, PerfSample

BUSY_UTILIZATION = 50.0  # percent: below it, clocks say nothing about speed
KEEP = 10  # samples kept per node


class PerfRow(NamedTuple):
    """One heartbeat's sample as the roster keeps it (a JSON list)."""

    ratio: float
    utilization: float
    slowest_gpu: int | None
    instance_type: str


def observe(entry: dict[str, Any], sample: PerfSample | None) -> None:
    """Keep ``sample`` (compactly) in the node's roster entry, the newest last."""
    if sample is None:
        return
    row = PerfRow(round(sample.sm_clock_ratio, 4), round(sample.utilization_pct, 1), sample.slowest_gpu,
                  sample.instance_type)
    entry["perf"] = [*entry.get("perf", []), list(row)][-KEEP:]


@dataclass(frozen=True)
class SlowNode:
    instance_id: str
    ratio: float  # the node's median over its last samples
    peer_median: float
    peers: int
    slowest_gpu: int | None
    instance_type: str

    @property
    def percent_below(self) -> float:
        return round(100.0 * (1.0 - self.ratio / self.peer_median), 1)


def slow_nodes(roster: dict[str, dict[str, Any]], *, below: float, samples: int, min_peers: int = 3) -> list[SlowNode]:
    """Nodes whose last ``samples`` samples are all busy and more than ``below`` (a fraction) under
    the median of their busy peers (at least ``min_peers`` of the same instance type)."""
    busy = {i: [r for r in (PerfRow(*row) for row in e.get("perf", [])[-samples:]) if r.utilization >= BUSY_UTILIZATION]
            for i, e in roster.items()}
    level = {i: (statistics.median(r.ratio for r in rows), rows[-1].instance_type) for i, rows in busy.items() if rows}
    found = []
    for instance, rows in busy.items():
        if len(rows) < samples:  # too few samples, or some of them idle
            continue
        kind = rows[-1].instance_type
        peers = [ratio for p, (ratio, k) in level.items() if p != instance and k == kind]
        if len(peers) < min_peers:
            continue
        median = statistics.median(peers)
        if median > 0 and all(r.ratio < (1.0 - below) * median for r in rows):
            found.append(SlowNode(instance, level[instance][0], median, len(peers), rows[-1].slowest_gpu, kind))
    return found


def slow_event(roster: dict[str, dict[str, Any]], slow: SlowNode, cluster: str, now: datetime) -> NodeHealthEvent:
    seen = roster[slow.instance_id]
    return NodeHealthEvent(
        schema_version="1", event_id=str(uuid.uuid4()), cluster=cluster,
        node=NodeIdentity.model_validate(seen["node"]), check="fail_slow", fault_code="FAIL_SLOW",
        severity="warning", observed_at=now, sent_at=now,
        component={"kind": "gpu", "index": slow.slowest_gpu} if slow.slowest_gpu is not None else None,
        evidence={"summary": f"slowest GPU at {slow.ratio:.0%} of its max SM clock, {slow.percent_below:g}% below "
                             f"the median of {slow.peers} busy {slow.instance_type or 'same-type'} peers "
                             f"({slow.peer_median:.0%})",
                  "sm_clock_ratio": slow.ratio, "peer_median": slow.peer_median, "peers": slow.peers,
                  "percent_below": slow.percent_below, "instance_type": slow.instance_type},
    )
