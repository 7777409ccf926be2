"""EC2's rebalance recommendation: the jobs on the Spot node are asked to checkpoint, once, and
nothing else happens to the node.

Fast tier: the ledger in DynamoDB (embedded), Slurm in memory. The real function on a real Slurm
and a real API server: tests/e2e/test_spot_interruption.py, tests/kube/test_local_stack.py.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta

import pytest
from botocore.exceptions import ClientError
from nodemedic.contracts.spot_interruption import NodeRebalanceEnvelope, RebalanceEnvelope
from nodemedic.domain.checkpoint import CheckpointPolicy, CheckpointRule, parse_checkpoint_policy
from nodemedic.errors import CommandFailedError, CommandPendingError, PolicyError
from nodemedic.planned_events import parse_planned_event
from nodemedic.providers.base import Member
from nodemedic.rebalance import QUIET, STALE, RebalanceOutcome, ask_to_checkpoint, unwanted
from nodemedic.safety.policy import Exclusions, SafetyPolicy
from nodemedic.store.control import ControlState, Switch
from nodemedic.store.ledger import Ledger

from tests.conftest import EVENTS
from tests.stages.conftest import opened
from tests.stages.memory_provider import MemoryProvider
from tests.stages.memory_slurm import MemorySlurm

SAMPLE = json.loads((EVENTS / "aws-ec2" / "rebalance-recommendation.json").read_text())
GPU1, GPU2, GPU3, LOGIN = "i-0000000000000a001", "i-0000000000000a002", "i-0000000000000a003", "i-0000000000000b001"
POLICY = CheckpointPolicy(default=CheckpointRule(signal="USR1", scope="batch"), rebalance=True)
PROVIDER = MemoryProvider(Member(GPU1, "gpu-1", "running"), Member(GPU2, "gpu-2", "running"),
                          Member(GPU3, "gpu-3", "running", tags={"nodemedic:exclude": "true"}),
                          Member(LOGIN, None, "running"))


def _recommended(instance: str, at: datetime) -> RebalanceEnvelope:
    event = copy.deepcopy(SAMPLE)
    event["detail"]["instance-id"] = instance
    event["time"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    envelope = parse_planned_event(event)
    assert isinstance(envelope, RebalanceEnvelope)
    return envelope


def _ask(instance: str, slurm: MemorySlurm, ledger: Ledger, now: datetime, *, policy: CheckpointPolicy = POLICY,
         safety: SafetyPolicy | None = None, control: ControlState | None = None) -> RebalanceOutcome:
    envelope = _recommended(instance, now)
    assert unwanted(envelope, policy, now) == ""
    return ask_to_checkpoint(envelope, cluster="c1", provider=PROVIDER, orchestrator=slurm, ledger=ledger,
                             checkpoints=policy, safety=safety or SafetyPolicy(), control=control or ControlState(),
                             now=now)


def test_the_jobs_on_the_node_are_asked_once_and_nothing_else_is_done(slurm: MemorySlurm, ledger: Ledger) -> None:
    """A job across gpu-1 and gpu-2: EC2 recommends rebalancing both (a capacity pool at risk),
    and the recommendation is delivered twice. The job is signalled once; the node is not drained."""
    slurm.n["gpu-1"].jobs = ["41", "42"]
    slurm.n["gpu-2"].jobs = ["41"]
    now = datetime.now(UTC)
    first = _ask(GPU1, slurm, ledger, now)
    assert (first.node, first.asked, first.not_asked, first.ignored) == ("gpu-1", ["41", "42"], {}, "")
    again = _ask(GPU1, slurm, ledger, now + timedelta(seconds=5))  # EventBridge delivers at least once
    other = _ask(GPU2, slurm, ledger, now + timedelta(seconds=9))
    assert again.asked == [] and set(again.not_asked) == {"41", "42"}
    assert other.asked == [] and other.not_asked == {"41": "asked within the last 30 min"}
    assert slurm.signalled == [("41", "USR1", "batch"), ("42", "USR1", "batch")]
    assert not slurm.n["gpu-1"].drained and not slurm.n["gpu-2"].drained
    later = _ask(GPU2, slurm, ledger, now + QUIET + timedelta(seconds=1))  # a new recommendation, later
    assert later.asked == ["41"] and slurm.signalled[-1] == ("41", "USR1", "batch")


def test_each_job_gets_its_partitions_rule_and_one_without_a_rule_is_not_asked(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    slurm.n["gpu-1"].jobs = ["7", "8", "9"]
    slurm.partition.update({"8": "debug", "9": "long"})
    policy = CheckpointPolicy(default=CheckpointRule(), rebalance=True,
                              partitions={"debug": None, "long": CheckpointRule(signal="USR2", scope="full")})
    out = _ask(GPU1, slurm, ledger, datetime.now(UTC), policy=policy)
    assert out.asked == ["7", "9"] and out.not_asked == {"8": "no checkpoint rule for debug"}
    assert sorted(slurm.signalled) == [("7", "USR1", "batch"), ("9", "USR2", "full")]


@pytest.mark.parametrize(("safety", "control", "why"), [
    (SafetyPolicy(), ControlState(paused=Switch(by="alice", reason="fleet upgrade", at=datetime.now(UTC))),
     "automation is paused (fleet upgrade)"),
    (SafetyPolicy(mode="dry_run"), ControlState(), "dry run"),
    (SafetyPolicy(exclusions=Exclusions(nodes=["gpu-*"])), ControlState(), "matches exclusion 'gpu-*'"),
])
def test_a_node_automation_keeps_its_hands_off_is_not_signalled(
        slurm: MemorySlurm, ledger: Ledger, safety: SafetyPolicy, control: ControlState, why: str) -> None:
    slurm.n["gpu-1"].jobs = ["41"]
    out = _ask(GPU1, slurm, ledger, datetime.now(UTC), safety=safety, control=control)
    assert why in out.ignored and out.asked == [] and slurm.signalled == []


def test_an_excluded_instance_a_node_under_an_incident_and_an_instance_of_no_node_are_left_alone(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    slurm.n["gpu-2"].jobs = ["41"]
    slurm.n["gpu-3"].jobs = ["43"]
    now = datetime.now(UTC)
    incident = opened(ledger, "gpu-2", instance=GPU2)  # its drain asks the jobs itself, by the fault's rule
    assert f"incident {incident.incident_id} holds the node" in _ask(GPU2, slurm, ledger, now).ignored
    assert "instance tag nodemedic:exclude=true" in _ask(GPU3, slurm, ledger, now).ignored
    assert _ask(LOGIN, slurm, ledger, now).ignored == "backs no node of the cluster"
    assert _ask("i-0123456789abcdef0", slurm, ledger, now).ignored == "not a member of cluster c1"
    assert slurm.signalled == []


def test_a_job_the_scheduler_could_not_signal_is_asked_by_the_retried_delivery(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    slurm.n["gpu-1"].jobs = ["41", "42"]
    slurm.unsignalable = {"42"}
    now = datetime.now(UTC)
    with pytest.raises(CommandFailedError, match=r"job\(s\) 42 could not be asked to checkpoint \(asked: 41\)"):
        _ask(GPU1, slurm, ledger, now)
    slurm.unsignalable = set()
    retried = _ask(GPU1, slurm, ledger, now + timedelta(seconds=20))  # EventBridge retries the invocation
    assert retried.asked == ["42"] and retried.not_asked == {"41": "asked within the last 30 min"}
    assert [job for job, _, _ in slurm.signalled] == ["41", "42"]


def test_a_policy_without_rebalance_an_old_recommendation_and_a_policy_of_no_rules_ask_nothing() -> None:
    now = datetime.now(UTC).replace(microsecond=0)  # EventBridge's time is in whole seconds
    fresh = _recommended(GPU1, now)
    assert "rebalance: false" in unwanted(fresh, CheckpointPolicy(default=CheckpointRule()), now)
    assert "no rule to ask a job by" in unwanted(fresh, CheckpointPolicy(rebalance=True), now)
    assert unwanted(_recommended(GPU1, now - STALE), POLICY, now) == ""
    assert "old news" in unwanted(_recommended(GPU1, now - STALE - timedelta(seconds=1)), POLICY, now)


@pytest.mark.parametrize("value", ['"yes"', "1", "null"])
def test_rebalance_is_a_json_boolean_or_the_policy_is_refused(value: str) -> None:
    with pytest.raises(PolicyError, match="rebalance"):
        parse_checkpoint_policy(f'{{"default": {{}}, "rebalance": {value}}}')
    assert parse_checkpoint_policy('{"default": {}, "rebalance": true}').rebalance


def _node_notice(instance: str, node: str | None, at: datetime, cluster: str = "c1") -> NodeRebalanceEnvelope:
    """What a node's agent sends after reading the recommendation from instance metadata."""
    envelope = parse_planned_event({
        "id": "9a0d6c5e-1b7f-4e22-8a41-3f5c2d7e6b10", "source": "nodemedic.agent",
        "detail-type": "EC2 Instance Rebalance Recommendation", "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "detail": {"schema_version": "1", "cluster": cluster,
                   "node": {"instance_id": instance, "hostname": node or "ip-10-0-0-9", "slurm_node": node},
                   "notice_time": at.strftime("%Y-%m-%dT%H:%M:%SZ")}})
    assert isinstance(envelope, NodeRebalanceEnvelope)
    return envelope


def test_a_nodes_own_reading_asks_as_ec2s_event_does_and_the_two_ask_the_job_once(
        slurm: MemorySlurm, ledger: Ledger) -> None:
    slurm.n["gpu-1"].jobs = ["41"]
    now = datetime.now(UTC).replace(microsecond=0)
    from_node = ask_to_checkpoint(_node_notice(GPU1, "gpu-1", now), cluster="c1", provider=PROVIDER, orchestrator=slurm,
                                  ledger=ledger, checkpoints=POLICY, safety=SafetyPolicy(), control=ControlState(),
                                  now=now)
    assert from_node.asked == ["41"]
    assert _ask(GPU1, slurm, ledger, now + timedelta(seconds=3)).not_asked == {"41": "asked within the last 30 min"}
    assert slurm.signalled == [("41", "USR1", "batch")]


@pytest.mark.parametrize(("node", "cluster", "why"), [
    ("gpu-2", "c1", "the notice names node gpu-2, but i-0000000000000a001 backs gpu-1: not believed"),
    ("gpu-1", "other", "the notice is for cluster other; this pipeline serves c1"),
])
def test_a_nodes_notice_about_another_node_or_cluster_is_not_believed(
        slurm: MemorySlurm, ledger: Ledger, node: str, cluster: str, why: str) -> None:
    slurm.n["gpu-1"].jobs = ["41"]
    now = datetime.now(UTC)
    out = ask_to_checkpoint(_node_notice(GPU1, node, now, cluster), cluster="c1", provider=PROVIDER,
                            orchestrator=slurm, ledger=ledger, checkpoints=POLICY, safety=SafetyPolicy(),
                            control=ControlState(), now=now)
    assert out.ignored == why and slurm.signalled == []


def test_a_nodes_notice_is_as_old_as_ec2s_notice_time_not_as_its_sending() -> None:
    """An agent that restarts reads the same recommendation again and sends it anew: its age is EC2's."""
    now = datetime.now(UTC)
    assert "old news" in unwanted(_node_notice(GPU1, "gpu-1", now - timedelta(hours=2)), POLICY, now)



@pytest.mark.parametrize(("error", "asked_again"), [
    (ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "SendCommand"), ["42"]),
    (CommandPendingError("command c-2 on i-ctl still running after 60s"), []),
], ids=["never-sent", "answer-lost"])
def test_a_signal_command_that_failed_leaves_its_jobs_to_the_retried_delivery_unless_it_was_sent(
        slurm: MemorySlurm, ledger: Ledger, error: Exception, asked_again: list[str]) -> None:
    """The second of two signal commands fails. Never sent (SSM throttled SendCommand): its job
    was not asked, so EventBridge's retry asks it; the claim does not make the retry report it
    asked already. Sent, but its answer lost (a slow controller): the job is not signalled twice
    (a second USR1 could mean a second checkpoint, or a requeue). The job the first command
    signalled is asked once either way."""
    slurm.n["gpu-1"].jobs = ["41", "42"]
    slurm.partition["42"] = "long"
    policy = CheckpointPolicy(default=CheckpointRule(signal="USR1"), rebalance=True,
                              partitions={"long": CheckpointRule(signal="USR2")})
    real = slurm.request_checkpoint

    def second_fails(node: str, job_ids: list[str], signal: str, scope: str) -> list[str]:
        if signal == "USR2":
            raise error
        return real(node, job_ids, signal, scope)

    slurm.request_checkpoint = second_fails  # type: ignore[method-assign]
    now = datetime.now(UTC)
    with pytest.raises(type(error)):
        _ask(GPU1, slurm, ledger, now, policy=policy)
    assert slurm.signalled == [("41", "USR1", "batch")]
    slurm.request_checkpoint = real  # type: ignore[method-assign]
    retried = _ask(GPU1, slurm, ledger, now + timedelta(seconds=20), policy=policy)
    assert retried.asked == asked_again
    assert set(retried.not_asked) == {"41", "42"} - set(asked_again)
    assert slurm.signalled[1:] == [("42", "USR2", "batch")] * len(asked_again)
