"""The gate on a node its provider is working on (HyperPod patching it or running its deep health
check, EC2 starting it): the incident ends held, the node untouched and free for the next event.
And on a node whose instance is gone before the gate ran."""

from __future__ import annotations

import pytest
from nodemedic.errors import NodeGoneError, UnknownNodeError
from nodemedic.providers.base import Member
from nodemedic.safety.gate import lineage_keys
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.stages.gate import gate
from nodemedic.stages.resume import retire
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger

from tests.stages.conftest import clock, opened
from tests.stages.memory_provider import MemoryProvider


def test_a_fault_on_a_node_its_provider_works_on_is_held_and_the_node_left_free(ledger: Ledger) -> None:
    provider = MemoryProvider(Member("i-gpu-1", "gpu-1", "pending"))
    control = ControlStore(ledger._db, ledger._table, "c1")
    incident = opened(ledger)
    out = gate(incident, load_policy=lambda: SafetyPolicy(), provider=provider, control=control, ledger=ledger,
               clock=clock)
    assert out.verdict == "hold" and out.reason.startswith("provider:") and not out.notify
    assert ledger.get(incident.incident_id).status == "held"
    assert ledger.node_lock("c1", "i-gpu-1") is None  # the next event for the node opens an incident
    state = control.read()
    [slot] = lineage_keys(incident)
    assert incident.incident_id not in state.admissions and control.lineage(slot) == []  # no remediation counted

    provider.by_id["i-gpu-1"] = Member("i-gpu-1", "gpu-1", "running")  # the provider is done; the fault stays
    again = opened(ledger)
    assert gate(again, load_policy=lambda: SafetyPolicy(), provider=provider, control=control, ledger=ledger,
                clock=clock).verdict == "proceed"
    assert [iid for iid, _ in control.lineage(slot)] == [again.incident_id]



def test_an_instance_ec2_ended_before_the_gate_retires_the_incident_and_one_that_just_left_fails_it(
        ledger: Ledger) -> None:
    """Someone ended the instance between Detect and the gate (its group's health check, a
    scale-in): NodeGoneError, which the state machine retires (no page; the reconciler gives the
    node the group's next instance). An instance that left the cluster but that EC2 does not call
    ended (its tag taken off, an instance of another account) still fails: that is for a person."""
    control = ControlStore(ledger._db, ledger._table, "c1")
    incident = opened(ledger)
    with pytest.raises(NodeGoneError, match=r"EC2 ended i-gpu-1 \(terminated\) outside NodeMedic before the gate"):
        gate(incident, load_policy=lambda: SafetyPolicy(), provider=MemoryProvider(), control=control, ledger=ledger,
             clock=clock, ended=lambda instance: "terminated" if instance == "i-gpu-1" else None)
    assert "nothing was done to the node" in ledger.get(incident.incident_id).stages["gate"].result["gone"]
    ended = retire(incident, ledger=ledger, clock=clock)
    assert ended.status == "retired" and "before the gate" in ended.message
    assert ledger.node_lock("c1", "i-gpu-1") is None and control.read().admissions == {}
    other = opened(ledger, "gpu-2")
    with pytest.raises(UnknownNodeError, match="left cluster c1; nothing was drained"):
        gate(other, load_policy=lambda: SafetyPolicy(), provider=MemoryProvider(), control=control, ledger=ledger,
             clock=clock, ended=lambda _: None)
