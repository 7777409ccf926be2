"""Repair stage: the next rung of the escalation ladder (GPU reset, reboot, replace)."""

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.aws_retries import throttling_is_retryable
from nodemedic.contracts.stages import RepairInput
from nodemedic.domain.checkpoint import parse_checkpoint_policy
from nodemedic.observability import record_durations, seconds_since_fault, utc_now
from nodemedic.settings import settings
from nodemedic.stages.repair import repair

logger = Logger(service="repair")
metrics = Metrics()


@logger.inject_lambda_context
@throttling_is_retryable
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = RepairInput.model_validate(event)
    incident = request.incident
    logger.append_keys(incident=incident.incident_id, node=incident.slurm_node)
    s = settings()
    out = repair(incident, request.destination, provider=wiring.provider(), orchestrator=wiring.orchestrator(),
                 runner=wiring.node_commands(),
                 ledger=wiring.ledger(), documents=wiring.documents(), timeout_s=s.command_timeout_seconds,
                 check_timeout_s=s.health_check_timeout_seconds, prefix=s.drain_reason_prefix, clock=utc_now,
                 checkpoints=parse_checkpoint_policy(s.checkpoint_policy), hands_off=wiring.hands_off)
    logger.info("rung done", rung=out.rung, attempt=out.attempt, instance=out.instance_id, level=out.level)
    record_durations(metrics, incident, {"TimeToRepair": seconds_since_fault(incident)})
    return out.model_dump(mode="json")
