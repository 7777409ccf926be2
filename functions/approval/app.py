"""Approval stage: ask an operator (store the task token, notify), or record a denial."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.aws_retries import throttling_is_retryable
from nodemedic.contracts.stages import ApprovalInput, DenialInput
from nodemedic.observability import utc_now
from nodemedic.settings import settings
from nodemedic.stages.approval import Notifier, record_denial, request_approval

logger = Logger(service="approval")


@logger.inject_lambda_context
@throttling_is_retryable
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if "denial" in event:
        denial = DenialInput.model_validate(event)
        logger.append_keys(incident=denial.incident.incident_id, node=denial.incident.slurm_node)
        out = record_denial(denial.incident, denial.denial, ledger=wiring.ledger(), clock=utc_now)
        logger.info("denied", decision=out["decision"], reason=out["reason"])
        return out
    request = ApprovalInput.model_validate(event)
    logger.append_keys(incident=request.incident.incident_id, node=request.incident.slurm_node)
    request_approval(request.incident, request.task_token, ledger=wiring.ledger(),
                     notifier=Notifier(wiring.client("sns"), settings().escalation_topic_arn), clock=utc_now)
    logger.info("approval requested")
    return {"requested": True}
