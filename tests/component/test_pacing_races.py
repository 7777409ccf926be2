"""Many invocations of the planned-events function at once (AWS Health sends one event per
instance of a campaign, delivered together; EventBridge may deliver a sweep twice), each taking
room for planned work under the breaker, against DynamoDB in the embedded AWS from real threads:
together they never take more than the share, and none is lost (each is published or waits)."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
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
def planned_app() -> Iterator[tuple[ModuleType, Any]]:
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
        yield module, db


def notice(n: int) -> NodeHealthEvent:
    instance = f"i-{n:017x}"
    return NodeHealthEvent(schema_version="1", event_id=f"ev-{n}", cluster="c",
                           node=NodeIdentity(instance_id=instance, hostname=instance, slurm_node=f"gpu-{n}"),
                           check="aws_health", fault_code="PLANNED_RETIREMENT", severity="warning",
                           observed_at=NOW, sent_at=NOW, evidence={"deadline": NOW.isoformat()})


@pytest.mark.parametrize("invocations", [12, 30])
def test_concurrent_invocations_never_take_more_than_the_share_and_lose_nothing(
        planned_app: tuple[ModuleType, Any], invocations: int) -> None:
    app, db = planned_app
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
