"""Drain stage: drain the node with the pipeline's reason and requeue its jobs."""

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.aws_retries import throttling_is_retryable
from nodemedic.contracts.stages import StageInput
from nodemedic.domain.checkpoint import parse_checkpoint_policy
from nodemedic.observability import record_durations, seconds_since_fault, utc_now
from nodemedic.settings import settings
from nodemedic.stages.drain import drain

logger = Logger(service="drain")
metrics = Metrics()


@logger.inject_lambda_context
@throttling_is_retryable
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    incident = StageInput.model_validate(event).incident
    logger.append_keys(incident=incident.incident_id, node=incident.slurm_node)
    out = drain(incident, orchestrator=wiring.orchestrator(), ledger=wiring.ledger(),
                prefix=settings().drain_reason_prefix, clock=utc_now,
                checkpoints=parse_checkpoint_policy(settings().checkpoint_policy), hands_off=wiring.hands_off)
    logger.info("drained", drained_by_pipeline=out.drained_by_pipeline,
                requeued=out.requeued_jobs, not_requeued=out.jobs_not_requeued,
                checkpoint=out.checkpoint.model_dump(mode="json") if out.checkpoint else None)
    record_durations(metrics, incident, {"TimeToDrain": seconds_since_fault(incident)})
    if out.checkpoint and out.checkpoint.jobs:
        metrics.add_metric(name="WorkSavedSeconds", unit=MetricUnit.Seconds, value=out.checkpoint.work_saved_s)
        metrics.add_metric(name="WorkLostSeconds", unit=MetricUnit.Seconds, value=out.checkpoint.work_lost_s)
    return out.model_dump(mode="json")
