"""Planned notices waiting for their lead time, against DynamoDB in the embedded AWS (which holds
an item to DynamoDB's 400 KB): a maintenance campaign AWS schedules across a large fleet waits
whole, and what one item held before is still read and forgotten."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nodemedic.contracts.events import NodeHealthEvent, NodeIdentity
from nodemedic.store.deferred import DeferredPlans
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

NOW = datetime(2026, 11, 27, tzinfo=UTC)


@pytest.fixture
def db() -> Iterator[Any]:
    with EmbeddedAWS() as aws:
        client = aws.client("dynamodb")
        client.create_table(TableName="incidents", BillingMode="PAY_PER_REQUEST",
                            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
        yield client


@pytest.fixture
def store(db: Any) -> DeferredPlans:
    return DeferredPlans(db, "incidents", "c")


def _notice(n: int) -> NodeHealthEvent:
    """A retirement notice for node gpu-<n>, about as large as the planned-events function writes."""
    return NodeHealthEvent(
        schema_version="1", event_id=f"ev-{n:05d}", cluster="c",
        node=NodeIdentity(instance_id=f"i-{n:017x}", hostname=f"i-{n:017x}", slurm_node=f"gpu-{n}"),
        check="aws_health", fault_code="PLANNED_RETIREMENT", severity="warning", observed_at=NOW, sent_at=NOW,
        evidence={"aws_event_type": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", "deadline": (NOW + timedelta(days=14)).isoformat(),
                  "aws_event_arn": "arn:aws:health:us-east-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/" + "x" * 600})


def test_a_campaign_over_a_thousand_nodes_waits_whole_and_is_forgotten_whole(store: DeferredPlans) -> None:
    """One item held about 300 such notices; the rest were acted on at once, two weeks early, and
    tripped the breaker."""
    notices = [_notice(n) for n in range(1000)]
    assert all(store.defer(e, NOW + timedelta(days=12, minutes=n)) for n, e in enumerate(notices))
    waiting = store.waiting()
    assert [d.event.event_id for d in waiting] == [e.event_id for e in notices]  # the nearest first
    store.forget([e.event_id for e in notices[:900]])
    assert [d.event.event_id for d in store.waiting()] == [e.event_id for e in notices[900:]]


def test_a_notice_the_single_item_kept_is_read_moved_and_forgotten(store: DeferredPlans, db: Any) -> None:
    """Deployed over a version that kept every notice in DEFERRED#<cluster>: those still wait, a
    later version of one leaves no copy behind at its old time, and a published one goes."""
    old, moved = _notice(1), _notice(2)
    for event in (old, moved):
        db.update_item(TableName="incidents", Key={"pk": {"S": "DEFERRED#c"}}, UpdateExpression="SET #e = :e",
                              ExpressionAttributeNames={"#e": f"e:{event.event_id}"},
                              ExpressionAttributeValues={":e": {"M": {
                                  "act_at": {"S": NOW.isoformat()},
                                  "event": {"S": json.dumps(event.model_dump(mode="json", exclude_none=True))}}}})
    assert sorted(d.event.event_id for d in store.waiting()) == ["ev-00001", "ev-00002"]
    assert store.defer(moved, NOW + timedelta(days=3))  # AWS moved its window
    assert [(d.event.event_id, d.act_at) for d in store.waiting()] == [("ev-00001", NOW),
                                                                        ("ev-00002", NOW + timedelta(days=3))]
    store.forget(["ev-00001", "ev-00002"])
    assert store.waiting() == []
