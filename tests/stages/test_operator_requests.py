"""An operator's reboot or replace request (a runbook started by hand, or the CLI) meets the node's
incident at Detect, where it is enforced whoever started it: an open incident refuses it, naming
itself and what to do (folded into it, the request changed nothing while its execution
succeeded); an incident that ended and holds the node on purpose (a quarantine) lets it through,
its lock released. Fast tier: the real Detect, the ledger in DynamoDB (embedded)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from nodemedic.contracts.stages import DetectInput
from nodemedic.errors import IncidentStateError, InvalidEventError, UnknownNodeError
from nodemedic.providers.base import Member
from nodemedic.stages.detect import detect
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger

from tests.conftest import load_event
from tests.stages.conftest import opened
from tests.stages.memory_provider import MemoryProvider


def _request(ledger: Ledger, action: str, incident_id: str):
    event = load_event(f"runbooks/{action}-node.json")
    event["detail"].update(cluster="c1", slurm_node="gpu-1")
    event["time"] = datetime.now(UTC).isoformat()
    return detect(DetectInput(event=json.loads(json.dumps(event)), incident_id=incident_id), cluster="c1",
                  overrides_json="", provider=MemoryProvider(Member("i-gpu-1", "gpu-1", "running")), ledger=ledger,
                  control=ControlStore(ledger._db, ledger._table, "c1"), now=datetime.now(UTC))


@pytest.mark.parametrize("action", ["reboot", "replace"])
def test_a_request_for_a_node_whose_incident_is_open_is_refused_naming_it(ledger: Ledger, action: str) -> None:
    holder = opened(ledger, "gpu-1")
    with pytest.raises(InvalidEventError, match=f"gpu-1 is in incident {holder.incident_id}, still open "
                                                f"\\(XID 79, replace; at detect\\): a {action} request would fold"):
        _request(ledger, action, f"runbook-{action}")
    assert ledger.active_incident_id("c1", "i-gpu-1") == holder.incident_id  # nothing changed
    assert ledger.get(holder.incident_id).duplicate_events == 0


@pytest.mark.parametrize("action", ["reboot", "replace"])
def test_a_request_whose_node_another_took_meanwhile_is_refused_not_folded(ledger: Ledger, action: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Two requests for one node at once (two operators, or a retried runbook) both look before
    either writes: the one whose write comes second finds the other's incident holding the node.
    Folded into it, it would change nothing while its execution succeeded: refused, naming it."""
    looked = Ledger.lock_holder
    first: list[str] = []

    def racing(self: Ledger, cluster: str, instance_id: str):
        seen = looked(self, cluster, instance_id)
        if not first:  # the other request opens its incident right after this one looked
            first.append(opened(ledger, "gpu-1").incident_id)
        return seen

    monkeypatch.setattr(Ledger, "lock_holder", racing)
    with pytest.raises(InvalidEventError, match=f"gpu-1 is in incident inc-[0-9]+, still open .* a {action} request "
                                                "would fold into it and change nothing"):
        _request(ledger, action, f"runbook-{action}")
    assert ledger.active_incident_id("c1", "i-gpu-1") == first[0]
    assert ledger.get(first[0]).duplicate_events == 0  # not counted as one of its events
    with pytest.raises(IncidentStateError):
        ledger.get(f"runbook-{action}")


def test_a_request_for_a_quarantined_node_releases_it_and_opens_its_own_incident(ledger: Ledger) -> None:
    holder = opened(ledger, "gpu-1")
    ledger.end(holder, "quarantined", datetime.now(UTC), "failed its check after the last rung", release_node=False)
    out = _request(ledger, "replace", "runbook-replace")
    assert out.decision == "remediate" and out.incident is not None and out.incident.action == "replace"
    assert ledger.active_incident_id("c1", "i-gpu-1") == "runbook-replace"
    assert ledger.get(holder.incident_id).status == "quarantined"


def test_a_request_for_a_node_no_instance_backs_says_so_and_what_rejoins_it(ledger: Ledger) -> None:
    """The group replaced gpu-1's instance (or scaled it in): an operator's replace names a node
    with no instance. It is refused before anything changes, saying why and what gives the node an
    instance, not only "not a member"."""
    event = load_event("runbooks/replace-node.json")
    event["detail"].update(cluster="c1", slurm_node="gpu-1")
    event["time"] = datetime.now(UTC).isoformat()
    with pytest.raises(UnknownNodeError, match="no instance of it backs gpu-1 .*INSTANCE_LOST.*nodemedic:slurm-node=gpu-1"):
        detect(DetectInput(event=event, incident_id="runbook-replace"), cluster="c1", overrides_json="",
               provider=MemoryProvider(Member("i-gpu-2", "gpu-2", "running")), ledger=ledger,
               control=ControlStore(ledger._db, ledger._table, "c1"), now=datetime.now(UTC))
    assert ledger.active_incident_id("c1", "i-gpu-1") is None
