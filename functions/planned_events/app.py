"""Planned events: an AWS Health scheduled change (instance retirement, stop, reboot maintenance)
becomes one Node Health Event per affected node of this cluster on NodeMedic's bus, so each is
remediated before AWS acts; everything else it names is ignored and counted with the reason."""

from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.aws_retries import throttling_is_retryable
from nodemedic.contracts.events import HEALTH_DETAIL_TYPE, PLANNED_SOURCE
from nodemedic.errors import InvalidEventError, PublishFailedError
from nodemedic.planned_events import parse_health_event, plan
from nodemedic.settings import settings

logger = Logger(service="planned_events")
metrics = Metrics()
PUT_EVENTS_BATCH = 10  # PutEvents takes at most 10 entries per call


@logger.inject_lambda_context
@throttling_is_retryable
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    s = settings()
    metrics.add_dimension(name="Cluster", value=s.cluster_name)
    try:
        envelope = parse_health_event(event)
    except InvalidEventError as exc:
        logger.warning("AWS Health event rejected; no node touched", reason=str(exc))
        metrics.add_metric(name="PlannedEventsRejected", unit=MetricUnit.Count, value=1)
        return {"rejected": str(exc)}
    planned = plan(envelope, cluster=s.cluster_name, provider=wiring.provider(), now=datetime.now(UTC))
    entries = [{"Source": PLANNED_SOURCE, "DetailType": HEALTH_DETAIL_TYPE, "EventBusName": s.event_bus_name,
                "Detail": e.model_dump_json(exclude_none=True)} for e in planned.events]
    for start in range(0, len(entries), PUT_EVENTS_BATCH):
        batch = entries[start:start + PUT_EVENTS_BATCH]
        failed = wiring.client("events").put_events(Entries=batch).get("FailedEntryCount", 0)
        if failed:  # raised: EventBridge retries the invocation; Detect deduplicates what was put already
            raise PublishFailedError(f"{failed} of {len(batch)} planned-event entries were not put on the bus")
    if planned.ignored:
        logger.info("affected resources ignored", ignored=[f"{entity}: {why}" for entity, why in planned.ignored])
    logger.info("planned events published", event=envelope.detail.eventArn, type=envelope.detail.eventTypeCode,
                deadline=envelope.detail.startTime.isoformat(), nodes=[e.node.slurm_node for e in planned.events])
    metrics.add_metric(name="PlannedNodes", unit=MetricUnit.Count, value=len(planned.events))
    metrics.add_metric(name="PlannedIgnored", unit=MetricUnit.Count, value=len(planned.ignored))
    return {"nodes": [e.node.slurm_node for e in planned.events], "ignored": planned.ignored}
