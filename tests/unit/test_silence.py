"""Silent-node detection: the roster logic the sweeper runs, and the agent's IAM boundary."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nodemedic.contracts.events import NodeHeartbeat
from nodemedic.domain.silence import missing_event, record, silent
from nodemedic_sandbox.embedded_aws import schedule_period
from nodemedic_sandbox.iam import Request, evaluate
from samtranslator.yaml_helper import yaml_parse

T0 = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)


def beat(instance: str, at: datetime, status: str = "running", skew: timedelta = timedelta(0)) -> tuple[NodeHeartbeat, datetime]:
    """A heartbeat that reached AWS at ``at``, sent by a node whose clock is off by ``skew``."""
    return NodeHeartbeat(schema_version="1", cluster="local", sent_at=at + skew, status=status, interval_seconds=15,
                         node={"instance_id": instance, "hostname": "h", "slurm_node": "gpu-1"}), at


def test_a_node_is_silent_after_the_threshold_and_reported_once_until_it_returns():
    roster: dict = {}
    record(roster, *beat("i-00000000000000001", T0))
    assert silent(roster, T0 + timedelta(seconds=45), 45) == []
    assert silent(roster, T0 + timedelta(seconds=46), 45) == ["i-00000000000000001"]
    roster["i-00000000000000001"]["reported_at"] = (T0 + timedelta(seconds=46)).isoformat()
    assert silent(roster, T0 + timedelta(seconds=120), 45) == []  # once per silence
    record(roster, *beat("i-00000000000000001", T0 + timedelta(seconds=130)))  # it came back
    assert silent(roster, T0 + timedelta(seconds=180), 45) == ["i-00000000000000001"]


def test_an_agent_that_beats_slower_than_the_threshold_allows_is_silent_after_three_of_its_beats():
    """An agent set to beat every 60 s (it may: up to 300 s) against the stack's 45 s threshold
    was reported HEARTBEAT_MISSING between any two of its beats."""
    roster: dict = {}
    at = T0
    record(roster, NodeHeartbeat(schema_version="1", cluster="local", sent_at=at, interval_seconds=60,
                                 node={"instance_id": "i-00000000000000001", "hostname": "h"}), at)
    assert silent(roster, at + timedelta(seconds=59), 45) == []  # before its next beat is due
    assert silent(roster, at + timedelta(seconds=180), 45) == []
    assert silent(roster, at + timedelta(seconds=181), 45) == ["i-00000000000000001"]


def test_a_late_old_heartbeat_does_not_move_last_seen_back():
    roster: dict = {}
    record(roster, *beat("i-00000000000000001", T0 + timedelta(seconds=30)))
    record(roster, *beat("i-00000000000000001", T0))
    assert roster["i-00000000000000001"]["last_seen"] == (T0 + timedelta(seconds=30)).isoformat()
    record(roster, *beat("i-00000000000000001", T0 + timedelta(seconds=10), status="stopping"))  # before a restart
    assert roster["i-00000000000000001"]["last_seen"] == (T0 + timedelta(seconds=30)).isoformat()


def test_a_heartbeat_replayed_from_an_archive_neither_revives_a_dead_node_nor_stops_a_watch():
    """An EventBridge replay (or a delivery retried for hours) keeps each event's time: a heartbeat
    is dated by it, not by when the queue took it. Dated by the queue, a dead node's old heartbeat
    made it alive for another threshold, and an old goodbye stopped the watch of a running node."""
    from nodemedic.silence_sweeper import _arrived_at

    now = T0 + timedelta(hours=1)
    roster: dict = {}
    record(roster, *beat("i-00000000000000001", T0))  # its last heartbeat: then it died
    record(roster, *beat("i-00000000000000002", T0 + timedelta(minutes=59, seconds=50)))  # beating
    replayed = {"time": (T0 - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ"), "replay-name": "recover"}
    taken_now = {"Attributes": {"SentTimestamp": str(int(now.timestamp() * 1000))}}
    at = _arrived_at(taken_now, replayed, now)
    assert at == T0 - timedelta(minutes=5) + timedelta(seconds=1)  # the end of the event's second
    record(roster, *beat("i-00000000000000001", at)[:1], at)
    record(roster, beat("i-00000000000000002", at, status="stopping")[0], at)
    assert silent(roster, now, 45) == ["i-00000000000000001"] and "i-00000000000000002" in roster


def test_a_goodbye_stops_watching_the_node():
    roster: dict = {}
    record(roster, *beat("i-00000000000000001", T0))
    record(roster, *beat("i-00000000000000001", T0 + timedelta(seconds=5), status="stopping"))
    assert roster == {} and silent(roster, T0 + timedelta(hours=1), 45) == []


def test_the_missing_event_dates_the_fault_at_the_last_heartbeat():
    roster: dict = {}
    record(roster, *beat("i-00000000000000001", T0))
    event = missing_event(roster, "i-00000000000000001", "local", T0 + timedelta(seconds=50))
    assert (event.fault_code, event.check, event.observed_at) == ("HEARTBEAT_MISSING", "heartbeat", T0)
    assert event.evidence["silent_for_s"] == 50.0


@pytest.mark.parametrize("skew", [timedelta(minutes=-10), timedelta(hours=1)], ids=["10 min behind", "1 h ahead"])
def test_a_nodes_clock_neither_silences_it_nor_delays_its_silence(skew: timedelta):
    """Dated by AWS's clock: a node whose clock is behind is not silent while it beats, and one
    whose clock is ahead is silent the threshold after its last heartbeat, not an hour later."""
    roster: dict = {}
    for n in range(20):
        record(roster, *beat("i-00000000000000001", T0 + timedelta(seconds=15 * n), skew=skew))
        assert silent(roster, T0 + timedelta(seconds=15 * n + 14), 45) == []
    last = T0 + timedelta(seconds=15 * 19)
    assert silent(roster, last + timedelta(seconds=46), 45) == ["i-00000000000000001"]
    event = missing_event(roster, "i-00000000000000001", "local", last + timedelta(seconds=46))
    assert event.observed_at == last and event.evidence["silent_for_s"] == 46.0


def test_a_heartbeat_is_dated_by_eventbridge_or_sqs_never_by_the_node():
    from nodemedic.silence_sweeper import _arrived_at

    now = T0 + timedelta(minutes=1)
    queued = {"Attributes": {"SentTimestamp": str(int(T0.timestamp() * 1000) + 250)}}
    envelope = {"time": "2026-11-22T03:00:00Z", "detail": {"sent_at": "2026-11-22T02:00:00Z"}}
    assert _arrived_at(queued, envelope, now) == T0 + timedelta(milliseconds=250)  # SQS took it then
    assert _arrived_at(queued, {**envelope, "time": "2026-11-22T03:00:01Z"}, now) == T0 + timedelta(milliseconds=250)
    assert _arrived_at({}, envelope, now) == T0 + timedelta(seconds=1)  # the end of EventBridge's second
    assert _arrived_at({}, {"time": "2099-01-01T00:00:00Z"}, now) == now  # never later than now
    assert _arrived_at({"Attributes": {"SentTimestamp": "x"}}, {"time": "soon"}, now) == now


@pytest.mark.parametrize("put_ms", [0, 1, 500, 999])
def test_a_heartbeat_is_never_dated_before_it_reached_eventbridge(put_ms: int):
    """EventBridge's ``time`` is whole seconds: a heartbeat put at 03:00:00.9 reads "03:00:00Z".
    Dated by the second's start it looked up to a second old, and its node was reported silent
    before the threshold had passed since it last beat (CI: 4.45 s against 4.5 s)."""
    from nodemedic.silence_sweeper import _arrived_at

    put = T0 + timedelta(milliseconds=put_ms)
    envelope = {"time": put.strftime("%Y-%m-%dT%H:%M:%SZ")}
    for queued_after_ms in (0, 3, 40):
        sent = {"Attributes": {"SentTimestamp": str(int(put.timestamp() * 1000) + queued_after_ms)}}
        roster: dict = {}
        record(roster, beat("i-00000000000000001", put)[0], _arrived_at(sent, envelope, put + timedelta(seconds=2)))
        record(roster, beat("i-00000000000000002", put)[0], _arrived_at({}, envelope, put + timedelta(seconds=2)))
        assert silent(roster, put + timedelta(seconds=45) - timedelta(milliseconds=1), 45) == []


def test_local_mode_fires_rate_schedules_and_refuses_cron():
    assert schedule_period("rate(1 minute)") == 60 and schedule_period("rate(2 hours)") == 7200
    with pytest.raises(NotImplementedError):
        schedule_period("cron(0 12 * * ? *)")


@pytest.mark.parametrize("expression", ["rate(1 hours)", "rate(5 hour)", "rate(0 minutes)", "rate(-1 minutes)",
                                        "rate(5 weeks)", "rate(5minutes)"])
def test_a_rate_eventbridge_refuses_is_refused_locally(expression: str) -> None:
    with pytest.raises(ValueError, match="ScheduleExpression is not valid"):
        schedule_period(expression)


ACCOUNT = "arn:aws:{}:us-east-1:123456789012:{}"
BUS_ARN, TABLE_ARN = ACCOUNT.format("events", "event-bus/nodemedic-local"), ACCOUNT.format("dynamodb", "table/ledger")


def _agent_policy() -> list[dict]:
    """AgentPublishPolicy with its two references resolved as CloudFormation would."""
    template = yaml_parse((Path(__file__).resolve().parents[2] / "template.yaml").read_text())
    document = json.dumps(template["Resources"]["AgentPublishPolicy"]["Properties"]["PolicyDocument"])
    document = document.replace(json.dumps({"Fn::GetAtt": ["EventBus", "Arn"]}), json.dumps(BUS_ARN))
    return [json.loads(document.replace(json.dumps({"Fn::GetAtt": ["IncidentsTable", "Arn"]}), json.dumps(TABLE_ARN)))]


@pytest.mark.parametrize(("action", "resource", "context", "allowed"), [
    ("events:PutEvents", BUS_ARN, {"events:source": ["nodemedic.agent"]}, True),
    ("events:PutEvents", BUS_ARN, {"events:source": ["nodemedic.sweeper"]}, False),  # no forged sweeper events
    ("events:PutEvents", ACCOUNT.format("events", "event-bus/default"), {"events:source": ["nodemedic.agent"]},
     False),
    ("dynamodb:GetItem", TABLE_ARN, {"dynamodb:leadingkeys": ["EVENT#nodemedic.agent/5f0c"]}, True),
    ("dynamodb:GetItem", TABLE_ARN, {"dynamodb:leadingkeys": ["EVENT#nodemedic.sweeper/5f0c"]}, False),
    ("dynamodb:GetItem", TABLE_ARN, {"dynamodb:leadingkeys": ["INCIDENT#a1"]}, False),
    ("dynamodb:PutItem", TABLE_ARN, {"dynamodb:leadingkeys": ["EVENT#nodemedic.agent/5f0c"]}, False),
    ("dynamodb:Query", TABLE_ARN, {}, False),
])
def test_the_agent_role_may_put_agent_events_on_its_bus_and_read_decisions_on_agent_events_only(
        action: str, resource: str, context: dict, allowed: bool) -> None:
    assert evaluate(_agent_policy(), Request(action, resource, context)).allowed is allowed
