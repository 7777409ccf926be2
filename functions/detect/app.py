"""Detect stage: validate, classify, resolve the node, open the incident."""

from datetime import UTC, datetime, timedelta
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.aws_retries import throttling_is_retryable
from nodemedic.contracts.stages import DetectInput
from nodemedic.errors import InvalidEventError, UnknownNodeError, UnknownNodeQuietError
from nodemedic.observability import record_durations
from nodemedic.settings import settings
from nodemedic.stages.detect import Limits, detect

logger = Logger(service="detect")
metrics = Metrics()


@logger.inject_lambda_context
@throttling_is_retryable
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    now = datetime.now(UTC)
    try:
        request = DetectInput.model_validate(event)
    except ValueError as exc:
        raise InvalidEventError(f"rejected input: {exc}") from exc
    logger.append_keys(incident=request.incident_id)
    s = settings()
    limits = Limits(max_event_age=timedelta(seconds=s.max_event_age_seconds),
                    page_window=timedelta(minutes=s.unknown_node_page_minutes))
    try:
        out = detect(request, cluster=s.cluster_name, overrides_json=s.fault_action_overrides,
                     provider=wiring.provider(), ledger=wiring.ledger(), control=wiring.control(), now=now,
                     limits=limits)
    except (InvalidEventError, UnknownNodeError, UnknownNodeQuietError) as exc:
        why = ("stale" if str(exc).startswith("stale") else "invalid") if isinstance(exc, InvalidEventError) \
            else "unknown_node"
        logger.warning("event rejected; no incident opened, no node touched", reason=str(exc), kind=why)
        metrics.add_dimension(name="Cluster", value=s.cluster_name)
        metrics.add_dimension(name="Reason", value=why)
        metrics.add_metric(name="EventsRejected", unit=MetricUnit.Count, value=1)
        raise
    logger.info("detected", decision=out.decision, reason=out.reason)
    if out.decision == "monitor":  # recorded and counted, never acted on; FaultClass "unknown": a new code
        metrics.add_dimension(name="Cluster", value=s.cluster_name)
        metrics.add_dimension(name="FaultClass", value=out.fault_class or "unknown")
        metrics.add_metric(name="FaultsMonitored", unit=MetricUnit.Count, value=1)
    if out.incident and not out.recheck_of:  # a recheck's fault was counted when the cooldown held it
        record_durations(metrics, out.incident,
                         {"TimeToDetect": (now - out.incident.observed_at).total_seconds()})
    return out.model_dump(mode="json")
