"""An operator who pauses automation, or excludes a node, while its incident is under way stops
that incident before its next step that changes the node (the drain, the requeue, each rung,
the deep check after a rung, the node's return); the incident ends escalated with the node as it
is and says why.

Fast tier: the real Repair stage, the control item and the ledger in DynamoDB (embedded), the
gate's own rule (:func:`nodemedic.safety.gate.hands_off`), Slurm in memory.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from nodemedic import operations
from nodemedic.domain.checkpoint import CheckpointPolicy, CheckpointRule
from nodemedic.errors import CheckpointPendingError, HandsOffError
from nodemedic.providers.base import Member
from nodemedic.providers.run_command import Documents, RunCommand
from nodemedic.safety.gate import hands_off
from nodemedic.safety.policy import parse_policy
from nodemedic.stages.drain import drain
from nodemedic.stages.health_check import start_check
from nodemedic.stages.repair import repair
from nodemedic.stages.resume import end_unrecovered, resume
from nodemedic.stages.spares import swap_in
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger

from tests.stages.conftest import PREFIX, clock, opened
from tests.stages.memory_provider import MemoryProvider
from tests.stages.memory_slurm import MemorySlurm


class RebootingProvider(MemoryProvider):
    """Members in memory, and the reboots asked of them."""

    def __init__(self, *members: Member) -> None:
        super().__init__(*members)
        self.rebooted: list[str] = []

    def reboot(self, instance_ids: list[str]) -> None:
        self.rebooted += instance_ids


def _member(node: str, **tags: str) -> Member:
    return Member(f"i-{node}", node, "running", tags)


def _held(control: ControlStore, provider: MemoryProvider, policy: str = "{}"):
    def held(node: str, instance: str) -> str | None:  # as wiring.hands_off reads it
        member = provider.member(instance) if instance else provider.member_by_node(node)
        return hands_off(control.read(), parse_policy(policy, origin="test"), node, member.tags if member else {})
    return held


def _climb(ledger: Ledger, slurm: MemorySlurm, provider: RebootingProvider, control: ControlStore, policy: str,
           incident):
    return repair(incident, "service", provider=provider, orchestrator=slurm, runner=RunCommand(None, poll_interval=0),
                  ledger=ledger, documents=Documents("c1"), timeout_s=30, check_timeout_s=600, prefix=PREFIX,
                  clock=clock, hands_off=_held(control, provider, policy))


@pytest.mark.parametrize("how", ["pause", "exclusion-list", "exclusion-tag"])
def test_a_pause_or_exclusion_set_during_the_incident_stops_it_before_the_reboot(
        ledger: Ledger, slurm: MemorySlurm, how: str) -> None:
    """The incident passed its gate and drained gpu-1; then the on-call pauses automation (a bad
    rollout is suspected), lists gpu-1 in the policy's exclusions, or tags its instance
    ``nodemedic:exclude=true`` (they work on it). The reboot is never asked for; the incident
    ends escalated, naming who and why, the node drained as it was."""
    incident = opened(ledger, "gpu-1", ladder=("reboot", "replace"))
    slurm.n["gpu-1"].drained = True
    control = ControlStore(ledger._db, ledger._table, "c1")
    tags = {"nodemedic:exclude": "true"} if how == "exclusion-tag" else {}
    provider = RebootingProvider(_member("gpu-1", **tags), _member("gpu-2"))
    policy = '{"exclusions": {"nodes": ["gpu-1"]}}' if how == "exclusion-list" else "{}"
    if how == "pause":
        operations.pause(control, by="alice", reason="driver rollout suspected")

    with pytest.raises(HandsOffError) as stopped:
        _climb(ledger, slurm, provider, control, policy, incident)
    assert provider.rebooted == []
    why = {"pause": "automation paused by alice", "exclusion-list": "gpu-1 matches exclusion 'gpu-1'",
           "exclusion-tag": "instance tag nodemedic:exclude=true"}[how]
    assert why in str(stopped.value)

    # the state machine's Catch: HandsOffError -> Escalate (statemachines/remediation.asl.json)
    end = end_unrecovered(incident, "escalated", ledger=ledger, clock=clock,
                          error={"Error": "HandsOffError", "Cause": f'{{"errorMessage": "{stopped.value}"}}'})
    assert end.status == "escalated" and "stopped before a destructive step" in end.message and why in end.message
    assert ledger.get(incident.incident_id).status == "escalated"
    assert slurm.n["gpu-1"].drained, "the node was returned to service"


def test_with_automation_on_and_the_node_not_excluded_the_rung_acts(ledger: Ledger, slurm: MemorySlurm) -> None:
    """The same incident with nobody's hands in the way: the reboot is asked for (an exclusion of
    another node, a tag set to something else, change nothing)."""
    incident = opened(ledger, "gpu-1", ladder=("reboot", "replace"))
    slurm.n["gpu-1"].drained = True
    control = ControlStore(ledger._db, ledger._table, "c1")
    provider = RebootingProvider(_member("gpu-1", **{"nodemedic:exclude": "false"}), _member("gpu-2"))

    out = _climb(ledger, slurm, provider, control, '{"exclusions": {"nodes": ["gpu-2", "login-*"]}}', incident)
    assert (out.rung, provider.rebooted) == ("reboot", ["i-gpu-1"])


def test_a_pause_lifted_before_the_step_lets_the_incident_go_on(ledger: Ledger, slurm: MemorySlurm) -> None:
    """Only the moment of the step counts: a pause the operator lifted again is no reason to stop."""
    incident = opened(ledger, "gpu-1", ladder=("reboot", "replace"))
    slurm.n["gpu-1"].drained = True
    control = ControlStore(ledger._db, ledger._table, "c1")
    provider = RebootingProvider(_member("gpu-1"))
    operations.pause(control, by="alice", reason="checking a switch")
    operations.resume_automation(control, ledger, by="alice", reason="switch fine")

    assert _climb(ledger, slurm, provider, control, "{}", incident).rung == "reboot"
    assert provider.rebooted == ["i-gpu-1"]


@pytest.mark.parametrize("how", ["pause", "exclusion-tag"])
def test_a_pause_or_exclusion_set_after_the_gate_stops_the_drain_before_it_drains(
        ledger: Ledger, slurm: MemorySlurm, how: str) -> None:
    """The gate admitted the fault; before Drain ran, the on-call paused automation or tagged the
    instance excluded. The node is not drained and its job not requeued: it is theirs now."""
    incident = opened(ledger, "gpu-1")
    slurm.n["gpu-1"].jobs = ["42"]
    control = ControlStore(ledger._db, ledger._table, "c1")
    provider = MemoryProvider(_member("gpu-1", **({"nodemedic:exclude": "true"} if how == "exclusion-tag" else {})))
    if how == "pause":
        operations.pause(control, by="alice", reason="driver rollout suspected")

    with pytest.raises(HandsOffError, match="alice|nodemedic:exclude") as stopped:
        drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock, hands_off=_held(control, provider))
    assert not slurm.n["gpu-1"].drained and slurm.n["gpu-1"].jobs == ["42"]
    assert not any(c.startswith(("drain", "requeue")) for c in slurm.calls)

    # Escalate: the incident ends holding nothing, so the node's next fault is not folded into it
    end = end_unrecovered(incident, "escalated", ledger=ledger, clock=clock,
                          error={"Error": "HandsOffError", "Cause": f'{{"errorMessage": "{stopped.value}"}}'})
    assert end.status == "escalated" and ledger.node_lock("c1", incident.instance_id) is None


def test_a_pause_during_the_checkpoint_wait_keeps_the_job_from_being_requeued(ledger: Ledger,
                                                                             slurm: MemorySlurm) -> None:
    """The drain asked the job to checkpoint and waits for its marker; meanwhile the on-call
    pauses automation. The next call does not requeue the job: the node stays drained (the
    drain came first), the job runs on, the incident is stopped."""
    incident = opened(ledger, "gpu-1").model_copy(update={"fault_code": "PLANNED_RETIREMENT", "fault_class": "planned",
                                                          "action": "replace"})
    slurm.n["gpu-1"].jobs = ["42"]
    slurm.markers["42"] = 9_000.0
    control = ControlStore(ledger._db, ledger._table, "c1")
    held = _held(control, MemoryProvider(_member("gpu-1")))
    policy = CheckpointPolicy(default=CheckpointRule(signal="USR1", scope="batch", grace_seconds=300))
    now = [clock()]

    def later():
        return now[0]

    with pytest.raises(CheckpointPendingError):
        drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=later, checkpoints=policy, hands_off=held)
    operations.pause(control, by="alice", reason="a bad rollout")
    now[0] += timedelta(seconds=400)  # the grace is over: without the pause the job would be requeued now

    with pytest.raises(HandsOffError, match="automation paused by alice"):
        drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=later, checkpoints=policy, hands_off=held)
    assert slurm.n["gpu-1"].drained and slurm.n["gpu-1"].jobs == ["42"]
    assert not any(c.startswith("requeue") for c in slurm.calls)
    # the drain is NodeMedic's: the escalated incident keeps holding the node until an operator acts
    end_unrecovered(incident, "escalated", ledger=ledger, clock=clock,
                    error={"Error": "HandsOffError", "Cause": '{"errorMessage": "paused"}'})
    assert ledger.node_lock("c1", incident.instance_id) is not None


class SendingRunner:
    """The SSM commands a stage sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def send(self, instance_id: str, document: str, *_: object) -> str:
        self.sent.append((instance_id, document))
        return f"cmd-{len(self.sent)}"


def test_a_pause_after_the_reboot_keeps_its_deep_check_off_the_node(ledger: Ledger, slurm: MemorySlurm) -> None:
    """The ladder rebooted gpu-1; before its deep check (DCGM diagnostics, NCCL: they take the
    GPUs an operator may be working on) the on-call pauses automation. The check is not sent;
    the incident stops there. A check to verify a fault, before anything was done, still runs."""
    incident = opened(ledger, "gpu-1", ladder=("reboot", "replace"))
    slurm.n["gpu-1"].drained = True
    control = ControlStore(ledger._db, ledger._table, "c1")
    provider = RebootingProvider(_member("gpu-1"))
    _climb(ledger, slurm, provider, control, "{}", incident)  # the reboot
    operations.pause(control, by="alice", reason="a bad rollout")
    runner = SendingRunner()

    def check(purpose: str) -> str:
        return start_check(incident, "i-gpu-1", "full", f"token-{purpose}", purpose=purpose,  # type: ignore[arg-type]
                           runner=runner, ledger=ledger, control=control, stepfunctions=None,  # type: ignore[arg-type]
                           documents=Documents("c1"), timeout_s=60, clock=clock, hands_off=_held(control, provider))

    with pytest.raises(HandsOffError, match="automation paused by alice"):
        check("recovery")
    assert runner.sent == []
    assert check("verify") == "cmd-1" and runner.sent == [("i-gpu-1", Documents("c1").health_check)]


def test_an_excluded_spare_is_passed_over_and_none_is_taken_while_paused(ledger: Ledger, slurm: MemorySlurm) -> None:
    """An operator works on spare-1 (its instance tagged ``nodemedic:exclude=true``): the job of
    the failed node goes to spare-2. Once automation is paused, no spare is taken at all, and the
    stage says why for each."""
    slurm.n["spare-2"] = type(slurm.n["spare-1"])(reserved=True)
    slurm.n["gpu-1"].jobs, slurm.n["gpu-2"].jobs = ["77"], ["88"]
    control = ControlStore(ledger._db, ledger._table, "c1")
    provider = MemoryProvider(_member("gpu-1"), _member("gpu-2"), _member("spare-1", **{"nodemedic:exclude": "true"}),
                              _member("spare-2"))
    held = _held(control, provider)
    first, second = opened(ledger, "gpu-1"), opened(ledger, "gpu-2")
    for incident in (first, second):
        drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)

    taken = swap_in(first, orchestrator=slurm, provider=provider, ledger=ledger, pool_size=2, clock=clock, hands_off=held)
    assert taken.spare == "spare-2" and slurm.n["spare-1"].reserved

    operations.pause(control, by="alice", reason="a bad rollout")
    none = swap_in(second, orchestrator=slurm, provider=provider, ledger=ledger, pool_size=2, clock=clock, hands_off=held)
    assert none.spare is None and slurm.n["spare-1"].reserved
    assert "spare-1 (automation paused by alice" in none.reason


def test_stopped_after_a_replace_the_incident_holds_the_replacement(ledger: Ledger, slurm: MemorySlurm) -> None:
    """The ladder replaced gpu-1's instance (the replacement joined, drained with this incident's
    reason); automation is paused before its check. The incident ends escalated holding the node
    as it is now: the replacement's events fold into it, not into an incident of their own."""
    from nodemedic.contracts.incident import RungRecord, rungs_result

    incident = opened(ledger, "gpu-1", ladder=("replace",))
    drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    ledger.start_stage(incident, "repair", clock())
    ledger.record_progress(incident, "repair", rungs_result([RungRecord(rung="replace", instance_id="i-new")]))

    end_unrecovered(incident, "escalated", ledger=ledger, clock=clock,
                    error={"Error": "HandsOffError", "Cause": '{"errorMessage": "paused"}'})
    assert ledger.node_lock("c1", "i-new") is not None and ledger.node_lock("c1", incident.instance_id) is not None


@pytest.mark.parametrize("how", ["pause", "exclusion-tag"])
def test_a_pause_or_exclusion_set_before_the_return_keeps_the_repaired_node_drained(
        ledger: Ledger, slurm: MemorySlurm, how: str) -> None:
    """The ladder rebooted gpu-1 and its check passed; before Resume returns it, the on-call pauses
    automation or tags its instance excluded (they flash its firmware). Before, Resume returned it
    to service all the same and jobs landed on a node under someone's hands. Now it stays drained,
    NodeMedic keeps holding it, and the incident ends escalated saying how to return it."""
    incident = opened(ledger, "gpu-1", ladder=("reboot", "replace"))
    drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    control = ControlStore(ledger._db, ledger._table, "c1")
    provider = RebootingProvider(_member("gpu-1"))
    _climb(ledger, slurm, provider, control, "{}", incident)  # the reboot; its check passed
    if how == "pause":
        operations.pause(control, by="alice", reason="a bad rollout")
    else:  # the instance tagged since
        provider = RebootingProvider(_member("gpu-1", **{"nodemedic:exclude": "true"}))

    with pytest.raises(HandsOffError, match="not returning gpu-1 .* to service: (automation paused by alice|"
                                            "instance tag nodemedic:exclude=true)") as stopped:
        resume(incident, "service", orchestrator=slurm, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=0,
               clock=clock, hands_off=_held(control, provider))
    assert slurm.n["gpu-1"].drained and not any(c.startswith("resume") for c in slurm.calls)
    assert ledger.hold_of("c1", "gpu-1") is not None  # the reconciler still drains it again if it is lost

    # the state machine's Catch: HandsOffError -> Escalate
    end = end_unrecovered(incident, "escalated", ledger=ledger, clock=clock,
                          error={"Error": "HandsOffError", "Cause": f'{{"errorMessage": "{stopped.value}"}}'})
    assert end.status == "escalated" and "stopped before returning the node" in end.message
    assert "nodemedic remediate gpu-1 --action resume" in end.message
    assert ledger.node_lock("c1", incident.instance_id) is not None and slurm.n["gpu-1"].drained


def test_with_automation_on_the_repaired_node_is_returned(ledger: Ledger, slurm: MemorySlurm) -> None:
    """Nobody's hands in the way at the return (a pause lifted again counts for nothing): returned."""
    incident = opened(ledger, "gpu-1", ladder=("reboot", "replace"))
    drain(incident, orchestrator=slurm, ledger=ledger, prefix=PREFIX, clock=clock)
    control = ControlStore(ledger._db, ledger._table, "c1")
    provider = RebootingProvider(_member("gpu-1"))
    _climb(ledger, slurm, provider, control, "{}", incident)
    operations.pause(control, by="alice", reason="checking a switch")
    operations.resume_automation(control, ledger, by="alice", reason="switch fine")

    out = resume(incident, "service", orchestrator=slurm, ledger=ledger, prefix=PREFIX, job_wait_s=0, pool_size=0,
                 clock=clock, hands_off=_held(control, provider))
    assert out.resumed and not slurm.n["gpu-1"].drained
    assert ledger.get(incident.incident_id).status == "closed"
