"""Spare stage: swap a hot spare into service for the drained node (when the pool has one)."""

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.aws_retries import throttling_is_retryable
from nodemedic.contracts.stages import StageInput
from nodemedic.observability import utc_now
from nodemedic.settings import settings
from nodemedic.stages.spares import swap_in

logger = Logger(service="spares")
metrics = Metrics()


@logger.inject_lambda_context
@throttling_is_retryable
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    incident = StageInput.model_validate(event).incident
    logger.append_keys(incident=incident.incident_id, node=incident.slurm_node)
    out = swap_in(incident, orchestrator=wiring.orchestrator(), provider=wiring.provider(), ledger=wiring.ledger(),
                  pool_size=settings().hot_spares, clock=utc_now, hands_off=wiring.hands_off)
    logger.info("spare", spare=out.spare, pool=out.pool, reason=out.reason)
    metrics.add_dimension(name="Cluster", value=incident.cluster)
    metrics.add_metric(name="SparePoolSize", unit=MetricUnit.Count, value=len(out.pool))
    metrics.add_metric(name="SpareSwaps" if out.spare else "SpareMisses", unit=MetricUnit.Count, value=1)
    return out.model_dump(mode="json")
