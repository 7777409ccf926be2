"""The fast tier: stages against the in-memory Slurm and the ledger in the embedded DynamoDB."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nodemedic.contracts.incident import Incident, Rung
from nodemedic.store.ledger import Ledger
from nodemedic_sandbox.deploy import create_table_as_declared
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from tests.stages.memory_slurm import MemorySlurm

PREFIX = "nodemedic"
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAWS]:
    with EmbeddedAWS() as embedded:
        yield embedded


@pytest.fixture
def ledger(aws: EmbeddedAWS) -> Ledger:
    db = aws.client("dynamodb")
    name = f"incidents-{next(_ids)}"
    return Ledger(db, create_table_as_declared(db, name))


@pytest.fixture
def slurm() -> MemorySlurm:
    return MemorySlurm([f"gpu-{i}" for i in range(1, 5)] + ["spare-1"], spares=("spare-1",))


def opened(ledger: Ledger, node: str = "gpu-1", *, instance: str = "", minutes_ago: float = 0,
           ladder: tuple[Rung, ...] = ()) -> Incident:
    """An incident opened for ``node`` (instance ``i-<node>`` unless given), with its lock."""
    at = datetime.now(UTC) - timedelta(minutes=minutes_ago)
    incident = Incident(incident_id=f"inc-{next(_ids)}", cluster="c1", instance_id=instance or f"i-{node}",
                        slurm_node=node, fault_code="XID 79", fault_class="gpu_lost", action="replace",
                        source="test", observed_at=at, status="open", detected_at=at, reason="test", ladder=ladder)
    assert ledger.open_incident(incident) is None
    return incident


def clock() -> datetime:
    return datetime.now(UTC)


@contextmanager
def index_lag(db: Any, *, listed: Sequence[str] = (), unlisted: Sequence[str] = ()) -> Iterator[None]:
    """DynamoDB's index as it may lag on AWS (moto's is always current): its queries still list
    the keys ``listed`` (items gone or changed since) and do not list ``unlisted`` yet."""
    def lagging(parsed: dict[str, Any], **_: Any) -> None:
        parsed["Items"] = [i for i in parsed.get("Items", []) if i["pk"]["S"] not in unlisted] + \
            [{"pk": {"S": k}} for k in listed]

    db.meta.events.register("after-call.dynamodb.Query", lagging)
    try:
        yield
    finally:
        db.meta.events.unregister("after-call.dynamodb.Query", lagging)
