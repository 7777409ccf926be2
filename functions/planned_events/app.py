"""Planned events: an AWS Health scheduled change (instance retirement, stop, reboot maintenance),
the same found by the function's periodic sweep of EC2's scheduled events (what AWS Health did
not deliver) or read by a node's agent from its instance metadata, EC2's warning that a Capacity
Block ends, or its two-minute warning that it interrupts a Spot Instance or an instance of an
interruptible Capacity Reservation becomes one Node Health Event per affected node of this cluster
on NodeMedic's bus, so each is handled before AWS acts; everything else it names is ignored and
counted with the reason. An instance that runs again after a Spot stop or hibernation NodeMedic
retired its node for gets a ``NODE_JOINED`` event: its burn-in returns it. A Capacity Block's end
is also said on the escalation topic, once for the whole block, however often the warning is
delivered. EC2's rebalance recommendation for a Spot Instance publishes nothing: its node's jobs
are asked to checkpoint, where the CheckpointPolicy says so (:mod:`nodemedic.rebalance`). Planned
work the gate counts is paced under the circuit breaker (:class:`Pacer`): a campaign of many
nodes waits for room instead of tripping it."""

from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError
from nodemedic import wiring
from nodemedic.aws_retries import throttling_is_retryable
from nodemedic.bus import publish_health_events
from nodemedic.contracts.aws_health import AwsHealthEnvelope
from nodemedic.contracts.capacity_block import CapacityBlockEnvelope
from nodemedic.contracts.events import PLANNED_SOURCE, NodeHealthEvent
from nodemedic.contracts.incident import Incident
from nodemedic.contracts.instance_state import InstanceRunningEnvelope
from nodemedic.contracts.reservation_interruption import ReservationInterruptionEnvelope
from nodemedic.contracts.scheduled_notice import ScheduledEventsEnvelope
from nodemedic.contracts.spot_interruption import NodeRebalanceEnvelope, RebalanceEnvelope, SpotInterruptionEnvelope
from nodemedic.contracts.stages import GateOutput
from nodemedic.domain.checkpoint import parse_checkpoint_policy
from nodemedic.domain.classification import classify, parse_overrides
from nodemedic.errors import IncidentStateError, InvalidEventError, PolicyError
from nodemedic.planned_events import (
    Plan,
    act_at,
    deadline_of,
    event_id,
    moot,
    notice_kept_until,
    parse_planned_event,
    plan,
    plan_capacity_end,
    plan_node_scheduled,
    plan_reservation_interruption,
    plan_return,
    plan_scheduled,
    plan_spot_interruption,
    released,
    reservation_instances,
    scheduled_events,
    slack,
    superseded,
)
from nodemedic.rebalance import RebalanceOutcome, Recommendation, ask_to_checkpoint, unwanted
from nodemedic.reconciler import named_in_page
from nodemedic.safety.pacing import UNCOUNTED, Room, choose, gap, planned_share, room, runs_late, start_times
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.settings import Settings, settings
from nodemedic.stages.gate import STORM_RULES
from nodemedic.store.control import ControlState
from nodemedic.store.deferred import Deferred, DeferredPlans
from nodemedic.store.paced import PacedReleases, PacingConflictError, Release, Releases

logger = Logger(service="planned_events")
metrics = Metrics()
SLACK_LOOKS = 10  # nodes whose jobs one sweep reads (an SSM command each on Slurm): the function's timeout
# gate rules whose hold passes by itself: a planned notice they held is offered again at a later sweep
PASSING_HOLDS = STORM_RULES | {"cooldown", "provider", "policy", "planned_room"}
MAX_OFFERS = 48  # incidents that may hold one notice for a passing reason before it is left to a person


class ScheduledSweep:
    """The function's own schedule fired: sweep EC2's scheduled events."""


def _is_schedule(event: dict[str, Any]) -> bool:
    return event.get("source") == "aws.events" and event.get("detail-type") == "Scheduled Event"


def _announce_capacity_end(envelope: CapacityBlockEnvelope, planned: Plan, cluster: str, topic_arn: str,
                           now: datetime) -> None:
    """Say once, however often the warning is delivered, that the block's nodes are drained. The
    first delivery decides (a conditional write); if SNS cannot be reached, :func:`_say` takes
    that back and fails, so EventBridge's retry of the delivery says it."""
    d = envelope.detail
    key = f"capacity-block/{d.capacity_reservation_id}/{d.end_date:%Y%m%dT%H%M%SZ}"
    if not wiring.ledger().first_announcement(key, now):
        return
    nodes = sorted(str(e.node.slurm_node) for e in planned.events)
    message = (f"Capacity Block {d.capacity_reservation_id} ends at {d.end_date:%Y-%m-%d %H:%M}Z; EC2 begins to "
               f"terminate its instances at {d.termination_starts:%H:%M}Z. NodeMedic drains its {len(nodes)} "
               f"node(s) of cluster {cluster} ({', '.join(nodes)}): each job is checkpointed (per "
               f"the CheckpointPolicy) and moved to a spare outside the block; nothing is repaired or replaced "
               f"into the block. The nodes stay drained: add capacity (a new block) for the jobs that need it.")
    _say(topic_arn, "NodeMedic: Capacity Block ending", message, [key])


def _say(topic_arn: str, subject: str, message: str, announced: list[str]) -> None:
    """Publish to the escalation topic what ``announced`` (keys of :meth:`Ledger.first_announcement`)
    claimed to say; if SNS cannot be reached, take them back and raise, so the retry says it."""
    try:
        wiring.client("sns").publish(TopicArn=topic_arn, Subject=subject, Message=message)
    except Exception:
        for key in announced:
            wiring.ledger().forget_announcement(key)
        raise


def _announce_late(late: list[NodeHealthEvent], pace: str, why: str, cluster: str, topic_arn: str,
                   now: datetime) -> None:
    """Tell the on-call, once per notice, about planned work waiting for room that cannot start
    before its deadline (:meth:`Pacer.late`): AWS will act under the node's job, and a person may
    act first. Said as soon as it can be told, once however often it is found (a conditional
    write per notice); if SNS cannot be reached, taken back and raised, so the retried invocation
    says it."""
    keys = {f"planned-late/{e.event_id}": e for e in late}
    told = {key: e for key, e in keys.items() if wiring.ledger().first_announcement(key, now)}
    if not told:
        return
    named = [f"{e.node.slurm_node} ({e.node.instance_id}, {e.fault_code}, AWS acts from {_urgency(e):%Y-%m-%d %H:%M}Z)"
             for e in sorted(told.values(), key=_urgency)]
    # a campaign across a fleet can make thousands late at once: named all, the page was over SNS's
    # 256 KB, refused at every sweep, and nobody was told
    nodes = named_in_page(named)
    message = (f"NodeMedic cannot act on {len(told)} planned event(s) of cluster {cluster} before AWS does: "
               f"{nodes}. Planned work may take {pace} under the circuit breaker, the nearest deadline first, "
               f"and the room now is taken ({why}). AWS will act under the node's job; to act first, give "
               f"planned work more of the breaker's room (breaker.planned_percent) or replace or drain the node "
               f"by hand (docs/runbooks/maintenance-campaign.md). `nodemedic planned` lists what still waits.")
    _say(topic_arn, "NodeMedic: planned work runs late", message, list(told))


@logger.inject_lambda_context
@throttling_is_retryable
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    s = settings()
    metrics.add_dimension(name="Cluster", value=s.cluster_name)
    try:
        envelope = ScheduledSweep() if _is_schedule(event) else parse_planned_event(event)
    except InvalidEventError as exc:
        logger.warning("planned event rejected; no node touched", reason=str(exc))
        metrics.add_metric(name="PlannedEventsRejected", unit=MetricUnit.Count, value=1)
        return {"rejected": str(exc)}
    now = datetime.now(UTC)
    if isinstance(envelope, RebalanceEnvelope | NodeRebalanceEnvelope):
        return _rebalance(envelope, s, now)
    if isinstance(envelope, ScheduledSweep):
        if s.provider == "hyperpod":  # its instances are in the service's account, not this one
            logger.info("EC2 scheduled events not swept: HyperPod instances are not in this account's EC2")
            planned = Plan()
        else:
            planned = plan_scheduled(scheduled_events(wiring.client("ec2")), cluster=s.cluster_name,
                                     provider=wiring.provider(), now=now)
        what = {"sweep": "EC2 scheduled events"}
    elif isinstance(envelope, AwsHealthEnvelope):
        newest = wiring.ledger().newest_notice(envelope.detail.eventArn, envelope.version,
                                               notice_kept_until(envelope, now))
        planned = plan(envelope, cluster=s.cluster_name, provider=wiring.provider(), now=now) if newest \
            else superseded(envelope)
        what = {"event": envelope.detail.eventArn, "type": envelope.detail.eventTypeCode,
                "deadline": envelope.detail.startTime.isoformat()}
    elif isinstance(envelope, SpotInterruptionEnvelope):
        planned = plan_spot_interruption(envelope, cluster=s.cluster_name, provider=wiring.provider(), now=now)
        what = {"spot_interruption": envelope.detail.instance_id, "action": envelope.detail.instance_action,
                "deadline": envelope.interrupted_at.isoformat()}
    elif isinstance(envelope, ReservationInterruptionEnvelope):
        planned = plan_reservation_interruption(envelope, cluster=s.cluster_name, provider=wiring.provider(), now=now)
        what = {"reservation_interruption": envelope.detail.instance_id,
                "deadline": envelope.detail.termination_time.isoformat()}
    elif isinstance(envelope, InstanceRunningEnvelope):
        planned = plan_return(envelope, cluster=s.cluster_name, provider=wiring.provider(),
                              retired_by=lambda instance: wiring.ledger().lock_holder(s.cluster_name, instance),
                              now=now)
        what = {"running_again": envelope.detail.instance_id, "since": envelope.time.isoformat()}
    elif isinstance(envelope, ScheduledEventsEnvelope):
        planned = plan_node_scheduled(envelope, cluster=s.cluster_name, provider=wiring.provider(), now=now)
        what = {"node_scheduled_events": envelope.detail.node.instance_id,
                "codes": ",".join(e.code for e in envelope.detail.events)}
    else:
        ec2 = wiring.client("ec2")
        planned = plan_capacity_end(envelope, cluster=s.cluster_name, provider=wiring.provider(),
                                    instances=lambda block: reservation_instances(ec2, block), now=now)
        what = {"capacity_block": envelope.detail.capacity_reservation_id,
                "deadline": envelope.detail.termination_starts.isoformat()}
    store = DeferredPlans(wiring.client("dynamodb"), s.incidents_table, s.cluster_name)
    sweep = timedelta(minutes=s.planned_sweep_minutes)
    due, deferred = _later(planned.events, store, timedelta(hours=s.planned_lead_time_hours), sweep, now)
    waiting = store.waiting() if isinstance(envelope, ScheduledSweep) else []
    pacer = Pacer(s, sweep, now)
    came = [released(d.event, now) for d in _current([d for d in waiting if d.act_at <= now], planned, now)]
    later = [d for d in waiting if d.act_at > now]
    early = _current(pacer.campaign(later), planned, now)
    came += [released(d.event, now, early=pacer.why_early) for d in early]
    # a sweep may find again what comes out of waiting now: one event per id
    ready = list({e.event_id: e for e in [*due, *came]}.values())
    if later and pacer.room_left(ready):
        rest = [d for d in later if d not in early]
        came += [released(d.event, now, early=why) for d, why in _with_slack(_current(rest[:SLACK_LOOKS], planned, now), sweep)]
        ready = list({e.event_id: e for e in [*due, *came]}.values())
    go, wait = pacer.take(ready)
    kept = {e.event_id for e in wait}
    unkept = [e for e in due if e.event_id in kept and not store.defer(e, now)]  # for a sweep; a full store: now
    go += unkept
    # raised when refused: EventBridge retries the invocation
    publish_health_events(wiring.client("events"), s.event_bus_name, PLANNED_SOURCE, go)
    # what was published waits no longer, nor does a notice AWS withdrew: a copy of a due event
    # kept from an earlier version of its notice (a window AWS has since moved nearer) would come
    # out again at its old time, maybe after Detect's memory of this one has lapsed
    gone = [e.event_id for e in [*go, *ready] if e.event_id not in kept] + planned.withdrawn + planned.moot
    if gone:
        store.forget(gone)
    for_room = [e for e in wait if e not in unkept]  # what waits for room
    paced = sorted(str(e.node.slurm_node) for e in for_room)
    if paced:
        logger.info("planned events wait for room under the circuit breaker", room=pacer.why, waiting=paced)
        queue = for_room if isinstance(envelope, ScheduledSweep) else _room_queue(store, for_room)
        late, pace = pacer.late(queue, now + sweep)
        _announce_late(late, pace, pacer.why, s.cluster_name, s.escalation_topic_arn, now)
    if deferred:
        logger.info("planned events deferred until their lead time", deferred=deferred)
    if planned.ignored:
        logger.info("affected resources ignored", ignored=[f"{entity}: {why}" for entity, why in planned.ignored])
    if isinstance(envelope, CapacityBlockEnvelope) and planned.events:
        _announce_capacity_end(envelope, planned, s.cluster_name, s.escalation_topic_arn, now)
    nodes = sorted({str(e.node.slurm_node) for e in go})
    logger.info("planned events published", extra={**what, "nodes": nodes})
    metrics.add_metric(name="PlannedNodes", unit=MetricUnit.Count, value=len(nodes))
    metrics.add_metric(name="PlannedIgnored", unit=MetricUnit.Count, value=len(planned.ignored))
    metrics.add_metric(name="PlannedPaced", unit=MetricUnit.Count, value=len(paced))
    return {"nodes": nodes, "deferred": deferred, "paced": paced, "ignored": planned.ignored}


def _rebalance(envelope: Recommendation, s: Settings, now: datetime) -> dict[str, Any]:
    """EC2 recommends rebalancing a Spot Instance: its node's jobs are asked to checkpoint, where
    the CheckpointPolicy says so (:mod:`nodemedic.rebalance`); nothing else is done."""
    instance = envelope.instance_id
    try:
        checkpoints = parse_checkpoint_policy(s.checkpoint_policy)
        why = unwanted(envelope, checkpoints, now)
        outcome = RebalanceOutcome(instance_id=instance, ignored=why) if why else ask_to_checkpoint(
            envelope, cluster=s.cluster_name, provider=wiring.provider(), orchestrator=wiring.orchestrator(),
            ledger=wiring.ledger(), checkpoints=checkpoints, safety=wiring.policy(), control=wiring.control().read(),
            now=now)
    except PolicyError as exc:  # the drains that read the same policy fail and say so
        outcome = RebalanceOutcome(instance_id=instance, ignored=str(exc))
    logger.info("rebalance recommendation", extra=outcome.model_dump(mode="json"))
    metrics.add_metric(name="RebalanceCheckpointsAsked", unit=MetricUnit.Count, value=len(outcome.asked))
    return outcome.model_dump(mode="json")


def _room_queue(store: DeferredPlans, own: list[NodeHealthEvent]) -> list[NodeHealthEvent]:
    """What waits for room, a delivery's own notices with the queue before them (a delivery sees
    only its own: the queue counts too). The queue is what the store holds that is due as of this
    read, after the delivery kept its own: not as of the delivery's start. A campaign's deliveries
    run at once; one that began later keeps its notice with its later start as the time to act,
    and read as of the earlier start that notice was not due yet. Two deliveries each missed the
    other's notice, and a campaign that ran late was said to nobody.

    A queued notice that is moot (:func:`moot`: its instance left the cluster, its window ended)
    is no work: the next sweep forgets it. Counted, it took a room that is another's, which was
    said to run late for work that fits (one read of the cluster's members for the whole queue)."""
    read_at = datetime.now(UTC)
    mine = {e.event_id for e in own}
    queued = [d.event for d in store.waiting() if d.act_at <= read_at and d.event.event_id not in mine]
    if queued:
        try:
            members = {m.instance_id: m for m in wiring.provider().members()}
        except Exception as exc:  # noqa: BLE001 - what was published stays so: judged with the whole queue
            logger.warning("the cluster's members could not be read; every queued notice counts", error=str(exc))
        else:
            queued = [e for e in queued if moot(e, members.get(e.node.instance_id), read_at) is None]
    return [*queued, *own]


class Pacer:
    """Planned work under the breaker (:mod:`nodemedic.safety.pacing`): what of it may start now.
    The policy, the control state and the cluster's size are read once; the room is taken by a
    write conditional on the recent releases read (:mod:`nodemedic.store.paced`), so the many
    invocations of one campaign's notices never take more than there is."""

    ATTEMPTS = 8

    def __init__(self, s: Settings, sweep: timedelta, now: datetime) -> None:
        self.now = now
        try:
            self._overrides = parse_overrides(s.fault_action_overrides)
        except ValueError:  # Detect says so for every event; here the fault table's own actions
            self._overrides = {}
        self._releases = PacedReleases(wiring.client("dynamodb"), s.incidents_table, s.cluster_name)
        self._sweep = sweep
        self.why = ""
        self.why_early = ""
        self._offers: dict[str, NodeHealthEvent | None] = {}

    @cached_property
    def _facts(self) -> tuple[SafetyPolicy, ControlState, set[str], int] | None:
        """Read when planned work the gate counts is in play (a Spot warning's two minutes wait for none)."""
        try:
            policy = wiring.policy()
        except (PolicyError, ClientError) as exc:  # invalid, or its read throttled: offered again at a later sweep
            self.why = f"the safety policy cannot be read: {exc}"
            return None
        state = wiring.control().read()
        active = wiring.ledger().still_open([*state.admissions, *state.waiting])
        return policy, state, active, wiring.provider().size()

    def counted(self, event: NodeHealthEvent) -> bool:
        """Whether the gate counts the event's remediation (not a retire, a burn-in, a monitor)."""
        return classify(event.fault_code, self._overrides).action not in UNCOUNTED

    def _room(self, releases: Releases) -> tuple[Room, dict[str, datetime]]:
        """The room now, and the nodes released within the breaker's window (when)."""
        if self._facts is None:
            return Room(0, self.why), {}
        policy, state, active, size = self._facts
        recent = releases.recent(self.now, timedelta(minutes=policy.breaker.window_minutes))
        return room(state, policy, active, size, recent, self.now,
                    lambda code: classify(code, self._overrides).fault_class == "planned"), recent

    def campaign(self, later: list[Deferred]) -> list[Deferred]:
        """Those of the notices waiting for their time whose campaign must start now to be done
        by then (:func:`start_times`), the nearest first."""
        counted = [d for d in later if self.counted(d.event)]
        if not counted or self._facts is None:
            return []
        policy, _, _, size = self._facts
        share, spacing = planned_share(policy, size), gap(policy.breaker.window_minutes, self._sweep)
        starts = start_times([d.act_at for d in counted], share, spacing)
        self.why_early = (f"paced: {len(counted)} waiting notice(s) of this cluster are acted on {share} node(s) "
                          f"at a time, {spacing.total_seconds() / 60:g} min apart, to be done by their times")
        return [d for d, start in zip(counted, starts, strict=True) if start <= self.now]

    def late(self, waiting: list[NodeHealthEvent], next_sweep: datetime) -> tuple[list[NodeHealthEvent], str]:
        """Those of ``waiting`` (for room) that cannot start before their deadlines at the pace planned
        work may take (:func:`runs_late`; the next room at the next sweep), and that pace, said."""
        urgent = sorted(waiting, key=_urgency)
        if self._facts is None:  # nothing is released until the policy can be read: only the next sweep
            share, spacing, pace = len(urgent), timedelta(0), "nothing until the safety policy can be read"
        else:
            policy, _, _, size = self._facts
            share, spacing = planned_share(policy, size), gap(policy.breaker.window_minutes, self._sweep)
            pace = f"{share} node(s) every {spacing.total_seconds() / 60:g} min"
        late = runs_late([_urgency(e) for e in urgent], max(1, share), spacing, next_sweep)
        return [e for e, is_late in zip(urgent, late, strict=True) if is_late], pace

    def room_left(self, ready: list[NodeHealthEvent]) -> bool:
        """Whether the room now is more than ``ready`` takes."""
        return self._room(self._releases.read())[0].nodes > len({e.node.slurm_node for e in ready if self.counted(e)})

    def _offer(self, event: NodeHealthEvent) -> NodeHealthEvent | None:
        """The event as it is offered now: itself while no incident has taken it; None once one
        took it for good (acted on it, is acting, or was held for a reason that stays: an excluded
        node, dry run), as a notice a sweep finds again (EC2 still lists it) then publishes nothing
        new and takes no room; and a copy under a new id when each incident that took it was held
        for a reason that passes (a cooldown, its provider at work, a pause, the breaker, no room for
        planned work, a policy that could not be read). Detect remembers an event for ``EVENT_MEMORY``: offered under its
        own id again, it would only be deduplicated, and AWS would act under the node's job."""
        if event.event_id not in self._offers:
            ledger = wiring.ledger()
            current: NodeHealthEvent | None = event
            for n in range(1, MAX_OFFERS + 1):
                taker = ledger.event_handled_by(f"{PLANNED_SOURCE}/{current.event_id}") if current else None
                if taker is None:
                    break
                try:
                    taken = ledger.get(taker)
                except IncidentStateError:  # not in the ledger: nothing says it may be offered again
                    taken = None
                if taken is None or not (_held_by(taken) in PASSING_HOLDS or _taken_in_passing(taken, event)):
                    current = None
                    break
                # the n-th offer (not one per incident: one folded into a held incident that kept the
                # node's lock, a pause or the breaker, is offered anew once an operator lifted it)
                current = event.model_copy(update={"event_id": event_id(f"{event.event_id}/offer/{n}"),
                                                   "evidence": {**event.evidence, "offered_again_after": taker}})
            else:
                current = None  # held again and again: a person sees the held incidents
            self._offers[event.event_id] = current
        return self._offers[event.event_id]

    def take(self, ready: list[NodeHealthEvent]) -> tuple[list[NodeHealthEvent], list[NodeHealthEvent]]:
        """(to publish, to keep waiting): every event the gate does not count, and of the others
        the most urgent (nearest deadline) the room holds, each as it is offered now
        (:meth:`_offer`); what an incident took for good goes too (Detect only deduplicates it),
        as does another event of a node whose room is taken. What waits is read no further."""
        counted = sorted((e for e in ready if self.counted(e)), key=_urgency)
        go = [e for e in ready if not self.counted(e)]
        if not counted or self._facts is None:  # no policy: the gate would hold it; it waits
            return go, counted
        window = timedelta(minutes=self._facts[0].breaker.window_minutes)
        for _ in range(self.ATTEMPTS):
            releases = self._releases.read()
            r, recent = self._room(releases)
            self.why = r.why
            chosen = choose(counted, r.nodes, set(recent), self._offer)
            if chosen.fresh:
                releases.prune(self.now, window)  # the item keeps what the breaker's window still counts
                releases.releases |= {e.event_id: Release(node=node, at=self.now) for node, e in chosen.fresh.items()}
                try:
                    self._releases.save(releases)
                except PacingConflictError:
                    continue
            return go + chosen.publish, chosen.wait
        self.why = "other invocations kept taking the room meanwhile: the next sweep decides"
        return go, counted


def _taken_in_passing(incident: Incident, event: NodeHealthEvent) -> bool:
    """Whether ``incident`` took the notice only by having the node already (an Xid's repair
    under way when the notice came: Detect folded it in) and has ended since with the node
    returned or left drained, not acted on for this notice: a reboot leaves the same instance,
    which AWS still retires. A notice whose instance left the cluster since is moot (the sweep
    forgets it)."""
    return incident.status in ("closed", "failed") and incident.fault_code != event.fault_code


def _held_by(incident: Incident) -> str:
    """The gate rule that held ``incident`` ("" when it was not held)."""
    gate = incident.stages.get("gate")
    if incident.status != "held" or gate is None or not gate.result:
        return ""
    rules = GateOutput.model_validate(gate.result).rules
    return rules[-1].get("rule", "") if rules else ""


def _urgency(event: NodeHealthEvent) -> datetime:
    return deadline_of(event) or event.observed_at


def _current(waiting: list[Deferred], planned: Plan, now: datetime) -> list[Deferred]:
    """Those of ``waiting`` that still concern their node (:func:`moot`: its window has not ended,
    its instance still backs it); each other is added to ``planned`` as ignored and moot
    (forgotten: nothing is published for it)."""
    provider, kept = wiring.provider(), []
    for d in waiting:
        why = moot(d.event, provider.member(d.event.node.instance_id), now)
        if why:
            planned.ignored.append((d.event.node.instance_id, why))
            planned.moot.append(d.event.event_id)
        else:
            kept.append(d)
    return kept


def _with_slack(waiting: list[Deferred], sweep: timedelta) -> list[tuple[Deferred, str]]:
    """The notices still waiting for their lead time whose node has slack now (``slack`` within
    one ``sweep`` period), the nearest first, looking at ``SLACK_LOOKS`` nodes at most per sweep
    (one scheduler read each). A node that cannot be read waits for its time."""
    found = []
    for d in waiting[:SLACK_LOOKS]:
        node = str(d.event.node.slurm_node or d.event.node.k8s_node)
        try:
            why = slack(wiring.orchestrator().running_jobs(node), sweep)
        except Exception as exc:  # noqa: BLE001 - any failed read: the notice waits for its lead time
            logger.warning("could not read the jobs on a node waiting for its planned event; it waits",
                           node=node, error=str(exc))
            continue
        if why:
            logger.info("planned event acted on before its lead time", node=node, why=why)
            found.append((d, why))
    return found


def _later(events: list[NodeHealthEvent], store: DeferredPlans, lead: timedelta, sweep: timedelta,
           now: datetime) -> tuple[list[NodeHealthEvent], list[dict[str, str]]]:
    """The events to publish now, and (node, when) for each kept for its lead time."""
    due, deferred = [], []
    for event in events:
        when = act_at(event, lead, sweep)
        if when > now and store.defer(event, when):
            deferred.append({"node": str(event.node.slurm_node), "act_at": when.isoformat()})
        else:
            due.append(event)
    return due, deferred
