"""Reconciler: started every 5 minutes by a schedule; repairs stranded incidents, leaked locks
and claims, and lost drains, starts the burn-in of a held node nobody checks, finds nodes in
service it cannot watch (see nodemedic.reconciler), counts each kind and pages what it
did."""

from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger, single_metric
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.bus import publish_health_events
from nodemedic.contracts.events import RECONCILER_SOURCE, NodeHealthEvent
from nodemedic.domain.silence import named_node
from nodemedic.observability import NAMESPACE, utc_now
from nodemedic.providers.autoscaling import AutoScalingProvider
from nodemedic.providers.base import Member
from nodemedic.providers.ec2 import EC2Provider
from nodemedic.reconciler import AgentWatch, execution_arn, reconcile
from nodemedic.settings import Settings, settings
from nodemedic.store.roster import RosterStore

logger = Logger(service="reconciler")


def execution_status(incident_id: str) -> str | None:
    """The status of the execution named ``incident_id`` (every incident is one execution)."""
    sfn = wiring.client("stepfunctions")
    try:
        return str(sfn.describe_execution(executionArn=execution_arn(settings().state_machine_arn, incident_id))["status"])
    except sfn.exceptions.ExecutionDoesNotExist:
        return None


def heard_agents() -> dict[str, str | None]:
    """The instances whose agents the silence sweeper has heard (its roster), each with the node
    name its agent reports."""
    s = settings()
    roster, _ = RosterStore(wiring.client("dynamodb"), s.incidents_table, s.cluster_name).load()
    return {instance: named_node(seen) for instance, seen in roster.items()}


def publish(event: NodeHealthEvent) -> None:
    """Put ``event`` on the stack's bus: a ``NODE_JOINED`` (Detect opens the burn-in incident) or a
    recheck of a fault the cooldown held (Detect decides it again)."""
    publish_health_events(wiring.client("events"), settings().event_bus_name, RECONCILER_SOURCE, [event])


MAX_PAGE_BYTES = 200_000  # SNS allows 256 KB
UNREAD_NOTE = "(Pages earlier runs could not send were not readable now: a later run sends them.)"


def page(messages: list[str]) -> str:
    """All of one run's messages in one page, cut short (with a count) if too long for SNS."""
    text, shown = "", 0
    for message in messages:
        if len((text + message).encode()) > MAX_PAGE_BYTES:
            break
        text, shown = text + message + "\n\n", shown + 1
    return text + (f"... and {len(messages) - shown} more (see the reconciler's log)" if shown < len(messages) else "")


def send_pages(cluster: str, topic_arn: str, pages: list[str]) -> None:
    """One page per run, however many things it repaired (a controller restart re-drains many),
    with what earlier runs could not send. A run whose page cannot be sent (SNS unreachable past
    the SDK's retries) keeps its messages in the ledger and fails: the next run sends them."""
    ledger = wiring.ledger()
    try:
        earlier = ledger.unsent_pages(cluster)
    except Exception:
        if not pages:
            raise
        # this run's repairs are done and no later run will find them: they are paged now, and
        # what earlier runs kept stays kept for the next run
        logger.exception("could not read the pages earlier runs kept; this run's page goes alone")
        earlier, unread = [], True
    else:
        unread = False
    if not earlier and not pages:
        return
    late = f" (and {len(earlier)} from earlier runs, not sent then)" if earlier else ""
    try:
        wiring.client("sns").publish(TopicArn=topic_arn, Message=page(earlier + pages) + (UNREAD_NOTE if unread else ""),
                                     Subject=f"NodeMedic: the reconciler repaired {len(pages)} thing(s){late}"[:100])
    except Exception:
        if pages:
            ledger.keep_unsent_pages(cluster, pages)
        raise
    ledger.sent_pages(cluster, len(earlier))


def ended_instances(s: Settings) -> Callable[[], list[Member]] | None:
    """Where the provider's instances carry their Slurm node's name (Auto Scaling and EC2 on Slurm):
    how to list the instances EC2 ended that backed a node; else None."""
    if s.provider not in ("autoscaling", "ec2") or s.orchestrator != "slurm":
        return None

    def ended() -> list[Member]:
        provider = wiring.provider()
        return provider.ended() if isinstance(provider, AutoScalingProvider | EC2Provider) else []
    return ended


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    s = settings()
    report = reconcile(cluster=s.cluster_name, ledger=wiring.ledger(), orchestrator=wiring.orchestrator(),
                       execution_status=execution_status, prefix=s.drain_reason_prefix, now=utc_now(),
                       publish=publish, agents=AgentWatch(lambda: wiring.provider().members(), heard_agents,
                                                          ended=ended_instances(s),
                                                          relaunched=s.provider == "autoscaling"),
                       hands_off=wiring.hands_off)
    for kind, count in report.counts().items():
        with single_metric(name="ReconcilerRepairs", unit=MetricUnit.Count, value=count, namespace=NAMESPACE,
                           default_dimensions={"Cluster": s.cluster_name, "Kind": kind}):
            pass
    if report.unwatched_nodes is not None:
        with single_metric(name="UnwatchedNodes", unit=MetricUnit.Count, value=len(report.unwatched_nodes),
                           namespace=NAMESPACE, default_dimensions={"Cluster": s.cluster_name}):
            pass
    send_pages(s.cluster_name, s.escalation_topic_arn, report.pages)
    if report.errors:
        logger.error("reconciler could not repair everything", errors=report.errors)
    if report.burn_ins_started:
        logger.info("burn-ins started", nodes=report.burn_ins_started)
    if report.replacements_started:
        logger.info("replacements of instances EC2 ended started", nodes=report.replacements_started)
    if any(report.counts().values()) or report.holds_dropped or report.burn_ins_unchecked or report.unwatched_nodes:
        logger.warning("reconciler repaired", **report.model_dump(exclude={"pages", "errors"}))
    return report.model_dump()
