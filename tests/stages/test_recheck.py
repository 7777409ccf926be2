"""A fault the gate holds for its node's cooldown is not forgotten: once the cooldown ends, the
reconciler offers it to Detect again, which decides it from the held incident's record.

Before, the hold ended the incident and nothing remembered the fault. A polled check reports its
fault again, but a one-off Xid line (a GPU fallen off the bus) or an alarm's change of state is
never sent twice: the node stayed in service with it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st
from nodemedic.contracts.events import RECONCILER_SOURCE, NodeHealthEvent
from nodemedic.contracts.incident import Recheck
from nodemedic.contracts.stages import DetectInput, DetectOutput
from nodemedic.errors import InvalidEventError
from nodemedic.providers.base import Member
from nodemedic.reconciler import RECHECK_OFFERS, ReconcileReport, reconcile
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.stages.detect import detect
from nodemedic.stages.gate import gate
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger
from nodemedic_sandbox.deploy import create_table_as_declared
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from tests.stages.conftest import PREFIX
from tests.stages.memory_provider import MemoryProvider
from tests.stages.memory_slurm import MemorySlurm
from tests.stages.test_detect_hostile_input import ALARM, REFUSALS, _fresh, _paths, json_values

INSTANCE = "i-0000000000000000a"
COOLDOWN = timedelta(minutes=30)


class World:
    """One node, remediated ``minutes_ago`` (its slot's lineage), and a clock the test moves."""

    def __init__(self, ledger: Ledger, slurm: MemorySlurm, *, remediated_minutes_ago: float = 10,
                 policy: SafetyPolicy | None = None) -> None:
        self.ledger, self.slurm = ledger, slurm
        self.provider = MemoryProvider(Member(INSTANCE, "gpu-1", "running"))
        self.control = ControlStore(ledger._db, ledger._table, "c1")
        self.now = datetime.now(UTC)
        self.remediated = self.now - timedelta(minutes=remediated_minutes_ago)
        self.control.append_lineage(["node:gpu-1"], "inc-earlier", self.remediated)
        self.policy = policy or SafetyPolicy()
        self.published: list[NodeHealthEvent] = []

    def detect(self, event: dict[str, Any]) -> DetectOutput:
        return detect(DetectInput(event=event, incident_id=f"inc-{uuid.uuid4().hex[:8]}"), cluster="c1",
                      overrides_json="", provider=self.provider, ledger=self.ledger, control=self.control, now=self.now)

    def gate(self, out: DetectOutput) -> str:
        assert out.incident is not None
        return gate(out.incident, load_policy=lambda: self.policy, provider=self.provider, control=self.control,
                    ledger=self.ledger, clock=lambda: self.now).verdict

    def hold(self, event: dict[str, Any] | None = None) -> DetectOutput:
        """Detect ``event`` (an agent's Xid 79 unless given); the gate holds it for the cooldown."""
        out = self.detect(event or self.agent_event())
        assert out.incident is not None and self.gate(out) == "hold"
        return out

    def past_cooldown(self) -> None:
        self.now = self.remediated + COOLDOWN + timedelta(minutes=1)

    def reconcile(self) -> ReconcileReport:
        return reconcile(cluster="c1", ledger=self.ledger, orchestrator=self.slurm,
                         execution_status=lambda i: "RUNNING", prefix=PREFIX, now=self.now,
                         publish=self.published.append)

    def agent_event(self, fault_code: str = "XID 79", source: str = "nodemedic.agent") -> dict[str, Any]:
        at = self.now
        return {"source": source, "detail-type": "Node Health Event", "time": at.isoformat(),
                "detail": {"schema_version": "1", "event_id": str(uuid.uuid4()), "cluster": "c1",
                           "node": {"instance_id": INSTANCE, "hostname": "gpu-1", "slurm_node": "gpu-1"},
                           "check": "kernel_log", "fault_code": fault_code, "severity": "critical",
                           "observed_at": (at - timedelta(seconds=3)).isoformat(), "sent_at": at.isoformat(),
                           "evidence": {"pid": 4242}}}

    def on_the_bus(self, event: NodeHealthEvent) -> dict[str, Any]:
        """``event`` as EventBridge delivers it, entered the bus now."""
        return {"source": RECONCILER_SOURCE, "detail-type": "Node Health Event", "time": self.now.isoformat(),
                "detail": event.model_dump(mode="json", exclude_none=True)}

    def rechecks(self) -> list[Recheck]:
        return self.ledger.bookkeeping("c1", self.now).rechecks


@contextmanager
def drops_refused(ledger: Ledger) -> Iterator[None]:
    """DynamoDB throttles every delete of a recheck (past the SDK's retries)."""
    def refuse(params: dict[str, Any], **_: Any) -> None:
        if params.get("Key", {}).get("pk", {}).get("S", "").startswith("RECHECK#"):
            raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}},
                              "DeleteItem")

    ledger._db.meta.events.register("provide-client-params.dynamodb.DeleteItem", refuse)
    try:
        yield
    finally:
        ledger._db.meta.events.unregister("provide-client-params.dynamodb.DeleteItem", refuse)


@pytest.fixture
def world(ledger: Ledger, slurm: MemorySlurm) -> World:
    return World(ledger, slurm)


def test_a_fault_the_cooldown_held_is_decided_again_when_the_cooldown_ends(world: World) -> None:
    held = world.hold()
    assert held.incident is not None
    incident = world.ledger.get(held.incident.incident_id)
    assert incident.status == "held" and "decided again after" in incident.outcome
    [recheck] = world.rechecks()
    assert recheck.due == world.remediated + COOLDOWN

    assert world.reconcile().rechecks_offered == [] and world.published == []  # the cooldown goes on
    world.now = recheck.due + timedelta(seconds=1)
    assert world.reconcile().rechecks_offered == ["gpu-1"]
    [offer] = world.published
    out = world.detect(world.on_the_bus(offer))
    assert out.decision == "remediate" and out.recheck_of == incident.incident_id
    assert out.incident is not None
    # the fault as it was held: its code, its source, its time (not the offer's), its evidence
    assert (out.incident.fault_code, out.incident.source, out.incident.observed_at) == \
        (incident.fault_code, "nodemedic.agent", incident.observed_at)
    assert world.ledger.get(out.incident.incident_id).evidence("pid") == 4242
    assert world.gate(out) == "proceed"  # no longer within the cooldown: the node is remediated
    assert world.rechecks() == []  # decided: nothing is offered again
    assert world.reconcile().rechecks_offered == [] and len(world.published) == 1
    assert world.detect(world.on_the_bus(offer)).decision == "deduplicated"  # EventBridge delivers it twice


def test_a_polled_check_reporting_its_fault_again_keeps_one_recheck_per_node_and_code(world: World) -> None:
    world.hold()
    world.now += timedelta(minutes=5)
    again = world.hold()
    other = world.hold(world.agent_event("XID 48"))
    assert again.incident is not None and other.incident is not None
    assert sorted((r.fault_code, r.incident_id) for r in world.rechecks()) == \
        [("XID 48", other.incident.incident_id), ("XID 79", again.incident.incident_id)]


def test_a_fault_held_in_a_later_cooldown_is_not_lost_with_an_earlier_offer(world: World) -> None:
    """Detect decided the first offer but could not drop its recheck; the node was remediated
    again, and the same fault held in the new cooldown. The reconciler, finding the first offer
    decided, dropped the recheck, and with it the fault held later. The latest hold now replaces
    the recheck, never offered yet."""
    world.hold()
    world.past_cooldown()
    world.reconcile()
    with drops_refused(world.ledger):
        remediated = world.detect(world.on_the_bus(world.published[0]))
    assert remediated.incident is not None and world.gate(remediated) == "proceed"  # the node's new cooldown
    world.ledger.close(remediated.incident, world.now)

    world.now += timedelta(minutes=5)
    later = world.hold()
    assert later.incident is not None
    assert [r.incident_id for r in world.rechecks()] == [later.incident.incident_id]
    world.now += COOLDOWN
    assert world.reconcile().rechecks_offered == ["gpu-1"]
    offer = world.detect(world.on_the_bus(world.published[-1]))
    assert offer.decision == "remediate" and offer.recheck_of == later.incident.incident_id


def test_a_lone_ambiguous_fault_offered_again_does_not_corroborate_itself(world: World) -> None:
    """Offered under the reconciler's name, a lone heartbeat miss would have had a "second source"
    (the reconciler) and skipped the deep check that must come before any destructive action."""
    world.hold(world.agent_event("HEARTBEAT_MISSING", source="nodemedic.sweeper"))
    world.past_cooldown()
    world.reconcile()
    out = world.detect(world.on_the_bus(world.published[0]))
    assert out.incident is not None and out.incident.source == "nodemedic.sweeper"
    assert world.gate(out) == "verify"


def test_an_offer_put_on_the_bus_before_the_cooldown_ends_is_refused_and_the_recheck_kept(world: World) -> None:
    world.hold()
    [recheck] = world.rechecks()
    from nodemedic.reconciler import recheck_event
    early = recheck_event(recheck, INSTANCE, world.now)
    with pytest.raises(InvalidEventError, match="not before"):
        world.detect(world.on_the_bus(early))
    forged = early.model_copy(update={"evidence": {"recheck_of": "inc-someone-else"}})
    with pytest.raises(InvalidEventError, match="no recheck of incident inc-someone-else"):
        world.detect(world.on_the_bus(forged))
    assert world.rechecks() == [recheck]
    world.now = recheck.due + timedelta(seconds=1)
    assert world.detect(world.on_the_bus(early)).decision == "remediate"  # the same offer, once due


def test_a_fault_older_than_the_nodes_last_repair_is_refused_and_dropped(world: World) -> None:
    world.hold()
    world.past_cooldown()
    world.reconcile()
    repaired = world.detect(world.agent_event("XID 48"))  # a later fault, remediated and closed meanwhile
    assert repaired.incident is not None
    world.ledger.close(repaired.incident, world.now)
    with pytest.raises(InvalidEventError, match="predates the node's last completed repair"):
        world.detect(world.on_the_bus(world.published[0]))
    assert world.rechecks() == []


def test_a_recheck_of_an_instance_that_left_the_cluster_is_dropped_without_a_page(world: World) -> None:
    world.hold()
    world.past_cooldown()
    world.reconcile()
    world.provider.by_id = {"i-0000000000000000b": Member("i-0000000000000000b", "gpu-1", "running")}  # replaced
    with pytest.raises(InvalidEventError, match="no longer backs gpu-1"):
        world.detect(world.on_the_bus(world.published[0]))
    assert world.rechecks() == []


def test_a_recheck_never_decided_is_offered_a_few_times_then_paged_and_dropped(world: World) -> None:
    world.hold()
    world.past_cooldown()
    for _ in range(RECHECK_OFFERS):  # each event lost on its way (its execution failed, say)
        assert world.reconcile().rechecks_offered == ["gpu-1"]
    report = world.reconcile()
    assert report.rechecks_given_up == ["gpu-1"] and "never decided" in report.pages[0]
    assert world.rechecks() == [] and len(world.published) == RECHECK_OFFERS
    assert world.reconcile().pages == []


@pytest.mark.parametrize("mode", ["dry_run", "manual", "planned"])
def test_what_is_not_offered_again(ledger: Ledger, slurm: MemorySlurm, mode: str) -> None:
    """A dry run holds nothing; an operator's request is the operator's to repeat; planned work is
    offered again by the planned-events sweep itself."""
    world = World(ledger, slurm, policy=SafetyPolicy(mode="dry_run") if mode == "dry_run" else None)
    if mode == "manual":
        event = {"source": "nodemedic.operator", "detail-type": "Remediation Request", "time": world.now.isoformat(),
                 "detail": {"schema_version": "1", "cluster": "c1", "slurm_node": "gpu-1", "action": "reboot",
                            "reason": "operator sees NCCL hangs", "requested_by": "alice"}}
    else:
        event = world.agent_event("PLANNED_REBOOT" if mode == "planned" else "XID 79",
                                  source="nodemedic.planned" if mode == "planned" else "nodemedic.agent")
    out = world.detect(event)
    assert world.gate(out) == ("dry_run" if mode == "dry_run" else "hold")
    assert world.rechecks() == []


def test_a_recheck_detect_decided_but_could_not_drop_is_dropped_by_the_next_run(world: World) -> None:
    """Dropping it in Detect failed (DynamoDB throttled past the SDK's retries): the incident Detect
    opened stands, and the reconciler, finding the offer decided, drops the recheck without
    offering it again or paging."""
    world.hold()
    world.past_cooldown()
    world.reconcile()

    with drops_refused(world.ledger):
        out = world.detect(world.on_the_bus(world.published[0]))
    assert out.decision == "remediate" and len(world.rechecks()) == 1
    report = world.reconcile()
    assert report.rechecks_offered == [] and report.pages == [] and world.rechecks() == []
    assert len(world.published) == 1


def test_a_mutated_offer_decides_the_held_fault_as_it_was_or_is_refused(aws: EmbeddedAWS, slurm: MemorySlurm) -> None:
    """Whatever an offer on the bus holds (one to three of its fields, at any depth, replaced by a
    value of another JSON type or removed), Detect refuses it with its reason or decides the fault
    the cooldown held, unchanged: an offer names the held incident, it cannot change its fault."""
    @settings(max_examples=60, deadline=None)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        db = aws.client("dynamodb")
        world = World(Ledger(db, create_table_as_declared(db, f"incidents-{uuid.uuid4().hex[:12]}")), slurm)
        try:
            held = world.hold()
            world.past_cooldown()
            world.reconcile()
            offer = world.on_the_bus(world.published[0])
            for _ in range(data.draw(st.integers(1, 3))):
                path = data.draw(st.sampled_from(list(_paths(offer))))
                parent: Any = offer
                for key in path[:-1]:
                    parent = parent[key]
                if isinstance(parent, dict) and data.draw(st.booleans()):
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = data.draw(json_values)
            try:
                out = world.detect(offer)
            except REFUSALS:
                return
            if out.incident is not None:
                assert (out.incident.fault_code, out.incident.source, out.incident.observed_at,
                        out.incident.slurm_node, out.incident.instance_id) == \
                    (held.incident.fault_code, held.incident.source, held.incident.observed_at,
                     held.incident.slurm_node, held.incident.instance_id)
        finally:
            db.delete_table(TableName=world.ledger._table)

    check()


def test_an_alarm_the_cooldown_held_is_decided_again_as_the_alarm(world: World) -> None:
    """A CloudWatch alarm says ALARM once, on its change of state: held by the cooldown, the node's
    failed status check was never seen again. Offered again, it is still the alarm's fault."""
    alarm = _fresh(ALARM)  # the sample's node is gpu-2 on cluster "local": here, this world's node
    alarm["detail"]["configuration"]["metrics"][0]["metricStat"]["metric"]["dimensions"]["InstanceId"] = INSTANCE
    alarm["detail"]["state"]["timestamp"] = world.now.strftime("%Y-%m-%dT%H:%M:%S.000+0000")
    held = world.hold(alarm)
    assert held.incident is not None and held.incident.source == "aws.cloudwatch"
    world.past_cooldown()
    world.reconcile()
    out = world.detect(world.on_the_bus(world.published[0]))
    assert out.incident is not None and out.recheck_of == held.incident.incident_id
    assert (out.incident.source, out.incident.fault_code) == ("aws.cloudwatch", held.incident.fault_code)


def test_an_offer_eventbridge_refused_is_said_and_made_again_at_the_next_run(world: World) -> None:
    world.hold()
    world.past_cooldown()

    def refused(event: NodeHealthEvent) -> None:
        raise RuntimeError("PutEvents: 1 of 1 nodemedic.reconciler events were not put on the bus: ThrottlingException")

    report = reconcile(cluster="c1", ledger=world.ledger, orchestrator=world.slurm, execution_status=lambda i: "RUNNING",
                       prefix=PREFIX, now=world.now, publish=refused)
    assert report.rechecks_offered == [] and "cannot offer again the XID 79" in report.errors[0]
    world.now += timedelta(minutes=5)
    assert world.reconcile().rechecks_offered == ["gpu-1"]
    assert world.detect(world.on_the_bus(world.published[0])).decision == "remediate"


def test_a_recheck_naming_an_incident_the_ledger_lacks_is_dropped_and_said(world: World) -> None:
    world.hold()
    [recheck] = world.rechecks()
    world.ledger._db.delete_item(TableName=world.ledger._table, Key={"pk": {"S": f"INCIDENT#{recheck.incident_id}"}})
    world.now = recheck.due + timedelta(seconds=1)
    report = world.reconcile()
    assert "not in the ledger: dropped" in report.errors[0] and report.rechecks_offered == []
    assert world.rechecks() == [] and world.reconcile().errors == []
