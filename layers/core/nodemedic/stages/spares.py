"""Hot spares: swap a pre-validated standby node into service the moment a node is drained.

The pool is the nodes of one Slurm reservation (``SpareReservation``, ``users=root``,
``flags=ignore_jobs``): idle, healthy, and unusable by jobs that do not name the reservation.
Taking a spare removes it from the reservation, so the requeued job (the oldest pending job)
starts on it at once. The failed node is repaired off the critical path, passes the *full* deep
health check and joins the reservation in the spare's place (see :mod:`nodemedic.stages.resume`).
A node that ran no job leaves the pool alone (the spares wait for a failure that interrupts a
job): it is repaired, then resumed. A node whose capacity ends (a retire: its Capacity Block
ends) takes no spare that runs in the same block: that one goes away at the same time.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from nodemedic.contracts.incident import NON_DISRUPTIVE, SPARE_CLAIM, Claim, IncidentRef
from nodemedic.contracts.stages import SpareOutput
from nodemedic.errors import NodeGoneError
from nodemedic.orchestrators.base import UNREADY, Orchestrator
from nodemedic.providers.base import Provider
from nodemedic.safety.gate import HandsOff
from nodemedic.store.ledger import Ledger

RETIRED_STAYS = "the node stays drained (its capacity ends)"


def ready(state: str) -> bool:
    """A spare can take a job now: idle, and none of the ``UNREADY`` flags."""
    flags = set(state.split("+"))
    return "IDLE" in flags and not flags & UNREADY


def _ending_with(incident: IncidentRef, provider: Provider, names: list[str]) -> set[str]:
    """The spares (by node name) that run in the capacity that ends with a retiring node."""
    member = provider.member(incident.instance_id) if incident.action == "retire" else None
    block = member.topology.get("capacity_reservation") if member else None
    if not block:
        return set()
    return {name for name in names
            if (spare := provider.member_by_node(name)) and spare.topology.get("capacity_reservation") == block}


def _take(orchestrator: Orchestrator, ledger: Ledger, incident: IncidentRef, spare: str) -> str | None:
    """Take ``spare`` out of the pool; None when taken, else why not: the cluster deleted it since
    the pool was listed (Kubernetes: its instance ended), and its claim is released."""
    try:
        orchestrator.take_spare(spare)
        return None
    except NodeGoneError as exc:
        ledger.release_claim(Claim(kind=SPARE_CLAIM, key=spare, incident_id=incident.incident_id))
        return str(exc)


def swap_in(incident: IncidentRef, *, orchestrator: Orchestrator, provider: Provider, ledger: Ledger,
            pool_size: int, clock: Callable[[], datetime],
            hands_off: HandsOff = lambda node, instance: None) -> SpareOutput:
    """Take a ready spare for the node's interrupted jobs. Taking one changes that node: a spare
    an operator excluded (its instance tagged ``nodemedic:exclude=true``, the node listed in
    ``exclusions.nodes``: they work on it) is passed over, and none is taken while automation
    is paused (the repair that follows stops the incident), asked right before each is claimed."""
    record = ledger.start_stage(incident, "spare", clock())
    if record.completed_at:
        return SpareOutput.model_validate(record.result)
    retiring = incident.action == "retire"
    then = RETIRED_STAYS if retiring else "replace, then resume"
    spare = record.result.get("spare")
    drained = ledger.get(incident.incident_id).stages.get("drain")
    interrupted = list(drained.result.get("requeued_jobs", [])) if drained else []  # type: ignore[call-overload]
    if pool_size and not interrupted and not spare and incident.action not in NON_DISRUPTIVE:  # nothing interrupted
        # a job that also ran here, requeued by another incident's drain, and still waiting for
        # nodes: this node's failure interrupted it too
        others = ledger.interrupted_on(incident.cluster, incident.slurm_node, clock())
        interrupted = [j for j, s in orchestrator.job_states(others).items() if s.state == "PENDING"] if others else []
    if pool_size == 0:
        out = SpareOutput(spare=None, destination="service", pool=[],
                          reason=f"no hot-spare pool configured (HotSpares=0): {then}")
    elif not interrupted and not spare:
        out = SpareOutput(spare=None, destination="service", pool=[],
                          reason=f"no job was interrupted on {incident.slurm_node} (Drain requeued none): the "
                                 "spares stay for a failure that interrupts one; "
                                 + (RETIRED_STAYS if retiring else "repair, then resume"))
    else:
        pool = orchestrator.spares()
        ending = _ending_with(incident, provider, [s.name for s in pool]) if not spare else set()
        held: dict[str, str] = {}

        def free(name: str) -> bool:
            if why := hands_off(name, ""):  # the spare is known by its name
                held[name] = why
            return not why

        gone: dict[str, str] = {}
        while True:
            if not spare:
                candidates = sorted(s.name for s in pool if ready(s.state) and s.name not in gone
                                    and s.name != incident.slurm_node)
                spare = next((name for name in candidates if name not in ending and free(name)
                              and ledger.claim(SPARE_CLAIM, name, incident.incident_id)), None)
                ledger.record_progress(incident, "spare", {"spare": spare})
            if not spare or (why := _take(orchestrator, ledger, incident, str(spare))) is None:
                break
            gone[str(spare)] = why  # deleted since the listing (its instance ended): the next one
            spare = None
        passed = "".join(f"; {name} is gone ({why})" for name, why in gone.items())
        if spare:
            left = sorted(s.name for s in pool if s.name != spare and s.name not in gone)
            out = SpareOutput(spare=str(spare), destination="pool", pool=left,
                              reason=f"{spare} left the spare pool to take {incident.slurm_node}'s jobs "
                                     f"({', '.join(str(j) for j in interrupted)}); "
                                     f"{incident.slurm_node} joins the pool once repaired and fully checked{passed}")
        else:
            held.update(gone)
            unready = ", ".join(f"{s.name} ({'its capacity ends too' if s.name in ending else held.get(s.name, s.state)})"
                                for s in pool) or "none"
            out = SpareOutput(spare=None, destination="service", pool=sorted(s.name for s in pool),
                              reason=f"no ready spare (pool: {unready}): {then}")
    ledger.complete_stage(incident, "spare", clock(), out.model_dump(mode="json"))
    return out
