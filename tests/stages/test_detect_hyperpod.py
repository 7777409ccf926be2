"""SageMaker HyperPod's health monitoring agent (HMA) as a trigger: its node health event opens an
incident where HyperPod does not repair the node itself, and only records one where it does."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from nodemedic.contracts.stages import DetectInput
from nodemedic.errors import InvalidEventError, UnknownNodeError
from nodemedic.providers.base import Member
from nodemedic.stages.detect import detect
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger

from tests.stages.memory_provider import MemoryProvider

EVENTS = Path(__file__).resolve().parents[2] / "events" / "hyperpod"
OURS = "i-0a1b2c3d4e5f60789"
PROVIDER = MemoryProvider(Member(OURS, "ip-10-1-0-17", "running"))


def _event(name: str = "node-health-unhealthy.json", **summary: str) -> dict[str, Any]:
    """The sample in AWS's documented shape, sent now with a new id."""
    event = json.loads((EVENTS / name).read_text())
    event["id"], event["time"] = str(uuid.uuid4()), datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event["detail"]["HealthSummary"].update(summary)
    return event


def _detect(event: dict[str, Any], ledger: Ledger, incident_id: str | None = None) -> Any:  # noqa: ANN401
    return detect(DetectInput(event=event, incident_id=incident_id or f"inc-{uuid.uuid4().hex[:8]}"), cluster="c1",
                  overrides_json="", provider=PROVIDER, ledger=ledger,
                  control=ControlStore(ledger._db, ledger._table, "c1"), now=datetime.now(UTC))


def test_an_unhealthy_node_hyperpod_leaves_alone_is_remediated_as_hma_advises(ledger: Ledger) -> None:
    event = _event()
    out = _detect(event, ledger, "inc-hp1")
    assert out.decision == "remediate"
    assert (out.incident.fault_code, out.incident.action, out.incident.slurm_node) == (
        "HYPERPOD_REPLACE", "replace", "ip-10-1-0-17")
    [incident] = ledger.list_incidents()
    evidence = incident.stages["detect"].result["evidence"]
    assert evidence["hma_fault"] == "NvidiaErrorTerminate" and evidence["hyperpod_cluster"] == "ml-cluster"
    assert incident.stages["detect"].result["event"] == f"aws.sagemaker/{event['id']}"
    # EventBridge delivers at least once: the same event again opens nothing
    assert _detect(event, ledger).decision == "deduplicated" and len(ledger.list_incidents()) == 1


def test_a_reason_longer_than_expected_is_cut_not_a_reason_to_refuse_the_node(ledger: Ledger) -> None:
    """HMA's reason and recommendation are text NodeMedic only shows; a longer one than any seen
    refused the whole event before, and the unhealthy node was left in service."""
    reason = "HyperPod Health Monitoring Agent (HMA) has detected fault type NvidiaErrorTerminate on this node " \
             "and is unhealthy. " + "Details: " + "x" * 5000
    out = _detect(_event(HealthStatusReason=reason, Recommendation="Please Replace the Faulty Node. " + "y" * 3000),
                  ledger)
    assert out.decision == "remediate" and out.incident.action == "replace"
    [incident] = ledger.list_incidents()
    evidence = incident.stages["detect"].result["evidence"]
    assert evidence["reason"] == reason[:1024] and evidence["hma_fault"] == "NvidiaErrorTerminate"
    with pytest.raises(InvalidEventError, match="HealthStatusReason"):  # still text, nothing else
        _detect(_event(HealthStatusReason=["not", "text"]), ledger)  # type: ignore[arg-type]


def test_a_reboot_hma_advises_starts_the_reboot_ladder(ledger: Ledger) -> None:
    out = _detect(_event(Recommendation="Reboot the node to recover it."), ledger)
    assert (out.incident.fault_code, out.incident.action, out.incident.ladder) == (
        "HYPERPOD_REBOOT", "reboot", ("reboot", "replace"))


@pytest.mark.parametrize("repair", ["Replace", "Reboot"])
def test_a_node_hyperpod_repairs_itself_is_recorded_and_left_to_it(ledger: Ledger, repair: str) -> None:
    out = _detect(_event(RepairAction=repair), ledger)
    assert out.decision == "monitor" and "HyperPod" in out.reason
    assert ledger.list_incidents() == []


def test_a_node_hyperpod_finds_healthy_again_needs_nothing(ledger: Ledger) -> None:
    with pytest.raises(InvalidEventError, match=f"HyperPod reports {OURS} Healthy: nothing to remediate"):
        _detect(_event(HealthStatus="Healthy"), ledger)
    assert ledger.list_incidents() == []


def test_an_instance_that_is_not_the_clusters_member_is_an_unknown_node(ledger: Ledger) -> None:
    event = _event()
    event["detail"]["InstanceId"] = "i-0fedcba9876543210"
    with pytest.raises(UnknownNodeError, match="not a member of cluster c1"):
        _detect(event, ledger)
    assert ledger.list_incidents() == []


@pytest.mark.parametrize(("change", "field"), [
    (lambda e: e["detail"].pop("InstanceId"), "detail.aws.sagemaker.InstanceId"),
    (lambda e: e["detail"].update(InstanceId="i-0a1b; reboot"), "detail.aws.sagemaker.InstanceId"),
    (lambda e: e["detail"].pop("HealthSummary"), "detail.aws.sagemaker.HealthSummary"),
    (lambda e: e.pop("time"), "aws.sagemaker.time"),
    (lambda e: e.update(time="2026-11-22T03:00:05"), "aws.sagemaker.time"),  # no zone: not EventBridge's
])
def test_a_malformed_hyperpod_event_is_rejected_naming_the_field_and_opens_nothing(
        ledger: Ledger, change: Any, field: str) -> None:  # noqa: ANN401
    event = _event()
    change(event)
    with pytest.raises(InvalidEventError, match="rejected event") as rejected:
        _detect(event, ledger)
    assert field.split(".")[-1] in str(rejected.value)
    assert ledger.list_incidents() == []


def test_an_hour_old_verdict_is_stale(ledger: Ledger) -> None:
    event = _event()
    event["time"] = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with pytest.raises(InvalidEventError):
        _detect(event, ledger)
    assert ledger.list_incidents() == []
