"""The gate: may automation act on this incident, and how? A pure function of the facts.

Rules, in order; the first that decides wins, and every rule evaluated is recorded:

1. paused          -> hold       (an operator paused all automation)
2. excluded        -> hold       (node list/glob or instance tag in the policy)
3. breaker open    -> hold       (tripped earlier; only an operator resets it)
4. provider        -> hold       (its provider is working on the node: HyperPod patching or checking it)
5. cooldown        -> hold       (the node slot was remediated moments ago; the fault is decided
                                 again when the cooldown ends: ``Decision.recheck_at``)
6. lemon           -> quarantine (the Nth incident of a node slot or EC2 host in the window)
7. breaker limit   -> hold, trip (one more node would exceed the limit; names the correlation:
                                 rack, switch, placement, host, image, driver, kernel, fault).
                                 Nodes waiting for a slot (rule 8) count: a storm of faults at
                                 once trips it, however few slots the concurrency cap gives.
                                 Planned work finding no room under the limit or the cap is held
                                 instead (``planned_room``): it trips nothing and waits for no slot,
                                 and the planned-events sweep offers it again
8. concurrency     -> throttled  (waits for a slot: retried by the state machine, then failed safely)
9. corroboration   -> verify     (an ambiguous fault without an independent second signal)
10. otherwise      -> proceed    (or approval first, in approval mode)

A burn-in (a node that joined), a retirement (capacity AWS ends) and a lost instance (the
reconciler's INSTANCE_LOST: a node whose Spot instance EC2 ended, joined anew) skip rules 4-9; a
burn-in in approval mode asks before the first rung that changes the node, once its check failed,
and a lost instance before its replace rung.

In dry-run mode the same rules run, nothing is admitted, and the verdict is ``dry_run`` with
what automation would have done.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from nodemedic.contracts.events import INSTANCE_LOST, PLANNED_SOURCE, SOFTWARE_KEYS, SOFTWARE_VERSION_MAX
from nodemedic.contracts.incident import IncidentRef
from nodemedic.errors import HandsOffError
from nodemedic.providers.base import Member
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.store.control import Admission, ControlState

Verdict = Literal["proceed", "verify", "quarantine", "hold", "throttled", "dry_run"]
# the availability zone is left out: most GPU clusters live in one, so it would always "correlate".
# What a rollout changes (the machine image, the GPU driver, the kernel) fails many nodes at once
# whatever their rack: the same fault on every node that took the new version
CORRELATED_ATTRIBUTES = ("rack", "switch", "placement_group", "host_id", "image", "gpu_driver", "kernel", "fault_code")


def software_of(evidence: Mapping[str, object]) -> dict[str, str]:
    """The GPU driver and kernel versions a node's event carried (the agent sends them with
    every event); a value that is no short text is not one."""
    return {k: v for k in SOFTWARE_KEYS if isinstance(v := evidence.get(k), str) and 0 < len(v) <= SOFTWARE_VERSION_MAX}


@dataclass(frozen=True)
class Facts:
    incident: IncidentRef
    member: Member
    policy: SafetyPolicy
    state: ControlState
    active: set[str]  # admitted or waiting incidents still in progress
    cluster_size: int
    signals: dict[tuple[str, str], datetime]  # (source, fault code) -> last seen, for the instance
    lineage: dict[str, list[tuple[str, datetime]]]  # key -> earlier (incident, admitted at)
    now: datetime
    software: dict[str, str] = field(default_factory=dict)  # the node's versions (software_of)
    cluster: list[Member] | None = None  # every member, read only for a trip's page (correlation)


@dataclass
class Decision:
    verdict: Verdict
    reason: str
    rules: list[dict[str, str]] = field(default_factory=list)
    needs_approval: bool = False
    approve_repairs: bool = False  # burn-in in approval mode: ask before the first rung that changes the node
    trips_breaker: bool = False
    notify: str = ""
    would: str = ""  # dry-run: the verdict automation would have reached
    recheck_at: datetime | None = None  # a hold that passes by itself (the cooldown): decide the fault again then


def decided_again(incident: IncidentRef) -> bool:
    """A fault the pipeline could not decide now (the cooldown held it; AWS throttled its gate past
    the retries) is offered again by the reconciler: a one-off Xid line or an alarm's state change
    is never sent again. Not an operator's request, nor planned work, which the planned-events
    sweep offers again itself."""
    return incident.fault_class != "manual" and incident.source != PLANNED_SOURCE


def lineage_keys(incident: IncidentRef, host_id: str = "") -> list[str]:
    """Keys that outlive an instance: the Slurm node slot, and the EC2 host when known."""
    return [f"node:{incident.slurm_node}", *([f"host:{host_id}"] if host_id else [])]


def admission_of(incident: IncidentRef, member: Member, now: datetime,
                 software: Mapping[str, str] | None = None) -> Admission:
    kind = uncounted(incident)
    return Admission(slurm_node=incident.slurm_node, instance_id=incident.instance_id, at=now,
                     fault_code=incident.fault_code, attributes={**member.topology, **(software or {})},
                     burn_in=kind in (BURN_IN, INSTANCE_LOST_JOIN), retire=kind is RETIRE)


def correlation(admissions: list[Admission], cluster: list[Member] | None = None) -> list[str]:
    """Attribute values shared by at least two and at least half of the nodes, most shared first;
    with the ``cluster``'s members, how many of them have it too (a value every node has says
    less than one only the failing ones have)."""
    n = len(admissions)
    found: list[tuple[int, str]] = []
    for attr in CORRELATED_ATTRIBUTES:
        values = Counter(a.fault_code if attr == "fault_code" else a.attributes.get(attr, "") for a in admissions)
        value, count = max(values.items(), key=lambda kv: kv[1])
        if value and count >= 2 and count * 2 >= n:
            known = [m.topology.get(attr) for m in cluster or [] if m.topology.get(attr)]
            share = f"; {known.count(value)} of {len(cluster or [])} in the cluster" if known else ""
            found.append((count, f"{attr}={value} ({count} of {n} nodes{share})"))
    return [text for _, text in sorted(found, key=lambda f: -f[0])]


def paused_by(state: ControlState) -> str | None:
    """Who paused automation, when and why; None while automation is on."""
    paused = state.paused
    return f"automation paused by {paused.by} at {paused.at:%Y-%m-%d %H:%M}Z: {paused.reason}" if paused else None


# (node, instance; "": the one backing the node) -> why automation must not touch it now
HandsOff = Callable[[str, str], "str | None"]


def hands_off(state: ControlState, policy: SafetyPolicy, node: str, tags: dict[str, str]) -> str | None:
    """Why automation must keep its hands off ``node`` now (paused, or the node excluded); None:
    it may act. The gate asks it of a new fault (rules 1 and 2); the drain and the repair ladder
    ask it again right before each step that changes a node, so a pause or an exclusion an
    operator sets while an incident is under way stops that incident there
    (:class:`~nodemedic.errors.HandsOffError`)."""
    return paused_by(state) or policy.exclusions.excludes(node, tags)


def refuse_if_held(hands_off: HandsOff, node: str, instance: str) -> None:
    """:class:`~nodemedic.errors.HandsOffError` when automation must keep its hands off the node
    now: asked right before a step that changes it (a drain, a requeue, a rung, a deep check)."""
    if held := hands_off(node, instance):
        raise HandsOffError(f"not touching {node} ({instance}): {held}")


@dataclass(frozen=True)
class Uncounted:
    """A kind of incident that passes rules 4-9 without being counted by them, and why."""

    name: str
    passes: tuple[tuple[str, str], ...]  # (rule, why it passes)
    reason: str
    asks: str | None = None  # what approval mode asks first; None: nothing


# a joined node is not in service yet: checking it takes no capacity from anyone, so it neither
# counts toward nor waits for the breaker's limit or the concurrency cap; and it is no
# remediation of the slot (no cooldown, no lemon count): held, it would stay out. Checking it as
# it is changes nothing; if it fails, the ladder's rungs do (reset, reboot, replace)
BURN_IN = Uncounted("burn-in", (
    ("provider", "its provider may still be checking it; the full deep health check decides"),
    ("cooldown", "not a remediation"), ("lemon", "not a remediation"),
    ("breaker_limit", "a node not yet in service: not counted"), ("concurrency", "not counted"),
    ("corroboration", "the full deep health check decides")),
    "the node joined; the full check before it takes work", "approval required before a rung changes it")
# EC2 ended the instance of a Slurm node (retired for its Spot interruption, or outside any
# incident: its group's health check, an operator): the node serves and runs nothing, and joining
# the group's new instance in its place takes no capacity from anyone (a Spot reclaim of many
# nodes, counted, would trip the breaker and hold every fault after it)
INSTANCE_LOST_JOIN = Uncounted("instance lost", (
    ("provider", "the instance is gone"), ("cooldown", "nothing on the node is repaired"),
    ("lemon", "EC2 ended the instance; the node is joined to another"),
    ("breaker_limit", "a node not in service: not counted"), ("concurrency", "not counted"),
    ("corroboration", "Detect checked that the instance is gone and nothing backs the node")),
    "join the instance its group launched in its place, checked before it takes work",
    "approval required before the replace rung")
# AWS takes the capacity back at a known time whatever NodeMedic does: draining the node first
# (its job checkpointed and moved) removes nothing AWS is not removing, so a whole Capacity Block
# ending neither trips nor waits for the breaker's limit or the cap; and nothing is repaired, so
# neither cooldown nor lemon applies. A pause or an open breaker (rules 1-3) still holds it: then
# the job meets the end unprepared, as without NodeMedic
RETIRE = Uncounted("retire", (
    ("provider", "the capacity ends whatever its provider is doing"), ("cooldown", "nothing is repaired"),
    ("lemon", "nothing is repaired"), ("breaker_limit", "capacity AWS takes back; not counted"),
    ("concurrency", "not counted"), ("corroboration", "EC2 announced the end of the capacity")),
    "the node's capacity ends; drain it before AWS takes it back")


def uncounted(incident: IncidentRef) -> Uncounted | None:
    """Which kind of uncounted incident ``incident`` is, if any."""
    if incident.action == "burn_in":
        return BURN_IN
    if incident.fault_code == INSTANCE_LOST:
        return INSTANCE_LOST_JOIN
    return RETIRE if incident.action == "retire" else None


def decide(f: Facts) -> Decision:
    rules: list[dict[str, str]] = []
    p, node = f.policy, f.incident.slurm_node

    def ok(rule: str, detail: str) -> None:
        rules.append({"rule": rule, "result": "pass", "detail": detail})

    def stop(verdict: Verdict, rule: str, detail: str, **extra: object) -> Decision:
        rules.append({"rule": rule, "result": verdict, "detail": detail})
        return Decision(verdict, f"{rule}: {detail}", rules, **extra)  # type: ignore[arg-type]

    if why := paused_by(f.state):
        return _dry(f, stop("hold", "paused", why))
    ok("paused", "automation is on")
    why = p.exclusions.excludes(node, f.member.tags)
    if why:
        return _dry(f, stop("hold", "excluded", f"{why}; recorded, node untouched"))
    ok("excluded", "not excluded")
    b = f.state.breaker
    if b.state == "open" and b.tripped:
        return _dry(f, stop("hold", "breaker", f"circuit breaker open since {b.tripped.at:%H:%M:%S}Z "
                                               f"({b.tripped.reason}); recorded, no action"))
    ok("breaker", "closed")

    if (kind := uncounted(f.incident)) is not None:
        rules.extend({"rule": rule, "result": "pass", "detail": f"{kind.name}: {detail}"} for rule, detail in kind.passes)
        # in approval mode an operator approves the rungs that change the node, as for any fault
        approval = kind.asks is not None and p.mode == "approval"
        return _dry(f, Decision("proceed", f"{kind.name}: {kind.reason}" + (f"; {kind.asks}" if approval else ""),
                                rules, approve_repairs=approval))

    if f.member.state == "pending":
        # HyperPod patching the node (SystemUpdating) or running its deep health check, EC2 starting
        # it: what the agent sees meanwhile (a driver being replaced, a GPU under stress) races the
        # provider's own work, and HyperPod refuses a reboot or replace of a node it is working on.
        # Its work decides; a fault the agent still finds afterwards is reported again, decided then.
        detail = f"its provider is working on {node} (pending): its work decides; recorded, node untouched"
        if f.incident.fault_code != "HEARTBEAT_MISSING":
            return _dry(f, stop("hold", "provider", detail))
        # the sweeper reports a silent node its provider works on only once that has gone on for
        # hours (PROVIDER_BUSY_LIMIT): the provider is stuck, and nobody but a person can act
        return _dry(f, stop("hold", "provider", detail, notify=(
            f"NodeMedic: {node} ({f.incident.instance_id}) is silent and its provider still reports it pending "
            "(HyperPod updating or checking it, EC2 starting it). NodeMedic cannot act on a node its provider is "
            f"working on; if that work does not end, the node needs a person. Incident {f.incident.incident_id}.")))
    ok("provider", f"{node} is {f.member.state} at its provider")

    slot = lineage_keys(f.incident)[0]
    cooldown = timedelta(minutes=p.node_cooldown_minutes)
    recent = [at for _, at in f.lineage.get(slot, []) if f.now - at < cooldown]
    if recent:
        # the fault is not forgotten: the reconciler offers it again once the cooldown ends
        again = max(recent) + cooldown
        offered = decided_again(f.incident)
        return _dry(f, stop("hold", "cooldown", f"{node} was remediated at {max(recent):%H:%M:%S}Z, "
                                                f"within the {p.node_cooldown_minutes:g} min cooldown"
                                                + (f"; decided again after {again:%H:%M:%S}Z" if offered else ""),
                            recheck_at=again if offered else None))
    ok("cooldown", f"no remediation of {node} within {p.node_cooldown_minutes:g} min")

    window = timedelta(hours=p.lemon.window_hours)
    for key, history in f.lineage.items():
        earlier = [iid for iid, at in history if f.now - at <= window and iid != f.incident.incident_id]
        if len(earlier) + 1 >= p.lemon.incidents:
            return _dry(f, stop(
                "quarantine", "lemon",
                f"incident {len(earlier) + 1} of {key} within {p.lemon.window_hours:g} h (limit "
                f"{p.lemon.incidents}; earlier: {', '.join(earlier)}): quarantined, not replaced again",
                notify=f"NodeMedic quarantined {node} ({f.incident.instance_id}): {len(earlier) + 1} incidents "
                       f"of {key} within {p.lemon.window_hours:g} h. It stays drained until an operator "
                       f"investigates. Incident {f.incident.incident_id}, fault {f.incident.fault_code}."))
    ok("lemon", f"fewer than {p.lemon.incidents} incidents within {p.lemon.window_hours:g} h")

    limit = p.breaker_limit(f.cluster_size)
    counted = f.state.counted_by_breaker(f.now, timedelta(minutes=p.breaker.window_minutes), f.active)
    waiting = {i: a for i, a in f.state.waiting_for_slot(f.active).items() if i != f.incident.incident_id}
    mine = admission_of(f.incident, f.member, f.now, f.software)
    nodes = {a.slurm_node for a in [*counted.values(), *waiting.values()]} | {node}
    in_progress = sum(a.counted and i in f.active and i != f.incident.incident_id
                      for i, a in f.state.admissions.items())
    if f.incident.source == PLANNED_SOURCE:
        # the planned-events function released this work into room it read (safety/pacing.py); a
        # fault admitted since may have taken that room. Planned work then yields: it neither trips
        # the breaker (stopping every repair, faults' too) nor waits for a slot (where the breaker
        # counts it); held for a reason that passes, the sweep offers it again when there is room
        full = (f"{len(nodes)} nodes would be under remediation within {p.breaker.window_minutes:g} min "
                f"(limit {limit})" if len(nodes) > limit else
                f"{in_progress} remediations in progress (max {p.max_concurrent})" if in_progress >= p.max_concurrent
                else "")
        if full:
            return _dry(f, stop("hold", "planned_room", f"{full}: planned work yields to faults, and is offered "
                                                        "again at a later planned-events sweep with room"))
        ok("planned_room", f"room for planned work: {len(nodes)} of at most {limit} nodes, "
                           f"{in_progress} of {p.max_concurrent} in progress")
    if len(nodes) > limit:
        involved = list({a.slurm_node: a for a in [*counted.values(), *waiting.values(), mine]}.values())
        shared = correlation(involved, f.cluster)
        queued = {a.slurm_node for a in waiting.values()} - {a.slurm_node for a in counted.values()}
        detail = (f"{len(nodes)} nodes under remediation within {p.breaker.window_minutes:g} min"
                  f"{f' ({len(queued)} waiting for a slot)' if queued else ''} exceed the "
                  f"limit of {limit} ({p.breaker.max_percent:g}% of {f.cluster_size}, at most "
                  f"{p.breaker.max_nodes})")
        notify = (f"NodeMedic circuit breaker TRIPPED on cluster {f.incident.cluster}: {detail}. "
                  f"Correlated: {'; '.join(shared) or 'no shared rack, switch, placement or fault'}. "
                  f"Nodes: {', '.join(sorted(nodes))}. All destructive actions are stopped; events are still "
                  f"recorded. After investigating, reset it: nodemedic breaker reset --reason TEXT")
        return _dry(f, stop("hold", "breaker_limit", detail, trips_breaker=True, notify=notify))
    ok("breaker_limit", f"{len(nodes)} of at most {limit} nodes within {p.breaker.window_minutes:g} min")

    if in_progress >= p.max_concurrent:
        return _dry(f, stop("throttled", "concurrency",
                            f"{in_progress} remediations in progress (max {p.max_concurrent})"))
    ok("concurrency", f"{in_progress} in progress (max {p.max_concurrent})")

    if f.incident.confidence == "ambiguous":
        fresh = timedelta(minutes=p.corroboration_minutes)
        own = (f.incident.source, f.incident.fault_code)
        others = sorted(f"{s}:{c}" for (s, c), at in f.signals.items()
                        if (s, c) != own and f.now - at <= fresh)
        if not others:
            return _dry(f, stop("verify", "corroboration",
                                f"{f.incident.fault_code} from {f.incident.source} alone is ambiguous: "
                                f"deep health check before any destructive action",
                                needs_approval=p.mode == "approval"))
        ok("corroboration", f"corroborated by {', '.join(others)}")
    else:
        ok("corroboration", f"{f.incident.fault_code} is a high-confidence fault")

    approval = p.mode == "approval"
    reason = "all safety rules pass" + ("; approval required before replace/reboot" if approval else "")
    return _dry(f, Decision("proceed", reason, rules, needs_approval=approval))


def _dry(f: Facts, d: Decision) -> Decision:
    """In dry-run mode: keep the reasoning, take no action, admit nothing, notify nobody."""
    if f.policy.mode != "dry_run":
        return d
    return Decision("dry_run", f"dry run: automation would {d.verdict} ({d.reason})", d.rules, would=d.verdict)
