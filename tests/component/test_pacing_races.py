"""Many invocations of the planned-events function at once (AWS Health sends one event per
instance of a campaign, delivered together; EventBridge may deliver a sweep twice), each taking
room for planned work under the breaker, against DynamoDB in the embedded AWS from real threads:
together they never take more than the share, and none is lost (each is published or waits). And
what the function tells the on-call about a campaign too large for its pace fits one SNS page."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from nodemedic import wiring
from nodemedic.contracts.events import NodeHealthEvent, NodeIdentity
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger
from nodemedic.store.paced import PacedReleases
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

APP = Path(__file__).parents[2] / "functions" / "planned_events" / "app.py"
NOW = datetime.now(UTC)


@pytest.fixture
def planned_app() -> Iterator[tuple[ModuleType, Any, EmbeddedAWS]]:
    # the wiring is put back before the embedded AWS stops (which resets the wiring's caches)
    with EmbeddedAWS() as aws, pytest.MonkeyPatch.context() as monkeypatch:
        db = aws.client("dynamodb")
        db.create_table(TableName="incidents", BillingMode="PAY_PER_REQUEST",
                        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
        monkeypatch.setattr(wiring, "client", lambda service: aws.client(service))
        monkeypatch.setattr(wiring, "policy", SafetyPolicy)  # the defaults: 64 nodes -> a limit of 6, a share of 3
        monkeypatch.setattr(wiring, "control", lambda: ControlStore(db, "incidents", "c"))
        monkeypatch.setattr(wiring, "ledger", lambda: Ledger(db, "incidents"))
        monkeypatch.setattr(wiring, "provider", lambda: SimpleNamespace(size=lambda: 64))
        spec = importlib.util.spec_from_file_location("planned_events_app_under_race", APP)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module, db, aws


def notice(n: int, node: str = "gpu-") -> NodeHealthEvent:
    instance = f"i-{n:017x}"
    return NodeHealthEvent(schema_version="1", event_id=f"ev-{n}", cluster="c",
                           node=NodeIdentity(instance_id=instance, hostname=instance, slurm_node=f"{node}{n}"),
                           check="aws_health", fault_code="PLANNED_RETIREMENT", severity="warning",
                           observed_at=NOW, sent_at=NOW, evidence={"deadline": NOW.isoformat()})


@pytest.mark.parametrize("invocations", [12, 30])
def test_concurrent_invocations_never_take_more_than_the_share_and_lose_nothing(
        planned_app: tuple[ModuleType, Any, EmbeddedAWS], invocations: int) -> None:
    app, db, _ = planned_app
    settings = SimpleNamespace(fault_action_overrides="{}", incidents_table="incidents", cluster_name="c")
    start = threading.Barrier(invocations)
    results: dict[int, tuple[list[str], list[str]]] = {}

    def invoke(n: int) -> None:
        pacer = app.Pacer(settings, app.timedelta(minutes=60), NOW)
        pacer._facts  # noqa: B018 - read the policy and control state before the race, as each invocation does
        start.wait()
        go, wait = pacer.take([notice(n)])
        results[n] = ([e.event_id for e in go], [e.event_id for e in wait])

    threads = [threading.Thread(target=invoke, args=(n,)) for n in range(invocations)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == invocations  # every invocation answered
    published = sorted(i for go, _ in results.values() for i in go)
    waiting = sorted(i for _, wait in results.values() for i in wait)
    assert len(published) == 3, published  # the share: never more, whatever the interleaving
    assert sorted(published + waiting) == sorted(f"ev-{n}" for n in range(invocations))  # nothing lost
    recorded = PacedReleases(db, "incidents", "c").read().releases
    assert sorted(recorded) == published  # what was published is what the next invocation counts


def test_a_campaign_of_late_notices_too_many_to_name_is_told_in_one_page_sns_takes(
        planned_app: tuple[ModuleType, Any, EmbeddedAWS]) -> None:
    """900 notices late at once, on nodes with long (Kubernetes) names: named all, the page was
    over SNS's 256 KB, refused at every sweep (each took its announcement back and failed), and
    nobody was told. Now the nearest 50 are named and the rest counted; each is told once."""
    app, _, aws = planned_app
    sns, sqs = aws.client("sns"), aws.client("sqs")
    topic = sns.create_topic(Name="escalation")["TopicArn"]
    queue = sqs.create_queue(QueueName="escalation")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    late = [notice(n, node="ip-10-0-1-17." + "a" * 230 + "-") for n in range(900)]
    app._announce_late(late, "3 node(s) every 120 min", "3 of 3 planned node(s)", "c", topic, NOW)
    app._announce_late(late, "3 node(s) every 120 min", "3 of 3 planned node(s)", "c", topic, NOW)  # a later sweep
    [page] = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    message = json.loads(page["Body"])["Message"]
    assert "cannot act on 900 planned event(s) of cluster c" in message and "; and 850 more." in message
    assert len(message.encode()) < 64 * 1024


def test_a_notice_a_later_delivery_kept_counts_in_the_queue_an_earlier_one_reads(
        planned_app: tuple[ModuleType, Any, EmbeddedAWS]) -> None:
    """A campaign's deliveries run at once. One that began later keeps its notice to wait for
    room with its own start as the time to act; read as of the earlier delivery's start, that
    notice was not due, and each delivery missed the other's in the late check."""
    app, db, _ = planned_app
    store = app.DeferredPlans(db, "incidents", "c")
    began = datetime.now(UTC)  # this delivery's start
    time.sleep(0.01)
    store.defer(notice(1), datetime.now(UTC))  # the other delivery, begun later, keeps its own
    store.defer(notice(2), began)  # this one keeps its own
    store.defer(notice(3), datetime.now(UTC) + timedelta(hours=5))  # waits for its lead time: not room
    assert sorted(e.event_id for e in app._room_queue(store, [notice(2)])) == ["ev-1", "ev-2"]
