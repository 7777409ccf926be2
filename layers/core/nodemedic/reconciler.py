"""The reconciler: finds what every exit path should have left right and was not, and fixes it.

Runs on a schedule (every 5 minutes). One read of the ledger's bookkeeping (through its sparse
index, :meth:`~nodemedic.store.ledger.Ledger.bookkeeping`), then:

- an incident still ``open`` whose execution is no longer running (it was stopped, timed out, or
  its failure could not even be recorded) ends ``failed`` exactly as a failed stage does
  (:func:`nodemedic.stages.failure.fail`): lock released, node held drained if NodeMedic acted;
- a node lock whose incident ended with a status that does not keep it (closed, failed, denied,
  dry run) or is gone is released, so the node's next fault is not folded into a dead incident;
- a claim (hot spare, replacement) whose incident ended or is gone is released;
- a node NodeMedic holds drained that is not drained (a controller restarted without saving the
  drain; the scheduler was unreachable when the incident failed) is drained again, never over
  someone else's drain, and never while its incident is returning it to service;
- a node still drained by an incident that ended after returning it (slurmctld lost the return:
  it restarted from state saved before it) is returned again, by the same command, which lifts
  only that incident's drain: an incident that is over never keeps a node out of service (not
  while automation is paused or the node excluded: ``returns_held``, returned once lifted);
- a node held out for its burn-in that no incident is checking - on Slurm drained ``<prefix>:burn-in
  <instance> joined`` by the agent, whose ``NODE_JOINED`` was folded into another incident for the
  node that ended without checking it (a verify that passed, a hold) or never arrived; on
  Kubernetes registered with the startup taint ``nodemedic.io/burn-in``, which nothing else
  reports - gets its burn-in started: a ``NODE_JOINED`` health event (source
  ``nodemedic.reconciler``) on the second run that sees it (the first may precede the agent's
  event, or a replace incident's adoption of its replacement). A node whose instance an open
  incident has claimed (a replacement being adopted) is that incident's, and no burn-in is started
  while an open incident waits for a replacement it asked for (the node may be it). A burn-in a
  storm held (automation paused, the breaker open) is started again once lifted. If a later
  run still finds it unchecked, it is paged once: it would otherwise stay out of service unnoticed;
- a node retired for a Spot stop or hibernation whose instance EC2 has started again (its
  ``LaunchTime`` after the interruption) but that the retirement still holds (EC2's "running" was
  lost, or came while the retirement was still open) gets its burn-in started, once per start;
- a Slurm node whose instance EC2 has ended (Auto Scaling: after its retirement for a Spot
  termination, or while no incident held it) and that no instance backs gets an ``INSTANCE_LOST``
  incident, once per instance, which names the instance its group launched in its place after it;
  with plain EC2, where nothing launches one in its place, such a node is paged once per instance;
  an instance of the group that backs no node ``UNNAMED_AFTER`` after its launch (no lost node
  took it) is paged once: it runs nothing while it costs;
- a node in service that NodeMedic cannot watch for ``UNWATCHED_AFTER`` is paged once, with every
  other such node in one page: its agent sent no heartbeat (never installed, it cannot start, it
  was stopped), so nothing there is detected, not even its silence, since the silence sweeper
  watches only agents it has heard; or its agent names it unlike the scheduler, so Detect refuses
  every event it sends (identity mismatch). Watchable again, it is forgotten;
- a Kubernetes node returned to service outside NodeMedic (an operator's uncordon and untaint)
  that still carries the autoscaler holds NodeMedic set while holding it (Karpenter's
  do-not-disrupt, the Cluster Autoscaler's scale-down-disabled) gets them removed, unless an open
  incident, a lock or a drain hold is about it: otherwise it would never be consolidated or scaled
  down;
- a Kubernetes node whose GPU clients (the GPU operator's components, NVML clients) an incident
  paused for a GPU reset and that ended before it resumed them (it failed, it was stopped) gets
  them back;
- a fault the gate held for its node's cooldown (the node was remediated moments before) is
  offered to Detect again once the cooldown ends (``RECHECK#``, a ``recheck`` health event): a
  one-off Xid line or an alarm's change of state is never sent again, and the node would stay in
  service with it. Detect decides it as it decides any fault, from the held incident's record.

Each repair is counted by kind (metric ``ReconcilerRepairs``, dimensions Cluster and Kind).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from pydantic import BaseModel, Field

from nodemedic.contracts.events import INSTANCE_LOST, RECONCILER_SOURCE, NodeHealthEvent, NodeIdentity
from nodemedic.contracts.incident import (
    REPLACEMENT_CLAIM,
    Bookkeeping,
    Incident,
    NodeLock,
    Recheck,
    UnwatchedNode,
    UnwatchedNodes,
)
from nodemedic.domain.scontrol import burn_in_instance
from nodemedic.errors import IncidentStateError
from nodemedic.orchestrators.base import NodeStatus, Orchestrator
from nodemedic.planned_events import back_from_interruption, ended_by_interruption
from nodemedic.providers.base import Member
from nodemedic.safety.gate import HandsOff
from nodemedic.stages.drain import owner_tag
from nodemedic.stages.failure import fail
from nodemedic.stages.gate import STORM_RULES
from nodemedic.stages.resume import return_node
from nodemedic.store.ledger import Ledger

KEEPS_LOCK = frozenset({"open", "held", "quarantined", "escalated", "retired"})  # see the runbooks: on purpose
GRACE = timedelta(minutes=2)  # an incident whose execution is not found yet (read after write) is left alone
# a node in service unwatched this long is paged: longer than a reboot outside NodeMedic takes
# to show in the scheduler (Slurm's SlurmdTimeout, 300 s by default) plus two runs
UNWATCHED_AFTER = timedelta(minutes=15)
MAX_UNWATCHED = 2000  # nodes tracked at once
RECORD_BYTES = 300_000  # and the record's size: it stays under DynamoDB's 400 KB item, whatever the names
PAGE_NAMES = 50  # named in a page; the rest counted
UNNAMED_AFTER = timedelta(minutes=30)  # a group's instance that backs no node this long after its launch is paged
RECHECK_OFFERS = 3  # a fault the cooldown held is offered again at most this often (one per run)


@dataclass(frozen=True)
class AgentWatch:
    """Which instances the cluster has (the capacity provider's ``members``), and which of them
    the silence sweeper has heard, with the node name each one's agent reports (the roster)."""

    members: Callable[[], list[Member]]
    heard: Callable[[], Mapping[str, str | None]]
    # on Slurm, where the provider's instances carry the node's name (Auto Scaling, EC2): the
    # instances EC2 ended that backed a node, as long as EC2 lists them. None: not known (HyperPod
    # replaces its own instances; on Kubernetes a new instance registers as a node of its own)
    ended: Callable[[], list[Member]] | None = None
    # whether something launches an instance in an ended one's place that the provider's replace
    # claims and names after the node (an Auto Scaling group); False: nothing does (plain EC2: its
    # replace stops and starts the same instance), and a node whose instance ended is paged
    relaunched: bool = True


def execution_arn(state_machine_arn: str, name: str) -> str:
    """The ARN of the state machine's execution ``name`` (an incident's id is its execution's name)."""
    return state_machine_arn.replace(":stateMachine:", ":execution:", 1) + f":{name}"


class ReconcileReport(BaseModel):
    """What one run found and repaired, by kind; ``pages``: what the on-call must be told."""

    incidents_failed: list[str] = Field(default_factory=list)
    locks_released: list[str] = Field(default_factory=list)
    claims_released: list[str] = Field(default_factory=list)
    drains_reasserted: list[str] = Field(default_factory=list)
    returns_reasserted: list[str] = Field(default_factory=list,
                                          description="returned by an incident that ended, drained again by the scheduler")
    returns_held: list[str] = Field(default_factory=list, description=(
        "a lost return not made again while automation is paused or the node excluded: made once lifted"))
    holds_dropped: list[str] = Field(default_factory=list)
    burn_ins_started: list[str] = Field(default_factory=list, description="held for a burn-in nobody ran: started")
    burn_ins_unchecked: list[str] = Field(default_factory=list, description="held for a burn-in nobody runs")
    replacements_started: list[str] = Field(default_factory=list, description="nodes whose instance EC2 ended (after "
                                            "a Spot interruption's retirement, or outside any incident): the group's "
                                            "new instance joined in their place")
    nodes_without_instance: list[str] = Field(default_factory=list, description="nodes whose instance EC2 ended where "
                                              "nothing launches one in its place (Provider=ec2): paged")
    unnamed_instances: list[str] = Field(default_factory=list, description="the group's instances that back no node "
                                         "30 minutes after their launch (Provider=autoscaling on Slurm): paged once")
    gpu_clients_resumed: list[str] = Field(default_factory=list, description="a GPU reset's pause nobody undid")
    autoscaler_holds_released: list[str] = Field(default_factory=list,
                                                 description="nodes in service still kept from the autoscalers")
    rechecks_offered: list[str] = Field(default_factory=list, description="faults put off (the cooldown, a failed gate), "
                                        "offered again")
    rechecks_given_up: list[str] = Field(default_factory=list, description="offered again and again, never decided")
    unwatched_nodes: list[str] | None = Field(default=None, description="nodes in service NodeMedic cannot watch; "
                                             "None when not checked")
    pages: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {"incident": len(self.incidents_failed), "lock": len(self.locks_released),
                "claim": len(self.claims_released), "drain": len(self.drains_reasserted),
                "return": len(self.returns_reasserted),
                "gpu_clients": len(self.gpu_clients_resumed), "autoscaler_hold": len(self.autoscaler_holds_released),
                "recheck": len(self.rechecks_offered)}


UNCHECKED = "reconciler: held for its burn-in, no incident checking it"


def burn_in_event(cluster: str, node: str, instance_id: str, reason: str, now: datetime,
                  started_by: str = UNCHECKED, offer: str | None = None) -> NodeHealthEvent:
    """The ``NODE_JOINED`` event that starts the burn-in of ``node``, held out with ``reason``.
    ``offer``: what names this offer (its event id is derived from it: the same offer, the same
    id); None: an id of its own."""
    event_id = "burn-" + hashlib.sha256(offer.encode()).hexdigest()[:40] if offer else str(uuid.uuid4())
    return NodeHealthEvent(
        schema_version="1", event_id=event_id, cluster=cluster,
        node=NodeIdentity(instance_id=instance_id, hostname=node, slurm_node=node), check="burn_in",
        fault_code="NODE_JOINED", severity="warning", observed_at=now, sent_at=now,
        evidence={"drain_reason": reason, "started_by": started_by})


def reconcile(*, cluster: str, ledger: Ledger, orchestrator: Orchestrator,
              execution_status: Callable[[str], str | None], prefix: str, now: datetime,
              publish: Callable[[NodeHealthEvent], None], agents: AgentWatch | None = None,
              hands_off: HandsOff = lambda node, instance: None) -> ReconcileReport:
    """``execution_status(incident_id)``: its execution's status (RUNNING, SUCCEEDED, ...), None
    when there is no such execution. ``publish(event)`` puts a health event on the stack's bus.
    ``agents``: where to learn which agents are heard (None: not checked). ``hands_off``: why a
    node must not be returned now (a pause, an exclusion), as the stages ask it."""
    report = ReconcileReport()
    books = ledger.bookkeeping(cluster, now)
    _strays(books, ledger, orchestrator, execution_status, prefix, now, report)
    _locks_and_claims(books, cluster, ledger, report)
    _rechecks(books, ledger, now, publish, report)
    try:
        nodes = {n.name: n for n in orchestrator.nodes()}
    except Exception as exc:  # noqa: BLE001 - the scheduler is down: the next run tries again
        report.errors.append(f"cannot read the scheduler's nodes: {exc}")
        return report
    members: list[Member] | None = None
    if agents is not None:
        try:
            members = agents.members()
        except Exception as exc:  # noqa: BLE001 - the next run tries again
            report.errors.append(f"cannot list the cluster's instances: {exc}")
    _holds(books, ledger, orchestrator, nodes, prefix, report)
    _lost_returns(books, ledger, orchestrator, nodes, prefix, report, hands_off)
    _unchecked_burn_ins(books, cluster, ledger, nodes, prefix, now, publish, report, members)
    _paused_gpu_clients(books, ledger, orchestrator, report)
    _stray_autoscaler_holds(books, orchestrator, report)
    if agents is not None and members is not None:
        _back_from_interruption(books, cluster, ledger, members, nodes, now, publish, report)
        if agents.ended is not None and agents.relaunched:
            _ended_by_interruption(books, cluster, ledger, members, nodes, now, publish, report)
            _ended_outside_incidents(books, cluster, ledger, members, agents.ended, nodes, prefix, now, publish, report)
            _unnamed_instances(books, cluster, ledger, members, now, report)
        elif agents.ended is not None:
            _ended_for_good(books, cluster, ledger, members, agents.ended, nodes, prefix, now, report)
        _unwatched_nodes(cluster, ledger, agents, members, nodes, now, report)
    return report


def offer_id(recheck: Recheck) -> str:
    """The id of every offer of ``recheck``: the same each time, so Detect decides it once."""
    return "recheck-" + hashlib.sha256(f"{recheck.cluster}/{recheck.incident_id}".encode()).hexdigest()[:40]


def recheck_event(recheck: Recheck, instance_id: str, now: datetime) -> NodeHealthEvent:
    """The event that offers Detect a fault the cooldown held again. It names the held incident,
    from which Detect reads the fault."""
    return NodeHealthEvent(
        schema_version="1", event_id=offer_id(recheck), cluster=recheck.cluster,
        node=NodeIdentity(instance_id=instance_id, hostname=recheck.slurm_node, slurm_node=recheck.slurm_node),
        check="recheck", fault_code=recheck.fault_code, severity="warning", observed_at=now, sent_at=now,
        evidence={"recheck_of": recheck.incident_id})


def _rechecks(books: Bookkeeping, ledger: Ledger, now: datetime, publish: Callable[[NodeHealthEvent], None],
              report: ReconcileReport) -> None:
    """Offer Detect again each fault the cooldown held whose cooldown has ended, and each fault
    whose gate failed on a passing error (stages.failure, due at once). Detect drops the
    recheck once it decided (one it could not drop is dropped here, its offer acknowledged); one
    still here at the next run was not decided (the event was lost, its execution failed) and is
    offered again, ``RECHECK_OFFERS`` times at most: then the on-call is told, and it is dropped."""
    for recheck in (r for r in books.rechecks if r.due <= now):
        try:
            if recheck.offers and ledger.event_handled_by(f"{RECONCILER_SOURCE}/{offer_id(recheck)}"):
                ledger.drop_recheck(recheck)
                continue
            if recheck.offers >= RECHECK_OFFERS:
                if ledger.drop_recheck(recheck):
                    report.pages.append(
                        f"NodeMedic put off a {recheck.fault_code} on {recheck.slurm_node} (incident "
                        f"{recheck.incident_id}: its cooldown, or its gate failed) and offered it again "
                        f"{recheck.offers} times; it was never decided. The node may still be in service with that "
                        f"fault: check it (nodemedic show {recheck.incident_id}) and remediate it by hand if it is "
                        "sick (nodemedic remediate).")
                    report.rechecks_given_up.append(recheck.slurm_node)
                continue
            try:
                held = ledger.get(recheck.incident_id)
            except IncidentStateError:  # not in the ledger (a restored backup, a hand-made item): nothing to offer
                ledger.drop_recheck(recheck)
                report.errors.append(f"the {recheck.fault_code} the cooldown held on {recheck.slurm_node} names "
                                     f"incident {recheck.incident_id}, which is not in the ledger: dropped")
                continue
            if ledger.offered(recheck):
                publish(recheck_event(recheck, held.instance_id, now))
                report.rechecks_offered.append(recheck.slurm_node)
        except Exception as exc:  # noqa: BLE001 - one item's error never stops the others
            report.errors.append(f"cannot offer again the {recheck.fault_code} the cooldown held on "
                                 f"{recheck.slurm_node}: {exc}")


def _retirements(locks: list[NodeLock], ledger: Ledger, report: ReconcileReport) -> list[tuple[NodeLock, Incident]]:
    """Those of ``locks`` a retired incident holds, each with that incident."""
    try:
        statuses = ledger.statuses(sorted({lock.incident_id for lock in locks})) if locks else {}
    except Exception as exc:  # noqa: BLE001 - the next run tries again
        report.errors.append(f"cannot read the incidents holding {len(locks)} node(s): {exc}")
        return []
    found: list[tuple[NodeLock, Incident]] = []
    for lock in (lock for lock in locks if statuses.get(lock.incident_id) == "retired"):
        try:
            found.append((lock, ledger.get(lock.incident_id)))
        except Exception as exc:  # noqa: BLE001 - one item's error never stops the others
            report.errors.append(f"cannot read incident {lock.incident_id}, which holds {lock.slurm_node}: {exc}")
    return found


def _first(ledger: Ledger, key: str, now: datetime, report: ReconcileReport) -> bool:
    """Whether this run is the first to announce ``key`` (a DynamoDB error: not now, said)."""
    try:
        return ledger.first_announcement(key, now)
    except Exception as exc:  # noqa: BLE001 - the next run tries again
        report.errors.append(f"cannot record {key}: {exc}")
        return False


def _back_from_interruption(books: Bookkeeping, cluster: str, ledger: Ledger, members: list[Member],
                            nodes: dict[str, NodeStatus], now: datetime,
                            publish: Callable[[NodeHealthEvent], None], report: ReconcileReport) -> None:
    """A node retired for a Spot stop or hibernation whose instance EC2 has started again (its
    launch time after the interruption), still held by the retirement: EC2's "running" was not
    delivered, or came while the retirement was still open. Its burn-in is started (Detect
    releases the retirement's lock for it), once per start of the instance."""
    running = {m.instance_id: m for m in members if m.state == "running" and m.slurm_node and m.launched_at}
    for lock, retired in _retirements([lock for lock in books.locks if lock.instance_id in running], ledger, report):
        member = running[lock.instance_id]
        node, started = str(member.slurm_node), member.launched_at or now
        key = f"back-from-interruption/{cluster}/{lock.instance_id}/{started:%Y%m%dT%H%M%SZ}"
        if not back_from_interruption(retired, lock.instance_id, started) or not _first(ledger, key, now, report):
            continue
        status = nodes.get(node)
        try:
            publish(burn_in_event(cluster, node, lock.instance_id, status.reason if status else "", now,
                                  started_by=f"reconciler: EC2 started {lock.instance_id} again after the "
                                             f"Spot interruption incident {lock.incident_id} retired it for"))
        except Exception as exc:  # noqa: BLE001 - taken back: the next run starts it
            ledger.forget_announcement(key)
            report.errors.append(f"cannot start the burn-in of {node}, back from its Spot interruption: {exc}")
        else:
            report.burn_ins_started.append(node)


def lost_event(cluster: str, node: str, instance_id: str, now: datetime, retired_by: str | None = None,
               after_hold: str | None = None) -> NodeHealthEvent:
    """The ``INSTANCE_LOST`` event that has ``node``, whose instance EC2 ended, replaced: the same
    id for the same instance, so a second delivery is deduplicated. ``retired_by``: the
    interruption incident (Spot, interruptible Capacity Reservation) that retired the node for it;
    None: it ended outside any incident.
    ``after_hold``: the incident a storm held it in (automation paused, the breaker open) before:
    offered again, under an id of its own."""
    why = (f"for the interruption incident {retired_by} retired {node} for" if retired_by
           else f"outside any incident (its group's health check, an operator, a Spot interruption NodeMedic was not "
                f"told of), and no instance backs {node} since")
    again = f"; offered again, incident {after_hold} was held" if after_hold else ""
    name = f"{cluster}/{instance_id}" + (f"/{after_hold}" if after_hold else "")
    return NodeHealthEvent(
        schema_version="1", event_id="lost-" + hashlib.sha256(name.encode()).hexdigest()[:40],
        cluster=cluster, node=NodeIdentity(instance_id=instance_id, hostname=node, slurm_node=node),
        check="spot_interruption" if retired_by else "ec2_status", fault_code=INSTANCE_LOST, severity="critical",
        observed_at=now, sent_at=now,
        evidence={**({"retired_by": retired_by} if retired_by else {}),
                  "started_by": f"reconciler: EC2 ended {instance_id} {why}{again}"})


OFFERS_AFTER_HOLDS = 5  # a lost node or a burn-in held by one storm after another is offered again this often at most


def _held_by_a_storm(ledger: Ledger, event: NodeHealthEvent) -> str | None:
    """The incident that took ``event``, if a storm held it (automation paused, the breaker open):
    its hold kept the node until an operator resumed automation or reset the breaker, and nothing
    else offers it again. None for any other end (a failure was paged; a refusal said why)."""
    taker = ledger.event_handled_by(f"{RECONCILER_SOURCE}/{event.event_id}")
    if taker is None:
        return None
    incident = ledger.get(taker)
    gate = incident.stages.get("gate")
    rules = gate.result.get("rules") if gate else None
    last = rules[-1] if isinstance(rules, list) and rules else None
    return taker if incident.status == "held" and isinstance(last, dict) and last.get("rule") in STORM_RULES else None


def _after_storms(ledger: Ledger, key: str, event_for: Callable[[str, str | None], NodeHealthEvent],
                  first: Callable[[str], bool]) -> tuple[NodeHealthEvent, str] | None:
    """The event to publish now for an offer announced under ``key``, and its announcement's key
    (made by ``first``): the first offer, or the one after each storm that held the one before
    (automation paused, the breaker open: its hold kept the node until an operator lifted it, and
    nothing else offers it again), ``OFFERS_AFTER_HOLDS`` at most. None when it was offered and
    nothing since asks again. ``event_for(key, held_by)``: the offer's event."""
    after: str | None = None
    for _ in range(OFFERS_AFTER_HOLDS + 1):
        offer = key + (f"/{after}" if after else "")
        event = event_for(offer, after)
        if first(offer):
            return event, offer
        after = _held_by_a_storm(ledger, event)
        if after is None:
            return None
    return None


def _start_replacement(cluster: str, node: str, instance_id: str, ledger: Ledger, now: datetime,
                       publish: Callable[[NodeHealthEvent], None], report: ReconcileReport,
                       retired_by: str | None = None) -> None:
    """Publish the ``INSTANCE_LOST`` event of ``node``, once per lost instance, and once more after
    each storm that held it: one that fails is taken back, and the next run tries again; an
    incident that fails is paged as any other, never started again. One node's error never stops
    the run."""
    key = None
    try:
        offer = _after_storms(ledger, f"lost/{cluster}/{instance_id}",
                              lambda _, held: lost_event(cluster, node, instance_id, now, retired_by, after_hold=held),
                              lambda k: _first(ledger, k, now, report))
        if offer is None:
            return
        event, key = offer
        publish(event)
    except Exception as exc:  # noqa: BLE001 - a publish taken back: the next run starts it
        if key is not None:
            ledger.forget_announcement(key)
        report.errors.append(f"cannot start the replacement of {node}, whose instance EC2 ended: {exc}")
    else:
        report.replacements_started.append(node)


def _ended_by_interruption(books: Bookkeeping, cluster: str, ledger: Ledger, members: list[Member],
                           nodes: dict[str, NodeStatus], now: datetime,
                           publish: Callable[[NodeHealthEvent], None], report: ReconcileReport) -> None:
    """A Slurm node retired for an interruption (Spot, interruptible Capacity Reservation) that
    terminates its instance, which EC2 has ended since: no instance backs the node, and the one
    its Auto Scaling group launched in its place backs no node (the group cannot tell it which).
    An ``INSTANCE_LOST`` incident replaces it (Detect releases the retirement's lock for it): the
    replace rung claims the group's new instance, names it after the node, joins it and checks
    it. Once per lost instance: an incident that fails is paged as any other, never started
    again."""
    for lock in _lost_to_interruptions(books, ledger, members, nodes, report):
        _start_replacement(cluster, str(lock.slurm_node), lock.instance_id, ledger, now, publish, report,
                           retired_by=lock.incident_id)


def _lost_to_interruptions(books: Bookkeeping, ledger: Ledger, members: list[Member], nodes: dict[str, NodeStatus],
                           report: ReconcileReport) -> list[NodeLock]:
    """The locks of the Slurm nodes retired for an interruption that terminates their instance,
    which EC2 has ended since, and that no instance backs now."""
    live = {m.instance_id for m in members}
    backed = {m.slurm_node for m in members if m.slurm_node}
    lost = [lock for lock in books.locks
            if lock.instance_id not in live and lock.slurm_node in nodes and lock.slurm_node not in backed]
    return [lock for lock, retired in _retirements(lost, ledger, report) if ended_by_interruption(retired, lock.instance_id)]


def _ended_outside_incidents(books: Bookkeeping, cluster: str, ledger: Ledger, members: list[Member],
                             ended: Callable[[], list[Member]], nodes: dict[str, NodeStatus], prefix: str,
                             now: datetime, publish: Callable[[NodeHealthEvent], None],
                             report: ReconcileReport) -> None:
    """A Slurm node whose instance EC2 ended while no incident held it (the group's health check
    replaced it, an operator terminated it, a Spot interruption whose warning never reached
    NodeMedic): no instance backs the node, and the group launched one in its place that backs
    none and cannot know which node to be. An ``INSTANCE_LOST`` incident replaces it, as after a
    Spot retirement. Only as many as the group has such instances that no open incident will take
    (a replace rung waiting for one, a lost node's incident not there yet): a group scaled in launched none,
    and the node it gave up is left alone (so is one an operator drained: they have it in hand; one
    a failed incident left drained gets it, its check deciding: the failure was paged)."""
    held = {lock.slurm_node for lock in books.locks}
    claimed = _claimed_replacements(books)
    # the group's new instances nobody has yet, less those open incidents will take
    takers = sum(1 for i in books.open_incidents if _will_take_an_instance(i))
    launched = sum(1 for m in members if not m.slurm_node and m.instance_id not in claimed) - takers
    if launched <= 0:
        return
    latest = _lost_nodes(ended, members, held, nodes, prefix, now, report)
    for node_name, m in sorted(latest.items())[:launched]:
        _start_replacement(cluster, node_name, m.instance_id, ledger, now, publish, report)


def _unnamed_instances(books: Bookkeeping, cluster: str, ledger: Ledger, members: list[Member], now: datetime,
                       report: ReconcileReport) -> None:
    """The group's running instances that back no Slurm node ``UNNAMED_AFTER`` after their launch
    and that no incident claimed: no lost node took them (the group scaled out, or launched one in
    place of a node scaled in or lost longer than EC2 lists its instance), so they run nothing
    while they cost. Paged once each, all of a run's in one page; not while an open incident may
    still take one (a replace rung waiting, a lost node's incident, one this run started)."""
    if any(_will_take_an_instance(i) for i in books.open_incidents) or report.replacements_started:
        return
    claimed = _claimed_replacements(books)
    report.unnamed_instances = sorted(m.instance_id for m in members
                                      if m.slurm_node is None and m.state == "running" and m.instance_id not in claimed
                                      and m.launched_at is not None and now - m.launched_at >= UNNAMED_AFTER)
    new = [i for i in report.unnamed_instances if _first(ledger, f"unnamed/{cluster}/{i}", now, report)]
    if new:
        report.pages.append(
            f"NodeMedic: {len(new)} instance(s) of the cluster's Auto Scaling group back no Slurm node "
            f"{int(UNNAMED_AFTER.total_seconds() // 60)} minutes or more after their launch: {named_in_page(new)}. "
            f"They run no jobs while they cost, and no node lost its instance for them to take (the group scaled "
            f"out, or replaced a node it scaled in, or one lost longer than EC2 lists its ended instance). "
            f"Terminate what the cluster does not need, lowering the group's desired capacity (aws autoscaling "
            f"terminate-instance-in-auto-scaling-group --should-decrement-desired-capacity), or give each a node: "
            f"tag it nodemedic:slurm-node=<node> and join it as the node (NodeJoinCommand).")


def _lost_nodes(ended: Callable[[], list[Member]], members: list[Member], held: AbstractSet[str | None],
                nodes: dict[str, NodeStatus], prefix: str, now: datetime, report: ReconcileReport) -> dict[str, Member]:
    """The Slurm nodes whose instance EC2 ended and that no instance backs now, each with the last
    instance that backed it; less those ``held`` (an incident has them) and those an operator
    drained (they have them in hand: one a failed NodeMedic incident left drained is not theirs).
    Empty, said, when EC2 cannot list them now."""
    try:
        gone = ended()
    except Exception as exc:  # noqa: BLE001 - the next run tries again
        report.errors.append(f"cannot list the instances EC2 ended: {exc}")
        return {}
    backed = {m.slurm_node for m in members if m.slurm_node}
    latest: dict[str, Member] = {}
    for m in gone:
        node = nodes.get(m.slurm_node or "")
        if node is None or node.name in backed or node.name in held or (node.drained and not node.reason.startswith(prefix)):
            continue
        if node.name not in latest or (m.launched_at or now) > (latest[node.name].launched_at or now):
            latest[node.name] = m
    return latest


def _ended_for_good(books: Bookkeeping, cluster: str, ledger: Ledger, members: list[Member],
                    ended: Callable[[], list[Member]], nodes: dict[str, NodeStatus], prefix: str,
                    now: datetime, report: ReconcileReport) -> None:
    """A Slurm node whose instance EC2 ended (while no incident held it, under an incident its
    replace rung retired for it, or after its retirement for a Spot interruption that terminates
    it), where nothing launches one in its place (plain EC2:
    NodeMedic's replace stops and starts the same instance, and it launches none): the node stays
    out of service with no instance, for good. Paged once per instance, every such node of a run
    in one page (a Spot reclaim ends many at once), with what to do; a node an operator drained or
    another incident keeps is left alone (theirs)."""
    lost = {node: (m.instance_id, "outside NodeMedic")
            for node, m in _lost_nodes(ended, members, _in_hand(books), nodes, prefix, now, report).items()}
    lost.update({str(lock.slurm_node): (lock.instance_id, f"for the interruption incident {lock.incident_id} "
                                                          "retired it for")
                 for lock in _lost_to_interruptions(books, ledger, members, nodes, report)})
    said: list[str] = []
    for node_name, (instance_id, why) in sorted(lost.items()):
        if not _first(ledger, f"ended-for-good/{cluster}/{instance_id}", now, report):
            continue
        report.nodes_without_instance.append(node_name)
        node = nodes[node_name]
        said.append(f"{node_name} ({instance_id} ended {why}; {node.state}"
                    + (f", drained: {node.reason}" if node.drained else "") + ")")
    if said:
        report.pages.append(
            f"NodeMedic: {len(said)} node(s) have no instance: EC2 ended theirs (an operator's terminate, a Spot "
            f"interruption, a failed host), and with Provider=ec2 nothing launches one in its place: "
            f"{named_in_page(said)}. They stay out of service in Slurm. For each, launch an instance tagged "
            f"nodemedic:cluster={cluster} and nodemedic:slurm-node=<node>: a node nobody drained is checked as it "
            f"boots, before it takes work; one that stays drained (by NodeMedic), check it once the instance runs "
            f"(nodemedic remediate <node> --action health-check --level full) and return it (--action resume). Or "
            f"take the node out of slurm.conf.")


def _unwatched_nodes(cluster: str, ledger: Ledger, agents: AgentWatch, members: list[Member],
                     nodes: dict[str, NodeStatus], now: datetime, report: ReconcileReport) -> None:
    try:
        heard = agents.heard()
        known = ledger.unwatched_nodes(cluster)
    except Exception as exc:  # noqa: BLE001 - the next run tries again
        report.errors.append(f"cannot tell which agents are heard: {exc}")
        return

    def why(member: Member) -> str | None:
        if member.instance_id not in heard:
            return "no heartbeat from its agent"
        named = heard[member.instance_id]
        if named and named != member.slurm_node:  # Detect refuses its every event: identity mismatch
            return f"its agent calls it {named}"
        return None

    unwatched = sorted((m.instance_id, m.slurm_node, reason) for m in members
                       if m.state == "running" and m.slurm_node in nodes and nodes[m.slurm_node].serving
                       and (reason := why(m)))
    now_known, size = UnwatchedNodes(), 0
    for instance, node, reason in unwatched[:MAX_UNWATCHED]:
        entry = (known.nodes[instance].model_copy(update={"why": reason}) if instance in known.nodes
                 else UnwatchedNode(node=node or "", why=reason, since=now))
        size += len(instance) + len(entry.model_dump_json()) + 4
        if size > RECORD_BYTES:  # long node names: the rest is counted, not tracked
            break
        now_known.nodes[instance] = entry
    due = {i: n for i, n in now_known.nodes.items() if now - n.since >= UNWATCHED_AFTER}
    report.unwatched_nodes = [f"{n.node} ({i}): {n.why}" for i, n in due.items()]
    new: list[str] = []
    unpaged: set[str] = set()
    for i, n in due.items():  # a run the schedule started twice at once pages each spell once
        try:
            if n.paged or not ledger.first_announcement(f"unwatched/{cluster}/{i}/{n.since.isoformat()}", now):
                continue
        except Exception as exc:  # noqa: BLE001 - not announced, left unmarked: the next run pages it
            report.errors.append(f"cannot page {n.node} ({i}), which NodeMedic cannot watch: {exc}")
            unpaged.add(i)
            continue
        new.append(f"{n.node} ({i}, since {n.since:%Y-%m-%d %H:%M} UTC: {n.why})")
    if new:
        report.pages.append(_unwatched_page(new, untracked=len(unwatched) - len(now_known.nodes)))
    now_known.nodes.update({i: n.model_copy(update={"paged": True}) for i, n in due.items() if i not in unpaged})
    if now_known != known:
        try:
            ledger.save_unwatched_nodes(cluster, now_known)
        except Exception as exc:  # noqa: BLE001 - the next run finds them again, as new
            report.errors.append(f"cannot record the nodes NodeMedic cannot watch: {exc}")


def named_in_page(names: list[str]) -> str:
    """``names`` as a page says them: the first ``PAGE_NAMES``, then how many more (a page names
    what a person can read, and stays under SNS's 256 KB however many there are)."""
    more = len(names) - PAGE_NAMES
    return "; ".join(names[:PAGE_NAMES]) + (f"; and {more} more" if more > 0 else "")


def _unwatched_page(new: list[str], untracked: int) -> str:
    """The page for the nodes newly found unwatched (``untracked``: more, beyond the record)."""
    return (f"NodeMedic cannot watch {len(new)} node(s) in service: no fault there is detected or remediated, not "
            f"even the node going silent: {named_in_page(new)}. "
            + (f"{untracked} more cannot be watched either (too many to track one by one). " if untracked else "")
            + "Install or start the agent there (systemctl status nodemedic-agent, or the DaemonSet's pod); check "
            "that it reaches instance metadata and has the stack's AgentPublishPolicy; give it the node's scheduler "
            "name (node.slurm_node in its config, or NODEMEDIC_NODE_NAME). `nodemedic doctor` lists them.")


def _in_hand(books: Bookkeeping) -> set[str]:
    """The nodes a lock or an open incident is about: their incident decides what happens to them."""
    return {lock.slurm_node for lock in books.locks} | {i.slurm_node for i in books.open_incidents}


def _stray_autoscaler_holds(books: Bookkeeping, orchestrator: Orchestrator, report: ReconcileReport) -> None:
    busy = _in_hand(books) | {hold.slurm_node for hold in books.holds}
    try:
        stray = orchestrator.stray_autoscaler_holds()
    except Exception as exc:  # noqa: BLE001 - the next run tries again
        report.errors.append(f"cannot read the autoscaler holds: {exc}")
        return
    for node in stray:
        if node in busy:  # its incident or drain hold decides when it is let go
            continue
        try:
            if orchestrator.release_autoscaler_holds(node):
                report.autoscaler_holds_released.append(node)
                report.pages.append(f"NodeMedic removed the autoscaler holds it had set on {node} (Karpenter's "
                                    "do-not-disrupt, the Cluster Autoscaler's scale-down-disabled): the node was "
                                    "returned to service outside NodeMedic, and would otherwise never be "
                                    "consolidated or scaled down.")
        except Exception as exc:  # noqa: BLE001
            report.errors.append(f"release the autoscaler holds of {node}: {exc}")


def _paused_gpu_clients(books: Bookkeeping, ledger: Ledger, orchestrator: Orchestrator,
                        report: ReconcileReport) -> None:
    open_ids = {i.incident_id for i in books.open_incidents}
    try:
        paused = orchestrator.gpu_clients_paused()
    except Exception as exc:  # noqa: BLE001 - the next run tries again
        report.errors.append(f"cannot read the paused GPU clients: {exc}")
        return
    # read again: an incident opened a moment ago may not be in the bookkeeping's index yet
    owners = sorted(set(paused.values()) - open_ids)
    open_ids |= {i for i, status in (ledger.statuses(owners) if owners else {}).items() if status == "open"}
    for node, owner in sorted(paused.items()):
        if owner in open_ids:  # its GPU reset is under way
            continue
        try:
            if orchestrator.resume_gpu_clients(node, owner):
                report.gpu_clients_resumed.append(node)
                report.pages.append(f"NodeMedic resumed the GPU clients (GPU operator components, NVML clients) on "
                                    f"{node}: incident {owner} paused them for a GPU reset and ended before it "
                                    "resumed them.")
        except Exception as exc:  # noqa: BLE001
            report.errors.append(f"resume the GPU clients on {node}: {exc}")


def _strays(books: Bookkeeping, ledger: Ledger, orchestrator: Orchestrator,
            execution_status: Callable[[str], str | None], prefix: str, now: datetime,
            report: ReconcileReport) -> None:
    for incident in books.open_incidents:
        try:
            status = execution_status(incident.incident_id)
            if status == "RUNNING" or (status is None and now - incident.detected_at < GRACE):
                continue
            ended = fail(incident, {"Error": "IncidentStranded",
                                    "Cause": f"its execution is {status or 'gone'} but the incident was still open"},
                         orchestrator=orchestrator, ledger=ledger, prefix=prefix, clock=lambda: now)
        except Exception as exc:  # noqa: BLE001 - one item's error never stops the others
            report.errors.append(f"incident {incident.incident_id}: {exc}")
            continue
        if ended.status == "failed":
            report.incidents_failed.append(incident.incident_id)
            report.pages.append(ended.message)


def _locks_and_claims(books: Bookkeeping, cluster: str, ledger: Ledger, report: ReconcileReport) -> None:
    ids = sorted({lock.incident_id for lock in books.locks} | {claim.incident_id for claim in books.claims})
    statuses = ledger.statuses(ids) if ids else {}
    for lock in books.locks:
        if statuses.get(lock.incident_id) not in KEEPS_LOCK and ledger.release_lock(lock, cluster):
            report.locks_released.append(f"{lock.slurm_node or lock.instance_id} ({lock.instance_id}, incident "
                                         f"{lock.incident_id} {statuses.get(lock.incident_id, 'gone')})")
    for claim in books.claims:
        if statuses.get(claim.incident_id) != "open" and ledger.release_claim(claim):
            report.claims_released.append(f"{claim.kind} {claim.key} (incident {claim.incident_id} "
                                          f"{statuses.get(claim.incident_id, 'gone')})")


def _replace_progress(incident: Incident) -> dict[str, object]:
    rungs = incident.repair_rungs
    return rungs[-1].progress if rungs and rungs[-1].rung == "replace" else {}


def _found_its_instance(incident: Incident) -> bool:
    return bool(_replace_progress(incident).get("new_instance_id"))


def _awaits_an_instance(incident: Incident) -> bool:
    """Its replace rung asked for a replacement and has not found its instance yet."""
    return bool(_replace_progress(incident).get("requested_at")) and not _found_its_instance(incident)


def _will_take_an_instance(incident: Incident) -> bool:
    """An open incident that will claim one of the group's new instances: a replace rung that asked
    for one, or a lost node's incident (one this reconciler started) not there yet."""
    return _awaits_an_instance(incident) or (incident.fault_code == INSTANCE_LOST and not _found_its_instance(incident))


def _claimed_replacements(books: Bookkeeping) -> set[str]:
    """The instances an open incident claimed as a node's replacement, not named after it yet."""
    return {c.key for c in books.claims if c.kind == REPLACEMENT_CLAIM}


def _replacement_awaited(books: Bookkeeping) -> bool:
    """An open incident asked for a replacement and has not found its instance yet: a node held for
    its burn-in now may be that replacement (on Kubernetes it registers under a name of its own),
    which the incident adopts and checks once it finds it. A burn-in of its own started there
    raced the adoption: two incidents deciding on one node."""
    return any(_awaits_an_instance(i) for i in books.open_incidents)


def _lost_returns(books: Bookkeeping, ledger: Ledger, orchestrator: Orchestrator, nodes: dict[str, NodeStatus],
                  prefix: str, report: ReconcileReport, hands_off: HandsOff) -> None:
    """A node that reads drained by an incident that ended (closed, or failed after that) after
    returning it: the scheduler lost the return (slurmctld restarted from state saved before it).
    Returned again, by the same command (it lifts only that incident's drain), so the node is not
    kept out of service for good by an incident that is over. A node an incident or a drain hold is
    about is that one's. Not while automation is paused or the node excluded (an operator may work
    on a node they found drained), asked right before the return: a run after it is lifted returns it."""
    busy = _in_hand(books) | {hold.slurm_node for hold in books.holds}
    owners = {node.name: node.reason.split()[0].removeprefix(f"{prefix}:") for node in nodes.values()
              if node.drained and node.reason.startswith(f"{prefix}:") and node.name not in busy}
    for name, incident_id in sorted(owners.items()):
        try:
            incident = ledger.get(incident_id)
        except IncidentStateError:  # not one of this stack's incidents
            continue
        back = incident.stages.get("resume")
        if (incident.status not in ("closed", "failed") or back is None or back.result.get("resumed") is not True
                or back.result.get("slurm_node", name) != name):
            continue
        try:
            if hands_off(name, ""):
                report.returns_held.append(name)
                continue
            returned = return_node(orchestrator, name, "pool" if back.result.get("destination") == "pool" else "service",
                                   owner_tag(prefix, incident))
        except Exception as exc:  # noqa: BLE001 - one node's error never stops the others
            report.errors.append(f"return {name}: {exc}")
            continue
        if returned:
            report.returns_reasserted.append(name)
            report.pages.append(
                f"NodeMedic returned {name} again: incident {incident_id} ({incident.status}) had returned it, but the "
                f"scheduler had it drained by that incident again ({nodes[name].state}); it lost the return "
                f"(a controller restart from state saved before it).")


def _orphaned_hold(cluster: str, ledger: Ledger, node: NodeStatus, named: str, now: datetime,
                   report: ReconcileReport) -> None:
    """``node`` is held for the burn-in of ``named``, which left the cluster, and no instance serves
    the node now: nothing to check. Said once, from the second run that finds it so."""
    key = f"burn-in-orphaned/{cluster}/{node.name}/{named}"
    if ledger.first_announcement(f"{key}/seen", now):
        return
    _unchecked(ledger, key, node.name, now, report,
               f"NodeMedic: {node.name} is held out of service for the burn-in of {named}, which is no longer in the "
               f"cluster (ended outside NodeMedic), and no instance of the cluster serves {node.name} now, so nothing "
               f"can be checked. It stays drained; its burn-in starts once an instance joins under that name.")


def _unchecked(ledger: Ledger, key: str, node: str, now: datetime, report: ReconcileReport, page: str) -> None:
    """``node`` is held for a burn-in nobody runs: counted each run, ``page`` said once (``key``)."""
    report.burn_ins_unchecked.append(node)
    if ledger.first_announcement(key, now):
        report.pages.append(page)


def _unchecked_burn_ins(books: Bookkeeping, cluster: str, ledger: Ledger, nodes: dict[str, NodeStatus], prefix: str,
                        now: datetime, publish: Callable[[NodeHealthEvent], None],
                        report: ReconcileReport, members: list[Member] | None = None) -> None:
    """Start the burn-in nobody started of each node held for one; page the one that did not take.
    With the cluster's ``members``: a hold that names an instance no longer in the cluster (ended
    since its boot held the node; on Slurm a later instance joins under the same name, and its own
    boot leaves the node as it finds it, drained) is the burn-in of the instance behind the node
    now. While none is, nothing can be checked: it is paged once, from its second sighting (the
    instance that joins may not be listed yet at the first), and stays drained."""
    busy = _in_hand(books)
    claimed = _claimed_replacements(books)  # a replacement an open incident adopts
    awaited = _replacement_awaited(books)
    behind = None if members is None else {m.instance_id: m.slurm_node for m in members}
    for node in nodes.values():
        named = burn_in_instance(prefix, node.reason) if node.drained else None
        if named is None or node.name in busy or awaited:
            continue
        instance: str | None = named
        if behind is not None and named not in behind:
            instance = next((i for i, n in behind.items() if n == node.name), None)
        if instance is None:
            _orphaned_hold(cluster, ledger, node, named, now, report)
            continue
        if instance in claimed:
            continue
        key = f"burn-in-unchecked/{cluster}/{node.name}/{instance}"
        if ledger.first_announcement(f"{key}/seen", now):  # the agent's NODE_JOINED may be on its way
            continue
        offer = _after_storms(ledger, f"{key}/started", partial(_burn_in_offer, cluster, node, instance, now),
                              lambda k: ledger.first_announcement(k, now))
        if offer is not None:
            event, started = offer
            try:
                publish(event)
            except Exception as exc:  # noqa: BLE001 - taken back: the next run starts it
                ledger.forget_announcement(started)
                report.errors.append(f"cannot start the burn-in of {node.name}: {exc}")
            else:
                report.burn_ins_started.append(node.name)
            continue
        _unchecked(ledger, key, node.name, now, report,
                   f"NodeMedic: {node.name} ({instance}) is held out of service for its burn-in ({node.reason}) "
                   f"but no incident is checking it: the burn-in the reconciler started for it did not run (see "
                   f"the Detect function's log for its NODE_JOINED event). It stays drained until someone acts: "
                   f"`nodemedic remediate {node.name} --action reboot` drains it under an incident, reboots it and "
                   f"checks it before returning it; `nodemedic remediate {node.name} --action resume` returns it "
                   f"unchecked.")


def _ended_incidents_drain(node: NodeStatus, holder: str, prefix: str, ledger: Ledger) -> str:
    """The id of the ended NodeMedic incident whose reason the node is drained with, other than
    ``holder``; "" for any other drain (the holder's own, an operator's, a burn-in's, an open
    incident's)."""
    if not node.reason.startswith(f"{prefix}:") or node.drained_by(f"{prefix}:{holder}"):
        return ""
    named = node.reason[len(prefix) + 1:].split(" ", 1)[0]
    status = ledger.statuses([named]).get(named) if named else None
    return named if status is not None and status != "open" else ""


def _burn_in_offer(cluster: str, node: NodeStatus, instance: str, now: datetime, offer: str,
                   held: str | None) -> NodeHealthEvent:
    """The ``NODE_JOINED`` of the burn-in nobody checks, offered as ``offer`` (again after ``held``)."""
    return burn_in_event(cluster, node.name, instance, node.reason, now, offer=offer,
                         started_by=UNCHECKED + (f"; offered again, incident {held} was held" if held else ""))


def _holds(books: Bookkeeping, ledger: Ledger, orchestrator: Orchestrator, nodes: dict[str, NodeStatus], prefix: str,
           report: ReconcileReport) -> None:
    """Each node an incident holds drained is drained, under that incident's reason. A drain that
    was lost (a controller restart) or lifted outside NodeMedic is made again; so is one another
    NodeMedic incident's reason stands for, once that incident has ended (a controller crash lost
    the later drain and brought the earlier one back: a quarantined node whose drain names a
    closed incident could be lifted by nobody's resume). An operator's drain stays theirs."""
    returning = {i.incident_id for i in books.open_incidents if "resume" in i.stages}
    for hold in books.holds:
        node = nodes.get(hold.slurm_node)
        if hold.incident_id in returning:
            continue
        if node is None:  # the node left the cluster
            ledger.drop_hold(hold.cluster, hold.slurm_node, hold.incident_id)
            report.holds_dropped.append(hold.slurm_node)
            continue
        other = _ended_incidents_drain(node, hold.incident_id, prefix, ledger) if node.drained else ""
        if node.drained and not other:
            continue
        current = ledger.hold_of(hold.cluster, hold.slurm_node)  # dropped meanwhile: being returned
        if current is None or current.incident_id != hold.incident_id:
            continue
        try:
            if orchestrator.drain(hold.slurm_node, hold.reason, takeover=f"{prefix}:" if other else "-"):
                report.drains_reasserted.append(hold.slurm_node)
                was = (f"it was drained by incident {other}, which has ended" if other else
                       f"it was in service ({node.state}); the drain was lost (a controller restart) or lifted "
                       "outside NodeMedic")
                report.pages.append(
                    f"NodeMedic drained {hold.slurm_node} again: incident {hold.incident_id} holds it drained "
                    f"({hold.reason}) but {was}. To return it, use `nodemedic remediate "
                    f"{hold.slurm_node} --action resume`.")
        except Exception as exc:  # noqa: BLE001
            report.errors.append(f"drain {hold.slurm_node}: {exc}")
