"""Deep health check stage: validate the instance before it returns to service."""

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.contracts.stages import HealthCheckInput
from nodemedic.observability import record_durations, seconds_since_fault, utc_now
from nodemedic.settings import settings
from nodemedic.stages.health_check import health_check, verify

logger = Logger()
metrics = Metrics()


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = HealthCheckInput.model_validate(event)
    incident = request.incident
    logger.append_keys(incident=incident.incident_id, node=incident.slurm_node, purpose=request.purpose)
    if request.purpose == "verify":
        out = verify(incident, runner=wiring.run_command(), ledger=wiring.ledger(), control=wiring.control(),
                     command=settings().deep_health_check_command,
                     timeout_s=settings().command_timeout_seconds, clock=utc_now)
        logger.info("verified", healthy=out.healthy)
        return out.model_dump(mode="json")
    out = health_check(incident, request.instance_id, runner=wiring.run_command(),
                       ledger=wiring.ledger(), command=settings().deep_health_check_command,
                       timeout_s=settings().command_timeout_seconds, clock=utc_now)
    logger.info("healthy", instance=out.instance_id, checks=len(out.checks))
    record_durations(metrics, incident, {"TimeToHealthCheck": seconds_since_fault(incident)})
    return out.model_dump(mode="json")
