"""Property: whatever an event that reaches Detect holds, Detect opens an incident, records it, or
refuses it with its reason (InvalidEventError, UnknownNodeError, UnknownNodeQuietError). No
other exception: a crash is no clear error, and the Lambda's retries would run it three times.

Every trigger sample in events/ (the agent's health events, a CloudWatch alarm, HyperPod's node
health events, the runbooks' requests) with one to three of its fields, at any depth, replaced by
a value of another JSON type or removed. The planned-event samples (AWS Health, Capacity Block,
a node's reading of its scheduled events) go through their own parser the same way."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nodemedic.contracts.aws_health import AwsHealthEnvelope
from nodemedic.contracts.capacity_block import CapacityBlockEnvelope
from nodemedic.contracts.instance_state import InstanceRunningEnvelope
from nodemedic.contracts.reservation_interruption import ReservationInterruptionEnvelope
from nodemedic.contracts.spot_interruption import NodeRebalanceEnvelope, RebalanceEnvelope, SpotInterruptionEnvelope
from nodemedic.contracts.stages import DetectInput
from nodemedic.domain.checkpoint import CheckpointPolicy, CheckpointRule
from nodemedic.errors import InvalidEventError, UnknownNodeError, UnknownNodeQuietError
from nodemedic.planned_events import (
    Plan,
    notice_kept_until,
    parse_planned_event,
    plan,
    plan_capacity_end,
    plan_node_scheduled,
    plan_reservation_interruption,
    plan_return,
    plan_spot_interruption,
)
from nodemedic.providers.base import Member
from nodemedic.rebalance import unwanted
from nodemedic.stages.detect import detect
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from tests.stages.memory_provider import MemoryProvider

EVENTS = Path(__file__).resolve().parents[2] / "events"
TRIGGERS = sorted(p for d in ("health", "alarms", "hyperpod", "runbooks") for p in (EVENTS / d).glob("*.json"))
PLANNED = sorted(p for d in ("aws-health", "aws-ec2", "scheduled-events") for p in (EVENTS / d).glob("*.json"))
REFUSALS = (InvalidEventError, UnknownNodeError, UnknownNodeQuietError)
MEMBER = Member("i-0a1b2c3d4e5f60789", "gpu-2", "running")  # the node every trigger sample names

json_values = st.one_of(
    st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=False), st.text(max_size=40),
    st.sampled_from(["", "x" * 3000, "2099-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "9999-12-31T23:59:59Z",
                     "0001-01-01T00:00:00+14:00", "2026-11-22T03:00:00", "1764000000", "Fri, 31 Dec 9999 23:59:59 GMT",
                     "ALARM", "Unhealthy",
                     "i-0123456789abcdef0", "gpu-1", "../../etc/passwd", "\ud800", "a\x00b", "\u202egpu-1"]),
    st.lists(st.one_of(st.integers(), st.text(max_size=5)), max_size=3),
    st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=8)), max_size=3))


def _paths(obj: object, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    if prefix:
        yield prefix
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        yield from _paths(value, (*prefix, key))


def _fresh(path: Path) -> dict[str, Any]:
    """The sample as sent now, with a new id, so that only the mutation can make it wrong."""
    event = json.loads(path.read_text())
    now = datetime.now(UTC)
    event["id"], event["time"] = str(uuid.uuid4()), now.strftime("%Y-%m-%dT%H:%M:%SZ")
    detail = event["detail"]
    if "observed_at" in detail:
        detail["observed_at"] = (now - timedelta(seconds=5)).isoformat()
    if "sent_at" in detail:
        detail["sent_at"] = now.isoformat()
    if "event_id" in detail:
        detail["event_id"] = uuid.uuid4().hex
    if isinstance(detail.get("state"), dict):  # a CloudWatch alarm's (an instance state change's is a word)
        detail["state"]["timestamp"] = now.strftime("%Y-%m-%dT%H:%M:%S.000+0000")
    return event


@st.composite
def mutated(draw: st.DrawFn, sample: Path) -> dict[str, Any]:
    event = _fresh(sample)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(event))))
        parent: Any = event
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
    return event


def _detect(aws: EmbeddedAWS, event: dict[str, Any]) -> str:
    """Detect on a ledger of its own, for the cluster the samples name, whose member is the node
    they name: what a mutation changes decides, not an earlier example's incident."""
    db = aws.client("dynamodb")
    table = f"incidents-{uuid.uuid4().hex[:12]}"
    db.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    try:
        out = detect(DetectInput(event=event, incident_id=f"inc-{uuid.uuid4().hex[:8]}"), cluster="local",
                     overrides_json="", provider=MemoryProvider(MEMBER), ledger=Ledger(db, table),
                     control=ControlStore(db, table, "local"), now=datetime.now(UTC))
    finally:
        db.delete_table(TableName=table)
    return out.decision


@pytest.mark.parametrize("path", TRIGGERS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_each_trigger_sample_sent_now_is_taken(aws: EmbeddedAWS, path: Path) -> None:
    """The property below starts from events Detect accepts, so a mutation is what it refuses."""
    assert _detect(aws, _fresh(path)) in ("remediate", "monitor")


@pytest.mark.parametrize("path", TRIGGERS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_an_envelope_id_too_long_for_a_ledger_key_is_refused_with_its_reason(aws: EmbeddedAWS, path: Path) -> None:
    """The envelope's id names the event's acknowledgement in the ledger: one of 3,000 characters
    (a hand-made runbook envelope) made DynamoDB refuse the key, and Detect crash, not refuse."""
    event = {**_fresh(path), "id": "x" * 3000}
    with pytest.raises(InvalidEventError, match="id"):
        _detect(aws, event)


def _strings(event: dict[str, Any]) -> Iterator[tuple[str | int, ...]]:
    for path in _paths(event):
        parent: Any = event
        for key in path:
            parent = parent[key]
        if isinstance(parent, str):
            yield path


def _with(event: dict[str, Any], path: tuple[str | int, ...], value: object) -> dict[str, Any]:
    parent: Any = event
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return event


@pytest.mark.parametrize("path", TRIGGERS + PLANNED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_lone_surrogate_anywhere_is_refused_with_its_place(aws: EmbeddedAWS, path: Path) -> None:
    """JSON's \\u escapes can write half a surrogate pair; UTF-8 cannot encode it, so DynamoDB's
    request failed and Detect crashed (an agent's evidence, an alarm's reason, a runbook's note)."""
    for where in _strings(_fresh(path)):
        event = _with(_fresh(path), where, "gpu\udc80")
        with pytest.raises(InvalidEventError, match=r"\.".join(map(str, where)) + ": not Unicode text"):
            _detect(aws, event) if path in TRIGGERS else parse_planned_event(event)


@pytest.mark.parametrize("path", TRIGGERS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_detect_decides_or_refuses_a_mutated_trigger_and_never_crashes(aws: EmbeddedAWS, path: Path) -> None:
    @settings(max_examples=80, deadline=None)
    @given(event=mutated(path))
    def check(event: dict[str, Any]) -> None:
        try:
            _detect(aws, event)
        except REFUSALS:
            pass

    check()


def _plan(event: dict[str, Any]) -> Plan:
    """What the planned-events function makes of the event, with the node the samples name as
    the cluster's member (and in the sample Capacity Block)."""
    envelope, provider, now = parse_planned_event(event), MemoryProvider(MEMBER), datetime.now(UTC)
    if isinstance(envelope, AwsHealthEnvelope):
        notice_kept_until(envelope, now)
        return plan(envelope, cluster="local", provider=provider, now=now)
    if isinstance(envelope, CapacityBlockEnvelope):
        return plan_capacity_end(envelope, cluster="local", provider=provider, instances=lambda _: [MEMBER.instance_id],
                                 now=now)
    if isinstance(envelope, SpotInterruptionEnvelope):
        return plan_spot_interruption(envelope, cluster="local", provider=provider, now=now)
    if isinstance(envelope, ReservationInterruptionEnvelope):
        return plan_reservation_interruption(envelope, cluster="local", provider=provider, now=now)
    if isinstance(envelope, InstanceRunningEnvelope):
        return plan_return(envelope, cluster="local", provider=provider, retired_by=lambda _: None, now=now)
    if isinstance(envelope, RebalanceEnvelope | NodeRebalanceEnvelope):  # no event: judged against now first
        unwanted(envelope, CheckpointPolicy(default=CheckpointRule(), rebalance=True), now)
        return Plan()
    return plan_node_scheduled(envelope, cluster="local", provider=provider, now=now)


@pytest.mark.parametrize("path", PLANNED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_mutated_planned_event_is_planned_or_refused_with_its_reason(path: Path) -> None:
    """Parsed, then planned as the planned-events function plans it: a time of year 9999, with no
    timezone, or a number (which pydantic reads as Unix time) passed an AWS Health event's parser,
    then overflowed its arithmetic or could not be compared with now."""
    @settings(max_examples=80, deadline=None)
    @given(event=mutated(path))
    def check(event: dict[str, Any]) -> None:
        try:
            _plan(event)
        except InvalidEventError:
            pass

    check()


ODD_TIMES = ["9999-12-31T23:59:59Z", "Fri, 31 Dec 9999 23:59:59 GMT", "0001-01-01T00:00:00+14:00", "2026-11-22T03:00:00",
             "1764000000", 1764000000, 1764000000.5]


def _times(event: dict[str, Any]) -> Iterator[tuple[str | int, ...]]:
    """The places of the sample's times: the envelope's, the detail's (observed_at, startTime,
    end-date, not_before...); not the agent's free-form evidence, nor an AWS Health entity's
    lastUpdatedTime, which NodeMedic does not read."""
    return (p for p in _strings(event) if "evidence" not in p and "affectedEntities" not in p
            and re.search(r"(?i)(time|date|_at|not_before|not_after)$", str(p[-1])))


@pytest.mark.parametrize("path", TRIGGERS + PLANNED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_an_odd_time_anywhere_is_refused_with_its_place(aws: EmbeddedAWS, path: Path) -> None:
    """A time of year 9999 (PutEvents lets the sender set even the envelope's), year 1, one with
    no timezone, or a number (which pydantic reads as Unix time): refused where it is. An
    envelope's year 9999 overflowed Detect's arithmetic; an AWS Health event's ISO 8601 times were
    not checked at all, so year 9999 overflowed the planning and a time with no timezone could not
    be compared with now."""
    places = list(_times(_fresh(path)))
    assert ("time",) in places
    for where in places:
        for value in ODD_TIMES:
            event = _with(_fresh(path), where, value)
            with pytest.raises(InvalidEventError, match=r"\.".join(map(str, where[1:] if where[0] == "detail" else where))):
                _detect(aws, event) if path in TRIGGERS else _plan(event)


ALARM = EVENTS / "alarms" / "ec2-status-check-failed.json"


def _alarm_on(*instances: str) -> dict[str, Any]:
    """The sample alarm, as metric math over the status check of each of ``instances``."""
    event = _fresh(ALARM)
    [metric] = event["detail"]["configuration"]["metrics"]
    event["detail"]["configuration"]["metrics"] = [
        {**metric, "id": f"m{n}", "metricStat": {**metric["metricStat"], "metric": {
            **metric["metricStat"]["metric"], "dimensions": {"InstanceId": instance}}}}
        for n, instance in enumerate(instances)] + [{"id": "e1", "expression": "MAX(METRICS())", "returnData": True}]
    return event


def test_an_alarm_over_several_instances_is_refused_not_blamed_on_its_first(aws: EmbeddedAWS) -> None:
    """Metric math over two nodes' status checks does not say which one failed: NodeMedic took the
    first metric's instance, and would have replaced a node that may be healthy."""
    assert _detect(aws, _alarm_on(MEMBER.instance_id)) == "remediate"  # one instance: as before
    with pytest.raises(InvalidEventError, match="watches 2 instances"):
        _detect(aws, _alarm_on(MEMBER.instance_id, "i-0fedcba9876543210"))


@pytest.mark.parametrize("value", ["x" * 3000, "i-../../etc", "I-0A1B2C3D4E5F60789"])
def test_an_alarm_whose_instance_dimension_is_no_instance_id_is_refused(aws: EmbeddedAWS, value: str) -> None:
    with pytest.raises(InvalidEventError, match="no EC2 instance id"):
        _detect(aws, _alarm_on(value))
