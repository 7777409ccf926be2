"""AWS Health scheduled changes (events/aws-health/, in the shapes AWS documents) become one Node
Health Event per affected node of this cluster, and nothing for anything else, with the reason."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from nodemedic.contracts.incident import Incident, StageRecord
from nodemedic.contracts.reservation_interruption import ReservationInterruptionEnvelope
from nodemedic.contracts.spot_interruption import NodeRebalanceEnvelope, RebalanceEnvelope
from nodemedic.domain.classification import classify, parse_overrides
from nodemedic.errors import InvalidEventError
from nodemedic.orchestrators.base import RunningJob
from nodemedic.planned_events import (
    act_at,
    moot,
    parse_planned_event,
    plan,
    plan_capacity_end,
    plan_node_scheduled,
    plan_reservation_interruption,
    plan_return,
    plan_scheduled,
    plan_spot_interruption,
    released,
    slack,
)
from nodemedic.providers.base import Member
from nodemedic.stages.detect import parse_trigger

SAMPLES = Path(__file__).resolve().parents[2] / "events" / "aws-health"
RETIREMENT = json.loads((SAMPLES / "ec2-instance-retirement-scheduled.json").read_text())
REBOOT = json.loads((SAMPLES / "ec2-instance-reboot-maintenance-scheduled.json").read_text())
NOW = datetime(2026, 11, 22, 3, 0, 5, tzinfo=UTC)
HOURLY = timedelta(hours=1)  # the planned-events sweep's default period (PlannedSweepMinutes)
OURS, THEIRS = "i-0a1b2c3d4e5f60789", "i-0fedcba9876543210"


class _Cluster:
    """The provider's view: one member, ours, backing gpu-2; one joining instance with no node."""

    kind = "test"

    def member(self, instance_id: str) -> Member | None:
        if instance_id == OURS:
            return Member(OURS, "gpu-2", "running")
        return Member(instance_id, None, "running") if instance_id == "i-0123456789abcdef0" else None


def _plan(event: dict[str, Any]) -> Any:
    return plan(parse_planned_event(event), cluster="local", provider=_Cluster(), now=NOW)  # type: ignore[arg-type]


def test_the_documented_samples_parse_with_their_rfc1123_times() -> None:
    parsed = parse_planned_event(RETIREMENT)
    assert parsed.detail.startTime == datetime(2026, 12, 6, tzinfo=UTC)
    assert parsed.detail.endTime == datetime(2026, 12, 6, 4, tzinfo=UTC)
    assert [e.entityValue for e in parse_planned_event(REBOOT).detail.affectedEntities] == [OURS, THEIRS]


def test_a_retirement_of_a_member_becomes_its_nodes_health_event_which_detect_replaces() -> None:
    planned = _plan(RETIREMENT)
    [event] = planned.events
    assert (event.node.instance_id, event.node.slurm_node, event.fault_code) == (OURS, "gpu-2", "PLANNED_RETIREMENT")
    assert event.evidence["deadline"] == "2026-12-06T00:00:00+00:00"
    envelope = {"source": "nodemedic.planned", "detail-type": "Node Health Event",
                "detail": json.loads(event.model_dump_json(exclude_none=True))}
    assert parse_trigger(envelope).detail.fault_code == "PLANNED_RETIREMENT"  # type: ignore[union-attr]
    assert classify("PLANNED_RETIREMENT", {}).action == "replace"
    assert classify("PLANNED_REBOOT", {}).action == "reboot"
    assert classify("PLANNED_NETWORK_MAINTENANCE", {}).action == "monitor"


def test_the_same_health_event_again_gives_the_same_event_id_and_each_node_its_own() -> None:
    first, again = _plan(RETIREMENT).events[0], _plan(copy.deepcopy(RETIREMENT)).events[0]
    assert first.event_id == again.event_id  # a redelivery or update: Detect deduplicates it
    other = copy.deepcopy(RETIREMENT)
    other["detail"]["eventArn"] += "-2"
    assert _plan(other).events[0].event_id != first.event_id


def test_resources_that_are_not_nodes_of_this_cluster_are_ignored_with_the_reason() -> None:
    event = copy.deepcopy(REBOOT)
    event["detail"]["affectedEntities"] += [{"entityValue": "i-0123456789abcdef0"},
                                            {"entityValue": "arn:aws:ec2:us-east-1:123456789012:volume/vol-1"},
                                            {"entityValue": "i-0aaaaaaaaaaaaaaaa", "statusCode": "RESOLVED"}]
    planned = _plan(event)
    assert [e.node.slurm_node for e in planned.events] == ["gpu-2"]
    assert dict(planned.ignored) == {
        THEIRS: "not a member of cluster local",
        "i-0123456789abcdef0": "backs no node of the cluster's scheduler",
        "arn:aws:ec2:us-east-1:123456789012:volume/vol-1": "not an EC2 instance id",
        "i-0aaaaaaaaaaaaaaaa": "AWS marks it resolved"}


@pytest.mark.parametrize("resource", [OURS, f"arn:aws:ec2:us-east-1:123456789012:instance/{OURS}"])
def test_a_notice_without_affected_entities_acts_on_the_instances_its_resources_name(resource: str) -> None:
    """AWS's schema requires neither list; a notice naming its instance only in ``resources`` was
    planned as nothing at all, and said nothing."""
    event = copy.deepcopy(RETIREMENT)
    event["resources"], event["detail"]["affectedEntities"] = [resource], []
    assert [e.node.instance_id for e in _plan(event).events] == [OURS]
    event["resources"] = []
    planned = _plan(event)
    assert planned.events == [] and [why for _, why in planned.ignored] == ["names no affected resource"]


def test_an_affected_entity_named_by_its_ec2_arn_is_that_instance() -> None:
    """An entity may name its instance by ARN, as ``resources`` do: that notice was ignored as
    "not an EC2 instance id", and the retirement hit the job like a crash."""
    event = copy.deepcopy(RETIREMENT)
    event["detail"]["affectedEntities"][0]["entityValue"] = f"arn:aws:ec2:us-east-1:123456789012:instance/{OURS}"
    [planned] = _plan(event).events
    assert planned.node.instance_id == OURS and planned.event_id == _plan(RETIREMENT).events[0].event_id
    event["detail"]["affectedEntities"][0]["entityValue"] = f"arn:aws:ec2:us-east-1:123456789012:volume/vol-0abc{OURS}"
    assert _plan(event).events == []


@pytest.mark.parametrize(("change", "why"), [
    ({"statusCode": "closed"}, "is closed"),
    ({"endTime": "Sun, 22 Nov 2026 02:00:00 GMT"}, "window ended"),
    ({"eventTypeCode": "AWS_EC2_OPERATIONAL_ISSUE"}, "not a scheduled change"),
    # no window end, its date long past: an archive replayed after Detect's memory of it lapsed
    ({"endTime": None, "startTime": "Fri, 06 Nov 2026 00:00:00 GMT"}, "passed more than 15 days ago"),
])
def test_a_closed_past_or_other_event_plans_nothing(change: dict[str, str], why: str) -> None:
    event = copy.deepcopy(RETIREMENT)
    event["detail"].update(change)
    planned = _plan(event)
    assert not planned.events and why in planned.ignored[0][1]


def test_a_retirement_whose_date_passed_days_ago_is_still_acted_on() -> None:
    """AWS stops a retiring instance some time after the date: a node still running it goes."""
    event = copy.deepcopy(RETIREMENT)
    event["detail"].update({"endTime": None, "startTime": "Fri, 20 Nov 2026 00:00:00 GMT", "statusCode": "open"})
    assert [e.node.slurm_node for e in _plan(event).events] == ["gpu-2"]


@pytest.mark.parametrize(("path", "value"), [
    (("detail", "startTime"), "next Tuesday"),
    (("detail", "startTime"), "Thu, 01 Jan 1970 00:00:00 GMT"),
    (("detail", "startTime"), None),
    (("detail", "eventArn"), "not-an-arn"),
    (("detail", "eventTypeCode"), "x" * 200),
    (("detail", "affectedEntities"), [{"entityValue": ""}]),
    (("source",), "nodemedic.agent"),
])
def test_a_malformed_health_event_is_rejected_with_the_field(path: tuple[str, ...], value: Any) -> None:
    with pytest.raises(InvalidEventError, match=path[-1]):
        parse_planned_event(_with(RETIREMENT, path, value))


# -- a Capacity Block's end (events/aws-ec2/, the shape in EC2's "Monitor Capacity Blocks") -------
BLOCK_END = json.loads((SAMPLES.parent / "aws-ec2" / "capacity-block-expiration-warning.json").read_text())
BLOCK = "cr-0a1b2c3d4e5f60718"
WARNED = datetime(2026, 11, 22, 10, 20, 5, tzinfo=UTC)


def _plan_block(event: dict[str, Any], running: dict[str, list[str]], now: datetime = WARNED) -> Any:
    return plan_capacity_end(parse_planned_event(event), cluster="local", provider=_Cluster(),  # type: ignore[arg-type]
                             instances=lambda block: running.get(block, []), now=now)


@pytest.mark.parametrize("detail_type", ["Capacity Block Expiration Warning",
                                         "Capacity Block Reservation Expiration Warning"])
def test_a_capacity_block_warning_in_either_documented_spelling_retires_the_blocks_nodes(detail_type: str) -> None:
    event = {**copy.deepcopy(BLOCK_END), "detail-type": detail_type}
    planned = _plan_block(event, {BLOCK: [OURS, THEIRS, "i-0123456789abcdef0"]})
    [retire] = planned.events
    assert (retire.node.instance_id, retire.node.slurm_node, retire.fault_code) == (OURS, "gpu-2",
                                                                                   "PLANNED_CAPACITY_END")
    # EC2 starts terminating 10 min after the warning, 30 min before the block's end
    assert retire.evidence == {"capacity_reservation_id": BLOCK, "deadline": "2026-11-22T10:30:00+00:00",
                               "block_end": "2026-11-22T11:00:00+00:00"}
    assert dict(planned.ignored) == {THEIRS: "not a member of cluster local",
                                     "i-0123456789abcdef0": "backs no node of the cluster's scheduler"}
    envelope = {"source": "nodemedic.planned", "detail-type": "Node Health Event",
                "detail": json.loads(retire.model_dump_json(exclude_none=True))}
    assert parse_trigger(envelope).detail.fault_code == "PLANNED_CAPACITY_END"  # type: ignore[union-attr]
    c = classify("PLANNED_CAPACITY_END", {})
    assert (c.fault_class, c.action, c.ladder) == ("planned", "retire", ())


def test_the_guides_detail_type_key_is_read_too_and_a_redelivery_keeps_the_event_id() -> None:
    event = copy.deepcopy(BLOCK_END)
    event["detail_type"] = event.pop("detail-type")
    first = _plan_block(BLOCK_END, {BLOCK: [OURS]}).events[0]
    assert _plan_block(event, {BLOCK: [OURS]}).events[0].event_id == first.event_id


def test_an_ended_or_empty_block_plans_nothing_with_the_reason() -> None:
    assert _plan_block(BLOCK_END, {BLOCK: [OURS]}, now=datetime(2026, 11, 22, 11, tzinfo=UTC)).ignored == [
        (BLOCK, "the Capacity Block ended at 2026-11-22T11:00:00+00:00")]
    assert _plan_block(BLOCK_END, {}).ignored == [(BLOCK, "no running instance of this account is in the Capacity "
                                                          "Block")]


def test_an_operator_cannot_make_a_fault_a_retire() -> None:
    with pytest.raises(ValueError, match="retire"):
        parse_overrides('{"XID 79": "retire"}')


@pytest.mark.parametrize(("path", "value"), [
    (("detail", "capacity-reservation-id"), "cr-; rm -rf /"),
    (("detail", "capacity-reservation-id"), None),
    (("detail", "end-date"), "soon"),
    (("detail", "end-date"), "2026-11-22T11:00:00"),
    (("detail-type",), "Capacity Block Delivered"),
    (("source",), "aws.health"),
])
def test_a_malformed_capacity_block_warning_is_rejected_with_the_field(path: tuple[str, ...], value: Any) -> None:
    with pytest.raises(InvalidEventError, match="AWS Health event" if value == "aws.health" else path[-1]):
        parse_planned_event(_with(BLOCK_END, path, value))


# -- a Spot interruption (events/aws-ec2/, the shape in EC2's "Spot Instance interruption notices") --
SPOT = json.loads((SAMPLES.parent / "aws-ec2" / "spot-interruption-warning.json").read_text())


def _plan_spot(event: dict[str, Any], now: datetime = WARNED) -> Any:
    return plan_spot_interruption(parse_planned_event(event), cluster="local", provider=_Cluster(),  # type: ignore[arg-type]
                                  now=now)


@pytest.mark.parametrize(("action", "deadline"), [("terminate", "2026-11-22T10:22:00+00:00"),
                                                  ("stop", "2026-11-22T10:22:00+00:00"),
                                                  ("hibernate", "2026-11-22T10:20:00+00:00")])  # no 2 min
def test_a_spot_interruption_retires_its_node_with_the_deadline_ec2_keeps(action: str, deadline: str) -> None:
    event = _with(SPOT, ("detail", "instance-action"), action)
    [retire] = _plan_spot(event).events
    assert (retire.node.instance_id, retire.node.slurm_node, retire.fault_code, retire.check) == (
        OURS, "gpu-2", "PLANNED_SPOT_INTERRUPTION", "spot_interruption")
    assert retire.evidence == {"instance_action": action, "deadline": deadline, "warned_at": "2026-11-22T10:20:00+00:00"}
    envelope = {"source": "nodemedic.planned", "detail-type": "Node Health Event",
                "detail": json.loads(retire.model_dump_json(exclude_none=True))}
    assert parse_trigger(envelope).detail.fault_code == "PLANNED_SPOT_INTERRUPTION"  # type: ignore[union-attr]
    c = classify("PLANNED_SPOT_INTERRUPTION", {})
    assert (c.fault_class, c.action, c.ladder) == ("planned", "retire", ())


def test_a_redelivered_spot_warning_keeps_its_event_id_and_another_instance_is_ignored() -> None:
    assert _plan_spot(copy.deepcopy(SPOT)).events[0].event_id == _plan_spot(SPOT).events[0].event_id
    theirs = _plan_spot(_with(SPOT, ("detail", "instance-id"), THEIRS))
    assert not theirs.events and theirs.ignored == [(THEIRS, "not a member of cluster local")]


@pytest.mark.parametrize(("action", "read_after", "planned"), [
    ("terminate", timedelta(minutes=4), True),  # 2 min after EC2 acted: the delivery's retries may take that
    ("terminate", timedelta(minutes=4, seconds=1), False),
    ("stop", timedelta(minutes=5), False),  # a dead-letter queue redriven: the instance may run again by now
    ("hibernate", timedelta(minutes=2), True),  # hibernation begins at the warning
    ("hibernate", timedelta(minutes=2, seconds=1), False),
    ("stop", timedelta(days=30), False),  # an archive replayed
])
def test_a_spot_warning_read_after_ec2_acted_plans_nothing(action: str, read_after: timedelta, planned: bool) -> None:
    """Before, a warning redriven days later retired the node, which EC2 may have started again
    and which served jobs: a healthy node drained for an interruption long over."""
    sent = datetime.fromisoformat(SPOT["time"])  # the warning's own time; WARNED is when it was read
    late = _plan_spot(_with(SPOT, ("detail", "instance-action"), action), now=sent + read_after)
    assert bool(late.events) is planned
    assert planned or "nothing is left to plan" in late.ignored[0][1]


@pytest.mark.parametrize(("path", "value"), [
    (("detail", "instance-id"), "i-; reboot"),
    (("detail", "instance-id"), None),
    (("detail", "instance-action"), "explode"),
    (("time",), "2026-11-22T10:20:00"),
    (("time",), "0001-01-01T00:00:00Z"),
])
def test_a_malformed_spot_warning_is_rejected_with_the_field(path: tuple[str, ...], value: Any) -> None:
    with pytest.raises(InvalidEventError, match=f"Spot interruption warning.*{path[-1]}"):
        parse_planned_event(_with(SPOT, path, value))


# -- an interruptible Capacity Reservation's reclaim (events/aws-ec2/, the shape in EC2's "Monitor
# interruptible Capacity Reservations with EventBridge and CloudTrail") --
RECLAIM = json.loads((SAMPLES.parent / "aws-ec2" / "capacity-reservation-interruption-warning.json").read_text())


def _plan_reclaim(event: dict[str, Any], now: datetime = WARNED) -> Any:
    envelope = parse_planned_event(event)
    assert isinstance(envelope, ReservationInterruptionEnvelope)
    return plan_reservation_interruption(envelope, cluster="local", provider=_Cluster(), now=now)  # type: ignore[arg-type]


@pytest.mark.parametrize("detail_type", ["EC2 Capacity Reservation Instance Interruption Warning",
                                         "EC2 Interruptible Capacity Reservation Instance Interruption Warning"])
def test_a_reclaimed_reservations_instance_retires_its_node_with_the_termination_time(detail_type: str) -> None:
    [retire] = _plan_reclaim(_with(RECLAIM, ("detail-type",), detail_type)).events
    assert (retire.node.instance_id, retire.node.slurm_node, retire.fault_code, retire.check) == (
        OURS, "gpu-2", "PLANNED_RESERVATION_INTERRUPTION", "reservation_interruption")
    assert retire.evidence == {"instance_action": "terminate", "deadline": "2026-11-22T10:22:00+00:00",
                               "warned_at": "2026-11-22T10:20:00+00:00"}
    assert _plan_reclaim(copy.deepcopy(RECLAIM)).events[0].event_id == retire.event_id  # a redelivery
    c = classify("PLANNED_RESERVATION_INTERRUPTION", {})
    assert (c.fault_class, c.action, c.ladder) == ("planned", "retire", ())
    envelope = {"source": "nodemedic.planned", "detail-type": "Node Health Event",
                "detail": json.loads(retire.model_dump_json(exclude_none=True))}
    assert parse_trigger(envelope).detail.fault_code == "PLANNED_RESERVATION_INTERRUPTION"  # type: ignore[union-attr]
    theirs = _plan_reclaim(_with(RECLAIM, ("detail", "instance-id"), THEIRS))
    assert not theirs.events and theirs.ignored == [(THEIRS, "not a member of cluster local")]


def test_a_reclaim_warning_read_after_the_termination_plans_nothing() -> None:
    terminated = datetime.fromisoformat("2026-11-22T10:22:00+00:00")
    assert _plan_reclaim(RECLAIM, now=terminated + timedelta(minutes=2)).events
    late = _plan_reclaim(RECLAIM, now=terminated + timedelta(minutes=2, seconds=1))
    assert not late.events and "nothing is left to plan" in late.ignored[0][1]


@pytest.mark.parametrize(("path", "value"), [
    (("detail", "instance-id"), "i-; reboot"),
    (("detail", "instance-action"), "stop"),  # a reclaim only terminates
    (("detail", "instance-termination-time"), None),
    (("detail", "instance-termination-time"), "2026-11-22T10:22:00"),
])
def test_a_malformed_reclaim_warning_is_rejected_with_the_field(path: tuple[str, ...], value: Any) -> None:
    with pytest.raises(InvalidEventError, match=f"Capacity Reservation interruption warning.*{path[-1]}"):
        parse_planned_event(_with(RECLAIM, path, value))


# -- a rebalance recommendation (events/aws-ec2/, the shape in EC2's "EC2 instance rebalance
# recommendations"): what it asks is tests/stages/test_rebalance.py --
REBALANCE = json.loads((SAMPLES.parent / "aws-ec2" / "rebalance-recommendation.json").read_text())


def test_a_rebalance_recommendation_parses_as_one_and_names_its_instance() -> None:
    envelope = parse_planned_event(copy.deepcopy(REBALANCE))
    assert isinstance(envelope, RebalanceEnvelope)
    assert (envelope.detail.instance_id, envelope.time.isoformat()) == ("i-0a1b2c3d4e5f60789", "2026-11-22T10:05:00+00:00")


@pytest.mark.parametrize(("path", "value"), [
    (("detail", "instance-id"), "i-; reboot"),
    (("detail", "instance-id"), None),
    (("source",), "aws.sagemaker"),  # only EC2 (or a node's agent, in its own shape) says so
    (("time",), "2026-11-22T10:05:00"),
])
def test_a_malformed_rebalance_recommendation_is_rejected_with_the_field(path: tuple[str, ...], value: Any) -> None:
    with pytest.raises(InvalidEventError, match=f"rebalance recommendation.*{path[-1]}"):
        parse_planned_event(_with(REBALANCE, path, value))


def test_ec2s_shape_from_a_nodes_agent_is_refused_as_a_nodes_notice_and_its_own_shape_parses() -> None:
    with pytest.raises(InvalidEventError, match="node's rebalance recommendation: detail"):
        parse_planned_event(_with(REBALANCE, ("source",), "nodemedic.agent"))
    sample = json.loads((SAMPLES.parent / "scheduled-events" / "ec2-rebalance-recommendation.json").read_text())
    envelope = parse_planned_event(sample)
    assert isinstance(envelope, NodeRebalanceEnvelope)
    assert (envelope.instance_id, envelope.named, envelope.recommended_at.isoformat()) == (
        "i-0a1b2c3d4e5f60789", ("local", "gpu-2"), "2026-11-22T10:05:00+00:00")


# -- the instance back: EC2's "running" after a Spot stop or hibernation NodeMedic retired its node for --
RUNNING = json.loads((SAMPLES.parent / "aws-ec2" / "instance-running.json").read_text())  # 2026-11-22T11:05:12Z
STOP_DEADLINE = datetime(2026, 11, 22, 10, 22, tzinfo=UTC)


def _retired(action: str = "stop", *, status: str = "retired", fault: str = "PLANNED_SPOT_INTERRUPTION",
             instance: str = OURS, deadline: str = STOP_DEADLINE.isoformat()) -> Incident:
    return Incident(incident_id="inc-spot", cluster="local", instance_id=instance, slurm_node="gpu-2", fault_code=fault,
                    fault_class="planned", action="retire", source="nodemedic.planned", observed_at=WARNED,
                    status=status, detected_at=WARNED, reason="Spot interruption", stages={"detect": StageRecord(
                        started_at=WARNED, completed_at=WARNED,
                        result={"evidence": {"instance_action": action, "deadline": deadline}})})


def _plan_return(event: dict[str, Any], holder: Incident | None) -> Any:
    return plan_return(parse_planned_event(event), cluster="local", provider=_Cluster(),  # type: ignore[arg-type]
                       retired_by=lambda instance: holder, now=NOW)


@pytest.mark.parametrize("action", ["stop", "hibernate"])
def test_an_instance_ec2_starts_again_after_a_spot_stop_rejoins_through_its_burn_in(action: str) -> None:
    [joined] = _plan_return(RUNNING, _retired(action)).events
    assert (joined.node.instance_id, joined.node.slurm_node, joined.fault_code, joined.check) == (
        OURS, "gpu-2", "NODE_JOINED", "burn_in")
    assert joined.evidence["returned_from"] == "inc-spot"
    assert joined.evidence["running_since"] == "2026-11-22T11:05:12+00:00"
    assert _plan_return(copy.deepcopy(RUNNING), _retired(action)).events[0].event_id == joined.event_id
    assert classify("NODE_JOINED", {}).action == "burn_in"


@pytest.mark.parametrize("holder", [
    None,  # no incident holds it: an instance that starts (a scale-out, an operator's start)
    _retired("terminate"),  # EC2 terminated it: that instance never runs again
    _retired(status="closed"),
    _retired(status="open"),  # still being retired
    _retired(fault="PLANNED_CAPACITY_END"),
    _retired(instance=THEIRS),  # a lock of another instance's incident
    _retired(deadline="2026-11-22T11:30:00+00:00"),  # running before EC2 stopped it: a replay of an earlier start
    _retired(deadline="not a time"),
    _retired(deadline="2026-11-22T10:22:00"),  # no timezone: not a deadline EC2 gave
], ids=["no-lock", "terminated", "closed", "open", "capacity-end", "other-instance", "before-the-stop",
        "garbled-deadline", "naive-deadline"])
def test_any_other_instance_that_runs_is_ignored_with_the_reason(holder: Incident | None) -> None:
    planned = _plan_return(RUNNING, holder)
    assert not planned.events and planned.ignored == [(OURS, "not an instance NodeMedic retired for a Spot stop or "
                                                             "hibernation that has run again since")]


@pytest.mark.parametrize(("path", "value"), [
    (("detail", "instance-id"), "i-; reboot"),
    (("detail", "state"), "stopped"),
    (("detail", "state"), None),
    (("time",), "2026-11-22T11:05:12"),
])
def test_a_malformed_state_change_is_rejected_with_the_field(path: tuple[str, ...], value: Any) -> None:
    with pytest.raises(InvalidEventError, match=f"instance state change.*{path[-1]}"):
        parse_planned_event(_with(RUNNING, path, value))


def _with(event: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of ``event`` with the field at ``path`` set to ``value``."""
    changed = copy.deepcopy(event)
    target = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return changed


def _scheduled(code: str, instance: str = OURS, description: str = "", event_id: str = "instance-event-0a1b2c3d4e5f6a7b8",
               not_after: datetime | None = None) -> tuple[str, dict[str, Any]]:
    """(instance, event) as DescribeInstanceStatus returns a scheduled event (boto3's datetimes)."""
    event: dict[str, Any] = {"InstanceEventId": event_id, "Code": code, "NotBefore": datetime(2026, 12, 6, tzinfo=UTC),
                             "Description": description or f"The instance is scheduled for {code}"}
    if not_after:
        event["NotAfter"] = not_after
    return instance, event


@pytest.mark.parametrize(("code", "description", "fault"), [
    ("instance-retirement", "", "PLANNED_RETIREMENT"),
    ("instance-stop", "", "PLANNED_STOP"),
    ("instance-reboot", "", "PLANNED_REBOOT"),
    ("system-reboot", "", "PLANNED_SYSTEM_REBOOT"),
    ("system-maintenance", "Scheduled network maintenance", "PLANNED_NETWORK_MAINTENANCE"),
    ("system-maintenance", "Scheduled power maintenance", "PLANNED_POWER_MAINTENANCE"),
])
def test_each_ec2_scheduled_event_of_a_member_becomes_its_planned_fault(code: str, description: str,
                                                                        fault: str) -> None:
    [event] = plan_scheduled([_scheduled(code, description=description)], cluster="local", provider=_Cluster(),
                             now=NOW).events  # type: ignore[arg-type]
    assert (event.node.slurm_node, event.fault_code, event.check) == ("gpu-2", fault, "ec2_scheduled_event")
    assert event.evidence["deadline"] == "2026-12-06T00:00:00+00:00" and event.evidence["ec2_event_code"] == code


def test_a_later_sweep_of_the_same_scheduled_event_repeats_its_event_id_and_another_event_does_not() -> None:
    sweep = lambda *events: plan_scheduled(list(events), cluster="local", provider=_Cluster(), now=NOW)  # noqa: E731
    first, again = sweep(_scheduled("instance-retirement")), sweep(_scheduled("instance-retirement"))
    assert first.events[0].event_id == again.events[0].event_id  # Detect deduplicates it: one incident
    other = sweep(_scheduled("instance-retirement", event_id="instance-event-0fffffffffffffff0"))
    assert other.events[0].event_id != first.events[0].event_id


def test_a_sweep_ignores_what_is_over_or_not_ours_with_the_reason() -> None:
    planned = plan_scheduled([
        _scheduled("instance-reboot", description="[Completed] The instance is running on new hardware."),
        _scheduled("system-reboot", description="[Canceled] Scheduled reboot"),
        _scheduled("instance-stop", not_after=datetime(2026, 11, 22, tzinfo=UTC)),
        _scheduled("instance-retirement", instance=THEIRS),
        _scheduled("host-error"),
    ], cluster="local", provider=_Cluster(), now=NOW)  # type: ignore[arg-type]
    assert planned.events == []
    reasons = [why for _, why in planned.ignored]
    assert reasons[0].startswith("instance-reboot is over: [Completed]")
    assert reasons[1].startswith("system-reboot is over: [Canceled]")
    assert reasons[2] == "instance-stop: its window ended at 2026-11-22T00:00:00+00:00"
    assert reasons[3] == "not a member of cluster local"
    assert reasons[4] == "host-error is not one NodeMedic acts on"


@pytest.mark.parametrize(("lead_hours", "expected"), [
    (0, NOW),  # no lead time: at once
    (24, datetime(2026, 12, 4, 23, tzinfo=UTC)),  # a day before the deadline, at an hourly sweep before that
    (24 * 30, NOW),  # the deadline is nearer than the lead time: at once
])
def test_a_notice_is_acted_on_its_lead_time_before_the_deadline_or_at_once(lead_hours: int, expected: datetime) -> None:
    [event] = _plan(RETIREMENT).events  # deadline 2026-12-06T00:00Z, noticed 2026-11-22
    assert act_at(event, timedelta(hours=lead_hours), HOURLY) == expected


def test_a_shorter_sweep_acts_nearer_the_lead_time() -> None:
    [event] = _plan(RETIREMENT).events
    assert act_at(event, timedelta(hours=24), timedelta(minutes=15)) == datetime(2026, 12, 4, 23, 45, tzinfo=UTC)


def test_a_released_notice_is_observed_when_published_and_keeps_when_it_came() -> None:
    [event] = _plan(RETIREMENT).events
    later = datetime(2026, 12, 4, 23, 0, 30, tzinfo=UTC)
    out = released(event, later)
    assert (out.observed_at, out.sent_at, out.event_id) == (later, later, event.event_id)  # Detect dedupes it
    assert out.evidence["noticed_at"] == NOW.isoformat() and out.evidence["deadline"] == event.evidence["deadline"]


def _job(marker_ago: float | None, job_id: str = "7") -> RunningJob:
    now = NOW.timestamp()
    return RunningJob(job_id, "batch", now - 86400, None if marker_ago is None else now - marker_ago, now)


@pytest.mark.parametrize(("jobs", "acts"), [
    ([], "no job runs on the node"),
    ([_job(600)], "every job on the node (1) checkpointed within the last 60 min"),  # lose 10 min, not an interval
    ([_job(600), _job(5400, "8")], None),  # one job's last checkpoint is 90 min old: wait for its next
    ([_job(None)], None),  # never reported one: wait for the lead time (its CheckpointPolicy then)
    ([_job(-86400)], None),  # a marker a day ahead of the controller's clock says nothing
])
def test_a_waiting_notice_is_acted_on_early_only_when_that_loses_nothing_or_next_to_nothing(
        jobs: list[RunningJob], acts: str | None) -> None:
    assert slack(jobs, HOURLY) == acts


def test_a_shorter_sweep_asks_for_a_checkpoint_within_its_own_period() -> None:
    """Every 15 minutes: a checkpoint 10 minutes old is slack, one 20 minutes old waits for the next."""
    quarter = timedelta(minutes=15)
    assert slack([_job(600)], quarter) == "every job on the node (1) checkpointed within the last 15 min"
    assert slack([_job(1200)], quarter) is None


def test_a_notice_released_early_says_why() -> None:
    [event] = _plan(RETIREMENT).events
    out = released(event, NOW + timedelta(days=1), early="no job runs on the node")
    assert out.evidence["early"] == "no job runs on the node" and out.evidence["noticed_at"] == NOW.isoformat()
    assert "early" not in released(event, NOW).evidence


def test_a_notice_aws_closes_or_cancels_withdraws_the_event_it_would_have_been() -> None:
    [waiting] = _plan(RETIREMENT).events
    closed = copy.deepcopy(RETIREMENT)
    closed["detail"]["statusCode"] = "closed"
    assert waiting.event_id in _plan(closed).withdrawn
    [scheduled] = plan_scheduled([_scheduled("system-reboot")], cluster="local", provider=_Cluster(),
                                 now=NOW).events  # type: ignore[arg-type]
    canceled = plan_scheduled([_scheduled("system-reboot", description="[Canceled] Scheduled reboot")],
                              cluster="local", provider=_Cluster(), now=NOW)  # type: ignore[arg-type]
    assert canceled.withdrawn == [scheduled.event_id]


NODE_NOTICE = json.loads((SAMPLES.parent / "scheduled-events" / "ec2-scheduled-events.json").read_text())


def _node_plan(change: dict[str, Any] | None = None) -> Any:
    event = copy.deepcopy(NODE_NOTICE)
    event["detail"].update(change or {})
    return plan_node_scheduled(parse_planned_event(event), cluster="local", provider=_Cluster(), now=NOW)  # type: ignore[arg-type]


def test_a_nodes_reading_of_its_scheduled_events_is_planned_as_the_sweeps_find_with_the_same_event_id() -> None:
    """The agent read instance metadata (the one source on a HyperPod node): the active event is the
    sweep's event, so whichever arrives second is a redelivery; a canceled one withdraws its copy
    that waits for its lead time."""
    planned = _node_plan()
    [event] = planned.events
    [swept] = plan_scheduled([_scheduled("instance-retirement", event_id="instance-event-0d59937288b749b32")],
                             cluster="local", provider=_Cluster(), now=NOW).events  # type: ignore[arg-type]
    assert (event.node.slurm_node, event.fault_code, event.event_id) == ("gpu-2", "PLANNED_RETIREMENT", swept.event_id)
    assert event.evidence["deadline"] == "2026-12-06T00:00:00+00:00" and event.evidence["read_from"] == "instance metadata"
    [canceled] = plan_scheduled([_scheduled("system-reboot", event_id="instance-event-0a1b2c3d4e5f6a7b8")],
                                cluster="local", provider=_Cluster(), now=NOW).events  # type: ignore[arg-type]
    assert planned.withdrawn == [canceled.event_id]
    assert planned.ignored == [(OURS, "system-reboot instance-event-0a1b2c3d4e5f6a7b8 is canceled, not active")]


@pytest.mark.parametrize(("change", "why"), [
    ({"cluster": "other"}, "the notice is for cluster other; this pipeline serves local"),
    ({"node": {"instance_id": OURS, "hostname": "gpu-3", "slurm_node": "gpu-3"}},
     f"the notice names node gpu-3, but {OURS} backs gpu-2: not believed"),
    ({"node": {"instance_id": THEIRS, "hostname": "gpu-9", "slurm_node": "gpu-9"}}, "not a member of cluster local"),
])
def test_a_nodes_notice_for_another_cluster_or_naming_another_nodes_instance_plans_nothing(change: dict[str, Any],
                                                                                          why: str) -> None:
    planned = _node_plan(change)
    assert planned.events == [] and why in [w for _, w in planned.ignored]


def test_a_nodes_notice_replayed_after_detect_forgot_what_it_acted_on_plans_nothing() -> None:
    """An archive of NodeMedic's bus replayed weeks later: the notice calls a retirement active
    that AWS carried out long ago (the instance since started on new hardware, a member again).
    Detect no longer remembers the incident that acted on it, so it would drain the node again;
    the agent sends a current notice every hour anyway. A notice within that memory is planned
    (a redelivery Detect deduplicates)."""
    event = copy.deepcopy(NODE_NOTICE)
    sent = datetime.fromisoformat(event["time"])
    envelope = parse_planned_event(event)
    late = plan_node_scheduled(envelope, cluster="local", provider=_Cluster(), now=sent + timedelta(days=15, minutes=1))  # type: ignore[arg-type]
    assert late.events == [] and late.ignored == [
        (OURS, "the notice was sent at 2026-11-22T03:00:05+00:00, more than 15 days ago: a replay, not believed")]
    within = plan_node_scheduled(envelope, cluster="local", provider=_Cluster(), now=sent + timedelta(days=14))  # type: ignore[arg-type]
    assert [e.node.slurm_node for e in within.events] == ["gpu-2"]


@pytest.mark.parametrize("change", [
    {"events": [{**NODE_NOTICE["detail"]["events"][0], "not_before": "2026-12-06T00:00:00"}]},  # no time zone
    {"events": [{**NODE_NOTICE["detail"]["events"][0], "event_id": "../../etc"}]},
    {"events": [NODE_NOTICE["detail"]["events"][0]] * 21},  # more than an instance has
    {"node": {"instance_id": "i-1", "hostname": "x"}},
])
def test_a_node_notice_that_is_not_the_contract_is_refused_with_its_reason(change: dict[str, Any]) -> None:
    event = copy.deepcopy(NODE_NOTICE)
    event["detail"].update(change)
    with pytest.raises(InvalidEventError, match="rejected node's scheduled events"):
        parse_planned_event(event)


def test_a_waiting_notice_is_moot_once_its_instance_left_the_cluster_or_backs_another_node() -> None:
    [event] = plan_scheduled([_scheduled("instance-retirement")], cluster="local", provider=_Cluster(),
                             now=NOW).events  # type: ignore[arg-type]
    assert moot(event, Member(OURS, "gpu-2", "running"), NOW) is None
    assert moot(event, Member(OURS, "gpu-2", "stopped"), NOW) is None  # stopped and started by the ec2 provider: still its node
    assert moot(event, None, NOW) == f"{OURS} is no longer a member of the cluster: the notice for gpu-2 is moot"
    assert moot(event, Member(OURS, "gpu-5", "running"), NOW) == f"{OURS} backs gpu-5 now, not gpu-2: the notice is moot"


def test_a_notice_whose_window_ended_while_it_waited_is_moot_one_with_no_end_is_not() -> None:
    """A reboot maintenance that waited past its window (automation paused for days, the breaker's
    room taken by a campaign): AWS has rebooted the node already, so rebooting it again would only
    cost its job. A retirement has no window end ("after" its date): while its instance is a
    member, AWS has not acted yet, and it is acted on."""
    end = NOW + timedelta(hours=2)
    [reboot] = plan_scheduled([_scheduled("system-reboot", not_after=end)], cluster="local", provider=_Cluster(),
                              now=NOW).events  # type: ignore[arg-type]
    member = Member(OURS, "gpu-2", "running")
    assert moot(reboot, member, end - timedelta(seconds=1)) is None
    assert moot(reboot, member, end) == (f"its window ended at {end.isoformat()} while it waited: AWS has done "
                                         "what it announced")
    [retirement] = plan_scheduled([_scheduled("instance-retirement")], cluster="local", provider=_Cluster(),
                                  now=NOW).events  # type: ignore[arg-type]
    assert retirement.evidence["window_end"] is None and moot(retirement, member, NOW + timedelta(days=60)) is None
