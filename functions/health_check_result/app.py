"""SSM says a command ended: if a deep health check waits on it, answer its task token."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.observability import utc_now
from nodemedic.stages.health_check import complete_check

logger = Logger(service="health_check_result")


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    detail = event.get("detail")
    detail = detail if isinstance(detail, dict) else {}
    command_id = detail.get("command-id")
    if not isinstance(command_id, str) or not command_id:
        logger.warning("not an SSM command status event; ignored", detail_type=event.get("detail-type"))
        return {"answered": False}
    out = complete_check(command_id, ssm=wiring.client("ssm"), stepfunctions=wiring.client("stepfunctions"),
                         ledger=wiring.ledger(), control=wiring.control(), clock=utc_now)
    if out is None:
        logger.info("no deep health check waits on this command", command=command_id, status=detail.get("status"))
        return {"answered": False}
    logger.info("deep health check answered", command=command_id, instance=out.instance_id, healthy=out.healthy,
                level=out.level)
    return {"answered": True, "healthy": out.healthy}
