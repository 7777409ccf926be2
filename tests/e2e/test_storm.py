"""A failure storm on a 16-node real Slurm cluster: the circuit breaker stops automation once,
names the correlation, and an operator's reset re-enables it. Concurrent sources fold into one
incident."""

from collections.abc import Iterator

import pytest
from nodemedic import operations
from nodemedic_sandbox.local import LocalMode

from tests.e2e.support import OPERATOR, by_status, control, drained_nodes, put_all, stack, tag


@pytest.fixture(scope="module")
def storm() -> Iterator[LocalMode]:
    """16 nodes; the breaker allows 20 % of them (3) within its window."""
    with stack(16, BreakerMaxPercent="20", BreakerMaxNodes="8", NodeCooldownMinutes="0") as local:
        yield local


def test_a_storm_trips_the_breaker_once_and_an_operator_reset_re_enables_automation(storm: LocalMode) -> None:
    local = storm
    failing = [f"gpu-{i}" for i in range(1, 9)]  # 50 % of the cluster, all behind one top-of-rack switch
    tag(local, failing, "nodemedic:rack", "rack-b")
    tag(local, [f"gpu-{i}" for i in range(9, 17)], "nodemedic:rack", "rack-a")
    before = {n: local.cluster.instance_of(n) for n in local.node_names}

    put_all(local, [local.health_event(n, "XID 79") for n in failing])
    executions = local.wait_for_executions(8, timeout=300)

    assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
    status = by_status(local)
    assert len(status["closed"]) == 3 and len(status["held"]) == 5, status
    # only the three admitted nodes were drained and replaced; the five held ones were not touched
    assert drained_nodes(local) == set(status["closed"])
    for node in status["held"]:
        assert local.cluster.instance_of(node) == before[node]
        assert "DRAIN" not in local.scheduler.node(node)["State"]
    # one notification, naming the correlation
    [message] = [m["Message"] for m in local.escalations()]
    assert "circuit breaker TRIPPED" in message and "rack=rack-b (4 of 4 nodes; 8 of 16 in the cluster)" in message
    held = [i for i in local.incidents() if i.status == "held"]
    assert sum(i.outcome.startswith("breaker_limit") for i in held) == 1
    assert all(i.outcome.startswith(("breaker_limit", "breaker:")) for i in held)
    assert control(local).read().breaker.state == "open"

    # later events are recorded, cause no action and no new notification: new nodes get a held
    # incident each; a node already held folds the event into its incident
    again = status["held"][0]
    put_all(local, [local.health_event(n, "XID 79") for n in ("gpu-9", "gpu-10", again)])
    local.wait_for_executions(11, timeout=120)
    now = by_status(local)
    assert set(now["held"]) == {*status["held"], "gpu-9", "gpu-10"} and len(now["held"]) == 7
    assert next(i for i in local.incidents() if i.slurm_node == again).duplicate_events == 1
    assert drained_nodes(local) == set(status["closed"]) and local.escalations() == []

    # an operator resets it: automation acts again, also on a node that was held
    with pytest.raises(operations.OperatorError, match="reason"):
        operations.reset_breaker(control(local), local.ledger, OPERATOR, "")
    state, released = operations.reset_breaker(control(local), local.ledger, OPERATOR, "rack-b ToR switch replaced")
    assert state.breaker.state == "closed" and state.breaker.trips == 1
    assert sorted(i.slurm_node for i in released) == sorted(now["held"])  # the operator is told what was held
    with pytest.raises(operations.OperatorError, match="closed"):
        operations.reset_breaker(control(local), local.ledger, OPERATOR, "twice")
    put_all(local, [local.health_event(n, "XID 79") for n in ("gpu-12", again)])
    local.wait_for_executions(13, timeout=120)
    assert {"gpu-12", again} <= set(by_status(local)["closed"])
    assert local.cluster.instance_of("gpu-12") != before["gpu-12"]
    assert local.cluster.instance_of(again) != before[again]


def test_concurrent_events_for_one_node_from_three_sources_open_one_incident(storm: LocalMode) -> None:
    local = storm
    node = "gpu-16"
    instance = local.cluster.instance_of(node)
    seen = {e["name"] for e in local.executions()}
    cw = local.aws.client("cloudwatch")
    cw.put_metric_alarm(
        AlarmName=f"nodemedic-status-{node}", Namespace="AWS/EC2", MetricName="StatusCheckFailed_System",
        Dimensions=[{"Name": "InstanceId", "Value": instance}], Statistic="Maximum", Period=60,
        EvaluationPeriods=1, Threshold=1, ComparisonOperator="GreaterThanOrEqualToThreshold")
    put_all(local, [local.health_event(node, "XID 79"), local.health_event(node, "ECC_DBE")])
    local.put_event(local.health_event(node, "HEARTBEAT_MISSING", check="heartbeat"), source="nodemedic.sweeper")
    cw.set_alarm_state(AlarmName=f"nodemedic-status-{node}", StateValue="ALARM", StateReason="test")
    executions = [e for e in local.wait_for_executions(len(seen) + 4, timeout=120) if e["name"] not in seen]

    decisions = sorted(local.detect_decision(e) for e in executions)
    assert decisions == ["deduplicated"] * 3 + ["remediate"]
    [incident] = [i for i in local.incidents() if i.slurm_node == node]
    assert incident.duplicate_events == 3
    # whichever event came first, the node is acted on at most once
    assert local.drains().count(node) <= 1
