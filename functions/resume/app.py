"""Resume stage: return the node to service and close the incident."""

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.contracts.stages import StageInput
from nodemedic.observability import record_durations, utc_now
from nodemedic.settings import settings
from nodemedic.stages.resume import resume

logger = Logger()
metrics = Metrics()


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    incident = StageInput.model_validate(event).incident
    logger.append_keys(incident=incident.incident_id, node=incident.slurm_node)
    out = resume(incident, orchestrator=wiring.orchestrator(), ledger=wiring.ledger(),
                 prefix=settings().drain_reason_prefix, clock=utc_now)
    logger.info("incident closed", resumed=out.resumed, node_state=out.node_state)
    record_durations(metrics, incident, {"TimeToResume": out.time_to_recover_s,
                                         "TimeToRecover": out.time_to_recover_s})
    return out.model_dump(mode="json")
