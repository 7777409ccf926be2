"""Pacing of planned work: how many planned remediations may start now, and when a campaign of
them must start to be done by each notice's time. A pure function of the facts, like the gate.

AWS may schedule many of a cluster's instances for the same change (the retirement of a rack's
hosts, a reboot maintenance across a fleet). Published at once, they are more nodes than the
circuit breaker allows within its window: it trips, and every destructive action stops, for
faults too, until an operator resets it; beyond the concurrency cap they wait for a slot and fail
after about ten minutes. So planned work:

- takes at most ``breaker.planned_percent`` of the breaker's limit (half by default, at least one
  node: :func:`planned_share`), and never
  what the limit or the concurrency cap has left after the faults under remediation;
- takes nothing while automation is paused or the breaker is open (the gate would hold the
  incident, and the notice would be gone; waiting, it is acted on once automation is back);
- starts a campaign early enough (:func:`start_times`): groups of that share, one breaker window
  apart, the last one at its notices' own time.

What AWS takes back whatever NodeMedic does (a retire: a Capacity Block's end, a Spot
interruption) and what changes no node (monitor) is not paced, as the gate does not count it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from nodemedic.contracts.events import NodeHealthEvent
from nodemedic.domain.classification import UNREPAIRED
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.store.control import ControlState

# what the gate does not count: what nothing repairs (monitor; retire: capacity AWS takes back
# whatever NodeMedic does), and a node not yet in service (burn_in)
UNCOUNTED: frozenset[str] = UNREPAIRED | {"burn_in"}


@dataclass(frozen=True)
class Room:
    nodes: int  # planned remediations that may start now
    why: str  # what decides it, for the log


def planned_share(policy: SafetyPolicy, cluster_size: int) -> int:
    """The most nodes planned work may hold within the breaker's window: ``planned_percent`` of
    its limit, at least one."""
    return max(1, int(policy.breaker_limit(cluster_size) * policy.breaker.planned_percent / 100))


def gap(window_minutes: float, sweep: timedelta) -> timedelta:
    """Time between two groups of a campaign: a node released at one sweep counts for the
    breaker's window, so the first sweep after the window is the one with room again."""
    return sweep * (int(window_minutes * 60 // sweep.total_seconds()) + 1)


def room(state: ControlState, policy: SafetyPolicy, active: set[str], cluster_size: int,
         recent: dict[str, datetime], now: datetime, is_planned: Callable[[str], bool]) -> Room:
    """How many planned remediations may start now. ``active``: the incidents of ``state`` still
    open; ``recent``: node -> when planned work was released for it (the gate may not have
    admitted it yet); ``is_planned``: whether a fault code is planned work."""
    if state.paused:
        return Room(0, f"automation is paused ({state.paused.reason})")
    if state.breaker.state == "open":
        return Room(0, "the circuit breaker is open")
    window = timedelta(minutes=policy.breaker.window_minutes)
    limit = policy.breaker_limit(cluster_size)
    held = [*state.counted_by_breaker(now, window, active).values(), *state.waiting_for_slot(active).values()]
    released = {node for node, at in recent.items() if now - at <= window}
    nodes = {a.slurm_node for a in held} | released
    planned = {a.slurm_node for a in held if is_planned(a.fault_code)} | released
    in_progress = sum(a.counted and i in active for i, a in state.admissions.items())
    share = planned_share(policy, cluster_size)
    n = min(share - len(planned), limit - len(nodes), policy.max_concurrent - in_progress)
    return Room(max(0, n), f"{len(planned)} of {share} planned node(s), {len(nodes)} of the breaker's {limit} "
                           f"within {policy.breaker.window_minutes:g} min, {in_progress} of "
                           f"{policy.max_concurrent} remediation(s) in progress")


@dataclass(frozen=True)
class Choice:
    publish: list[NodeHealthEvent]  # each as offered now
    fresh: dict[str, NodeHealthEvent]  # node -> the event that takes room for it
    wait: list[NodeHealthEvent]  # as they came


def choose(urgent_first: list[NodeHealthEvent], room_nodes: int, recent: set[str],
           offer: Callable[[NodeHealthEvent], NodeHealthEvent | None]) -> Choice:
    """Which of the counted events to publish now, the most urgent first: one whose node is
    ``recent`` (released within the window) or already chosen takes no room; one ``offer`` says
    an incident took for good (None) is published as it is (Detect only deduplicates it) and
    takes none either; every other takes a node of ``room_nodes`` while there is one. What waits
    is not offered (a read of the ledger each)."""
    publish: list[NodeHealthEvent] = []
    fresh: dict[str, NodeHealthEvent] = {}
    wait: list[NodeHealthEvent] = []
    for e in urgent_first:
        node = str(e.node.slurm_node or e.node.k8s_node)
        free = node in recent or node in fresh
        if not free and len(fresh) >= room_nodes:
            wait.append(e)
            continue
        offered = offer(e)
        publish.append(offered or e)
        if offered is not None and not free:
            fresh[node] = offered
    return Choice(publish, fresh, wait)


def start_times(act_at: list[datetime], per_group: int, spacing: timedelta) -> list[datetime]:
    """When to release each of a campaign's notices (``act_at[i]``: the latest moment for each)
    so that at most ``per_group`` start per ``spacing`` and none later than its own time: groups
    formed from the latest back, each at its earliest member's time and ``spacing`` before the next."""
    out = list(act_at)
    latest = sorted(range(len(act_at)), key=lambda i: act_at[i], reverse=True)
    bound: datetime | None = None  # the latest the next group may start
    for g in range(0, len(latest), per_group):
        group = latest[g:g + per_group]
        start = act_at[group[-1]] if bound is None else min(act_at[group[-1]], bound)
        for i in group:
            out[i] = start
        bound = start - spacing
    return out


def runs_late(deadlines: list[datetime], per_group: int, spacing: timedelta, next_room: datetime) -> list[bool]:
    """Whether each notice waiting for room (``deadlines``: the nearest first) cannot start before
    its deadline even if planned work took its whole share at every chance from ``next_room`` on:
    the k-th group of ``per_group`` starts ``k`` spacings after it. Faults taking room only delay
    them more: a notice found late here is late unless the queue before it shrinks (a notice AWS
    withdraws, or one whose node left); one not found late may still be."""
    return [deadline <= next_room + (i // per_group) * spacing for i, deadline in enumerate(deadlines)]
