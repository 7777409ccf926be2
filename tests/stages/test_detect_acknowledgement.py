"""Detect records its decision on each event it decides on, where the agent that sent it reads it
(through the agent's own reader and key): the acknowledgement that stops the agent sending the
event again. An event naming an unknown node is not acknowledged: that node may join later."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nodemedic.contracts.stages import DetectInput
from nodemedic.errors import InvalidEventError, UnknownNodeError
from nodemedic.providers.base import Member
from nodemedic.stages.detect import detect
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger
from nodemedic_agent.acknowledgements import Acknowledgements

from tests.stages.memory_provider import MemoryProvider

PROVIDER = MemoryProvider(Member("i-0000000000000000a", "gpu-1", "running"))


def _event(fault_code: str = "XID 79", *, node: str = "gpu-1", instance: str = "i-0000000000000000a",
           cluster: str = "c1") -> dict[str, Any]:
    now = datetime.now(UTC)
    return {"source": "nodemedic.agent", "detail-type": "Node Health Event", "time": now.isoformat(),
            "detail": {"schema_version": "1", "event_id": str(uuid.uuid4()), "cluster": cluster,
                       "node": {"instance_id": instance, "hostname": f"{node}.local", "slurm_node": node},
                       "check": "kernel_log", "component": {"kind": "gpu", "index": 0}, "fault_code": fault_code,
                       "severity": "critical", "observed_at": (now - timedelta(seconds=2)).isoformat(),
                       "sent_at": now.isoformat(), "evidence": {}}}


def _detect(event: dict[str, Any], ledger: Ledger) -> str:
    out = detect(DetectInput(event=event, incident_id=f"inc-{uuid.uuid4().hex[:8]}"), cluster="c1",
                 overrides_json="", provider=PROVIDER, ledger=ledger,
                 control=ControlStore(ledger._db, ledger._table, "c1"), now=datetime.now(UTC))
    return out.decision


def _acknowledged(event: dict[str, Any], ledger: Ledger) -> str | None:
    return Acknowledgements(ledger._db, ledger._table).decision(event["detail"]["event_id"])


def test_every_decision_is_acknowledged_to_the_agent(ledger: Ledger) -> None:
    fault, second, monitored = _event(), _event("XID 48"), _event("XID154_NONE")
    assert _acknowledged(fault, ledger) is None  # not decided yet: the agent sends it again
    assert _detect(fault, ledger) == "remediate" and _acknowledged(fault, ledger) == "remediate"
    assert _detect(second, ledger) == "deduplicated" and _acknowledged(second, ledger) == "deduplicated"
    assert _detect(monitored, ledger) == "monitor" and _acknowledged(monitored, ledger) == "monitor"
    assert _detect(fault, ledger) == "deduplicated"  # sent again after all: nothing new
    assert len(ledger.list_incidents()) == 1


def test_a_rejected_event_is_acknowledged_an_unknown_node_is_not(ledger: Ledger) -> None:
    elsewhere, stranger = _event(cluster="c2"), _event(node="gpu-9", instance="i-0000000000000000f")
    with pytest.raises(InvalidEventError, match="for cluster c2"):
        _detect(elsewhere, ledger)
    assert _acknowledged(elsewhere, ledger) == "rejected"  # sending it again changes nothing
    with pytest.raises(UnknownNodeError):
        _detect(stranger, ledger)
    assert _acknowledged(stranger, ledger) is None
    assert ledger.list_incidents() == []
