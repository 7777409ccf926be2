"""The gate on a node its provider is working on (HyperPod patching it or running its deep health
check, EC2 starting it): the incident ends held, the node untouched and free for the next event."""

from __future__ import annotations

from nodemedic.providers.base import Member
from nodemedic.safety.gate import lineage_keys
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.stages.gate import gate
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

