"""Reconciler: started every 5 minutes by a schedule; repairs stranded incidents, leaked locks
and claims, and lost drains (see nodemedic.reconciler), counts each kind and pages what it did."""

from typing import Any

from aws_lambda_powertools import Logger, single_metric
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.observability import NAMESPACE, utc_now
from nodemedic.reconciler import reconcile
from nodemedic.settings import settings

logger = Logger(service="reconciler")


def execution_status(incident_id: str) -> str | None:
    """The status of the execution named ``incident_id`` (every incident is one execution)."""
    arn = settings().state_machine_arn.replace(":stateMachine:", ":execution:", 1) + f":{incident_id}"
    sfn = wiring.client("stepfunctions")
    try:
        return str(sfn.describe_execution(executionArn=arn)["status"])
    except sfn.exceptions.ExecutionDoesNotExist:
        return None


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    s = settings()
    report = reconcile(cluster=s.cluster_name, ledger=wiring.ledger(), orchestrator=wiring.orchestrator(),
                       execution_status=execution_status, prefix=s.drain_reason_prefix, now=utc_now())
    for kind, count in report.counts().items():
        with single_metric(name="ReconcilerRepairs", unit=MetricUnit.Count, value=count, namespace=NAMESPACE,
                           default_dimensions={"Cluster": s.cluster_name, "Kind": kind}):
            pass
    for message in report.pages:
        wiring.client("sns").publish(TopicArn=s.escalation_topic_arn, Subject="NodeMedic: reconciler repaired "
                                     "an incident or a drain", Message=message)
    if report.errors:
        logger.error("reconciler could not repair everything", errors=report.errors)
    if any(report.counts().values()) or report.holds_dropped:
        logger.warning("reconciler repaired", **report.model_dump(exclude={"pages", "errors"}))
    return report.model_dump()
