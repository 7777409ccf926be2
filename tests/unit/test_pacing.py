"""Planned work paced under the breaker: the room it may take now, and when a campaign starts."""

import zlib
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st
from nodemedic.contracts.events import NodeHealthEvent, NodeIdentity
from nodemedic.contracts.incident import IncidentRef
from nodemedic.domain.classification import classify
from nodemedic.providers.base import Member
from nodemedic.safety.gate import Facts, admission_of, decide
from nodemedic.safety.pacing import Room, choose, gap, planned_share, room, runs_late, start_times
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.store.control import ControlState, Switch

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
POLICY = SafetyPolicy()  # breaker: 10 % of the cluster, at most 8 nodes, 60 min; 4 at once


def is_planned(code: str) -> bool:
    return classify(code).fault_class == "planned"


def incident(node: str, code: str) -> IncidentRef:
    c = classify(code)
    return IncidentRef(incident_id=f"inc-{node}", cluster="c", instance_id=f"i-{zlib.crc32(node.encode()):017x}",
                       slurm_node=node, fault_code=code, observed_at=NOW, source="nodemedic.agent",
                       fault_class=c.fault_class, action=c.action)


def admit(state: ControlState, node: str, code: str, at: datetime = NOW) -> str:
    inc = incident(node, code)
    state.admissions[inc.incident_id] = admission_of(inc, Member(inc.instance_id, node, "running"), at)
    return inc.incident_id


def room_of(state: ControlState, active: set[str], size: int = 64, recent: dict[str, datetime] | None = None,
            policy: SafetyPolicy = POLICY) -> Room:
    return room(state, policy, active, size, recent or {}, NOW, is_planned)


def test_planned_work_takes_half_the_breakers_limit_of_an_idle_cluster() -> None:
    assert POLICY.breaker_limit(64) == 6 and planned_share(POLICY, 64) == 3
    r = room_of(ControlState(), set())
    assert r.nodes == 3 and "0 of 3 planned node(s)" in r.why
    assert room_of(ControlState(), set(), size=8).nodes == 1  # a small cluster's limit of one: one at a time


def test_an_operator_may_give_planned_work_more_of_the_breakers_limit_for_a_campaign() -> None:
    policy = SafetyPolicy.model_validate({"breaker": {"planned_percent": 100}})
    assert planned_share(policy, 64) == 6 and room_of(ControlState(), set(), policy=policy).nodes == 4  # the cap
    state = ControlState()
    admit(state, "gpu-1", "XID 79", at=NOW - timedelta(minutes=10))  # a fault still takes its node of the limit
    assert room_of(state, set(), policy=policy).nodes == 4 and room_of(state, set(), size=40, policy=policy).nodes == 3
    assert planned_share(SafetyPolicy.model_validate({"breaker": {"planned_percent": 1}}), 64) == 1  # at least one


def test_faults_within_the_window_leave_planned_work_only_what_the_breaker_has_left() -> None:
    state = ControlState()
    for n in range(5):  # five faults repaired within the last hour (ended: not active)
        admit(state, f"gpu-{n}", "XID 79", at=NOW - timedelta(minutes=30))
    assert room_of(state, set()).nodes == 1  # 6 - 5
    admit(state, "gpu-9", "XID 79", at=NOW - timedelta(minutes=30))
    assert room_of(state, set()).nodes == 0
    old = ControlState()
    for n in range(6):  # repaired over an hour ago: the breaker counts them no more
        admit(old, f"gpu-{n}", "XID 79", at=NOW - timedelta(minutes=61))
    assert room_of(old, set()).nodes == 3


def test_planned_work_in_the_window_and_released_work_not_yet_admitted_use_up_the_share() -> None:
    state = ControlState()
    admit(state, "gpu-1", "PLANNED_RETIREMENT", at=NOW - timedelta(minutes=50))
    assert room_of(state, set()).nodes == 2
    recent = {"gpu-2": NOW - timedelta(seconds=5), "gpu-1": NOW - timedelta(minutes=50)}  # gpu-1: admitted too
    assert room_of(state, set(), recent=recent).nodes == 1
    assert room_of(state, set(), recent={"gpu-3": NOW - timedelta(minutes=90)}).nodes == 2  # out of the window


def test_the_concurrency_cap_and_nodes_waiting_for_a_slot_count() -> None:
    state = ControlState()
    active = {admit(state, f"gpu-{n}", "XID 79") for n in range(4)}  # four in progress: the cap
    assert room_of(state, active).nodes == 0 and "4 of 4 remediation(s) in progress" in room_of(state, active).why
    waiting = ControlState()
    inc = incident("gpu-7", "XID 79")
    waiting.waiting[inc.incident_id] = admission_of(inc, Member(inc.instance_id, "gpu-7", "running"), NOW)
    admit(waiting, "gpu-8", "XID 79")
    assert room_of(waiting, {inc.incident_id, "inc-gpu-8"}).nodes == 3  # 6 - 2 leaves 4; the share is 3
    assert room_of(waiting, {inc.incident_id, "inc-gpu-8"}, size=30).nodes == 1  # limit 3 - 2


def test_nothing_while_automation_is_paused_or_the_breaker_is_open() -> None:
    paused = ControlState(paused=Switch(by="alice", reason="fabric upgrade", at=NOW))
    assert room_of(paused, set()) == Room(0, "automation is paused (fabric upgrade)")
    tripped = ControlState()
    tripped.breaker.state = "open"
    assert room_of(tripped, set()).nodes == 0


@given(size=st.integers(1, 400), faults=st.integers(0, 12), done=st.integers(0, 12),
       max_percent=st.sampled_from([5, 10, 25, 100]), max_nodes=st.integers(1, 20), max_concurrent=st.integers(1, 8),
       planned_percent=st.sampled_from([1, 50, 100]))
def test_planned_work_the_room_holds_never_trips_the_breaker(size: int, faults: int, done: int, max_percent: int,
                                                               max_nodes: int, max_concurrent: int,
                                                               planned_percent: int) -> None:
    """Whatever faults are in progress or were repaired within the window, the planned work the
    room lets start passes the gate: none trips the breaker, none waits for a slot."""
    policy = SafetyPolicy.model_validate({"breaker": {"max_percent": max_percent, "max_nodes": max_nodes,
                                                      "planned_percent": planned_percent},
                                          "max_concurrent": max_concurrent})
    state = ControlState()
    active = {admit(state, f"fault-{n}", "XID 79") for n in range(faults)}
    for n in range(done):
        admit(state, f"done-{n}", "XID 79", at=NOW - timedelta(minutes=20))
    n_room = room_of(state, active, size=size, policy=policy).nodes
    for n in range(n_room):
        inc = incident(f"planned-{n}", "PLANNED_RETIREMENT")
        member = Member(inc.instance_id, inc.slurm_node, "running")
        d = decide(Facts(inc, member, policy, state, active, size, {}, {}, NOW))
        assert d.verdict == "proceed" and not d.trips_breaker, d.reason
        state.admissions[inc.incident_id] = admission_of(inc, member, NOW)
        active.add(inc.incident_id)


def test_a_campaign_starts_early_enough_to_be_done_by_its_time_in_groups_a_window_apart() -> None:
    t = NOW + timedelta(days=3)
    starts = start_times([t] * 7, per_group=3, spacing=timedelta(hours=2))
    assert sorted(starts) == [t - timedelta(hours=4)] + [t - timedelta(hours=2)] * 3 + [t] * 3
    # a group starts at its earliest member's time, and the next one a spacing before it
    mixed = start_times([t, t - timedelta(minutes=30), t - timedelta(hours=10)], per_group=2,
                        spacing=timedelta(hours=2))
    assert mixed == [t - timedelta(minutes=30)] * 2 + [t - timedelta(hours=10)]
    assert gap(60, timedelta(minutes=60)) == timedelta(hours=2)  # released at one sweep, counted at the next
    assert gap(60, timedelta(minutes=15)) == timedelta(minutes=75)
    assert gap(90, timedelta(minutes=60)) == timedelta(hours=2)


@given(st.lists(st.integers(0, 20_000), max_size=60), st.integers(1, 5), st.integers(5, 300))
def test_no_notice_starts_after_its_time_and_no_window_holds_more_than_a_group(
        minutes: list[int], per_group: int, spacing_minutes: int) -> None:
    act_at = [NOW + timedelta(minutes=m) for m in minutes]
    spacing = timedelta(minutes=spacing_minutes)
    starts = start_times(act_at, per_group, spacing)
    assert all(s <= a for s, a in zip(starts, act_at, strict=True))
    for s in starts:
        assert sum(s <= other < s + spacing for other in starts) <= per_group


def notice(node: str, n: int = 0) -> NodeHealthEvent:
    instance = f"i-{zlib.crc32(node.encode()):017x}"
    return NodeHealthEvent(schema_version="1", event_id=f"ev-{node}-{n}", cluster="c",
                           node=NodeIdentity(instance_id=instance, hostname=instance, slurm_node=node),
                           check="aws_health", fault_code="PLANNED_RETIREMENT", severity="warning",
                           observed_at=NOW, sent_at=NOW, evidence={})


def test_the_room_goes_to_the_most_urgent_and_what_waits_is_not_read() -> None:
    offered: list[str] = []

    def as_is(e: NodeHealthEvent) -> NodeHealthEvent:
        offered.append(e.event_id)
        return e

    urgent_first = [notice("gpu-1"), notice("gpu-2"), notice("gpu-1", 1), notice("gpu-3"), notice("gpu-9")]
    chosen = choose(urgent_first, room_nodes=1, recent={"gpu-9"}, offer=as_is)
    # gpu-1 takes the room; its second notice and gpu-9's (released within the window) take none
    assert [e.event_id for e in chosen.publish] == ["ev-gpu-1-0", "ev-gpu-1-1", "ev-gpu-9-0"]
    assert list(chosen.fresh) == ["gpu-1"] and [e.event_id for e in chosen.wait] == ["ev-gpu-2-0", "ev-gpu-3-0"]
    assert offered == ["ev-gpu-1-0", "ev-gpu-1-1", "ev-gpu-9-0"]
    assert choose(urgent_first[:2], room_nodes=0, recent=set(), offer=as_is).publish == []


def test_a_notice_taken_for_good_takes_no_room_and_one_offered_again_takes_it_under_its_new_id() -> None:
    settled, held = notice("gpu-1"), notice("gpu-2")
    again = held.model_copy(update={"event_id": "ev-gpu-2-offer-1"})

    def offer(e: NodeHealthEvent) -> NodeHealthEvent | None:
        return {settled.event_id: None, held.event_id: again}.get(e.event_id, e)

    chosen = choose([settled, held, notice("gpu-3")], room_nodes=1, recent=set(), offer=offer)
    assert [e.event_id for e in chosen.publish] == ["ev-gpu-1-0", "ev-gpu-2-offer-1"]
    assert chosen.fresh == {"gpu-2": again} and [e.event_id for e in chosen.wait] == ["ev-gpu-3-0"]


def test_a_notice_the_pace_cannot_start_before_its_deadline_is_late_however_far_the_deadline() -> None:
    """Two nodes every 2 hours from the next sweep (in 1 h): the first two start then, the next two
    2 hours later, the fifth 4 hours later. A notice is late when its group starts at or after
    its deadline, not only when the deadline comes before the next sweep."""
    hour = timedelta(hours=1)
    deadlines = [NOW + 0.5 * hour, NOW + 3 * hour, NOW + 3 * hour, NOW + 3.5 * hour, NOW + 10 * hour]
    assert runs_late(deadlines, 2, 2 * hour, NOW + hour) == [True, False, True, False, False]
    assert runs_late(deadlines, 5, 2 * hour, NOW + hour) == [True, False, False, False, False]  # all at once

