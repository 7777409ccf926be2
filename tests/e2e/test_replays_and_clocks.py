"""One real fault is remediated at most once, whatever the bus does with its event (redelivery,
replay, redrive), and every duration is measured on a clock that can be trusted."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from nodemedic_sandbox.local import LocalMode

from tests.e2e.support import latest


def put(local: LocalMode, detail: dict, time: datetime | None = None) -> None:
    entry = {"Source": "nodemedic.agent", "DetailType": "Node Health Event", "EventBusName": local.stack.bus_name,
             "Detail": json.dumps(detail)}
    if time:
        entry["Time"] = time
    local.aws.client("events").put_events(Entries=[entry])


def test_a_redelivered_event_after_its_incident_closed_does_not_remediate_again(local: LocalMode) -> None:
    detail = local.health_event("gpu-2", "XID 79")
    put(local, detail)
    [first] = local.wait_for_executions(1, timeout=120)
    assert local.incident(first["name"]).status == "closed"

    put(local, detail)  # EventBridge retry, DLQ redrive or replay: the same event_id
    second = latest(local.wait_for_executions(2, timeout=60))
    assert local.detect_decision(second) == "deduplicated"
    assert f"handled already, by incident {first['name']}" in json.loads(second["output"])["detect"]["reason"]
    assert local.drains() == ["gpu-2"] and len(local.incidents()) == 1


def test_an_event_replayed_hours_later_or_older_than_the_last_repair_is_rejected(local: LocalMode) -> None:
    put(local, local.health_event("gpu-2", "XID 79"), time=datetime.now(UTC) - timedelta(hours=2))
    [replayed] = local.wait_for_executions(1)
    assert replayed["error"] == "InvalidEventError" and "stale: the event entered the bus" in replayed["cause"]
    assert "(limit 3600 s)" in replayed["cause"]

    put(local, local.health_event("gpu-3", "XID 79"))
    repaired = local.incident(latest(local.wait_for_executions(2, timeout=120))["name"])
    assert repaired.status == "closed" and repaired.closed_at is not None
    late = local.health_event("gpu-3", "XID 79", observed_at=repaired.closed_at - timedelta(seconds=30))
    put(local, late)  # a fault from before the repair, delivered after it
    stale = latest(local.wait_for_executions(3))
    assert stale["error"] == "InvalidEventError" and "predates the node's last completed repair" in stale["cause"]
    assert sorted(local.drains()) == ["gpu-3"]


def test_a_node_clock_ten_minutes_fast_gives_true_durations(local: LocalMode) -> None:
    fast = datetime.now(UTC) + timedelta(minutes=10)
    detail = local.health_event("gpu-2", "XID 79", observed_at=fast - timedelta(seconds=2))
    detail["sent_at"] = fast.isoformat()
    put(local, detail)
    [execution] = local.wait_for_executions(1, timeout=120)
    incident = local.incident(execution["name"])
    detect = incident.stages["detect"].result
    assert incident.status == "closed" and detect["origin_corrected"] is True
    assert 590 <= detect["node_clock_skew_s"] <= 610
    mttd = (incident.detected_at - incident.observed_at).total_seconds()
    assert 0 <= mttd < 30, mttd  # the node's 2 s delay plus delivery, not -600 s
    assert [v for v in local.metric_values("TimeToRecover", Cluster="local")] and \
        all(0 < v < 120 for v in local.metric_values("TimeToRecover", Cluster="local"))


def test_events_naming_unknown_nodes_page_once_per_window_and_are_counted(local: LocalMode) -> None:
    for n in range(3):
        detail = local.health_event("gpu-2", "XID 79")
        detail["node"]["instance_id"] = f"i-0badc0ffee000000{n}"
        put(local, detail)
    executions = local.wait_for_executions(3)
    assert {e["error"] for e in executions} == {"UnknownNodeError"}
    [page] = local.escalations()
    assert "counted, not paged" in page["Message"]
    assert sum(local.metric_values("EventsRejected", "Sum", Cluster="local", Reason="unknown_node")) == 3
    assert local.incidents() == [] and local.drains() == []
