"""Gate stage: apply the cluster's safety policy (pause, exclusions, breaker, provider at work, cooldown, lemon,
concurrency, corroboration, mode) and record the decision with its reasons."""

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.aws_retries import throttling_is_retryable
from nodemedic.contracts.stages import StageInput
from nodemedic.observability import utc_now
from nodemedic.providers.base import ended_state
from nodemedic.stages.gate import gate

logger = Logger(service="gate")
metrics = Metrics()


@logger.inject_lambda_context
@throttling_is_retryable
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    incident = StageInput.model_validate(event).incident
    logger.append_keys(incident=incident.incident_id, node=incident.slurm_node)
    out = gate(incident, load_policy=wiring.policy, provider=wiring.provider(), control=wiring.control(),
               ledger=wiring.ledger(), clock=utc_now, ended=lambda instance: ended_state(wiring.client("ec2"), instance))
    logger.info("gate", verdict=out.verdict, reason=out.reason)
    metrics.add_dimension(name="Cluster", value=incident.cluster)
    metrics.add_metric(name=f"Gate{out.verdict.title().replace('_', '')}", unit=MetricUnit.Count, value=1)
    failed = {r["rule"] for r in out.rules if r["result"] != "pass"}
    if "breaker_limit" in failed:
        metrics.add_metric(name="BreakerTripped", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="BreakerOpen", unit=MetricUnit.Count, value=int(bool(failed & {"breaker", "breaker_limit"})))
    return out.model_dump(mode="json")
