"""Deep health check stage: start the check on the instance; its result comes back as a callback
(HealthCheckResult). After a rung of the ladder, or to verify an ambiguous fault first. On
SageMaker HyperPod, whose nodes SSM does not reach, HyperPod's own deep health check is read
instead, and this function answers the task itself once HyperPod has decided."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.aws_retries import throttling_is_retryable
from nodemedic.contracts.stages import HealthCheckInput
from nodemedic.observability import utc_now
from nodemedic.settings import settings
from nodemedic.stages.health_check import start_check
from nodemedic.stages.hyperpod_check import hyperpod_check

logger = Logger(service="deep_health_check")


@logger.inject_lambda_context
@throttling_is_retryable
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = HealthCheckInput.model_validate(event)
    incident = request.incident
    s = settings()
    logger.append_keys(incident=incident.incident_id, node=incident.slurm_node, purpose=request.purpose)
    if s.provider == "hyperpod":
        out = hyperpod_check(incident, request.instance_id, request.level, request.task_token, purpose=request.purpose,
                             hyperpod=wiring.hyperpod(), ledger=wiring.ledger(), control=wiring.control(),
                             stepfunctions=wiring.client("stepfunctions"), clock=utc_now, hands_off=wiring.hands_off)
        logger.info("HyperPod's check decided", instance=request.instance_id, level=request.level, healthy=out.healthy)
        return {"healthy": out.healthy}
    command_id = start_check(incident, request.instance_id, request.level, request.task_token,
                             purpose=request.purpose, runner=wiring.node_commands(), ledger=wiring.ledger(),
                             control=wiring.control(), stepfunctions=wiring.client("stepfunctions"),
                             documents=wiring.documents(), timeout_s=s.command_timeout_seconds, clock=utc_now,
                             hands_off=wiring.hands_off)
    logger.info("deep health check sent", instance=request.instance_id, level=request.level, command=command_id)
    return {"command_id": command_id}
