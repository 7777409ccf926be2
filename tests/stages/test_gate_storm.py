"""A storm at the gate: many nodes fault at once while the concurrency cap lets only a few be
remediated. The breaker must trip on the demand, not wait for slots to free up one by one."""

from __future__ import annotations

import pytest
from nodemedic.contracts.incident import Incident
from nodemedic.errors import ThrottledError
from nodemedic.providers.base import Member
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.stages.gate import gate
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger

from tests.stages.conftest import clock, opened
from tests.stages.memory_provider import MemoryProvider

POLICY = SafetyPolicy.model_validate({"max_concurrent": 2, "breaker": {"max_percent": 100, "max_nodes": 5}})
NODES = [f"gpu-{i}" for i in range(1, 31)]


def _gate(incident: Incident, provider: MemoryProvider, control: ControlStore, ledger: Ledger) -> str:
    try:
        return gate(incident, load_policy=lambda: POLICY, provider=provider, control=control, ledger=ledger,
                    clock=clock).verdict
    except ThrottledError:
        return "throttled"


def test_thirty_faults_at_once_admit_two_and_trip_the_breaker_on_the_sixth_node(ledger: Ledger) -> None:
    provider = MemoryProvider(*(Member(f"i-{n}", n, "running") for n in NODES))
    control = ControlStore(ledger._db, ledger._table, "c1")
    incidents = [opened(ledger, n) for n in NODES]

    first = [_gate(i, provider, control, ledger) for i in incidents]
    assert first[:2] == ["proceed", "proceed"]
    assert first[2:5] == ["throttled"] * 3  # waiting for a slot, counted by the breaker
    assert first[5:] == ["hold"] * 25  # the 6th node trips it; the rest are held by the open breaker

    state = control.read()
    assert state.breaker.state == "open" and state.breaker.trips == 1
    assert "6 nodes under remediation within 60 min (3 waiting for a slot) exceed the limit of 5" in \
        (state.breaker.tripped.reason if state.breaker.tripped else "")
    assert sorted(state.admissions) == sorted(i.incident_id for i in incidents[:2])
    # the waiting ones' retry is held too: nothing more is admitted while the breaker is open
    assert [_gate(i, provider, control, ledger) for i in incidents[2:5]] == ["hold"] * 3
    assert sorted(state.admissions) == sorted(control.read().admissions)
    assert all(ledger.get(i.incident_id).status == "held" for i in incidents[2:])
    assert all(ledger.get(i.incident_id).status == "open" for i in incidents[:2])


@pytest.mark.parametrize("ended", ["closed", "failed"])
def test_a_waiting_incident_that_ended_no_longer_counts_and_is_forgotten(ledger: Ledger, ended: str) -> None:
    provider = MemoryProvider(*(Member(f"i-{n}", n, "running") for n in NODES[:6]))
    control = ControlStore(ledger._db, ledger._table, "c1")
    incidents = [opened(ledger, n) for n in NODES[:6]]
    assert [_gate(i, provider, control, ledger) for i in incidents[:5]] == ["proceed"] * 2 + ["throttled"] * 3
    for i in incidents[2:5]:  # retried past the budget (failed) or ended some other way
        if ended == "failed":
            ledger.fail(i, clock(), {"stage": "gate", "error": "ThrottledError", "cause": "x"}, "failed", None)
        else:
            ledger.end(i, "closed", clock(), "ended", release_node=True)
    assert _gate(incidents[5], provider, control, ledger) == "throttled"  # 3 nodes count: 2 admitted + itself
    assert sorted(control.read().waiting) == [incidents[5].incident_id]


def test_an_invalid_safety_policy_holds_every_incident_naming_the_field_and_releases_the_node(ledger: Ledger) -> None:
    """An operator's put-parameter with a bad policy: no rule of it is half applied. Each incident
    is held with a page that names the bad field; its node lock is released, so the same fault is
    taken again once the policy is fixed."""
    from nodemedic.safety.policy import parse_policy

    def bad() -> SafetyPolicy:
        return parse_policy('{"max_concurrent": 2, "breaker": {"max_percent": 0}}', origin="safety policy /p")

    provider = MemoryProvider(*(Member(f"i-{n}", n, "running") for n in NODES[:2]))
    control = ControlStore(ledger._db, ledger._table, "c1")
    held = opened(ledger, NODES[0])
    out = gate(held, load_policy=bad, provider=provider, control=control, ledger=ledger, clock=clock)
    assert out.verdict == "hold" and "breaker.max_percent" in out.reason
    assert out.notify and "breaker.max_percent" in out.notify and "Nothing was done to the node" in out.notify
    assert ledger.get(held.incident_id).status == "held"
    assert control.read().admissions == {}  # nothing admitted, the breaker untouched
    again = opened(ledger, NODES[0])  # the lock was released: the next fault opens an incident
    assert _gate(again, provider, control, ledger) == "proceed"


def test_a_breaker_tripped_by_a_rollout_names_the_image_and_driver_the_failing_nodes_share(ledger: Ledger) -> None:
    """A new AMI with a new GPU driver rolled out to part of the cluster, and the nodes that took it
    fail one after another in every rack: the trip's page names what they share. The versions
    come from the agent's events (their evidence), the image from EC2."""
    new, old = {"image": "ami-0new"}, {"image": "ami-0old"}
    members = [Member(f"i-{n}", n, "running", {}, {**(new if i < 4 else old), "rack": f"rack-{i % 4}"})
               for i, n in enumerate(NODES[:8])]
    provider = MemoryProvider(*members)
    control = ControlStore(ledger._db, ledger._table, "c1")
    policy = SafetyPolicy.model_validate({"breaker": {"max_percent": 100, "max_nodes": 3}})
    verdicts = []
    for i, node in enumerate(NODES[:4]):
        incident = opened(ledger, node)
        ledger.start_stage(incident, "detect", clock())
        ledger.complete_stage(incident, "detect", clock(), {"evidence": {
            "summary": "Xid 79", "gpu_driver": "575.51.03", "kernel": f"6.8.0-10{15 + i % 2}-aws"}})
        verdicts.append(gate(incident, load_policy=lambda: policy, provider=provider, control=control,
                             ledger=ledger, clock=clock))
    assert [v.verdict for v in verdicts] == ["proceed"] * 3 + ["hold"]
    page = verdicts[-1].notify
    # the image only half the cluster runs, all the failing nodes: a rollout, not the fleet
    assert "image=ami-0new (4 of 4 nodes; 4 of 8 in the cluster)" in page
    assert "gpu_driver=575.51.03 (4 of 4 nodes)" in page  # what each healthy node runs is not known
    assert "kernel=6.8.0-1015-aws (2 of 4 nodes)" in page  # shared by half: said, after the rest
    assert "rack=" not in page  # each in a rack of its own
    admitted = control.read().admissions.values()
    assert all(a.attributes["gpu_driver"] == "575.51.03" and a.attributes["image"] == "ami-0new" for a in admitted)
