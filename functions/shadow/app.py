"""Shadow stage (dry run): record what every stage would do, change nothing."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.aws_retries import throttling_is_retryable
from nodemedic.contracts.stages import ShadowInput
from nodemedic.observability import utc_now
from nodemedic.settings import settings
from nodemedic.stages.shadow import shadow

logger = Logger(service="shadow")


@logger.inject_lambda_context
@throttling_is_retryable
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = ShadowInput.model_validate(event)
    logger.append_keys(incident=request.incident.incident_id, node=request.incident.slurm_node)
    out = shadow(request.incident, request.gate, orchestrator=wiring.orchestrator(), ledger=wiring.ledger(),
                 prefix=settings().drain_reason_prefix,
                 health_check_command=f"{wiring.documents().health_check} --level quick", clock=utc_now)
    logger.info("dry run recorded", would=out.would, actions=out.actions)
    return out.model_dump(mode="json")
