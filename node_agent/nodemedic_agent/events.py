"""Findings and heartbeats as PutEvents entries, validated against the shared contract."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from nodemedic.contracts.events import (
    AGENT_SOURCE,
    HEALTH_DETAIL_TYPE,
    HEARTBEAT_DETAIL_TYPE,
    SCHEMA_VERSION,
    NodeHealthEvent,
    NodeHeartbeat,
    NodeIdentity,
    PerfSample,
)

from nodemedic_agent import __version__
from nodemedic_agent.checks.base import Finding

SEVERITY = {"failed": "critical", "degraded": "warning", "error": "warning"}


def health_event(finding: Finding, cluster: str, node: NodeIdentity, count: int,
                 now: datetime | None = None) -> NodeHealthEvent:
    sent = now or datetime.now(UTC)
    return NodeHealthEvent(
        schema_version=SCHEMA_VERSION, event_id=str(uuid.uuid4()), cluster=cluster, node=node,
        check=finding.check, component=finding.component, fault_code=finding.fault_code,
        severity=SEVERITY[finding.status],
        observed_at=min(finding.observed_at, sent), sent_at=sent, count=count,
        evidence={"summary": finding.summary[:512], **finding.evidence},
    )


def heartbeat(cluster: str, node: NodeIdentity, interval_s: float, status: str = "running",
              perf: PerfSample | None = None, now: datetime | None = None) -> NodeHeartbeat:
    return NodeHeartbeat(schema_version=SCHEMA_VERSION, cluster=cluster, node=node, sent_at=now or datetime.now(UTC),
                         status=status, interval_seconds=interval_s, agent_version=__version__,
                         perf=perf)


def entry(bus: str, model: NodeHealthEvent | NodeHeartbeat) -> dict[str, Any]:
    detail_type = HEALTH_DETAIL_TYPE if isinstance(model, NodeHealthEvent) else HEARTBEAT_DETAIL_TYPE
    return {"Source": AGENT_SOURCE, "DetailType": detail_type, "EventBusName": bus,
            "Detail": json.dumps(model.model_dump(mode="json", exclude_none=True), separators=(",", ":"))}
