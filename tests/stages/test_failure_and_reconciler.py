"""Every exit path leaves the ledger and the node right; the reconciler repairs what one did not.

Fast tier: the real stage code, the ledger in DynamoDB (embedded), Slurm in memory.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nodemedic.contracts.events import NodeHealthEvent
from nodemedic.contracts.incident import REPLACEMENT_CLAIM, SPARE_CLAIM, Incident, StageRecord
from nodemedic.errors import DrainFailedError, ReturnLostError
from nodemedic.providers.base import Member
from nodemedic.reconciler import UNWATCHED_AFTER, AgentWatch, ReconcileReport, reconcile
from nodemedic.stages.drain import drain, drain_reason
from nodemedic.stages.failure import fail
from nodemedic.stages.resume import end_unrecovered, resume
from nodemedic.stages.spares import swap_in
from nodemedic.store.ledger import Ledger

from tests.stages.conftest import PREFIX, clock, opened
from tests.stages.memory_provider import MemoryProvider
from tests.stages.memory_slurm import MemorySlurm

ERROR = {"Error": "DrainFailedError", "Cause": '{"errorMessage": "the controller did not answer"}'}


def _fail(incident, slurm: MemorySlurm, ledger: Ledger, error=ERROR):
    return fail(incident, error, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)


def _reconcile(slurm: MemorySlurm, ledger: Ledger, executions: dict[str, str] | None = None,
               now: datetime | None = None, started: list[NodeHealthEvent] | None = None):
    return reconcile(cluster="c1", ledger=ledger, orchestrator=slurm,
                     execution_status=lambda i: (executions or {}).get(i, "RUNNING"), prefix=PREFIX,
                     now=now or datetime.now(UTC), publish=(started if started is not None else []).append)


def test_controller_down_at_drain_fails_the_incident_releases_the_lock_and_the_reconciler_drains_it_later(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = opened(ledger)
    slurm.n["gpu-1"].jobs = ["42"]
    slurm.down = True
    with pytest.raises(DrainFailedError):
        drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    ended = _fail(incident, slurm, ledger)
    stored = ledger.get(incident.incident_id)
    assert (stored.status, stored.failure["stage"], stored.failure["error"]) == ("failed", "drain", "DrainFailedError")
    assert "could not be drained now" in ended.message and "the controller did not answer" in ended.message
    assert ledger.active_incident_id("c1", "i-gpu-1") is None  # the next fault, or a runbook, opens an incident
    assert ledger.hold_of("c1", "gpu-1").incident_id == incident.incident_id
    assert not slurm.n["gpu-1"].drained  # the sick node is in service until the scheduler answers

    assert _reconcile(slurm, ledger).errors  # still down: said, nothing else
    slurm.down = False
    report = _reconcile(slurm, ledger)
    assert report.drains_reasserted == ["gpu-1"] and "drained gpu-1 again" in report.pages[0]
    assert slurm.n["gpu-1"].reason == drain_reason(PREFIX, incident)
    assert slurm.n["gpu-1"].jobs == ["42"]  # a drain only: the job is not touched
    assert opened(ledger, "gpu-1")  # a new incident for the node opens


def test_a_new_incident_takes_over_a_failed_incidents_drain_and_returns_the_node(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    first = opened(ledger)
    drain(first, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    _fail(first, slurm, ledger)
    assert slurm.n["gpu-1"].reason == drain_reason(PREFIX, first)
    second = opened(ledger)
    out = drain(second, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    assert out.drained_by_pipeline and slurm.n["gpu-1"].reason == drain_reason(PREFIX, second)
    ledger.start_stage(second, "jobs", clock())
    ledger.complete_stage(second, "jobs", clock(), {"running": {}, "pending": [], "job_downtime_s": None})
    back = resume(second, "service", orchestrator=slurm, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=0,
                  clock=clock)
    assert back.resumed and not slurm.n["gpu-1"].drained
    assert ledger.hold_of("c1", "gpu-1") is None
    assert not _reconcile(slurm, ledger).drains_reasserted  # returned on purpose: never drained again


def test_an_operators_drain_is_neither_taken_over_nor_held(slurm: MemorySlurm, ledger: Ledger) -> None:
    slurm.n["gpu-1"].drained, slurm.n["gpu-1"].reason = True, "operator:bob RMA"
    incident = opened(ledger)
    out = drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    assert not out.drained_by_pipeline and slurm.n["gpu-1"].reason == "operator:bob RMA"
    ended = _fail(incident, slurm, ledger)
    assert "someone else's drain" in ended.message and ledger.hold_of("c1", "gpu-1") is None


def test_another_open_incidents_drain_is_not_taken_over(slurm: MemorySlurm, ledger: Ledger) -> None:
    first = opened(ledger)
    drain(first, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    second = opened(ledger, "gpu-1", instance="i-replacement")  # an event from the node's replacement
    out = drain(second, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    assert not out.drained_by_pipeline and slurm.n["gpu-1"].reason == drain_reason(PREFIX, first)


def test_a_failure_before_the_gate_let_nodemedic_act_touches_nothing(slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = opened(ledger)
    ledger.start_stage(incident, "gate", clock())
    ended = _fail(incident, slurm, ledger, {"Error": "ThrottledError", "Cause": "DynamoDB throttled"})
    assert "was not touched" in ended.message and "stage gate" in ended.message
    assert not slurm.n["gpu-1"].drained and ledger.hold_of("c1", "gpu-1") is None
    assert slurm.calls == []
    assert ledger.active_incident_id("c1", "i-gpu-1") is None


@pytest.mark.parametrize(("error", "again"), [("AwsThrottledError", True), ("ThrottledError", True),
                                              ("States.Timeout", True), ("PolicyError", False),
                                              ("UnknownNodeError", False)])
def test_a_fault_whose_gate_failed_on_a_passing_error_is_kept_to_be_offered_again(
        slurm: MemorySlurm, ledger: Ledger, error: str, again: bool) -> None:
    """Its agent stopped sending it once the incident opened: a failure that passes (throttling, a
    timeout) keeps it as a recheck due at once; one that does not (a bad policy) leaves it to the
    page. A chain of failures whose first incident left the ledger still counts, and never fails
    the Failure stage itself."""
    incident = opened(ledger)
    ledger.start_stage(incident, "detect", clock())
    ledger.complete_stage(incident, "detect", clock(), {"evidence": {"recheck_of": "inc-expired"}})
    ledger.start_stage(incident, "gate", clock())
    ended = _fail(incident, slurm, ledger, {"Error": error, "Cause": "x"})
    recheck = ledger.recheck("c1", "gpu-1", "XID 79")
    assert ("decides its XID 79 again" in ended.message) is again
    assert (recheck is not None and recheck.incident_id == incident.incident_id and recheck.due <= clock()) is again
    assert not slurm.n["gpu-1"].drained and slurm.calls == []


def test_a_failure_after_the_node_was_returned_leaves_it_in_service(slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = opened(ledger)
    drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    slurm.n["gpu-1"].jobs = []
    # Resume returns the node, then awaiting the requeued jobs fails
    ledger.start_stage(incident, "resume", clock())
    ledger.drop_hold("c1", "gpu-1", incident.incident_id)
    slurm.resume("gpu-1", f"{PREFIX}:{incident.incident_id}")
    ledger.record_progress(incident, "resume", {"resumed": True, "destination": "service"})
    ended = _fail(incident, slurm, ledger, {"Error": "States.Timeout", "Cause": ""})
    assert "returned to service before the failure" in ended.message
    assert not slurm.n["gpu-1"].drained and ledger.hold_of("c1", "gpu-1") is None


def test_a_spare_claimed_but_not_taken_goes_back_to_the_pool(slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = opened(ledger)
    slurm.n["gpu-1"].jobs = ["7"]
    drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    slurm.take_spare = lambda node: (_ for _ in ()).throw(DrainFailedError("spare-take failed"))  # type: ignore[method-assign]
    with pytest.raises(DrainFailedError):
        swap_in(incident, orchestrator=slurm, provider=MemoryProvider(), ledger=ledger, pool_size=1, clock=clock)
    _fail(incident, slurm, ledger)
    other = opened(ledger, "gpu-2")
    assert ledger.claim(SPARE_CLAIM, "spare-1", other.incident_id), "the pool is not empty from then on"


def test_the_reconciler_ends_stranded_incidents_and_releases_leaked_locks_and_claims(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    stranded = opened(ledger, "gpu-1", minutes_ago=10)
    drain(stranded, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    fresh = opened(ledger, "gpu-2")  # its execution not found yet (read after write): left alone
    running = opened(ledger, "gpu-3", minutes_ago=10)
    closed = opened(ledger, "gpu-4", minutes_ago=10)
    ledger.claim(SPARE_CLAIM, "spare-1", closed.incident_id)
    ledger.end(closed, "closed", clock(), "", release_node=False)  # a lock left behind
    quarantined = opened(ledger, "gpu-9", minutes_ago=10)
    ledger.end(quarantined, "quarantined", clock(), "lemon", release_node=False)

    report = _reconcile(slurm, ledger, {stranded.incident_id: "ABORTED", fresh.incident_id: None,  # type: ignore[dict-item]
                                        running.incident_id: "RUNNING"})
    assert report.incidents_failed == [stranded.incident_id]
    failed = ledger.get(stranded.incident_id)
    assert failed.status == "failed" and failed.failure["error"] == "IncidentStranded"
    assert "ABORTED" in failed.failure["cause"]
    assert slurm.n["gpu-1"].drained and ledger.hold_of("c1", "gpu-1") is not None
    assert [lock.split()[0] for lock in report.locks_released] == ["gpu-4"]
    assert report.claims_released == [f"spare spare-1 (incident {closed.incident_id} closed)"]
    assert ledger.get(fresh.incident_id).status == "open" and ledger.get(running.incident_id).status == "open"
    assert ledger.active_incident_id("c1", "i-gpu-9") == quarantined.incident_id  # kept on purpose
    assert report.counts() == {"incident": 1, "lock": 1, "claim": 1, "drain": 0, "return": 0, "gpu_clients": 0,
                               "autoscaler_hold": 0,
                               "recheck": 0}
    again = _reconcile(slurm, ledger, {fresh.incident_id: "RUNNING"})
    assert not any(again.counts().values()), "a second run finds nothing"


def test_a_drain_lost_in_a_controller_restart_is_reasserted_unless_the_node_is_being_returned(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    repairing = opened(ledger, "gpu-1")
    drain(repairing, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    escalated = opened(ledger, "gpu-2")
    drain(escalated, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    end_unrecovered(escalated, "escalated", ledger=ledger, clock=clock, error={"Error": "CapacityError"})
    returning = opened(ledger, "gpu-3")
    drain(returning, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    ledger.start_stage(returning, "resume", clock())
    for name in ("gpu-1", "gpu-2", "gpu-3"):  # slurmctld restarted without its saved state
        slurm.n[name].drained, slurm.n[name].reason = False, ""
    report = _reconcile(slurm, ledger)
    assert sorted(report.drains_reasserted) == ["gpu-1", "gpu-2"]
    assert slurm.n["gpu-1"].reason == drain_reason(PREFIX, repairing)
    assert not slurm.n["gpu-3"].drained


def _returned(ledger: Ledger, slurm: MemorySlurm, node: str = "gpu-1", destination: str = "service") -> Incident:
    incident = opened(ledger, node)
    drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    ledger.start_stage(incident, "jobs", clock())
    ledger.complete_stage(incident, "jobs", clock(), {"running": {}, "pending": [], "job_downtime_s": None})
    resume(incident, destination, orchestrator=slurm, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=2,
           clock=clock)
    return incident


def test_a_return_the_controller_lost_is_made_again_and_the_incident_closes_only_once_the_node_stays_back(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    slurm.lost_lifts = 1  # scontrol said resumed; slurmctld then restarted from state saved before
    with pytest.raises(ReturnLostError, match="returned again"):
        _returned(ledger, slurm)
    [incident] = [i for i in ledger.list_incidents() if i.slurm_node == "gpu-1"]
    assert incident.status == "open"
    assert not slurm.n["gpu-1"].drained  # returned again before the state machine's next try
    slurm.lost_lifts = 1  # lost again: the next try returns it again, still open
    slurm.n["gpu-1"].drained, slurm.n["gpu-1"].reason = True, drain_reason(PREFIX, incident)
    with pytest.raises(ReturnLostError):
        resume(incident, "service", orchestrator=slurm, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=2,
               clock=clock)
    back = resume(incident, "service", orchestrator=slurm, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=2,
                  clock=clock)
    assert back.resumed and back.node_state == "IDLE" and ledger.get(incident.incident_id).status == "closed"


def test_the_reconciler_returns_a_node_whose_return_was_lost_after_its_incident_closed(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    to_service, to_pool = _returned(ledger, slurm, "gpu-1"), _returned(ledger, slurm, "gpu-2", "pool")
    operators = _returned(ledger, slurm, "gpu-3")
    for name, incident in (("gpu-1", to_service), ("gpu-2", to_pool), ("gpu-3", operators)):
        assert ledger.get(incident.incident_id).status == "closed"  # slurmctld restarted from older state:
        slurm.n[name].drained, slurm.n[name].reason = True, drain_reason(PREFIX, incident)
    slurm.n["gpu-2"].reserved = False
    slurm.n["gpu-3"].reason = "operator:bob RMA"  # drained again since, by an operator: theirs
    failed = opened(ledger, "gpu-4")  # a failed incident holds its node drained: not a lost return
    drain(failed, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    _fail(failed, slurm, ledger)
    report = _reconcile(slurm, ledger)
    assert sorted(report.returns_reasserted) == ["gpu-1", "gpu-2"] and report.counts()["return"] == 2
    assert not slurm.n["gpu-1"].drained and not slurm.n["gpu-2"].drained and slurm.n["gpu-2"].reserved
    assert "returned gpu-1 again" in " ".join(report.pages)
    assert slurm.n["gpu-3"].reason == "operator:bob RMA" and slurm.n["gpu-4"].drained
    assert not _reconcile(slurm, ledger).returns_reasserted


def test_a_return_lost_at_every_try_fails_the_incident_and_the_reconciler_returns_the_node(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    slurm.lost_lifts = 100  # slurmctld loses every lift while the state machine tries
    with pytest.raises(ReturnLostError):
        _returned(ledger, slurm)
    [incident] = [i for i in ledger.list_incidents() if i.slurm_node == "gpu-1"]
    for _ in range(3):  # the state machine's tries
        with pytest.raises(ReturnLostError):
            resume(incident, "service", orchestrator=slurm, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=2,
                   clock=clock)
    ended = _fail(incident, slurm, ledger, {"Error": "ReturnLostError", "Cause": "read drained by it again"})
    assert ended.status == "failed" and "the reconciler makes it again" in ended.message
    assert slurm.n["gpu-1"].reason == drain_reason(PREFIX, incident)
    slurm.lost_lifts = 0  # the controller keeps what it is told again
    assert _reconcile(slurm, ledger).returns_reasserted == ["gpu-1"] and not slurm.n["gpu-1"].drained


def test_a_node_an_incident_left_drained_on_purpose_is_not_returned_by_the_reconciler(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    slurm.n["gpu-1"].drained, slurm.n["gpu-1"].reason = True, "operator:bob RMA"
    incident = _returned(ledger, slurm)  # the operator's drain was there first: left drained, closed
    assert ledger.get(incident.incident_id).status == "closed"
    slurm.n["gpu-1"].reason = drain_reason(PREFIX, incident)  # even if it now reads as NodeMedic's
    assert not _reconcile(slurm, ledger).returns_reasserted and slurm.n["gpu-1"].drained


def test_the_reconciler_never_overrides_an_operators_resume_through_nodemedic(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = opened(ledger)
    drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    _fail(incident, slurm, ledger)
    ledger.drop_hold("c1", "gpu-1")  # what `nodemedic remediate gpu-1 --action resume` does first
    slurm.resume("gpu-1")
    assert not _reconcile(slurm, ledger).drains_reasserted


def test_an_incident_ended_twice_is_recorded_once(slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = opened(ledger)
    first = _fail(incident, slurm, ledger)
    again = _fail(incident, slurm, ledger)  # the state machine retried the step
    assert first.status == again.status == "failed"
    assert ledger.get(incident.incident_id).failed_at is not None
    assert datetime.now(UTC) - ledger.get(incident.incident_id).failed_at < timedelta(minutes=1)


def test_two_failed_nodes_of_one_job_each_take_a_spare(slurm: MemorySlurm, ledger: Ledger) -> None:
    slurm.n["spare-2"] = type(slurm.n["spare-1"])(reserved=True)
    slurm.n["gpu-1"].jobs = ["77"]
    slurm.n["gpu-2"].jobs = ["77"]
    first, second = opened(ledger, "gpu-1"), opened(ledger, "gpu-2")
    drained = drain(first, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    assert drained.job_sizes == {"77": 2} and ledger.interrupted_on("c1", "gpu-2", clock()) == ["77"]
    assert drain(second, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock).requeued_jobs == []
    taken = [swap_in(i, orchestrator=slurm, provider=MemoryProvider(), ledger=ledger, pool_size=2, clock=clock)
             for i in (first, second)]
    assert sorted(t.spare for t in taken) == ["spare-1", "spare-2"]
    assert "(77)" in taken[1].reason
    # a node whose job was requeued elsewhere and already runs again takes none
    third = opened(ledger, "gpu-3")
    slurm.n["gpu-4"].jobs = ["88"]
    ledger.mark_interrupted("c1", "gpu-3", "88", "inc-x", clock())
    drain(third, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    assert swap_in(third, orchestrator=slurm, provider=MemoryProvider(), ledger=ledger, pool_size=2,
                   clock=clock).spare is None


def test_a_failure_after_the_gate_said_proceed_drains_the_node_even_if_drain_never_started(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = opened(ledger)
    ledger.start_stage(incident, "gate", clock())
    ledger.complete_stage(incident, "gate", clock(), {"verdict": "proceed", "reason": "", "rules": []})
    ended = _fail(incident, slurm, ledger, {"Error": "AwsThrottledError", "Cause": "UpdateItem still throttled"})
    assert "stays drained" in ended.message and slurm.n["gpu-1"].reason == drain_reason(PREFIX, incident)
    assert ledger.hold_of("c1", "gpu-1") is not None


def test_a_just_ended_execution_is_reconciled_at_once(slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = opened(ledger)  # its Failed step could not write the ledger (DynamoDB throttled for it)
    report = _reconcile(slurm, ledger, {incident.incident_id: "FAILED"})
    assert report.incidents_failed == [incident.incident_id]


def test_an_incident_that_leaves_a_node_to_its_operator_stops_holding_it(slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = opened(ledger)
    drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    slurm.n["gpu-1"].reason = "operator:bob RMA"  # the operator took the drain over mid-incident
    ledger.start_stage(incident, "jobs", clock())
    ledger.complete_stage(incident, "jobs", clock(), {"running": {}, "pending": [], "job_downtime_s": None})
    out = resume(incident, "service", orchestrator=slurm, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=0,
                 clock=clock)
    assert not out.resumed and ledger.hold_of("c1", "gpu-1") is None
    slurm.resume("gpu-1")  # the operator returns it, by hand
    assert not _reconcile(slurm, ledger).drains_reasserted


def test_a_burn_in_hold_nobody_checks_gets_its_burn_in_started_on_the_second_run_and_is_paged_if_that_does_not_take(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    # gpu-2 joined and was held for its burn-in, but its NODE_JOINED was folded into an incident
    # that ended without checking it; gpu-3 is held too, and its burn-in incident is running
    for node in ("gpu-2", "gpu-3"):
        slurm.drain(node, f"{PREFIX}:burn-in i-0{node[-1]:0>16} joined")
    opened(ledger, "gpu-3")
    slurm.drain("gpu-4", "ops: bad DIMM")  # an operator's drain is none of NodeMedic's business
    started: list[NodeHealthEvent] = []

    first = _reconcile(slurm, ledger, started=started)  # the agent's event may still be on its way: not yet
    assert (first.burn_ins_started, first.burn_ins_unchecked, first.pages, started) == ([], [], [], [])
    second = _reconcile(slurm, ledger, started=started)
    assert second.burn_ins_started == ["gpu-2"] and second.pages == [] and second.burn_ins_unchecked == []
    [event] = started
    assert (event.fault_code, event.check, event.node.instance_id, event.node.slurm_node) == \
           ("NODE_JOINED", "burn_in", "i-00000000000000002", "gpu-2")
    assert event.evidence["drain_reason"] == f"{PREFIX}:burn-in i-00000000000000002 joined"
    # the burn-in it started did not check the node either (its event lost): paged, once
    third = _reconcile(slurm, ledger, started=started)
    assert third.burn_ins_unchecked == ["gpu-2"] and len(started) == 1
    [page] = third.pages
    assert "gpu-2 (i-00000000000000002) is held out of service for its burn-in" in page
    assert "nodemedic remediate gpu-2 --action reboot" in page
    fourth = _reconcile(slurm, ledger, started=started)
    assert fourth.burn_ins_unchecked == ["gpu-2"] and fourth.pages == [] and len(started) == 1  # said once
    assert slurm.node_status("gpu-2").drained  # never lifted: the node stays out unchecked

    slurm.drain("gpu-1", f"{PREFIX}:burn-in i-00000000000000001 joined")
    assert _reconcile(slurm, ledger, started=started).pages == []  # a new hold: seen first, started next


@pytest.mark.parametrize(("rule", "again"), [("breaker", True), ("paused", True), ("excluded", False)])
def test_a_burn_in_the_reconciler_started_that_a_storm_held_is_started_again_once_it_is_lifted(
        slurm: MemorySlurm, ledger: Ledger, rule: str, again: bool) -> None:
    """The burn-in the reconciler started for gpu-2 was held by the open breaker (or a pause), and
    the operator has lifted it since (its hold released). Before, nothing started it again: the next
    run paged it as a burn-in that "did not run", and gpu-2 stayed out of service. Now the next run
    starts it again, under an id of its own; one held for the node itself is paged as before. A
    publish that fails is taken back, and the next run starts it."""
    slurm.drain("gpu-2", f"{PREFIX}:burn-in i-00000000000000002 joined")
    started: list[NodeHealthEvent] = []

    def refused(_: NodeHealthEvent) -> None:
        raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "PutEvents")

    assert _reconcile(slurm, ledger, started=started).burn_ins_started == []  # seen first
    failed = reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                       prefix=PREFIX, now=datetime.now(UTC), publish=refused)
    assert "cannot start the burn-in of gpu-2" in failed.errors[0]
    assert _reconcile(slurm, ledger, started=started).burn_ins_started == ["gpu-2"]
    held = opened(ledger, "gpu-2", instance="i-00000000000000002")
    ledger.acknowledge_event(f"nodemedic.reconciler/{started[0].event_id}", "remediate", held.incident_id,
                             datetime.now(UTC))
    ledger.start_stage(held, "gate", datetime.now(UTC))
    ledger.complete_stage(held, "gate", datetime.now(UTC), {"verdict": "hold", "rules": [{"rule": rule, "result": "hold"}]})
    ledger.end(held, "held", datetime.now(UTC), f"held: {rule}", release_node=True)  # lifted: released
    after = _reconcile(slurm, ledger, started=started)
    if again:
        assert after.burn_ins_started == ["gpu-2"] and after.pages == []
        assert started[1].event_id != started[0].event_id and held.incident_id in str(started[1].evidence["started_by"])
        return
    assert after.burn_ins_started == [] and after.burn_ins_unchecked == ["gpu-2"] and len(started) == 1
    assert "is held out of service for its burn-in" in after.pages[0]


def test_a_burn_in_hold_naming_an_instance_that_left_is_the_burn_in_of_the_instance_behind_the_node_now(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    """A soak: gpu-4's boot held it for the burn-in of its instance, which someone then ended. The
    reconciler started that burn-in, which Detect refused (the instance left the cluster), and
    paged; the later instance that joined under the name found the node drained already and left
    it so: the node stayed out for good. Now the hold is the burn-in of the instance behind the
    node now; while none is, nothing can be checked, and that is said once."""
    slurm.drain("gpu-4", f"{PREFIX}:burn-in i-0000000000000000a joined")  # the ended instance's hold
    members = [Member(f"i-{n:017x}", f"gpu-{n}", "running") for n in range(1, 4)]
    started: list[NodeHealthEvent] = []

    def run() -> ReconcileReport:
        return reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                         prefix=PREFIX, now=datetime.now(UTC), publish=started.append,
                         agents=AgentWatch(lambda: members, dict))

    waiting = [run() for _ in range(3)]  # no instance behind gpu-4: nothing to check; said once, not at first sight
    assert started == [] and not any(r.burn_ins_started for r in waiting)
    assert [r.burn_ins_unchecked for r in waiting] == [[], ["gpu-4"], ["gpu-4"]]
    assert [len(r.pages) for r in waiting] == [0, 1, 0]
    assert "held out of service for the burn-in of i-0000000000000000a, which is no longer in the cluster" \
        in waiting[1].pages[0]
    members.append(Member("i-0000000000000000b", "gpu-4", "running"))  # it joined under the name
    assert [run().burn_ins_started for _ in range(2)] == [[], ["gpu-4"]]  # seen first, started next
    [event] = started
    assert (event.node.instance_id, event.node.slurm_node) == ("i-0000000000000000b", "gpu-4")
    assert slurm.node_status("gpu-4").drained  # still out until its check passes


def test_a_held_replacement_an_open_incident_claimed_is_that_incidents_and_a_failed_start_is_said(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    """A replacement registers held (Kubernetes: the burn-in startup taint) under its own name;
    the incident that claimed its instance adopts and checks it: the reconciler leaves it alone."""
    incident = opened(ledger, "gpu-1")
    assert ledger.claim(REPLACEMENT_CLAIM, "i-0000000000000000e", incident.incident_id)
    slurm.drain("gpu-4", f"{PREFIX}:burn-in i-0000000000000000e joined")
    slurm.drain("gpu-2", f"{PREFIX}:burn-in i-00000000000000002 joined")

    def refused(event: NodeHealthEvent) -> None:
        raise RuntimeError("EventBridge refused the event")

    reports = [reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                         prefix=PREFIX, now=datetime.now(UTC), publish=refused) for _ in range(3)]
    assert all("gpu-4" not in r.burn_ins_unchecked + r.burn_ins_started for r in reports)
    # gpu-2: seen; its start refused and said, and tried again by the next run (taken back: it
    # never ran, so it is not paged as a burn-in that did not take)
    assert reports[1].errors == reports[2].errors == ["cannot start the burn-in of gpu-2: EventBridge refused the event"]
    assert not reports[2].burn_ins_started and not reports[2].burn_ins_unchecked and not reports[2].pages
    started: list[NodeHealthEvent] = []
    assert _reconcile(slurm, ledger, started=started).burn_ins_started == ["gpu-2"] and len(started) == 1


def test_no_burn_in_is_started_while_an_open_incident_waits_for_the_replacement_it_asked_for(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    """Kubernetes: the replacement registers held for its burn-in under a name of its own before
    the replace incident's next poll claims its instance. Two reconciler runs in that window (a
    Repair backing off, a loaded machine: a flake of the Kubernetes stack test) started a burn-in
    incident of its own, which returned the replacement to service instead of the spare pool."""
    incident = opened(ledger, "gpu-1")
    rung = {"rung": "replace", "instance_id": "i-gpu-1", "progress": {"requested_at": clock().isoformat()}}
    ledger.start_stage(incident, "repair", clock())
    ledger.record_progress(incident, "repair", {"rungs": [rung]})
    slurm.drain("gpu-4", f"{PREFIX}:burn-in i-0000000000000000e joined")  # the replacement, not claimed yet
    started: list[NodeHealthEvent] = []
    reports = [_reconcile(slurm, ledger, started=started) for _ in range(3)]
    assert started == [] and all(not r.burn_ins_started and not r.burn_ins_unchecked and not r.pages for r in reports)

    # the incident found its replacement, another instance: this hold is none of its, and is started as before
    rung["progress"]["new_instance_id"] = "i-0000000000000000f"
    ledger.record_progress(incident, "repair", {"rungs": [rung]})
    assert [_reconcile(slurm, ledger, started=started).burn_ins_started for _ in range(2)] == [[], ["gpu-4"]]


class _ThrottledAfterRequeue(Ledger):
    """DynamoDB throttled past the retry budget once the jobs are requeued: the node marks and the
    stage's completion fail (ProvisionedThroughputExceeded, surfaced after the client's retries)."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger._db, ledger._table)
        self.throttled = True

    def _throttle(self) -> None:
        if self.throttled:
            raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}},
                              "UpdateItem")

    def mark_interrupted(self, *args, **kwargs) -> None:
        self._throttle()
        super().mark_interrupted(*args, **kwargs)

    def complete_stage(self, *args, **kwargs):
        self._throttle()
        return super().complete_stage(*args, **kwargs)


def test_a_drain_retried_after_the_requeue_still_knows_the_jobs_it_moved_and_their_spare_is_taken(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    slurm.n["gpu-1"].jobs = ["77"]
    slurm.n["gpu-2"].jobs = ["77"]
    incident = opened(ledger, "gpu-1")
    throttled = _ThrottledAfterRequeue(ledger)
    with pytest.raises(ClientError):
        drain(incident, orchestrator=slurm, ledger=throttled, prefix=PREFIX, clock=clock)
    assert slurm.n["gpu-2"].jobs == []  # requeued: the retry finds the node empty

    throttled.throttled = False  # Step Functions retries the stage
    out = drain(incident, orchestrator=slurm, ledger=throttled, prefix=PREFIX, clock=clock)
    assert out.requeued_jobs == ["77"] and out.job_sizes == {"77": 2}
    assert ledger.interrupted_on("c1", "gpu-2", clock()) == ["77"]  # the marks the throttle cost are written
    taken = swap_in(incident, orchestrator=slurm, provider=MemoryProvider(), ledger=ledger, pool_size=1, clock=clock)
    assert taken.spare == "spare-1" and "(77)" in taken.reason


def test_a_drain_recorded_by_the_version_that_listed_each_jobs_nodes_is_still_read(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    incident = opened(ledger, "gpu-1")
    ledger.start_stage(incident, "drain", clock())
    ledger.complete_stage(incident, "drain", clock(), {
        "slurm_node": "gpu-1", "drained_by_pipeline": True, "requeued_jobs": ["77"], "jobs_not_requeued": [],
        "job_nodes": {"77": ["gpu-1", "gpu-2", "gpu-3"]}, "checkpoint": None})
    out = drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)  # a retry after the upgrade
    assert out.requeued_jobs == ["77"] and out.job_sizes == {"77": 3}
    assert slurm.calls == []  # nothing done again


def test_a_node_in_service_that_nodemedic_cannot_watch_is_paged_once_after_the_grace(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    """A node whose agent never started (or was stopped) never enters the roster: the sweeper
    cannot find it silent, so nothing there was detected and nobody was told. An agent that names
    its node unlike the scheduler is heard, but Detect refuses its every event."""
    members = [Member(f"i-{n:017x}", f"gpu-{n}", "running") for n in range(1, 5)]
    members += [Member("i-00000000000000005", "spare-1", "running"),
                Member("i-00000000000000009", "gpu-9", "running"),  # a member the scheduler does not list
                Member("i-0000000000000000a", None, "running")]  # an instance not yet a node
    slurm.n["gpu-2"].flags = "+NOT_RESPONDING"  # rebooting outside NodeMedic: not in service
    slurm.n["gpu-3"].drained, slurm.n["gpu-3"].reason = True, "operator: RMA"
    heard: dict[str, str | None] = {"i-00000000000000001": "gpu-1", "i-00000000000000005": "ip-10-0-0-5"}
    watch = AgentWatch(lambda: members, lambda: heard)
    t0 = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)

    def run(minutes: float):
        return reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                         prefix=PREFIX, now=t0 + timedelta(minutes=minutes), publish=[].append, agents=watch)

    first = run(0)
    assert first.unwatched_nodes == [] and first.pages == []  # it may be booting: not yet
    assert run(10).pages == []
    due = run(UNWATCHED_AFTER.total_seconds() / 60)
    assert due.unwatched_nodes == ["gpu-4 (i-00000000000000004): no heartbeat from its agent",
                                   "spare-1 (i-00000000000000005): its agent calls it ip-10-0-0-5"]
    [page] = due.pages
    assert "cannot watch 2 node(s) in service" in page and "not even the node going silent" in page
    assert "gpu-4 (i-00000000000000004, since 2026-11-26 08:00 UTC: no heartbeat from its agent)" in page
    assert "spare-1 (i-00000000000000005, since 2026-11-26 08:00 UTC: its agent calls it ip-10-0-0-5)" in page
    assert all(n not in page for n in ("gpu-1", "gpu-2", "gpu-3", "gpu-9"))
    # a second run the schedule started at the same moment read the record before the first saved it
    record = ledger.unwatched_nodes("c1")
    ledger.save_unwatched_nodes("c1", record.model_copy(update={"nodes": {
        i: n.model_copy(update={"paged": False}) for i, n in record.nodes.items()}}))
    assert run(UNWATCHED_AFTER.total_seconds() / 60).pages == []  # one page per spell, not two
    again = run(20)
    assert len(again.unwatched_nodes or []) == 2 and again.pages == []  # paged once
    heard["i-00000000000000004"] = "gpu-4"  # its agent starts
    heard["i-00000000000000005"] = None  # an agent that names no node: Detect asks the provider
    assert run(25).unwatched_nodes == []
    del heard["i-00000000000000004"]  # and is stopped again: a new spell, a new grace
    assert run(30).pages == [] and len(run(30 + UNWATCHED_AFTER.total_seconds() / 60).pages) == 1


def test_an_unreadable_member_list_is_an_error_and_nothing_is_paged(slurm: MemorySlurm, ledger: Ledger) -> None:
    def members() -> list[Member]:
        raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "DescribeInstances")
    report = reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                       prefix=PREFIX, now=datetime.now(UTC), publish=[].append,
                       agents=AgentWatch(members, dict))
    assert report.unwatched_nodes is None and report.pages == []
    assert report.errors == ["cannot list the cluster's instances: An error occurred (ThrottlingException) when calling "
                             "the DescribeInstances operation: Rate exceeded"]


def test_an_unreadable_unwatched_record_is_started_afresh_not_an_error_every_run(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    """Written by another version, or damaged: reading it must not fail every later run."""
    ledger._db.put_item(TableName=ledger._table, Item={"pk": {"S": "UNWATCHED#c1"}, "nodes": {"S": '{"nodes": {"i-1": 1}}'}})
    members = [Member("i-00000000000000004", "gpu-4", "running")]
    report = reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                       prefix=PREFIX, now=datetime.now(UTC), publish=[].append,
                       agents=AgentWatch(lambda: members, dict))
    assert report.errors == [] and report.unwatched_nodes == []
    assert list(ledger.unwatched_nodes("c1").nodes) == ["i-00000000000000004"]  # a fresh record, saved


def test_many_unwatched_nodes_with_long_names_fit_the_record_and_the_rest_are_counted(ledger: Ledger) -> None:
    """A fleet whose agents all name their nodes wrongly (a bad config rolled out), with long
    names: the record outgrew DynamoDB's 400 KB item, was never saved, and so no node was ever
    due: nothing was paged."""
    names = [f"gpu-{n:04d}-" + "x" * 180 for n in range(1500)]
    slurm = MemorySlurm(names)
    members = [Member(f"i-{n:017x}", name, "running") for n, name in enumerate(names)]
    heard: dict[str, str | None] = {m.instance_id: "ip-10-0-0-1-" + "y" * 180 for m in members}
    t0 = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)

    def run(minutes: float):
        return reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                         prefix=PREFIX, now=t0 + timedelta(minutes=minutes), publish=[].append,
                         agents=AgentWatch(lambda: members, lambda: heard))

    assert run(0).errors == []
    tracked = len(ledger.unwatched_nodes("c1").nodes)
    assert 0 < tracked < len(names)
    due = run(UNWATCHED_AFTER.total_seconds() / 60)
    assert due.errors == [] and len(due.unwatched_nodes or []) == tracked
    [page] = due.pages
    assert f"cannot watch {tracked} node(s)" in page and f"and {tracked - 50} more" in page
    assert f"{len(names) - tracked} more cannot be watched either" in page


def _retired_for_spot(slurm: MemorySlurm, ledger: Ledger, action: str, deadline: datetime) -> None:
    """gpu-1 (i-...1) retired for a Spot interruption (``action``) that EC2 acts on at ``deadline``."""
    incident = Incident(incident_id="inc-spot", cluster="c1", instance_id="i-00000000000000001", slurm_node="gpu-1",
                        fault_code="PLANNED_SPOT_INTERRUPTION", fault_class="planned", action="retire",
                        source="nodemedic.planned", observed_at=deadline, status="open", detected_at=deadline,
                        reason="planned", stages={"detect": StageRecord(started_at=deadline, completed_at=deadline,
                                                                        result={"evidence": {
                                                                            "instance_action": action,
                                                                            "deadline": deadline.isoformat()}})})
    assert ledger.open_incident(incident) is None
    ledger.end(incident, "retired", deadline, "retired", release_node=False)
    slurm.drain("gpu-1", drain_reason(PREFIX, incident))


def test_a_spot_node_ec2_started_again_gets_its_burn_in_from_the_reconciler_once(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    """The retirement of gpu-1 for a Spot stop holds it; EC2's "running" never came. A start
    before the stop is not a return; a publish that fails is tried again by the next run."""
    stopped_at = datetime.now(UTC) - timedelta(minutes=5)
    _retired_for_spot(slurm, ledger, "stop", stopped_at)
    started: list[NodeHealthEvent] = []
    launched = [stopped_at - timedelta(minutes=1)]

    def run(publish: Callable[[NodeHealthEvent], None] = started.append) -> ReconcileReport:
        members = [Member("i-00000000000000001", "gpu-1", "running", launched_at=launched[0])]
        return reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                         prefix=PREFIX, now=datetime.now(UTC), publish=publish,
                         agents=AgentWatch(lambda: members, dict))

    assert run().burn_ins_started == [] and started == []  # its launch before the stop: not back
    launched[0] = datetime.now(UTC)  # EC2 started it again

    def refused(_: NodeHealthEvent) -> None:
        raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "PutEvents")

    assert "back from its Spot interruption" in run(refused).errors[0]
    assert run().burn_ins_started == ["gpu-1"]
    [joined] = started
    assert (joined.fault_code, joined.node.instance_id, joined.node.slurm_node) == ("NODE_JOINED",
                                                                                   "i-00000000000000001", "gpu-1")
    assert run().burn_ins_started == [] and len(started) == 1  # once per start


@pytest.mark.parametrize("action", ["terminate", "stop"])
def test_a_slurm_node_whose_spot_instance_ec2_ended_is_replaced_through_the_reconciler_once(
        slurm: MemorySlurm, ledger: Ledger, action: str) -> None:
    """The retirement of gpu-1 for a Spot termination holds it; EC2 has ended the instance and
    the group launched another that backs no node. The reconciler starts the replacement, once,
    only where the provider joins the group's instances (Auto Scaling on Slurm), and only for a
    termination (a stopped instance comes back as itself). A publish that fails is tried again."""
    _retired_for_spot(slurm, ledger, action, datetime.now(UTC) - timedelta(minutes=5))
    started: list[NodeHealthEvent] = []
    members = [Member("i-00000000000000001", "gpu-1", "running"), Member("i-00000000000000002", "gpu-2", "running")]

    def run(publish: Callable[[NodeHealthEvent], None] = started.append, joins: bool = True) -> ReconcileReport:
        return reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                         prefix=PREFIX, now=datetime.now(UTC), publish=publish,
                         agents=AgentWatch(lambda: members, dict, ended=(lambda: []) if joins else None))

    assert run().replacements_started == []  # EC2 has not acted yet
    members[0] = Member("i-00000000000000009", None, "running")  # EC2 ended it; the group launched another

    def refused(_: NodeHealthEvent) -> None:
        raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "PutEvents")

    assert run(joins=False).replacements_started == []  # HyperPod, EC2, Kubernetes: never
    if action == "stop":
        assert run().replacements_started == [] and started == []
        return
    assert "cannot start the replacement of gpu-1" in run(refused).errors[0]
    assert run().replacements_started == ["gpu-1"]
    [lost] = started
    assert (lost.fault_code, lost.node.instance_id, lost.node.slurm_node, lost.evidence["retired_by"]) == (
        "INSTANCE_LOST", "i-00000000000000001", "gpu-1", "inc-spot")
    assert run().replacements_started == [] and len(started) == 1  # once per instance lost


def test_a_slurm_node_whose_instance_ended_outside_any_incident_gets_the_groups_new_instance_once(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    """The group's health check ended gpu-1's and gpu-3's instances while no incident held them (EC2
    still lists them, terminated). The reconciler starts an INSTANCE_LOST incident for as many of
    them as the group launched instances that back no node (a group scaled in launched none), once
    per lost instance; never for a node an operator drained, one an incident holds, or one an
    instance backs again."""
    members = [Member("i-00000000000000002", "gpu-2", "running"), Member("i-00000000000000004", "gpu-4", "running")]
    ended = [Member("i-00000000000000001", "gpu-1", "terminated"), Member("i-00000000000000003", "gpu-3", "terminated"),
             Member("i-00000000000000005", "gpu-2", "terminated"),  # replaced by NodeMedic: gpu-2 is backed again
             Member("i-00000000000000006", "gpu-9", "terminated")]  # not a node of the cluster (removed from it)
    started: list[NodeHealthEvent] = []
    slurm.drain("gpu-3", f"{PREFIX}:inc-failed XID 79")  # an incident that failed left it drained: the check decides

    def run(listing: Callable[[], list[Member]] = lambda: ended) -> ReconcileReport:
        return reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                         prefix=PREFIX, now=datetime.now(UTC), publish=started.append,
                         agents=AgentWatch(lambda: members, dict, ended=listing))

    assert run().replacements_started == [] and started == []  # scaled in: the group launched nothing
    members.append(Member("i-00000000000000011", None, "pending"))  # the group launches one in place of one

    def refused() -> list[Member]:
        raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "Request limit exceeded."}},
                          "DescribeInstances")

    assert "cannot list the instances EC2 ended" in run(refused).errors[0]
    assert run().replacements_started == ["gpu-1"]  # one launched: one node
    [lost] = started
    assert (lost.fault_code, lost.check, lost.node.instance_id, lost.node.slurm_node) == (
        "INSTANCE_LOST", "ec2_status", "i-00000000000000001", "gpu-1")
    assert "retired_by" not in lost.evidence and "outside any incident" in str(lost.evidence["started_by"])
    members.append(Member("i-00000000000000012", None, "running"))
    assert run().replacements_started == ["gpu-3"]  # gpu-1's is started once; the second launch: gpu-3
    assert run().replacements_started == [] and len(started) == 2


def test_a_node_an_operator_drained_or_an_incident_holds_is_not_replaced_when_its_instance_ends(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    members = [Member("i-00000000000000011", None, "running"), Member("i-00000000000000012", None, "running")]
    ended = [Member("i-00000000000000001", "gpu-1", "terminated"), Member("i-00000000000000003", "gpu-3", "terminated")]
    slurm.drain("gpu-1", "operator: RMA, decommissioning")
    held = opened(ledger, "gpu-3", instance="i-00000000000000003")
    started: list[NodeHealthEvent] = []
    report = reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                       prefix=PREFIX, now=datetime.now(UTC), publish=started.append,
                       agents=AgentWatch(lambda: members, dict, ended=lambda: ended))
    assert report.replacements_started == [] and started == [], held


def test_a_node_whose_instance_ended_where_nothing_launches_another_is_paged_once_per_instance(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    """Provider=ec2: EC2 ended the instances of gpu-1, gpu-2, gpu-3 and gpu-4 while no incident
    held them, and nothing launches one in their place. No INSTANCE_LOST is started (nothing would
    come to claim); the on-call is told which node has no instance and what to do, once per lost
    instance: not for a node an operator drained, an incident keeps, or an instance backs again."""
    members = [Member("i-00000000000000012", "gpu-2", "running"),  # gpu-2 has an instance again
               Member("i-00000000000000099", None, "running")]  # not a node (the cluster's, untagged)
    ended = [Member("i-00000000000000001", "gpu-1", "terminated", launched_at=datetime.now(UTC) - timedelta(days=9)),
             Member("i-00000000000000002", "gpu-2", "terminated"),
             Member("i-00000000000000003", "gpu-3", "terminated"), Member("i-00000000000000004", "gpu-4", "shutting-down"),
             Member("i-00000000000000005", "spare-1", "terminated")]
    slurm.drain("gpu-3", "operator: RMA, decommissioning")
    opened(ledger, "gpu-4", instance="i-00000000000000004")
    started: list[NodeHealthEvent] = []

    def run(listing: Callable[[], list[Member]] = lambda: ended) -> ReconcileReport:
        return reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                         prefix=PREFIX, now=datetime.now(UTC), publish=started.append,
                         agents=AgentWatch(lambda: members, dict, ended=listing, relaunched=False))

    def refused() -> list[Member]:
        raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "Request limit exceeded."}},
                          "DescribeInstances")

    assert "cannot list the instances EC2 ended" in run(refused).errors[0]
    first = run()
    assert first.nodes_without_instance == ["gpu-1", "spare-1"] and started == [] and first.replacements_started == []
    [page] = first.pages  # one for all of them (a Spot reclaim ends many at once)
    assert "2 node(s) have no instance" in page and "gpu-1 (i-00000000000000001 ended outside NodeMedic" in page
    assert "spare-1 (i-00000000000000005" in page
    assert "nodemedic:slurm-node=<node>" in page
    assert run().pages == []  # told once
    ended.append(Member("i-00000000000000021", "gpu-1", "terminated", launched_at=datetime.now(UTC)))  # launched
    # for it by an operator since, ended too
    assert run().nodes_without_instance == ["gpu-1"] and started == []


def test_a_group_instance_that_backs_no_node_half_an_hour_after_its_launch_is_paged_once(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    """The group runs instances no lost node took (it scaled out; or it replaced a node it scaled
    in). Half an hour after its launch, one that backs no node and that no incident claimed is
    paged, once: it runs nothing while it costs. Not while an open incident may still take one."""
    now = datetime.now(UTC)
    members = [Member("i-00000000000000001", "gpu-1", "running", launched_at=now - timedelta(days=3)),
               Member("i-00000000000000011", None, "running", launched_at=now - timedelta(minutes=40)),
               Member("i-00000000000000012", None, "running", launched_at=now - timedelta(minutes=5)),  # just launched
               Member("i-00000000000000013", None, "running", launched_at=now - timedelta(hours=2)),  # claimed
               Member("i-00000000000000014", None, "pending", launched_at=now - timedelta(hours=2))]
    lost = opened(ledger, "gpu-2", instance="i-00000000000000002")
    adopting = opened(ledger, "gpu-3", instance="i-00000000000000003")  # its replacement claimed, not named yet
    assert ledger.claim(REPLACEMENT_CLAIM, "i-00000000000000013", adopting.incident_id)

    def run() -> ReconcileReport:
        return reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                         prefix=PREFIX, now=now, publish=lambda _: None,
                         agents=AgentWatch(lambda: members, dict, ended=list))

    ledger.start_stage(lost, "repair", now)  # a replace rung waits for the group's next instance
    ledger.record_progress(lost, "repair", {"rungs": [{"rung": "replace", "instance_id": "i-00000000000000002",
                                                       "progress": {"requested_at": now.isoformat()}}]})
    assert run().pages == []
    ledger.end(lost, "failed", now, "test", release_node=True)
    first = run()
    assert first.unnamed_instances == ["i-00000000000000011"]
    [page] = first.pages
    assert "1 instance(s) of the cluster's Auto Scaling group back no Slurm node" in page and "i-00000000000000011" in page
    again = run()
    assert again.unnamed_instances == ["i-00000000000000011"] and again.pages == []  # counted each run, told once


@pytest.mark.parametrize("action", ["terminate", "stop"])
def test_a_node_retired_for_a_spot_termination_where_nothing_launches_another_is_paged_once(
        slurm: MemorySlurm, ledger: Ledger, action: str) -> None:
    """Provider=ec2: gpu-1 was retired for a Spot interruption, and EC2 has acted. Terminated, the
    node has no instance and nothing launches one: paged once, saying how to return it (the
    retirement's drain stays, so the new instance's boot does not hold it for a burn-in). Stopped,
    the instance comes back as itself: nothing to say."""
    _retired_for_spot(slurm, ledger, action, datetime.now(UTC) - timedelta(minutes=5))
    members = [Member("i-00000000000000002", "gpu-2", "running")]
    if action == "stop":
        members.append(Member("i-00000000000000001", "gpu-1", "stopped"))

    def run() -> ReconcileReport:
        return reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                         prefix=PREFIX, now=datetime.now(UTC), publish=lambda _: None,
                         agents=AgentWatch(lambda: members, dict, ended=list, relaunched=False))

    first = run()
    if action == "stop":
        assert (first.nodes_without_instance, first.pages) == ([], [])
        return
    assert first.nodes_without_instance == ["gpu-1"] and first.replacements_started == []
    [page] = first.pages
    assert "gpu-1 (i-00000000000000001 ended for the interruption incident inc-spot retired it for" in page
    assert "drained: nodemedic:inc-spot" in page and "nodemedic remediate <node> --action health-check" in page
    assert run().pages == []


@pytest.mark.parametrize(("rule", "again"), [("paused", True), ("breaker", True), ("excluded", False), ("lemon", False)])
def test_a_lost_node_whose_incident_a_storm_held_is_offered_again_and_no_other_hold_is(
        slurm: MemorySlurm, ledger: Ledger, rule: str, again: bool) -> None:
    """gpu-1's INSTANCE_LOST incident was held and its hold released since. Held by a storm
    (automation paused, the breaker open: released when an operator lifted it), it is offered again
    under an id of its own, once per hold; held for the node itself (an exclusion: the operator's
    word on this node), never."""
    members = [Member("i-00000000000000011", None, "running")]
    ended = [Member("i-00000000000000001", "gpu-1", "terminated")]
    started: list[NodeHealthEvent] = []

    def run() -> ReconcileReport:
        return reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "SUCCEEDED",
                         prefix=PREFIX, now=datetime.now(UTC), publish=started.append,
                         agents=AgentWatch(lambda: members, dict, ended=lambda: ended))

    assert run().replacements_started == ["gpu-1"]
    held = opened(ledger, "gpu-1", instance="i-00000000000000001")
    ledger.acknowledge_event(f"nodemedic.reconciler/{started[0].event_id}", "remediate", held.incident_id,
                             datetime.now(UTC))
    ledger.start_stage(held, "gate", datetime.now(UTC))
    ledger.complete_stage(held, "gate", datetime.now(UTC), {"verdict": "hold", "rules": [{"rule": rule, "result": "hold"}]})
    ledger.end(held, "held", datetime.now(UTC), f"held: {rule}", release_node=True)
    assert run().replacements_started == (["gpu-1"] if again else [])
    if again:
        assert started[1].event_id != started[0].event_id and held.incident_id in str(started[1].evidence["started_by"])
    assert run().replacements_started == [] and len(started) == (2 if again else 1)


_NODES = [f"gpu-{i}" for i in range(1, 7)]
_node_states = st.fixed_dictionaries({n: st.sampled_from(["backed", "lost", "lost+operator", "lost+failed", "lost+held",
                                                         "absent"]) for n in _NODES})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(states=_node_states, launched=st.integers(0, 4), runs=st.integers(1, 3))
def test_lost_nodes_are_replaced_only_when_nothing_else_has_them_and_never_beyond_what_the_group_launched(
        ledger: Ledger, states: dict[str, str], launched: int, runs: int) -> None:
    """Whatever mix of nodes the reconciler finds (backed, lost with nothing holding them, lost and
    drained by an operator, left drained by a failed incident, held by an incident, or no longer in
    the scheduler), it starts a replacement only for a lost node nothing else has, at most as many
    as the group launched instances that back no node, and each lost instance once over any runs."""
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    slurm = MemorySlurm([n for n in _NODES if states[n] != "absent"])
    members = [Member(f"i-{0x300 + i:017x}", None, "running") for i in range(launched)]
    ended: list[Member] = []
    for i, (node, state) in enumerate(states.items()):
        if state == "backed":
            members.append(Member(f"i-{0x100 + i:017x}", node, "running"))
            continue
        ended.append(Member(f"i-{0x200 + i:017x}", node, "terminated"))
        if state == "lost+operator":
            slurm.drain(node, "operator: RMA")
        elif state == "lost+failed":
            slurm.drain(node, f"{PREFIX}:inc-failed XID 79")
        elif state == "lost+held":
            at = datetime.now(UTC)
            assert ledger.open_incident(Incident(
                incident_id=f"inc-{cluster}-{node}", cluster=cluster, instance_id=f"i-{0x200 + i:017x}", slurm_node=node,
                fault_code="XID 79", fault_class="gpu_lost", action="replace", source="test", observed_at=at,
                status="open", detected_at=at, reason="test")) is None
    started: list[NodeHealthEvent] = []
    for _ in range(runs):
        reconcile(cluster=cluster, ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                  prefix=PREFIX, now=datetime.now(UTC), publish=started.append,
                  agents=AgentWatch(lambda: members, dict, ended=lambda: ended))
    free = sorted(n for n, s in states.items() if s in ("lost", "lost+failed"))
    assert sorted(str(e.node.slurm_node) for e in started) == free[:launched]
    assert len({e.node.instance_id for e in started}) == len(started)


def test_a_lost_node_no_event_can_name_is_an_error_of_the_run_not_its_end(ledger: Ledger) -> None:
    slurm = MemorySlurm(["gpu:1", "gpu-2"])  # a name no health event carries (the scheduler's, not NodeMedic's)
    members = [Member("i-00000000000000011", None, "running"), Member("i-00000000000000012", None, "running")]
    ended = [Member("i-00000000000000001", "gpu:1", "terminated"), Member("i-00000000000000002", "gpu-2", "terminated")]
    report = reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                       prefix=PREFIX, now=datetime.now(UTC), publish=lambda _: None,
                       agents=AgentWatch(lambda: members, dict, ended=lambda: ended))
    assert report.replacements_started == ["gpu-2"]
    assert [e for e in report.errors if e.startswith("cannot start the replacement of gpu:1")]


@pytest.mark.parametrize("taker", ["lost", "claimed", "awaiting"])
def test_a_new_instance_an_open_incident_will_take_is_not_given_to_a_lost_node(
        slurm: MemorySlurm, ledger: Ledger, taker: str) -> None:
    """One instance the group launched, and gpu-1 lost its own. Whoever will take that instance
    first keeps it: an INSTANCE_LOST of gpu-2 the last run started (not at its rung yet), a
    replace rung that claimed it, or one that asked for a replacement and waits. Before, gpu-1's
    incident was started too and waited out its budget for an instance that never came (found by
    the soak with scale-ins: ReplacementPendingError)."""
    members = [Member("i-00000000000000011", None, "running")]
    ended = [Member("i-00000000000000001", "gpu-1", "terminated")]
    other = opened(ledger, "gpu-2", instance="i-00000000000000002")
    if taker == "lost":
        ledger.end(other, "closed", datetime.now(UTC), "test", release_node=True)
        at = datetime.now(UTC)
        assert ledger.open_incident(Incident(
            incident_id="inc-lost-2", cluster="c1", instance_id="i-00000000000000003", slurm_node="gpu-2",
            fault_code="INSTANCE_LOST", fault_class="instance_lost", action="replace", source="nodemedic.reconciler",
            observed_at=at, status="open", detected_at=at, reason="test")) is None
    elif taker == "claimed":
        assert ledger.claim(REPLACEMENT_CLAIM, "i-00000000000000011", other.incident_id)
    else:
        ledger.start_stage(other, "repair", datetime.now(UTC))
        ledger.record_progress(other, "repair", {"rungs": [{"rung": "replace", "instance_id": "i-00000000000000002",
                                                            "progress": {"requested_at": datetime.now(UTC).isoformat()}}]})
    started: list[NodeHealthEvent] = []
    report = reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                       prefix=PREFIX, now=datetime.now(UTC), publish=started.append,
                       agents=AgentWatch(lambda: members, dict, ended=lambda: ended))
    assert report.replacements_started == [] and started == [], report.errors
    members.append(Member("i-00000000000000012", None, "pending"))  # the group launches one more
    again = reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda _: "RUNNING",
                      prefix=PREFIX, now=datetime.now(UTC), publish=started.append,
                      agents=AgentWatch(lambda: members, dict, ended=lambda: ended))
    assert again.replacements_started == ["gpu-1"]


def test_a_node_held_drained_under_the_reason_of_an_ended_incident_is_drained_under_its_holders(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    """Found by soak 1156: gpu-1's incident A closed and returned it; B (a retirement the lemon rule
    quarantined) drained it; slurmctld crashed and restarted from state saved before both, so
    gpu-1 came back drained under A's reason. The reconciler saw it drained and moved on: the
    quarantine's node named a closed incident, whose drain nobody would lift. Now B's drain is
    made again over it. A drain of an incident still open, or an operator's, stays."""
    closed = _returned(ledger, slurm, "gpu-1")
    quarantined = opened(ledger, "gpu-1", instance="i-gpu-1b")
    drain(quarantined, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    end_unrecovered(quarantined, "quarantined", ledger=ledger, clock=clock, reason="lemon: incident 3 of node:gpu-1")
    slurm.n["gpu-1"].reason = drain_reason(PREFIX, closed)  # the crash brought the older drain back
    still_open = opened(ledger, "gpu-2")
    held = opened(ledger, "gpu-3")
    drain(held, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    end_unrecovered(held, "quarantined", ledger=ledger, clock=clock, reason="lemon")
    slurm.n["gpu-3"].reason = drain_reason(PREFIX, still_open)  # another incident's, still open: left alone
    report = _reconcile(slurm, ledger)
    assert report.drains_reasserted == ["gpu-1"]
    assert slurm.n["gpu-1"].drained and slurm.n["gpu-1"].reason == drain_reason(PREFIX, quarantined)
    assert f"it was drained by incident {closed.incident_id}, which has ended" in report.pages[0]
    assert slurm.n["gpu-3"].reason == drain_reason(PREFIX, still_open)
    slurm.n["gpu-3"].reason = "operator:bob RMA"
    assert not _reconcile(slurm, ledger).drains_reasserted  # once; an operator's drain stays theirs
    assert slurm.n["gpu-3"].reason == "operator:bob RMA"


@pytest.mark.parametrize("why", ["automation paused by alice (a bad rollout)", "gpu-1 matches exclusion 'gpu-1'"])
def test_a_lost_return_is_not_made_again_while_automation_is_paused_or_the_node_excluded(
        slurm: MemorySlurm, ledger: Ledger, why: str) -> None:
    """slurmctld lost a closed incident's return; meanwhile an operator paused automation, or
    excluded the node they found drained to work on it. The reconciler leaves it drained (counted
    as held, no page) and returns it on the first run after the pause or the exclusion is lifted."""
    incident = _returned(ledger, slurm, "gpu-1")
    slurm.n["gpu-1"].drained, slurm.n["gpu-1"].reason = True, drain_reason(PREFIX, incident)
    held: dict[str, str] = {"gpu-1": why}
    asked: list[str] = []

    def hands_off(node: str, instance: str) -> str | None:
        asked.append(node)
        return held.get(node)

    def run() -> ReconcileReport:
        return reconcile(cluster="c1", ledger=ledger, orchestrator=slurm, execution_status=lambda i: "SUCCEEDED",
                         prefix=PREFIX, now=datetime.now(UTC), publish=[].append, hands_off=hands_off)

    report = run()
    assert (report.returns_held, report.returns_reasserted, report.pages) == (["gpu-1"], [], [])
    assert slurm.n["gpu-1"].drained and asked == ["gpu-1"]
    held.clear()  # lifted
    report = run()
    assert report.returns_reasserted == ["gpu-1"] and not slurm.n["gpu-1"].drained
