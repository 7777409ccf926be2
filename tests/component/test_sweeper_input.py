"""The silence sweeper against heartbeats a hostile or broken sender put on the queue (each is
counted invalid and dropped, and never stops the sweep of the rest of the fleet), a queue it could
not read to the end, and a sweep that races another."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws
from nodemedic.providers.base import Member
from nodemedic.silence_sweeper import SilenceSweeper
from nodemedic.store.roster import RosterConflictError, RosterHead, RosterStore
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from tests.stages.memory_provider import MemoryProvider


def heartbeat(instance_id: str, hostname: str) -> str:
    now = datetime.now(UTC).isoformat()
    return json.dumps({"version": "0", "id": "4b1d0c2e-1f3a-4e5b-9c7d-0a1b2c3d4e5f", "detail-type": "Node Heartbeat",
                       "source": "nodemedic.agent", "time": now[:19] + "Z", "detail": {
                           "schema_version": "1", "cluster": "prod", "sent_at": now, "interval_seconds": 15,
                           "node": {"instance_id": instance_id, "hostname": hostname, "slurm_node": "gpu-1"}}})


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield


@pytest.mark.parametrize("poison", [
    heartbeat("i-0000000000000000b", "gpu\udc80"),  # JSON writes it as \\udc80: half a surrogate pair, no UTF-8
    "not json", "null", "[]", json.dumps({"detail": "x"}),
    # EventBridge takes JSON nested up to 1,100 levels; Python's decoder stops short of that with a
    # RecursionError, which failed every sweep while the message was on the queue
    '{"detail": {"node": ' + "[" * 1050 + "]" * 1050 + "}}",
])
def test_a_heartbeat_that_cannot_be_stored_is_invalid_and_the_sweep_goes_on(aws: None, poison: str) -> None:
    db, sqs = boto3.client("dynamodb"), boto3.client("sqs")
    db.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    queue = sqs.create_queue(QueueName="hb")["QueueUrl"]
    sqs.send_message(QueueUrl=queue, MessageBody=poison)
    sqs.send_message(QueueUrl=queue, MessageBody=heartbeat("i-0000000000000000a", "ip-10-0-0-1.ec2.internal"))
    boto3.client("events").create_event_bus(Name="bus")
    sweeper = SilenceSweeper(sqs=sqs, events=boto3.client("events"), roster=RosterStore(db, "t", "prod"),
                             provider=MemoryProvider(Member("i-0000000000000000a", "gpu-1", "running")),
                             queue_url=queue, bus="bus", cluster="prod", threshold_s=60)
    result = sweeper.sweep(datetime.now(UTC))
    assert (result.heartbeats, result.invalid, result.watched) == (1, 1, 1)
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, VisibilityTimeout=0)  # neither comes back


@pytest.mark.parametrize("sent_time", ["9999-12-31T23:59:59Z", "9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+14:00",
                                       "0001-01-01T00:00:00Z", "1970-01-01T00:00:00Z",
                                       "2026-13-45T99:00:00Z", "yesterday"])
def test_a_heartbeat_with_any_time_its_sender_gave_is_dated_by_sqs_and_the_sweep_goes_on(aws: None, sent_time: str) -> None:
    """PutEvents takes the event's time from its sender. At 1970 the node's HEARTBEAT_MISSING could
    not be built (no health event is dated before 2020); at year 9999 the end of its second is no
    date. Either way the sweep failed on it, and every sweep after it while the message came back:
    no node's silence was found meanwhile. Such a heartbeat is dated by SQS, as one with no time."""
    db, sqs = boto3.client("dynamodb"), boto3.client("sqs")
    db.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    queue = sqs.create_queue(QueueName="hb")["QueueUrl"]
    odd = {**json.loads(heartbeat("i-0000000000000000a", "ip-10-0-0-1.ec2.internal")), "time": sent_time}
    before = datetime.now(UTC) - timedelta(seconds=1)
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(odd))
    boto3.client("events").create_event_bus(Name="bus")
    roster = RosterStore(db, "t", "prod")
    sweeper = SilenceSweeper(sqs=sqs, events=boto3.client("events"), roster=roster,
                             provider=MemoryProvider(Member("i-0000000000000000a", "gpu-1", "running")),
                             queue_url=queue, bus="bus", cluster="prod", threshold_s=60)
    result = sweeper.sweep(datetime.now(UTC))
    assert (result.heartbeats, result.invalid, result.reported) == (1, 0, [])
    seen = datetime.fromisoformat(roster.load()[0]["i-0000000000000000a"]["last_seen"])
    assert before <= seen <= datetime.now(UTC)


def test_a_roster_entry_no_health_event_can_be_made_of_is_dropped_and_the_others_are_reported(aws: None) -> None:
    """One entry the sweep cannot report (a last heartbeat dated 1970, left by an earlier version)
    failed every sweep: no node's silence was found. It is dropped and counted; the rest go on."""
    now = datetime.now(UTC)
    sweeper = _silent({"i-0000000000000000a": "1970-01-01T00:00:00+00:00",
                       "i-0000000000000000b": (now - timedelta(minutes=5)).isoformat()},
                      MemoryProvider(Member("i-0000000000000000a", "gpu-1", "running"),
                                     Member("i-0000000000000000b", "gpu-2", "running")))
    result = sweeper.sweep(now)
    assert (result.reported, result.invalid) == (["i-0000000000000000b"], 1)
    assert list(sweeper.roster.load()[0]) == ["i-0000000000000000b"]


class EmptyQueue:
    """A heartbeat queue that stays empty, answering at once (SQS's long poll waits its second)."""

    def receive_message(self, **_: object) -> dict:
        return {}


def _silent(last_seen: dict[str, str], provider: MemoryProvider) -> SilenceSweeper:
    """A sweeper whose roster holds these nodes (gpu-1, gpu-2, ... in turn), each last heard from
    at its time; nothing more is heard."""
    db = boto3.client("dynamodb")
    db.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    boto3.client("events").create_event_bus(Name="bus")
    roster = RosterStore(db, "t", "prod")
    roster.save({instance: {"node": {"instance_id": instance, "hostname": "h", "slurm_node": f"gpu-{n}"},
                            "last_seen": seen, "interval_s": 15.0, "reported_at": None}
                 for n, (instance, seen) in enumerate(last_seen.items(), 1)}, RosterHead())
    return SilenceSweeper(sqs=EmptyQueue(), events=boto3.client("events"), roster=roster, provider=provider,
                          queue_url="hb", bus="bus", cluster="prod", threshold_s=60)


def _silent_since(last_seen: datetime, instance: str, provider: MemoryProvider) -> SilenceSweeper:
    """A sweeper whose roster holds one node, last heard from at ``last_seen``; nothing more is heard."""
    return _silent({instance: last_seen.isoformat()}, provider)


def test_a_node_its_provider_is_working_on_is_not_reported_and_its_silence_counts_from_then(aws: None) -> None:
    """HyperPod patches a node (SystemUpdating: cordoned, evicted, its root volume replaced) or runs
    its deep health check on it; EC2 starts an instance. Its agent is silent meanwhile, for tens of
    minutes: every node of a rolling patch was reported HEARTBEAT_MISSING, each an incident that
    raced HyperPod's own work. Now the silence counts from the last sweep that found the provider
    working on the node."""
    from datetime import timedelta

    instance = "i-0000000000000000a"
    provider = MemoryProvider(Member(instance, "gpu-1", "pending"))
    t0 = datetime.now(UTC) - timedelta(minutes=30)
    sweeper = _silent_since(t0, instance, provider)
    busy_at = t0 + timedelta(minutes=29)
    result = sweeper.sweep(busy_at)  # silent for 29 min, HyperPod updating it
    assert (result.reported, result.busy) == ([], [instance])
    provider.by_id[instance] = Member(instance, "gpu-1", "running")  # HyperPod is done; the agent starts
    assert sweeper.sweep(busy_at + timedelta(seconds=59)).reported == []
    published: list[dict] = []
    sweeper.events.meta.events.register("before-parameter-build.events.PutEvents",
                                        lambda params, **_: published.extend(params["Entries"]))
    assert sweeper.sweep(busy_at + timedelta(seconds=61)).reported == [instance]  # still silent: a fault now
    detail = json.loads(published[0]["Detail"])
    assert datetime.fromisoformat(detail["observed_at"]) == busy_at  # not 30 min ago: not refused as stale
    assert detail["evidence"]["last_heartbeat"] == t0.isoformat()


def test_a_node_its_provider_has_been_working_on_for_hours_is_reported_all_the_same(aws: None) -> None:
    """A node left in HyperPod's SystemUpdating (or EC2's pending) for good, its agent silent: the
    sweeper took it for busy at every sweep and never reported it. Past PROVIDER_BUSY_LIMIT of
    continuous silence under a busy provider, it is reported, saying since when the provider was at it."""
    from datetime import timedelta

    from nodemedic.domain.silence import PROVIDER_BUSY_LIMIT

    instance = "i-0000000000000000a"
    t0 = datetime.now(UTC) - timedelta(hours=5)
    sweeper = _silent_since(t0, instance, MemoryProvider(Member(instance, "gpu-1", "pending")))
    first = t0 + timedelta(minutes=2)
    sweeps = [first + timedelta(minutes=m) for m in range(0, int(PROVIDER_BUSY_LIMIT.total_seconds() // 60) + 4, 2)]
    published: list[dict] = []
    sweeper.events.meta.events.register("before-parameter-build.events.PutEvents",
                                        lambda params, **_: published.extend(params["Entries"]))
    reported = [at for at in sweeps if sweeper.sweep(at).reported]
    assert reported == [sweeps[-1]] and sweeps[-1] - first > PROVIDER_BUSY_LIMIT >= sweeps[-2] - first
    detail = json.loads(published[0]["Detail"])
    assert detail["fault_code"] == "HEARTBEAT_MISSING"
    assert detail["evidence"]["provider_busy_since"] == first.isoformat()
    assert datetime.fromisoformat(detail["observed_at"]) == sweeps[-2]  # the last sweep that still waited


def test_heartbeats_left_unread_make_no_node_silent_and_one_silent_before_the_last_full_read_is_reported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After the sweeper was down or throttled, or a burst, the queue holds more heartbeats than a
    sweep reads in its budget. Every node whose latest heartbeat waited unread was reported
    HEARTBEAT_MISSING: a fleet of false incidents, enough to trip the breaker and stop every real
    repair. Now a sweep that leaves heartbeats unread judges silence as of the last sweep that read
    the queue dry; a node silent before then is still reported."""
    import nodemedic.silence_sweeper as sweeper_mod

    a, b = "i-0000000000000000a", "i-0000000000000000b"
    now = datetime.now(UTC)
    with EmbeddedAWS() as aws:
        db, sqs, events = aws.client("dynamodb"), aws.client("sqs"), aws.client("events")
        db.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
        events.create_event_bus(Name="bus")
        roster = RosterStore(db, "t", "prod")
        read_dry = now - timedelta(seconds=50)  # the last sweep that read every heartbeat
        roster.save({i: {"node": {"instance_id": i, "hostname": h, "slurm_node": n}, "last_seen": seen.isoformat(),
                         "interval_s": 15.0, "reported_at": None}
                     for i, h, n, seen in [(a, "ip-10-0-0-1", "gpu-1", now - timedelta(seconds=100)),
                                           (b, "ip-10-0-0-2", "gpu-2", now - timedelta(seconds=60))]},
                    RosterHead(0, read_dry))
        queue = sqs.create_queue(QueueName="hb")["QueueUrl"]
        sqs.send_message(QueueUrl=queue, MessageBody=heartbeat(b, "ip-10-0-0-2").replace('"gpu-1"', '"gpu-2"'))
        sweeper = SilenceSweeper(sqs=sqs, events=events, roster=roster, queue_url=queue, bus="bus", cluster="prod",
                                 provider=MemoryProvider(Member(a, "gpu-1", "running"), Member(b, "gpu-2", "running")),
                                 threshold_s=45)
        with monkeypatch.context() as m:
            m.setattr(sweeper_mod, "RECEIVE_BUDGET_S", 0.0)  # the budget is spent before b's heartbeat is read
            behind = sweeper.sweep(now)
        assert behind.backlog and behind.judged_as_of == read_dry
        assert behind.reported == [a]  # silent 50 s before the last full read; b may be beating (it is)
        caught_up = sweeper.sweep(now + timedelta(seconds=10))
        assert (caught_up.backlog, caught_up.heartbeats, caught_up.reported) == (False, 1, [])
        assert caught_up.judged_as_of == now + timedelta(seconds=10)
        assert roster.load()[1].read_until == now + timedelta(seconds=10)


def test_a_sweep_that_finds_another_under_way_reads_nothing(aws: None) -> None:
    """Two sweeps at once (an invocation past its minute) each took part of the heartbeats and judged
    silence without the other part. The second now skips, leaving the queue to the first."""
    db, sqs = boto3.client("dynamodb"), boto3.client("sqs")
    db.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    queue = sqs.create_queue(QueueName="hb")["QueueUrl"]
    sqs.send_message(QueueUrl=queue, MessageBody=heartbeat("i-0000000000000000a", "ip-10-0-0-1"))
    roster = RosterStore(db, "t", "prod")
    now = datetime.now(UTC)
    roster.claim(now, timedelta(seconds=30))  # the first sweep, under way
    sweeper = SilenceSweeper(sqs=sqs, events=boto3.client("events"), roster=roster, queue_url=queue, bus="bus",
                             cluster="prod", provider=MemoryProvider(), threshold_s=45)
    with pytest.raises(RosterConflictError, match="another sweep is under way"):
        sweeper.sweep(now + timedelta(seconds=10))
    assert len(sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)["Messages"]) == 1  # left for the first


class SlowProvider(MemoryProvider):
    """Answers after ``delay`` of the sweep's time (throttled calls retried): meanwhile ``meanwhile``
    runs, as the next sweep would."""

    def __init__(self, *members: Member, meanwhile: Any) -> None:
        super().__init__(*members)
        self.meanwhile, self.outcome = meanwhile, None

    def member(self, instance_id: str) -> Member | None:
        if self.outcome is None:
            try:
                self.outcome = self.meanwhile()
            except RosterConflictError as exc:
                self.outcome = exc
        return super().member(instance_id)


def test_a_sweep_slowed_past_half_a_minute_still_keeps_the_next_one_out(aws: None) -> None:
    """The lease was 30 s; the function runs up to 75 s. A sweep slowed by throttled calls lost its
    lease before it saved: the next sweep read the queue's newer heartbeats against the roster
    without the first one's, and judged those nodes silent. The lease now lasts until the
    invocation ends; one whose invocation Lambda stopped keeps the next one out no longer."""
    db, sqs = boto3.client("dynamodb"), boto3.client("sqs")
    db.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    queue = sqs.create_queue(QueueName="hb")["QueueUrl"]
    roster = RosterStore(db, "t", "prod")
    now = datetime.now(UTC)
    silent = "i-0000000000000000a"
    roster.save({silent: {"node": {"instance_id": silent, "hostname": "ip-10-0-0-1", "slurm_node": "gpu-1"},
                          "last_seen": (now - timedelta(minutes=5)).isoformat(), "interval_s": 15.0,
                          "reported_at": None}}, RosterHead())

    def next_sweep() -> object:
        return SilenceSweeper(sqs=sqs, events=boto3.client("events"), roster=roster, queue_url=queue, bus="bus",
                              cluster="prod", provider=MemoryProvider(), threshold_s=45,
                              ).sweep(now + timedelta(seconds=40), ends=now + timedelta(seconds=115))

    provider = SlowProvider(Member(instance_id=silent, slurm_node="gpu-1", state="running"), meanwhile=next_sweep)
    first = SilenceSweeper(sqs=sqs, events=boto3.client("events"), roster=roster, queue_url=queue, bus="bus",
                           cluster="prod", provider=provider, threshold_s=45)
    first.sweep(now, ends=now + timedelta(seconds=75))
    assert isinstance(provider.outcome, RosterConflictError), provider.outcome  # 40 s on, it was kept out
    roster.claim(now + timedelta(seconds=60), timedelta(seconds=30))  # the first saved: the lease is free
    stopped = now + timedelta(seconds=100)  # an invocation Lambda stopped at its end, lease unreleased
    roster.claim(stopped, timedelta(seconds=75) + timedelta(seconds=1))
    with pytest.raises(RosterConflictError):
        roster.claim(stopped + timedelta(seconds=75), timedelta(seconds=30))
    roster.claim(stopped + timedelta(seconds=77), timedelta(seconds=30))


class ThrottledProvider(MemoryProvider):
    """Answers for one instance at a time until AWS throttles it, as Auto Scaling and EC2 do."""

    def __init__(self, *members: Member, allowed: int) -> None:
        super().__init__(*members)
        self.allowed, self.calls = allowed, 0

    def member(self, instance_id: str) -> Member | None:
        self.calls += 1
        if self.calls > self.allowed:
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}, "DescribeAutoScalingGroups")
        return super().member(instance_id)


def test_a_rack_gone_silent_at_once_is_reported_whole_not_lost_to_throttling(aws: None) -> None:
    """A rack or a switch lost: 40 nodes silent in one sweep. Each took its own provider calls (two
    on Auto Scaling: the group, then the instance); throttled, the sweep failed, and so did every
    sweep after it: none of them was reported. The provider now lists the cluster once."""
    db = boto3.client("dynamodb")
    db.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    events = boto3.client("events")
    events.create_event_bus(Name="bus")
    now = datetime.now(UTC)
    rack = [f"i-{n:017x}" for n in range(1, 41)]
    roster = RosterStore(db, "t", "prod")
    roster.save({i: {"node": {"instance_id": i, "hostname": f"ip-10-0-0-{n}", "slurm_node": f"gpu-{n}"},
                     "last_seen": (now - timedelta(minutes=2)).isoformat(), "interval_s": 15.0, "reported_at": None}
                 for n, i in enumerate(rack, 1)}, RosterHead())
    gone = rack[-2:]  # scaled in meanwhile: forgotten, not reported
    provider = ThrottledProvider(*(Member(i, f"gpu-{n}", "running") for n, i in enumerate(rack[:-2], 1)), allowed=20)
    sweeper = SilenceSweeper(sqs=EmptyQueue(), events=events, roster=roster, provider=provider, queue_url="hb",
                             bus="bus", cluster="prod", threshold_s=45)
    result = sweeper.sweep(now)
    assert result.reported == sorted(rack[:-2]) and result.forgotten == gone and provider.calls == 0
