"""A node slot's lineage (the incidents the cooldown and the lemon rule read) stays bounded."""

from __future__ import annotations

from datetime import timedelta

import pytest
from nodemedic.errors import ControlConflictError, PolicyError
from nodemedic.providers.base import Member
from nodemedic.safety.gate import lineage_keys
from nodemedic.safety.policy import SafetyPolicy, parse_policy
from nodemedic.stages.gate import gate
from nodemedic.store.control import LINEAGE_KEPT, ControlStore
from nodemedic.store.ledger import Ledger

from tests.stages.conftest import clock, opened
from tests.stages.memory_provider import MemoryProvider


def test_a_node_slots_lineage_keeps_its_newest_incidents_and_stays_under_the_item_limit(ledger: Ledger) -> None:
    """A slot's lineage was appended to at every remediation, without end: at some 4,000 incidents
    its item passes DynamoDB's 400 KB, and from then on every Gate for the node fails. It keeps the
    newest LINEAGE_KEPT now, as many as the lemon rule may count; one that grew since the Gate read
    it is a conflict (retried), not a lost entry."""
    provider = MemoryProvider(Member("i-gpu-1", "gpu-1", "running"))
    control = ControlStore(ledger._db, ledger._table, "c1")
    incident = opened(ledger)
    [slot] = lineage_keys(incident)
    long_ago = clock() - timedelta(days=30)  # outside the lemon window and the cooldown
    for n in range(LINEAGE_KEPT):
        control.append_lineage([slot], f"old-{n}", long_ago + timedelta(minutes=n))
    assert gate(incident, load_policy=lambda: SafetyPolicy(), provider=provider, control=control, ledger=ledger,
                clock=clock).verdict == "proceed"
    kept = [iid for iid, _ in control.lineage(slot)]
    assert len(kept) == LINEAGE_KEPT and kept[0] == "old-1" and kept[-1] == incident.incident_id

    read = control.lineage(slot)
    control.append_lineage([slot], "concurrent", clock())  # a second signal's lineage, written meanwhile
    state = control.read()
    with pytest.raises(ControlConflictError):
        control.save(state, {slot: ("late", clock())}, {slot: read})
    assert control.read().version == state.version
    assert [iid for iid, _ in control.lineage(slot)][-1] == "concurrent"  # nothing lost, nothing half-written


def test_the_lemon_rule_cannot_count_more_incidents_than_a_lineage_keeps() -> None:
    assert parse_policy(f'{{"lemon": {{"incidents": {LINEAGE_KEPT}}}}}').lemon.incidents == LINEAGE_KEPT
    with pytest.raises(PolicyError, match="lemon.incidents"):
        parse_policy(f'{{"lemon": {{"incidents": {LINEAGE_KEPT + 1}}}}}')


def test_a_lineage_grown_by_verified_faults_alone_is_kept_bounded_too(ledger: Ledger) -> None:
    """An ambiguous fault's incident enters the lineage once its check confirms it (append_lineage),
    not at the Gate: a slot whose incidents were all of that kind grew without end all the same."""
    control = ControlStore(ledger._db, ledger._table, "c1")
    long_ago = clock() - timedelta(days=30)
    for n in range(LINEAGE_KEPT + 5):
        control.append_lineage(["node:gpu-1"], f"inc-{n}", long_ago + timedelta(minutes=n))
    kept = [iid for iid, _ in control.lineage("node:gpu-1")]
    assert kept == [f"inc-{n}" for n in range(5, LINEAGE_KEPT + 5)]
