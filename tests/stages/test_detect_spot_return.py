"""Detect, for a node NodeMedic retired for a Spot stop or hibernation: once EC2 has started its
instance again, a ``NODE_JOINED`` for it opens the burn-in (the retirement's lock released)
instead of folding into the retired incident. Anything short of that (the instance not running,
a join from before EC2 stopped it, an instance EC2 terminated, a Capacity Block's end) still
folds into the retirement, as every event for a retired node does."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nodemedic.contracts.incident import Incident, StageRecord
from nodemedic.contracts.stages import DetectInput
from nodemedic.errors import InvalidEventError
from nodemedic.providers.base import Member
from nodemedic.stages.detect import detect
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger

from tests.stages.memory_provider import MemoryProvider

INSTANCE = "i-0000000000000000a"


def _retire(ledger: Ledger, *, action: str = "stop", fault: str = "PLANNED_SPOT_INTERRUPTION",
            deadline: datetime) -> Incident:
    warned = deadline - timedelta(minutes=2)
    incident = Incident(incident_id=f"inc-{uuid.uuid4().hex[:8]}", cluster="c1", instance_id=INSTANCE,
                        slurm_node="gpu-1", fault_code=fault, fault_class="planned", action="retire",
                        source="nodemedic.planned", observed_at=warned, status="open", detected_at=warned,
                        reason="planned", stages={"detect": StageRecord(started_at=warned, completed_at=warned, result={
                            "evidence": {"instance_action": action, "deadline": deadline.isoformat()}})})
    assert ledger.open_incident(incident) is None
    ledger.end(incident, "retired", warned + timedelta(seconds=40), "retired", release_node=False)
    return incident


def _joined(at: datetime) -> dict[str, Any]:
    return {"source": "nodemedic.planned", "detail-type": "Node Health Event", "time": at.isoformat(),
            "detail": {"schema_version": "1", "event_id": str(uuid.uuid4()), "cluster": "c1",
                       "node": {"instance_id": INSTANCE, "hostname": INSTANCE, "slurm_node": "gpu-1"},
                       "check": "burn_in", "fault_code": "NODE_JOINED", "severity": "warning",
                       "observed_at": at.isoformat(), "sent_at": at.isoformat(), "evidence": {}}}


def _detect(ledger: Ledger, event: dict[str, Any], state: str = "running") -> Any:
    return detect(DetectInput(event=event, incident_id=f"inc-{uuid.uuid4().hex[:8]}"), cluster="c1",
                  overrides_json="", provider=MemoryProvider(Member(INSTANCE, "gpu-1", state)), ledger=ledger,
                  control=ControlStore(ledger._db, ledger._table, "c1"), now=datetime.now(UTC))


@pytest.mark.parametrize("action", ["stop", "hibernate"])
def test_a_join_after_ec2_started_the_instance_again_opens_its_burn_in(ledger: Ledger, action: str) -> None:
    now = datetime.now(UTC)
    retired = _retire(ledger, action=action, deadline=now - timedelta(minutes=30))
    out = _detect(ledger, _joined(now))
    assert out.decision == "remediate" and out.incident is not None
    assert (out.incident.action, out.incident.fault_code) == ("burn_in", "NODE_JOINED")
    assert ledger.node_lock("c1", INSTANCE) == (out.incident.incident_id, "gpu-1")
    assert ledger.get(retired.incident_id).status == "retired"  # the ledger keeps what happened
    assert _detect(ledger, _joined(now)).decision == "deduplicated"  # a second join folds into the burn-in


@pytest.mark.parametrize(("action", "fault", "deadline_ago", "state"), [
    ("stop", "PLANNED_SPOT_INTERRUPTION", timedelta(minutes=30), "stopped"),  # not running: a forged join
    ("stop", "PLANNED_SPOT_INTERRUPTION", -timedelta(minutes=1), "running"),  # EC2 has not stopped it yet
    ("terminate", "PLANNED_SPOT_INTERRUPTION", timedelta(minutes=30), "running"),
    ("stop", "PLANNED_CAPACITY_END", timedelta(minutes=30), "running"),
], ids=["instance-stopped", "before-the-stop", "terminated", "capacity-end"])
def test_any_other_join_of_a_retired_node_folds_into_its_retirement(
        ledger: Ledger, action: str, fault: str, deadline_ago: timedelta, state: str) -> None:
    now = datetime.now(UTC)
    retired = _retire(ledger, action=action, fault=fault, deadline=now - deadline_ago)
    out = _detect(ledger, _joined(now), state=state)
    assert (out.decision, out.existing_incident_id) == ("deduplicated", retired.incident_id)
    assert ledger.node_lock("c1", INSTANCE) == (retired.incident_id, "gpu-1")


def test_the_agents_reading_of_the_notice_retires_the_node_and_eventbridges_warning_folds_into_it(
        ledger: Ledger) -> None:
    """The node's agent reads EC2's notice from instance metadata and the planned-events intake
    gets EventBridge's warning: whichever comes first opens the retire, with the deadline the
    notice gives; the other is the same interruption, folded into it."""
    from nodemedic.contracts.events import NodeIdentity
    from nodemedic_agent.events import health_event
    from nodemedic_agent.spot import SpotNotice, notice_finding

    now = datetime.now(UTC).replace(microsecond=0)
    deadline = now + timedelta(minutes=2)
    finding = notice_finding(SpotNotice("stop", deadline), now)
    assert finding is not None
    event = health_event(finding, "c1", NodeIdentity(instance_id=INSTANCE, hostname="gpu-1.local", slurm_node="gpu-1"),
                         1, now)
    from_agent = {"source": "nodemedic.agent", "detail-type": "Node Health Event", "time": now.isoformat(),
                  "detail": event.model_dump(mode="json", exclude_none=True)}
    out = _detect(ledger, from_agent)
    assert out.decision == "remediate" and out.incident is not None
    assert (out.incident.action, out.incident.fault_code) == ("retire", "PLANNED_SPOT_INTERRUPTION")
    opened = ledger.get(out.incident.incident_id)
    assert opened.deadline == deadline and opened.evidence("instance_action") == "stop"
    from_eventbridge = _joined(now)
    from_eventbridge["detail"].update(check="spot_interruption", fault_code="PLANNED_SPOT_INTERRUPTION",
                                      evidence={"instance_action": "stop", "deadline": deadline.isoformat()})
    again = _detect(ledger, from_eventbridge)
    assert again.decision == "deduplicated" and out.incident.incident_id in again.reason


def _lost(source: str = "nodemedic.reconciler", node: str = "gpu-1") -> dict[str, Any]:
    now = datetime.now(UTC)
    event = _joined(now)
    event["source"] = source
    event["detail"].update(check="spot_interruption", fault_code="INSTANCE_LOST", severity="critical",
                           event_id=f"lost-{uuid.uuid4().hex[:8]}")
    event["detail"]["node"]["slurm_node"] = node
    return event


def _detect_with(ledger: Ledger, event: dict[str, Any], *members: Member) -> Any:
    return detect(DetectInput(event=event, incident_id=f"inc-{uuid.uuid4().hex[:8]}"), cluster="c1",
                  overrides_json="", provider=MemoryProvider(*members), ledger=ledger,
                  control=ControlStore(ledger._db, ledger._table, "c1"), now=datetime.now(UTC))


@pytest.mark.parametrize("gone", [None, Member(INSTANCE, "gpu-1", "terminated")], ids=["left-the-group", "terminated"])
def test_the_reconcilers_instance_lost_replaces_a_node_whose_spot_instance_ec2_ended(
        ledger: Ledger, gone: Member | None) -> None:
    retired = _retire(ledger, action="terminate", deadline=datetime.now(UTC) - timedelta(minutes=5))
    out = _detect_with(ledger, _lost(), *([gone] if gone else []))
    assert out.decision == "remediate" and out.incident is not None
    assert (out.incident.action, out.incident.slurm_node, out.incident.instance_id) == ("replace", "gpu-1", INSTANCE)
    assert ledger.node_lock("c1", INSTANCE) == (out.incident.incident_id, "gpu-1")
    assert ledger.get(retired.incident_id).status == "retired"


@pytest.mark.parametrize(("source", "members", "said"), [
    ("nodemedic.agent", (), "is the reconciler's"),  # a node cannot have a node replaced
    ("nodemedic.reconciler", (Member(INSTANCE, "gpu-1", "running"),), "still runs"),
    ("nodemedic.reconciler", (Member("i-0000000000000000b", "gpu-1", "running"),), "backs gpu-1 already"),
], ids=["not-the-reconciler", "instance-runs", "node-backed"])
def test_an_instance_lost_that_is_not_so_is_refused_and_changes_nothing(
        ledger: Ledger, source: str, members: tuple[Member, ...], said: str) -> None:
    retired = _retire(ledger, action="terminate", deadline=datetime.now(UTC) - timedelta(minutes=5))
    with pytest.raises(InvalidEventError, match=said):
        _detect_with(ledger, _lost(source), *members)
    assert ledger.node_lock("c1", INSTANCE) == (retired.incident_id, "gpu-1")


def test_an_instance_lost_of_a_node_retired_for_a_spot_stop_folds_into_the_retirement(ledger: Ledger) -> None:
    """EC2 stops (not terminates) the instance: it comes back as itself, through its burn-in."""
    retired = _retire(ledger, action="stop", deadline=datetime.now(UTC) - timedelta(minutes=5))
    out = _detect_with(ledger, _lost())
    assert (out.decision, out.existing_incident_id) == ("deduplicated", retired.incident_id)
