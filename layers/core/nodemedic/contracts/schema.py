"""JSON Schema export of the event contract (``events/schema/*.json`` are generated from here)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from nodemedic.contracts.events import NodeHealthEvent, NodeHeartbeat, RemediationRequest
from nodemedic.contracts.scheduled_notice import ScheduledEventsNotice
from nodemedic.contracts.spot_interruption import RebalanceNotice

SCHEMAS: dict[str, type[BaseModel]] = {
    "node-health-event.v1.json": NodeHealthEvent,
    "node-heartbeat.v1.json": NodeHeartbeat,
    "remediation-request.v1.json": RemediationRequest,
    "ec2-scheduled-events.v1.json": ScheduledEventsNotice,
    "ec2-rebalance-recommendation.v1.json": RebalanceNotice,
}


def json_schema(name: str) -> dict[str, Any]:
    model = SCHEMAS[name]
    schema: dict[str, Any] = model.model_json_schema()
    schema["$id"] = f"https://nodemedic.dev/schemas/{name}"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
