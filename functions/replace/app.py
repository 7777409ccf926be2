"""Replace stage: replace (or reboot) the instance behind the node."""

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.contracts.stages import StageInput
from nodemedic.observability import record_durations, seconds_since_fault, utc_now
from nodemedic.settings import settings
from nodemedic.stages.replace import replace

logger = Logger()
metrics = Metrics()


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    incident = StageInput.model_validate(event).incident
    logger.append_keys(incident=incident.incident_id, node=incident.slurm_node)
    out = replace(incident, provider=wiring.provider(), runner=wiring.run_command(),
                  ledger=wiring.ledger(), join_command=settings().node_join_command,
                  timeout_s=settings().command_timeout_seconds, clock=utc_now)
    logger.info("instance restored", action=out.action, old=out.old_instance_id, new=out.instance_id)
    record_durations(metrics, incident, {"TimeToReplace": seconds_since_fault(incident)})
    return out.model_dump(mode="json")
