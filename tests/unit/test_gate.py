"""The safety gate's rules, one by one, and the policy's validation."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nodemedic.contracts.events import PLANNED_SOURCE
from nodemedic.contracts.incident import IncidentRef
from nodemedic.errors import PolicyError
from nodemedic.providers.base import Member
from nodemedic.safety.gate import Facts, admission_of, correlation, decide, software_of
from nodemedic.safety.policy import SafetyPolicy, parse_policy
from nodemedic.store.control import ControlState, Switch

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def incident(node: str = "gpu-1", code: str = "XID 79", iid: str = "inc-1", **kw: Any) -> IncidentRef:
    fields: dict[str, Any] = {"source": "nodemedic.agent", "fault_class": "gpu_lost", "action": "replace", **kw}
    return IncidentRef(incident_id=iid, cluster="c", instance_id="i-0000000000000000" + node[-1],
                       slurm_node=node, fault_code=code, observed_at=NOW, **fields)


def facts(inc: IncidentRef | None = None, *, policy: dict[str, Any] | None = None,
          state: ControlState | None = None, size: int = 16, member_topology: dict[str, str] | None = None,
          tags: dict[str, str] | None = None, signals: dict[tuple[str, str], datetime] | None = None,
          lineage: dict[str, list[tuple[str, datetime]]] | None = None, active: set[str] | None = None,
          member_state: str = "running") -> Facts:
    inc = inc or incident()
    member = Member(inc.instance_id, inc.slurm_node, member_state, tags or {}, member_topology or {})
    return Facts(inc, member, SafetyPolicy.model_validate(policy or {}), state or ControlState(),
                 active or set(), size, signals or {}, lineage or {}, NOW)


def admitted(state: ControlState, *nodes: str, at: datetime = NOW, rack: str = "r1") -> ControlState:
    for n in nodes:
        inc = incident(n, iid=f"inc-{n}")
        state.admissions[inc.incident_id] = admission_of(
            inc, Member(inc.instance_id, n, "running", {}, {"rack": rack}), at)
    return state


def test_a_healthy_cluster_lets_a_high_confidence_fault_through_with_every_rule_recorded() -> None:
    d = decide(facts())
    assert d.verdict == "proceed" and not d.needs_approval
    assert [r["rule"] for r in d.rules] == ["paused", "excluded", "breaker", "provider", "cooldown", "lemon",
                                            "breaker_limit", "concurrency", "corroboration"]
    assert all(r["result"] == "pass" for r in d.rules)


def test_paused_automation_holds_and_says_who_paused_it() -> None:
    state = ControlState(paused=Switch(by="alice", reason="switch firmware rollout", at=NOW))
    d = decide(facts(state=state))
    assert d.verdict == "hold" and "alice" in d.reason and "switch firmware rollout" in d.reason


@pytest.mark.parametrize(("exclusions", "tags"), [
    ({"nodes": ["gpu-*"]}, {}),
    ({"nodes": ["gpu-1"]}, {}),
    ({}, {"nodemedic:exclude": "true"}),
])
def test_excluded_nodes_are_held(exclusions: dict[str, Any], tags: dict[str, str]) -> None:
    d = decide(facts(policy={"exclusions": exclusions}, tags=tags))
    assert d.verdict == "hold" and d.reason.startswith("excluded")


@pytest.mark.parametrize(("action", "verdict"), [("replace", "hold"), ("reboot", "hold"),
                                                ("burn_in", "proceed"), ("retire", "proceed")])
def test_a_node_its_provider_is_working_on_is_held_untouched_without_a_page(action: str, verdict: str) -> None:
    """HyperPod patching the node (SystemUpdating) or running its deep health check: an agent event
    then started a remediation that raced HyperPod's work, and HyperPod refused its reboot or
    replace (InvalidInstanceStatus): the incident failed and paged. A joined node's burn-in and a
    retiring node's drain still go ahead."""
    d = decide(facts(incident(action=action), member_state="pending"))
    assert d.verdict == verdict and not d.notify
    if verdict == "hold":
        assert d.reason.startswith("provider: its provider is working on gpu-1") and "node untouched" in d.reason
        assert decide(facts(incident(action=action))).verdict == "proceed"  # the same fault on a running node


def test_a_silent_node_its_provider_still_reports_pending_is_held_and_a_person_told() -> None:
    """The sweeper reports a silent node whose provider reads pending only after hours of it (the
    provider is stuck): held quietly like an agent's fault, nobody would ever hear of it."""
    d = decide(facts(incident(code="HEARTBEAT_MISSING", action="reboot", confidence="ambiguous"),
                     member_state="pending"))
    assert d.verdict == "hold" and d.reason.startswith("provider:")
    assert "gpu-1" in d.notify and "still reports it pending" in d.notify and "needs a person" in d.notify


def test_an_open_breaker_holds_without_a_new_notification() -> None:
    state = ControlState()
    state.breaker.state = "open"
    state.breaker.tripped = Switch(by="nodemedic", reason="4 nodes", at=NOW)
    d = decide(facts(state=state))
    assert d.verdict == "hold" and d.reason.startswith("breaker") and not d.notify and not d.trips_breaker


def test_the_breaker_trips_on_the_node_past_the_limit_and_names_the_correlation() -> None:
    policy = {"breaker": {"max_percent": 20, "max_nodes": 8}}  # 20 % of 16 -> 3
    state = admitted(ControlState(), "gpu-2", "gpu-3", "gpu-4")
    d = decide(facts(incident("gpu-5", iid="inc-5"), policy=policy, state=state, member_topology={"rack": "r1"}))
    assert d.verdict == "hold" and d.trips_breaker
    assert "limit of 3" in d.reason
    assert "rack=r1 (4 of 4 nodes)" in d.notify and "fault_code=XID 79 (4 of 4 nodes)" in d.notify
    assert "gpu-2, gpu-3, gpu-4, gpu-5" in d.notify


def test_the_breaker_window_slides_and_a_reset_starts_the_count_again() -> None:
    policy = {"breaker": {"max_percent": 20, "window_minutes": 60}}
    old = admitted(ControlState(), "gpu-2", "gpu-3", "gpu-4", at=NOW - timedelta(minutes=61))
    assert decide(facts(incident("gpu-5"), policy=policy, state=old)).verdict == "proceed"
    # ...unless those remediations are still in progress
    busy = decide(facts(incident("gpu-5"), policy=policy, state=old, active={"inc-gpu-2", "inc-gpu-3", "inc-gpu-4"}))
    assert busy.trips_breaker
    recent = admitted(ControlState(), "gpu-2", "gpu-3", "gpu-4", at=NOW - timedelta(minutes=5))
    recent.breaker.reset = Switch(by="bob", reason="bad switch replaced", at=NOW - timedelta(minutes=1))
    assert decide(facts(incident("gpu-5"), policy=policy, state=recent)).verdict == "proceed"


def test_the_limit_is_the_smaller_of_share_and_count_and_never_zero() -> None:
    p = SafetyPolicy.model_validate({"breaker": {"max_percent": 50, "max_nodes": 5}})
    assert (p.breaker_limit(4), p.breaker_limit(16), p.breaker_limit(1)) == (2, 5, 1)


def test_concurrency_is_throttled_not_held() -> None:
    state = admitted(ControlState(), "gpu-2", "gpu-3")
    d = decide(facts(policy={"max_concurrent": 2, "breaker": {"max_percent": 100}}, state=state,
                     active={"inc-gpu-2", "inc-gpu-3"}))
    assert d.verdict == "throttled" and "2 remediations in progress (max 2)" in d.reason


def planned(node: str = "gpu-5", action: str = "replace") -> IncidentRef:
    return incident(node, "PLANNED_RETIREMENT", iid=f"inc-{node}", source=PLANNED_SOURCE, fault_class="planned",
                    action=action)


@pytest.mark.parametrize("mode", ["automatic", "approval", "dry_run"])
def test_planned_work_a_fault_left_no_room_for_yields_trips_nothing_and_waits_for_no_slot(mode: str) -> None:
    """The planned-events function released the work into room it read; a fault the gate admitted
    since took it. The fault would trip the breaker (every repair stopped until an operator resets
    it) or wait for a slot (counted by the breaker from then on); planned work is held instead, for
    a reason that passes: the planned-events sweep offers it again when there is room."""
    limit = {"mode": mode, "breaker": {"max_percent": 20, "max_nodes": 8}}  # 20 % of 16 -> 3
    full = admitted(ControlState(), "gpu-2", "gpu-3", "gpu-4")
    fault = decide(facts(incident("gpu-5", iid="inc-gpu-5"), policy=limit, state=full))
    d = decide(facts(planned(), policy=limit, state=full))
    if mode == "dry_run":
        assert (fault.would, d.would) == ("hold", "hold") and "planned_room" in d.reason
        return
    assert fault.trips_breaker and fault.rules[-1]["rule"] == "breaker_limit"
    assert d.verdict == "hold" and not d.trips_breaker and not d.notify and d.recheck_at is None
    assert d.rules[-1]["rule"] == "planned_room" and "breaker_limit" not in [r["rule"] for r in d.rules]
    assert d.reason.startswith("planned_room: 4 nodes would be under remediation within 60 min (limit 3)")
    assert "offered again at a later planned-events sweep" in d.reason

    cap = {"mode": mode, "max_concurrent": 2, "breaker": {"max_percent": 100}}
    busy = admitted(ControlState(), "gpu-2", "gpu-3")
    assert decide(facts(incident("gpu-5", iid="inc-gpu-5"), policy=cap, state=busy,
                        active={"inc-gpu-2", "inc-gpu-3"})).verdict == "throttled"
    d = decide(facts(planned(), policy=cap, state=busy, active={"inc-gpu-2", "inc-gpu-3"}))
    assert d.verdict == "hold" and "2 remediations in progress (max 2)" in d.reason and not d.trips_breaker


def test_planned_work_with_room_goes_through_the_same_rules_as_a_fault() -> None:
    d = decide(facts(planned(), policy={"mode": "approval", "breaker": {"max_percent": 20}},
                     state=admitted(ControlState(), "gpu-2"), active={"inc-gpu-2"}))
    assert d.verdict == "proceed" and d.needs_approval
    assert [r["rule"] for r in d.rules] == ["paused", "excluded", "breaker", "provider", "cooldown", "lemon",
                                            "planned_room", "breaker_limit", "concurrency", "corroboration"]
    assert d.rules[6]["detail"] == "room for planned work: 2 of at most 3 nodes, 1 of 4 in progress"


def waiting(state: ControlState, *nodes: str, at: datetime = NOW) -> ControlState:
    for n in nodes:
        inc = incident(n, iid=f"inc-{n}")
        state.waiting[inc.incident_id] = admission_of(inc, Member(inc.instance_id, n, "running", {}, {"rack": "r9"}), at)
    return state


def test_nodes_waiting_for_a_slot_count_toward_the_breaker() -> None:
    policy = {"max_concurrent": 2, "breaker": {"max_percent": 100, "max_nodes": 4}}
    state = waiting(admitted(ControlState(), "gpu-2", "gpu-3"), "gpu-4", "gpu-5")
    open_ = {"inc-gpu-2", "inc-gpu-3", "inc-gpu-4", "inc-gpu-5"}
    d = decide(facts(incident("gpu-6", iid="inc-gpu-6"), policy=policy, state=state, active=open_))
    assert d.verdict == "hold" and d.trips_breaker
    assert "5 nodes under remediation within 60 min (2 waiting for a slot) exceed the limit of 4" in d.reason
    assert "gpu-2, gpu-3, gpu-4, gpu-5, gpu-6" in d.notify
    # a waiting incident that ended (held, failed, closed) no longer counts, nor one from before a reset
    assert decide(facts(incident("gpu-6", iid="inc-gpu-6"), policy=policy, state=state,
                        active=open_ - {"inc-gpu-5"})).verdict == "throttled"
    state.breaker.reset = Switch(by="bob", reason="fabric fixed", at=NOW + timedelta(seconds=1))
    assert decide(facts(incident("gpu-6", iid="inc-gpu-6"), policy=policy, state=state,
                        active=open_)).verdict == "throttled"
    # the incident itself, waiting already, is one node: at the limit it waits on, it does not trip
    state = waiting(admitted(ControlState(), "gpu-2", "gpu-3"), "gpu-4", "gpu-5", "gpu-6")
    at_limit = {"max_concurrent": 2, "breaker": {"max_percent": 100, "max_nodes": 5}}
    assert decide(facts(incident("gpu-6", iid="inc-gpu-6"), policy=at_limit, state=state,
                        active=open_ | {"inc-gpu-6"})).verdict == "throttled"


def test_cooldown_holds_a_node_remediated_moments_ago() -> None:
    lineage = {"node:gpu-1": [("inc-0", NOW - timedelta(minutes=5))]}
    d = decide(facts(policy={"node_cooldown_minutes": 30}, lineage=lineage))
    assert d.verdict == "hold" and d.reason.startswith("cooldown")
    assert decide(facts(policy={"node_cooldown_minutes": 4}, lineage=lineage)).verdict == "proceed"


def test_the_nth_incident_of_a_slot_or_a_host_quarantines_and_pages() -> None:
    two = [("inc-a", NOW - timedelta(hours=5)), ("inc-b", NOW - timedelta(hours=1))]
    policy = {"node_cooldown_minutes": 0, "lemon": {"incidents": 3, "window_hours": 24}}
    d = decide(facts(policy=policy, lineage={"node:gpu-1": two}))
    assert d.verdict == "quarantine" and "inc-a, inc-b" in d.reason and "quarantined gpu-1" in d.notify
    # by EC2 host, whatever the slot
    d = decide(facts(policy=policy, lineage={"node:gpu-1": [], "host:h-1": two}))
    assert d.verdict == "quarantine" and "host:h-1" in d.reason
    # outside the window they do not count
    old = [("inc-a", NOW - timedelta(hours=30)), ("inc-b", NOW - timedelta(hours=1))]
    assert decide(facts(policy=policy, lineage={"node:gpu-1": old})).verdict == "proceed"


def test_an_ambiguous_fault_alone_is_verified_first_and_a_second_signal_corroborates_it() -> None:
    hb = incident(code="HEARTBEAT_MISSING", source="nodemedic.sweeper", confidence="ambiguous")
    own = {("nodemedic.sweeper", "HEARTBEAT_MISSING"): NOW}
    assert decide(facts(hb, signals=own)).verdict == "verify"
    second = {**own, ("aws.cloudwatch", "STATUS_CHECK_INSTANCE"): NOW - timedelta(minutes=2)}
    d = decide(facts(hb, signals=second))
    assert d.verdict == "proceed" and "aws.cloudwatch:STATUS_CHECK_INSTANCE" in d.rules[-1]["detail"]
    stale = {**own, ("aws.cloudwatch", "STATUS_CHECK_INSTANCE"): NOW - timedelta(minutes=30)}
    assert decide(facts(hb, signals=stale)).verdict == "verify"


def test_approval_mode_proceeds_with_approval_required() -> None:
    d = decide(facts(policy={"mode": "approval"}))
    assert d.verdict == "proceed" and d.needs_approval
    # a verified ambiguous fault asks too before its replace/reboot
    hb = incident(code="HEARTBEAT_MISSING", source="nodemedic.sweeper", confidence="ambiguous")
    d = decide(facts(hb, policy={"mode": "approval"}))
    assert d.verdict == "verify" and d.needs_approval


def test_a_burn_in_is_not_counted_but_asks_before_its_repairs_in_approval_mode() -> None:
    joined = incident("gpu-5", code="NODE_JOINED", fault_class="burn_in", action="burn_in")
    full = admitted(ControlState(), "gpu-2", "gpu-3", "gpu-4")  # the breaker's limit of 16 is reached
    d = decide(facts(joined, policy={"breaker": {"max_percent": 20}}, state=full))
    assert (d.verdict, d.needs_approval, d.approve_repairs, d.trips_breaker) == ("proceed", False, False, False)
    assert decide(facts(incident("gpu-5"), policy={"breaker": {"max_percent": 20}}, state=full)).verdict == "hold"
    # approval mode: the check of the node as it is needs no one; the rungs that change it do
    d = decide(facts(joined, policy={"mode": "approval"}))
    assert (d.verdict, d.needs_approval, d.approve_repairs) == ("proceed", False, True)
    assert "approval required before a rung changes it" in d.reason
    assert not decide(facts(policy={"mode": "approval"})).approve_repairs  # a fault asks after its drain
    d = decide(facts(joined, policy={"mode": "dry_run"}))
    assert (d.verdict, d.would) == ("dry_run", "proceed")


def test_a_node_whose_spot_instance_ec2_ended_is_joined_anew_without_filling_the_breaker() -> None:
    """A Spot reclaim of many nodes: each one's INSTANCE_LOST neither trips nor fills the breaker,
    so the faults after it are judged on the remediations only; a pause still holds it."""
    policy = {"breaker": {"max_percent": 20}}  # the limit: 3 of 16
    state, active = ControlState(), set()
    for n in range(1, 7):
        lost = incident(f"gpu-{n}", code="INSTANCE_LOST", iid=f"inc-l{n}", fault_class="instance_lost",
                        source="nodemedic.reconciler")
        d = decide(facts(lost, policy=policy, state=state, active=active, member_state="terminated"))
        assert (d.verdict, d.trips_breaker, d.approve_repairs) == ("proceed", False, False), d.reason
        state.admissions[lost.incident_id] = admission_of(lost, Member(lost.instance_id, lost.slurm_node, "terminated"),
                                                          NOW)
        active.add(lost.incident_id)
    assert decide(facts(incident("gpu-9", iid="inc-9"), policy=policy, state=state, active=active)).verdict == "proceed"
    d = decide(facts(lost, policy={"mode": "approval"}, member_state="terminated"))
    assert d.approve_repairs and "approval required before the replace rung" in d.reason
    state.paused = Switch(by="alice", reason="Spot storm: by hand", at=NOW)
    assert decide(facts(lost, policy=policy, state=state, member_state="terminated")).verdict == "hold"


def test_dry_run_keeps_the_reasoning_and_acts_on_nothing() -> None:
    d = decide(facts(policy={"mode": "dry_run"}))
    assert (d.verdict, d.would, d.notify, d.trips_breaker) == ("dry_run", "proceed", "", False)
    state = admitted(ControlState(), "gpu-2", "gpu-3", "gpu-4")
    d = decide(facts(incident("gpu-5"), policy={"mode": "dry_run", "breaker": {"max_percent": 20}}, state=state))
    assert d.would == "hold" and "breaker_limit" in d.reason and not d.trips_breaker


def test_correlation_needs_at_least_two_and_half_of_the_nodes() -> None:
    ms = [admission_of(incident(f"gpu-{i}"), Member("i", f"gpu-{i}", "running", {}, {"rack": r}), NOW)
          for i, r in enumerate(["a", "a", "b", "c"], 1)]
    assert correlation(ms) == ["fault_code=XID 79 (4 of 4 nodes)", "rack=a (2 of 4 nodes)"]
    assert correlation(ms[2:]) == ["fault_code=XID 79 (2 of 2 nodes)"]


@pytest.mark.parametrize(("text", "named"), [
    ('{"mode": "yolo"}', "mode"),
    ('{"breaker": {"max_percent": 0}}', "breaker.max_percent"),
    ('{"lemon": {"incidents": 1}}', "lemon.incidents"),
    ('{"max_concurrent": 3, "typo": 1}', "typo"),
    ("{not json", "not JSON"),
    ('{"breaker": ' * 100_000, "nested too deeply"),  # past Python's JSON decoder: a PolicyError, not a crash
])
def test_a_bad_policy_is_an_error_that_names_the_field(text: str, named: str) -> None:
    with pytest.raises(PolicyError, match="safety policy") as err:
        parse_policy(text)
    assert named in str(err.value)


def _retiring(node: str, iid: str) -> IncidentRef:
    return incident(node, code="PLANNED_CAPACITY_END", iid=iid, fault_class="planned", action="retire")


def test_a_whole_capacity_block_ending_is_drained_without_tripping_or_filling_the_breaker() -> None:
    policy = {"breaker": {"max_percent": 20, "max_nodes": 8}, "max_concurrent": 2, "mode": "approval"}  # limit 3
    state, active = ControlState(), set()
    for n in range(1, 9):  # 8 of 16 nodes: the block
        inc = _retiring(f"gpu-{n}", f"inc-r{n}")
        d = decide(facts(inc, policy=policy, state=state, active=active))
        assert d.verdict == "proceed" and not d.trips_breaker and not d.needs_approval, d.reason
        state.admissions[inc.incident_id] = admission_of(inc, Member(inc.instance_id, inc.slurm_node, "running"), NOW)
        active.add(inc.incident_id)
    # a fault meanwhile is judged on the remediations only: none, so it goes through
    d = decide(facts(incident("gpu-9", iid="inc-9"), policy=policy, state=state, active=active))
    limit = next(r for r in d.rules if r["rule"] == "breaker_limit")
    assert d.verdict == "proceed" and "1 of at most 3" in limit["detail"], d.rules


@pytest.mark.parametrize("why", ["paused", "breaker", "excluded"])
def test_an_operators_pause_an_open_breaker_or_an_exclusion_still_holds_a_retire(why: str) -> None:
    state = ControlState()
    if why == "paused":
        state.paused = Switch(by="alice", reason="block migration by hand", at=NOW)
    if why == "breaker":
        state.breaker.state = "open"
        state.breaker.tripped = Switch(by="nodemedic", reason="4 nodes", at=NOW)
    policy = {"exclusions": {"nodes": ["gpu-1"]}} if why == "excluded" else {}
    d = decide(facts(_retiring("gpu-1", "inc-r1"), policy=policy, state=state))
    assert d.verdict == "hold" and d.reason.startswith(why)


def test_a_dry_run_only_says_it_would_retire() -> None:
    d = decide(facts(_retiring("gpu-1", "inc-r1"), policy={"mode": "dry_run"}))
    assert d.verdict == "dry_run" and d.would == "proceed"


def test_the_versions_an_event_carried_are_short_texts_or_nothing() -> None:
    evidence = {"gpu_driver": "570.133.20", "kernel": "k" * 65, "image": "ami-0", "summary": "Xid 79"}
    assert software_of(evidence) == {"gpu_driver": "570.133.20"}
    assert software_of({"gpu_driver": 570, "kernel": ""}) == {}
