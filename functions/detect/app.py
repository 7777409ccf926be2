"""Detect stage: validate, classify, resolve the node, open the incident."""

from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.contracts.stages import DetectInput
from nodemedic.errors import InvalidEventError
from nodemedic.observability import record_durations
from nodemedic.settings import settings
from nodemedic.stages.detect import detect

logger = Logger(service="detect")
metrics = Metrics()


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    now = datetime.now(UTC)
    try:
        request = DetectInput.model_validate(event)
    except ValueError as exc:
        raise InvalidEventError(f"rejected input: {exc}") from exc
    logger.append_keys(incident=request.incident_id)
    try:
        out = detect(request, cluster=settings().cluster_name,
                     overrides_json=settings().fault_action_overrides,
                     provider=wiring.provider(), ledger=wiring.ledger(),
                     control=wiring.control(), now=now)
    except InvalidEventError as exc:
        logger.warning("event rejected; no incident opened, no node touched", reason=str(exc))
        raise
    logger.info("detected", decision=out.decision, reason=out.reason)
    if out.incident:
        record_durations(metrics, out.incident,
                         {"TimeToDetect": (now - out.incident.observed_at).total_seconds()})
    return out.model_dump(mode="json")
