"""Findings, heartbeats and scheduled-event notices as PutEvents entries, validated against the shared contract."""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from nodemedic.contracts.events import (
    AGENT_SOURCE,
    HEALTH_DETAIL_TYPE,
    HEARTBEAT_DETAIL_TYPE,
    MAX_EVIDENCE_BYTES,
    SCHEMA_VERSION,
    NodeHealthEvent,
    NodeHeartbeat,
    NodeIdentity,
    PerfSample,
)
from nodemedic.contracts.problems import describe
from nodemedic.contracts.scheduled_notice import SCHEDULED_DETAIL_TYPE, ScheduledEventsNotice
from nodemedic.contracts.spot_interruption import REBALANCE_DETAIL_TYPE, RebalanceNotice
from pydantic import ValidationError

from nodemedic_agent import __version__
from nodemedic_agent.checks.base import Finding

SEVERITY = {"failed": "critical", "degraded": "warning", "error": "warning"}
log = logging.getLogger("nodemedic_agent.events")


def _json_bytes(value: object) -> int:
    """The size of ``value`` as JSON; a value JSON has no type for (which the contract then
    refuses) counts as its text."""
    return len(json.dumps(value, separators=(",", ":"), default=str).encode())


def fit_evidence(evidence: dict[str, Any]) -> dict[str, Any]:
    """``evidence`` cut to the contract's limit: its longest text is shortened (ending "...")
    until it fits. A kernel message is kept to 1,024 characters, but each character that is not
    ASCII (or a control character) takes 6 bytes in JSON: an Xid line with a long tail of them
    made evidence the contract refuses, and the Xid was never sent."""
    evidence = dict(evidence)
    while (size := _json_bytes(evidence)) > MAX_EVIDENCE_BYTES:
        texts = [k for k, v in evidence.items() if isinstance(v, str) and len(v) > 3]
        if not texts:
            break  # no text left to cut: the contract says what is too large
        key = max(texts, key=lambda k: _json_bytes(evidence[k]))
        text = evidence[key]
        excess = size - MAX_EVIDENCE_BYTES
        keep = max(0, len(text) - 3 - len(text) * excess // _json_bytes(text) - 1)
        evidence[key] = text[:keep] + "..."
    return evidence


def _finite(value: object) -> object:
    """A measurement that is NaN or infinite (a rate over no time, a reading the tool could not
    make) as its text: JSON has no such number, and EventBridge refuses a Detail that holds one."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def health_event(finding: Finding, cluster: str, node: NodeIdentity, count: int,
                 now: datetime | None = None, software: Mapping[str, str] | None = None) -> NodeHealthEvent:
    """The finding as a Node Health Event. Where the contract refuses only what the finding says
    about its fault (its component or its evidence), the event goes without them, saying what was
    refused: the fault itself is never lost for the shape of its details. ``software`` (the node's
    GPU driver and kernel versions) goes in the evidence of every event: what the safety gate
    names when many nodes fail at once after a rollout."""
    sent = now or datetime.now(timezone.utc)

    def event(component: dict[str, Any] | None, evidence: dict[str, Any]) -> NodeHealthEvent:
        return NodeHealthEvent(
            schema_version=SCHEMA_VERSION, event_id=str(uuid.uuid4()), cluster=cluster, node=node,
            check=finding.check, component=component, fault_code=finding.fault_code,
            severity=SEVERITY[finding.status],
            observed_at=min(finding.observed_at, sent), sent_at=sent, count=count, evidence=evidence)

    summary = finding.summary[:512]
    try:
        evidence = {k: _finite(v) for k, v in finding.evidence.items()}
        return event(finding.component, fit_evidence({"summary": summary, **(software or {}), **evidence}))
    except ValidationError as exc:
        if any(err["loc"][:1] not in (("component",), ("evidence",)) for err in exc.errors()):
            raise
        refused = describe(exc, "event", limit=3)[:1024]
        log.warning("%s sent without its component and evidence, which the contract refused: %s", finding.fault_code, refused)
        return event(None, fit_evidence({"summary": summary, **(software or {}), "refused": refused}))


def heartbeat(cluster: str, node: NodeIdentity, interval_s: float, status: str = "running",
              perf: PerfSample | None = None, now: datetime | None = None) -> NodeHeartbeat:
    return NodeHeartbeat(schema_version=SCHEMA_VERSION, cluster=cluster, node=node, sent_at=now or datetime.now(timezone.utc),
                         status=status, interval_seconds=interval_s, agent_version=__version__,
                         perf=perf)


def sent_now(item: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A spooled health event's entry as it is sent ``now``: ``sent_at`` is when the agent sent the
    event. The pipeline measures the node's clock by it against the bus's time, so an event kept in
    the spool through an outage and sent with its first ``sent_at`` would read as a node clock that
    far behind, and its fault as that much younger than it is. Any other entry, or one that no
    longer reads as an event, is sent as it is."""
    if item.get("DetailType") != HEALTH_DETAIL_TYPE:
        return item
    try:
        event = NodeHealthEvent.model_validate_json(item["Detail"])
    except (KeyError, TypeError, ValueError):  # pydantic's ValidationError is a ValueError
        return item
    again = event.model_copy(update={"sent_at": max(now, event.sent_at)})
    return {**item, "Detail": json.dumps(again.model_dump(mode="json", exclude_none=True), separators=(",", ":"))}


def entry(bus: str, model: NodeHealthEvent | NodeHeartbeat | ScheduledEventsNotice | RebalanceNotice) -> dict[str, Any]:
    detail_type = (HEALTH_DETAIL_TYPE if isinstance(model, NodeHealthEvent) else
                   SCHEDULED_DETAIL_TYPE if isinstance(model, ScheduledEventsNotice) else
                   REBALANCE_DETAIL_TYPE if isinstance(model, RebalanceNotice) else HEARTBEAT_DETAIL_TYPE)
    return {"Source": AGENT_SOURCE, "DetailType": detail_type, "EventBusName": bus,
            "Detail": json.dumps(model.model_dump(mode="json", exclude_none=True), separators=(",", ":"))}
