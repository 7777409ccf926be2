"""On SageMaker HyperPod, whose nodes SSM does not reach, a node is judged by HyperPod's own deep
health check (StartClusterHealthCheck, followed in DescribeClusterNode), and the ladder skips the
GPU reset, which would be a command on the node. Fast tier: the real stages and the HyperPod
provider against the embedded AWS's HyperPod (its StartClusterHealthCheck held to the limits its
API reference states), the ledger in DynamoDB, Slurm in memory."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from nodemedic.contracts.incident import IncidentRef
from nodemedic.contracts.stages import HealthCheckOutput
from nodemedic.errors import HealthCheckPendingError, IncidentStateError, ProviderBusyError, ReplacementFailedError
from nodemedic.providers.hyperpod import ClusterNodeStatus, HyperPodProvider
from nodemedic.providers.run_command import Documents, RunCommand
from nodemedic.stages.hyperpod_check import REBOOT_SETTLE, START_GRACE, HyperPodProgress, hyperpod_check, judge
from nodemedic.stages.repair import repair
from nodemedic.stages.resume import end_unrecovered
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from tests.component.test_health_check_result import FakeStepFunctions
from tests.stages.conftest import PREFIX, opened
from tests.stages.memory_slurm import MemorySlurm

_clusters = itertools.count(1)


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


class NoSSM:
    """SSM, which does not reach HyperPod nodes: any command sent fails the test."""

    def send_command(self, **kwargs: object) -> None:
        raise AssertionError(f"a command was sent to a HyperPod node: {kwargs}")


def _cluster(aws: EmbeddedAWS, slurm: MemorySlurm) -> tuple[str, HyperPodProvider, list[str]]:
    name = f"hp{next(_clusters)}"
    aws.hyperpod.deep_checks.clear()  # the embedded AWS is the module's: only this test's requests count
    aws.hyperpod.calls.clear()
    ids = aws.hyperpod.create_cluster(name, ["gpu-1", "gpu-2"])
    return name, HyperPodProvider(aws.client("sagemaker"), name), ids


def _ref(ledger: Ledger, instance: str, ladder: tuple = ("reboot", "replace")) -> IncidentRef:
    incident = opened(ledger, "gpu-1", instance=instance, ladder=ladder)
    return IncidentRef(**{name: getattr(incident, name) for name in IncidentRef.model_fields})


def _rung(ledger: Ledger, ref: IncidentRef, rung: str, instance: str, clock: Clock) -> None:
    """Repair did ``rung`` on ``instance``: the check follows."""
    ledger.start_stage(ref, "repair", clock())
    ledger.record_progress(ref, "repair", {"rungs": [{"rung": rung, "instance_id": instance,
                                                      "started_at": clock().isoformat(),
                                                      "done_at": clock().isoformat()}]})


@dataclass
class Checking:
    """A HyperPod cluster of two nodes, an incident for the first, ``rung`` done on ``checked``
    (the second node for a replace, the first for a reboot), and the check's readings of it."""

    name: str
    ids: list[str]
    ref: IncidentRef
    hyperpod: HyperPodProvider
    ledger: Ledger
    clock: Clock
    sfn: FakeStepFunctions
    checked: str

    def __call__(self, token: str = "t") -> HealthCheckOutput:
        return hyperpod_check(self.ref, self.checked, "full", token, hyperpod=self.hyperpod, ledger=self.ledger,
                              control=ControlStore(self.ledger._db, self.ledger._table, "c1"), stepfunctions=self.sfn,
                              clock=self.clock)


def _checking(aws: EmbeddedAWS, slurm: MemorySlurm, ledger: Ledger, rung: str) -> Checking:
    name, hyperpod, ids = _cluster(aws, slurm)
    ref, clock = _ref(ledger, ids[0]), Clock()
    checked = ids[1] if rung == "replace" else ids[0]
    _rung(ledger, ref, rung, checked, clock)
    return Checking(name, ids, ref, hyperpod, ledger, clock, FakeStepFunctions(throttled=0), checked)


def test_a_replacement_is_judged_by_hyperpods_deep_check_asked_for_once(
        aws: EmbeddedAWS, slurm: MemorySlurm, ledger: Ledger) -> None:
    check = _checking(aws, slurm, ledger, "replace")
    name, ids, ref, clock, sfn = check.name, check.ids, check.ref, check.clock, check.sfn
    sent: list[str] = []
    check.hyperpod._sm.meta.events.register("before-call.sagemaker", lambda model, **_: sent.append(model.name))
    with pytest.raises(HealthCheckPendingError, match="asked for"):
        check("t1")
    assert aws.hyperpod.deep_checks == [(ids[1], ["InstanceStress"])]
    assert sent == ["DescribeClusterNode", "StartClusterHealthCheck"]  # one reading of the node per invocation
    clock.now += timedelta(minutes=1)
    with pytest.raises(HealthCheckPendingError, match="is running"):
        check("t2")  # a retry reads HyperPod again; it asks for nothing more
    assert len(aws.hyperpod.deep_checks) == 1 and sfn.answers == []
    aws.hyperpod.end_deep_check(name, ids[1], passed=True)
    out = check("t3")
    assert out.healthy and sfn.answers == ["t3"]
    repaired = ledger.get(ref.incident_id).stages["repair"]
    assert repaired.completed_at is not None  # healthy: the ladder ends here
    [rung] = repaired.result["rungs"]
    assert rung["check"]["healthy"] is True and "passed" in rung["check"]["checks"][0]["detail"]
    # the answer lost (the function timed out after sending it): the retry answers the same again
    assert check("t4").healthy and sfn.answers == ["t3", "t4"] and len(aws.hyperpod.deep_checks) == 1


def test_a_deep_check_that_fails_is_an_unhealthy_answer_with_hyperpods_reason(
        aws: EmbeddedAWS, slurm: MemorySlurm, ledger: Ledger) -> None:
    check = _checking(aws, slurm, ledger, "replace")
    name, ids, ref, sfn = check.name, check.ids, check.ref, check.sfn
    with pytest.raises(HealthCheckPendingError):
        check("t1")
    aws.hyperpod.end_deep_check(name, ids[1], passed=False, message="DCGM diagnostic failed on GPU 3")
    out = check("t2")
    assert not out.healthy and "DCGM diagnostic failed on GPU 3" in out.checks[0]["detail"]
    repaired = ledger.get(ref.incident_id).stages["repair"]
    assert repaired.completed_at is None and repaired.result["rungs"][0]["check"]["healthy"] is False
    assert sfn.answers == ["t2"]


def test_after_a_reboot_the_deep_check_waits_until_the_reboot_shows(
        aws: EmbeddedAWS, slurm: MemorySlurm, ledger: Ledger) -> None:
    """Right after BatchRebootClusterNodes HyperPod may still say Running from before the reboot: a
    deep check asked for then would judge the node before its reboot."""
    check = _checking(aws, slurm, ledger, "reboot")
    ids = check.ids
    with pytest.raises(HealthCheckPendingError, match="reboot has not shown"):
        check()
    assert aws.hyperpod.deep_checks == []
    check.clock.now += REBOOT_SETTLE
    with pytest.raises(HealthCheckPendingError, match="asked for"):
        check()
    assert aws.hyperpod.deep_checks == [(ids[0], ["InstanceStress"])]


def test_a_deep_check_never_seen_running_does_not_pass(aws: EmbeddedAWS, slurm: MemorySlurm, ledger: Ledger) -> None:
    check = _checking(aws, slurm, ledger, "replace")
    clock = check.clock
    with pytest.raises(HealthCheckPendingError):
        check()
    aws.hyperpod.end_deep_check(check.name, check.ids[1], passed=True)  # over before any retry read it
    clock.now += START_GRACE / 2
    with pytest.raises(HealthCheckPendingError, match="not started"):
        check()
    clock.now += START_GRACE
    out = check()
    assert not out.healthy and "never showed" in out.checks[0]["detail"]


def test_verifying_reads_hyperpods_status_and_starts_nothing_on_a_node_that_may_run_a_job(
        aws: EmbeddedAWS, slurm: MemorySlurm, ledger: Ledger) -> None:
    name, hyperpod, ids = _cluster(aws, slurm)
    ref, clock, sfn = _ref(ledger, ids[0]), Clock(), FakeStepFunctions(throttled=0)
    control = ControlStore(ledger._db, ledger._table, "c1")
    out = hyperpod_check(ref, ids[0], "quick", "t", purpose="verify", hyperpod=hyperpod, ledger=ledger,
                         control=control, stepfunctions=sfn, clock=clock)
    assert out.healthy and aws.hyperpod.deep_checks == [] and sfn.answers == ["t"]
    closed = ledger.get(ref.incident_id)
    assert closed.status == "closed" and "not corroborated" in closed.outcome


def test_a_node_no_longer_in_the_cluster_fails_its_check(aws: EmbeddedAWS, slurm: MemorySlurm, ledger: Ledger) -> None:
    name, hyperpod, ids = _cluster(aws, slurm)
    ref, clock, sfn = _ref(ledger, ids[0]), Clock(), FakeStepFunctions(throttled=0)
    _rung(ledger, ref, "replace", "i-0feedfeedfeedfeed", clock)
    out = hyperpod_check(ref, "i-0feedfeedfeedfeed", "full", "t", hyperpod=hyperpod, ledger=ledger,
                         control=ControlStore(ledger._db, ledger._table, "c1"), stepfunctions=sfn, clock=clock)
    assert not out.healthy and "not in the HyperPod cluster" in out.checks[0]["detail"]


@pytest.mark.parametrize(("status", "healthy"), [
    (("Pending", ""), None), (("SystemUpdating", ""), None), (("AttachInProgress", ""), None),
    (("SomeFutureStatus", ""), None), (("Running", ""), True), (("Failure", "bad GPU"), False),
    (("ShuttingDown", ""), False), (("DetachInProgress", ""), False), (None, False)])
def test_a_quick_check_is_hyperpods_status_of_the_node(status: tuple[str, str] | None, healthy: bool | None) -> None:
    now = datetime.now(UTC)
    node = ClusterNodeStatus(*status, "workers") if status else None
    verdict = judge(node, "quick", HyperPodProgress(started_at=now), now, after_reboot=False)
    assert verdict.healthy is healthy and not verdict.request


def test_the_ladder_skips_the_gpu_reset_on_hyperpod_and_reboots_through_hyperpod(
        aws: EmbeddedAWS, slurm: MemorySlurm, ledger: Ledger) -> None:
    name, hyperpod, ids = _cluster(aws, slurm)
    incident = opened(ledger, "gpu-1", instance=ids[0], ladder=("gpu_reset", "reboot", "replace"))
    slurm.n["gpu-1"].drained = True
    out = repair(incident, "service", provider=hyperpod, orchestrator=slurm, runner=RunCommand(NoSSM(), 0),
                 ledger=ledger, documents=Documents("c1"), timeout_s=30, check_timeout_s=600, prefix=PREFIX,
                 clock=lambda: datetime.now(UTC))
    assert (out.rung, out.attempt, out.last) == ("reboot", 2, False)
    assert aws.hyperpod.calls[-1] == ("reboot", [ids[0]])
    skipped, rebooted = ledger.get(incident.incident_id).stages["repair"].result["rungs"]
    assert skipped["rung"] == "gpu_reset" and "SSM Run Command does not reach" in skipped["skipped"]
    assert skipped["check"]["healthy"] is False and rebooted["rebooted"] is True


def test_a_rung_hyperpod_refuses_while_it_works_on_the_node_waits_for_that_work(
        aws: EmbeddedAWS, slurm: MemorySlurm, ledger: Ledger) -> None:
    """The agent and HyperPod's health agent saw the same fault; with automatic node recovery
    HyperPod began its own repair after the gate let NodeMedic's pass. Its BatchRebootClusterNodes
    is then refused (InstanceIdInUse): the incident failed and paged while HyperPod repaired the
    node. Now the rung waits (the state machine retries it), nothing recorded as rebooted; once
    HyperPod's work ends the retried rung reboots the node, once. An hour of it is escalated with
    the reason, the node left drained."""
    name, hyperpod, ids = _cluster(aws, slurm)
    incident = opened(ledger, "gpu-1", instance=ids[0], ladder=("reboot", "replace"))
    slurm.n["gpu-1"].drained = True

    def climb() -> object:
        return repair(incident, "service", provider=hyperpod, orchestrator=slurm, runner=RunCommand(NoSSM(), 0),
                      ledger=ledger, documents=Documents("c1"), timeout_s=30, check_timeout_s=600, prefix=PREFIX,
                      clock=lambda: datetime.now(UTC))

    aws.hyperpod.in_use.add(ids[0])
    try:
        for _ in range(2):  # each retry while HyperPod works: refused again, nothing done
            with pytest.raises(ProviderBusyError, match="InstanceIdInUse"):
                climb()
    finally:
        aws.hyperpod.in_use.clear()
    [rung] = ledger.get(incident.incident_id).stages["repair"].result["rungs"]
    assert rung["rung"] == "reboot" and not rung.get("rebooted")
    assert ledger.get(incident.incident_id).status == "open"
    out = climb()
    assert (out.rung, out.last) == ("reboot", False)
    assert [c for c in aws.hyperpod.calls if c[0] == "reboot"] == [("reboot", [ids[0]])] * 3  # refused twice, then done
    assert ledger.get(incident.incident_id).stages["repair"].result["rungs"][0]["rebooted"] is True

    busy = {"Error": "ProviderBusyError", "Cause": json.dumps({"errorMessage": f"HyperPod is working on {ids[0]} itself"})}
    end = end_unrecovered(incident, "escalated", ledger=ledger, clock=lambda: datetime.now(UTC), error=busy)
    assert end.status == "escalated" and "its provider was still working on it" in end.message
    assert "no capacity" not in end.message and f"HyperPod is working on {ids[0]}" in end.message
    assert ledger.get(incident.incident_id).status == "escalated" and slurm.n["gpu-1"].drained


@pytest.mark.parametrize("rung", ["reboot", "replace"])
def test_a_node_hyperpod_replaced_itself_while_the_rung_waited_is_its_replacement_checked_not_a_failure(
        aws: EmbeddedAWS, slurm: MemorySlurm, ledger: Ledger, rung: str) -> None:
    """HyperPod's automatic node recovery refused the rung while it worked on the node, then
    replaced it: the retried rung named an instance HyperPod no longer has (InstanceIdNotFound),
    and the incident failed and paged, the new node left drained. Now the rung leaves HyperPod's
    replacement, which serves the node's name, and its check (HyperPod's deep check) judges it."""
    name, hyperpod, ids = _cluster(aws, slurm)
    incident = opened(ledger, "gpu-1", instance=ids[0], ladder=(rung,))
    slurm.n["gpu-1"].drained = True
    clock = Clock()

    def climb() -> object:
        return repair(incident, "service", provider=hyperpod, orchestrator=slurm, runner=RunCommand(NoSSM(), 0),
                      ledger=ledger, documents=Documents("c1"), timeout_s=30, check_timeout_s=600, prefix=PREFIX,
                      clock=clock)

    if rung == "reboot":  # HyperPod works on the node: the rung waits
        aws.hyperpod.in_use.add(ids[0])
        with pytest.raises(ProviderBusyError):
            climb()
        aws.hyperpod.in_use.clear()
    aws.client("sagemaker").batch_replace_cluster_nodes(ClusterName=name, NodeIds=[ids[0]])  # HyperPod's own
    new = hyperpod.member_by_node("gpu-1").instance_id
    assert new not in ids
    out = climb()
    assert (out.rung, out.instance_id, out.last) == (rung, new, True)
    [done] = ledger.get(incident.incident_id).stages["repair"].result["rungs"]
    assert done["instance_id"] == new and not done.get("rebooted")
    assert f"{ids[0]} left the cluster before the {rung}" in done["replaced_by_provider"]
    assert out == climb()  # a retry leaves the same instance and asks HyperPod for nothing
    assert [c for c in aws.hyperpod.calls if c[1] == [new]] == []
    check = Checking(name, ids, incident, hyperpod, ledger, clock, FakeStepFunctions(throttled=0), new)
    with pytest.raises(HealthCheckPendingError, match="asked for"):  # no reboot to wait for: asked at once
        check("t1")
    with pytest.raises(HealthCheckPendingError, match="is running"):
        check("t2")
    aws.hyperpod.end_deep_check(name, new, passed=True)
    assert check("t3").healthy


def test_a_node_gone_from_hyperpod_with_nothing_in_its_place_fails_the_rung_with_the_reason(
        aws: EmbeddedAWS, slurm: MemorySlurm, ledger: Ledger) -> None:
    name, hyperpod, ids = _cluster(aws, slurm)
    aws.client("sagemaker").batch_replace_cluster_nodes(ClusterName=name, NodeIds=[ids[0]])
    incident = opened(ledger, "gpu-1", instance=ids[0], ladder=("reboot",))
    aws.hyperpod.set_status(name, hyperpod.member_by_node("gpu-1").instance_id, "ShuttingDown")  # not replaced: removed
    slurm.n["gpu-1"].drained = True
    with pytest.raises(ReplacementFailedError, match="no longer a node of HyperPod.*no instance serves the node"):
        repair(incident, "service", provider=hyperpod, orchestrator=slurm, runner=RunCommand(NoSSM(), 0),
               ledger=ledger, documents=Documents("c1"), timeout_s=30, check_timeout_s=600, prefix=PREFIX,
               clock=lambda: datetime.now(UTC))


def test_a_ladder_of_nothing_hyperpod_can_do_ends_with_the_reason(
        aws: EmbeddedAWS, slurm: MemorySlurm, ledger: Ledger) -> None:
    name, hyperpod, ids = _cluster(aws, slurm)
    incident = opened(ledger, "gpu-1", instance=ids[0], ladder=("gpu_reset",))
    slurm.n["gpu-1"].drained = True
    with pytest.raises(IncidentStateError, match="no rung of the ladder"):
        repair(incident, "service", provider=hyperpod, orchestrator=slurm, runner=RunCommand(NoSSM(), 0),
               ledger=ledger, documents=Documents("c1"), timeout_s=30, check_timeout_s=600, prefix=PREFIX,
               clock=lambda: datetime.now(UTC))
    assert aws.hyperpod.calls == []
