"""Silent-node detection: which nodes stopped sending heartbeats (pure; no AWS calls).

The roster maps instance id -> what the last heartbeat said. A node is silent once its last
heartbeat is older than the silence threshold; it is reported once per silence, and a new
heartbeat (the node came back) re-arms it. A node that said goodbye (``status: stopping``) is
no longer watched.

A heartbeat is dated by when it reached AWS (SQS's ``SentTimestamp``, or the end of EventBridge's
whole-second ``time`` if earlier), never by the node's clock (``sent_at``): a node whose clock runs behind would read as
silent while it beats, and one whose clock runs ahead would be found silent that much late.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from nodemedic.contracts.events import NodeHealthEvent, NodeHeartbeat, NodeIdentity
from nodemedic.domain.fail_slow import observe

Roster = dict[str, dict[str, Any]]


def record(roster: Roster, beat: NodeHeartbeat, seen_at: datetime) -> None:
    """``seen_at``: when the heartbeat reached AWS, by AWS's clock."""
    instance = beat.node.instance_id
    known = roster.get(instance)
    if known and datetime.fromisoformat(known["last_seen"]) > seen_at:
        return  # an older heartbeat delivered late (a goodbye too: the node beat again since)
    if beat.status == "stopping":
        roster.pop(instance, None)
        return
    entry = roster[instance] = {"node": beat.node.model_dump(mode="json", exclude_none=True),
                                "last_seen": seen_at.isoformat(), "interval_s": beat.interval_seconds,
                                "reported_at": None,
                                **{k: known[k] for k in ("perf", "slow_reported_at") if known and k in known}}
    observe(entry, beat.perf)


def named_node(seen: dict[str, Any]) -> str | None:
    """The node name a roster entry's agent reports: Detect refuses its events unless it is the
    one the scheduler gives the instance's node (or none)."""
    node = seen["node"]
    name = node.get("slurm_node") or node.get("k8s_node")
    return str(name) if name else None


MISSED_BEATS = 3  # a node is silent once it missed this many of the heartbeats it said it would send
# A node its provider has been working on (pending) for longer than this is reported silent all the
# same: the provider is stuck, not busy. Longer than NodeMedic itself waits for HyperPod's deep
# health check (the state machine's HealthCheckPendingError retries: about 3 h 8 min).
PROVIDER_BUSY_LIMIT = timedelta(hours=4)


def quiet_since(seen: dict[str, Any]) -> datetime:
    """When the node's unexplained silence began: its last heartbeat, or the last sweep that found
    its provider working on it (``provider_busy_at``: HyperPod updating or checking it, EC2
    starting it), whichever is later."""
    last = datetime.fromisoformat(seen["last_seen"])
    busy = seen.get("provider_busy_at")
    return max(last, datetime.fromisoformat(busy)) if busy else last


def provider_busy(seen: dict[str, Any], now: datetime) -> bool:
    """Record that the node's provider is working on it now (HyperPod updating or checking it, EC2
    starting it), so its silence counts from now on. False once the provider has been at it, with
    the node silent throughout, for longer than :data:`PROVIDER_BUSY_LIMIT`: then the silence is
    reported, naming since when."""
    since = datetime.fromisoformat(seen.setdefault("provider_busy_since", now.isoformat()))
    if now - since > PROVIDER_BUSY_LIMIT:
        return False
    seen["provider_busy_at"] = now.isoformat()
    return True


def is_silent(seen: dict[str, Any], now: datetime, threshold_s: float) -> bool:
    """Whether a roster entry's node has been silent for longer than ``threshold_s``, or than three
    of the heartbeat intervals its agent declares where that is longer. An agent set to beat every
    60 s against the stack's 45 s would otherwise be silent between any two beats."""
    return ((now - quiet_since(seen)).total_seconds()
            > max(threshold_s, MISSED_BEATS * float(seen.get("interval_s") or 0)))


def silent(roster: Roster, now: datetime, threshold_s: float) -> list[str]:
    """Instances silent (:func:`is_silent`) and not yet reported."""
    return sorted(instance for instance, seen in roster.items()
                  if seen["reported_at"] is None and is_silent(seen, now, threshold_s))


def missing_event(roster: Roster, instance: str, cluster: str, now: datetime) -> NodeHealthEvent:
    """HEARTBEAT_MISSING, observed when the unexplained silence began (:func:`quiet_since`)."""
    seen = roster[instance]
    since = quiet_since(seen)
    busy = {"provider_busy_since": seen.get("provider_busy_since"), "provider_busy_until": seen.get("provider_busy_at")}
    return NodeHealthEvent(
        schema_version="1", event_id=str(uuid.uuid4()), cluster=cluster,
        node=NodeIdentity.model_validate(seen["node"]), check="heartbeat", fault_code="HEARTBEAT_MISSING",
        severity="critical", observed_at=since, sent_at=now,
        evidence={"last_heartbeat": seen["last_seen"], "silent_for_s": round((now - since).total_seconds(), 1),
                  "heartbeat_interval_s": seen["interval_s"],
                  **{name: at for name, at in busy.items() if at}},
    )
