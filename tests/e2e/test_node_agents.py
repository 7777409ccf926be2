"""Real node agents (simulated GPUs) on the local cluster: a fault on a node reaches the
pipeline through the agent, and a node that goes silent is caught by the cloud-side sweeper."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from nodemedic_sandbox.local import LocalMode

from tests.conftest import require_slurm

SILENCE_S = 3.0
SWEEP_S = 0.5
HEARTBEAT_S = 0.5


@pytest.fixture
def fleet():
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01, schedule_scale=SWEEP_S / 60,
                   extra_parameters={"HeartbeatSilenceSeconds": str(SILENCE_S)}) as local:
        local.start_agents(heartbeat_s=HEARTBEAT_S, poll_s=0.5)
        time.sleep(2 * SWEEP_S + 0.5)  # every node has been seen by a sweep
        yield local


def test_an_xid_seen_by_the_agent_is_remediated(fleet: LocalMode) -> None:
    fleet.agents.inject("gpu-1", "xid", xid=79, gpu=4)
    [execution] = fleet.wait_for_executions(1, timeout=60)
    assert execution["status"] == "SUCCEEDED", execution.get("cause")
    [incident] = fleet.incidents()
    assert (incident.slurm_node, incident.fault_code, incident.source) == ("gpu-1", "XID 79", "nodemedic.agent")
    assert incident.status == "closed"


def test_a_silent_node_is_detected_by_the_sweeper_and_remediated(fleet: LocalMode) -> None:
    fleet.agents.stop_node("gpu-3")  # a clean shutdown says goodbye: not a fault
    killed_at = datetime.now(UTC)
    fleet.agents.kill("gpu-2")  # gpu-2 dies: its heartbeats stop
    executions = fleet.wait_for_executions(1, timeout=60)
    assert len(executions) == 1, [(i.slurm_node, i.fault_code, i.reason) for i in fleet.incidents()]
    [execution] = executions
    [incident] = fleet.incidents()
    assert (incident.slurm_node, incident.fault_code, incident.source) == ("gpu-2", "HEARTBEAT_MISSING", "nodemedic.sweeper")
    # Not before the node has been silent for the threshold (its last heartbeat was at most one
    # interval before the kill). How fast it is caught is measured in bench/silent_node.py, not
    # asserted here: a timed bound in a test fails on a loaded machine (CI saw 5.0 s once).
    latency = (incident.detected_at - killed_at).total_seconds()
    assert latency >= SILENCE_S - HEARTBEAT_S, latency
    assert execution["status"] == "SUCCEEDED", execution.get("cause")
    time.sleep(SILENCE_S + 2 * SWEEP_S)
    assert len(fleet.executions()) == 1  # reported once; gpu-3 and the live nodes never


def test_a_silent_node_whose_report_eventbridge_failed_is_reported_by_a_later_sweep(fleet: LocalMode) -> None:
    """PutEvents can take a call and fail entries of it (ThrottlingException, InternalFailure per
    entry); the sweeper must not count such a node as reported, or its silence is never acted on."""
    failures = fleet.aws.fail_entries("nodemedic.sweeper", times=2, code="ThrottlingException")
    fleet.agents.kill("gpu-2")
    executions = fleet.wait_for_executions(1, timeout=90)
    assert [json.loads(e["Detail"])["fault_code"] for e in failures.failed] == ["HEARTBEAT_MISSING"] * 2
    assert {json.loads(e["Detail"])["node"]["slurm_node"] for e in failures.failed} == {"gpu-2"}
    [incident] = fleet.incidents()
    assert (incident.slurm_node, incident.fault_code) == ("gpu-2", "HEARTBEAT_MISSING")
    assert executions[0]["status"] == "SUCCEEDED", executions[0].get("cause")
    time.sleep(SILENCE_S + 2 * SWEEP_S)
    assert len(fleet.executions()) == 1  # once taken, reported once
