"""The burn-in gate on real Slurm: a node that joins (boots again outside NodeMedic) takes no job
until the pipeline's full deep health check passes; one that fails it climbs the ladder; an
operator's drain is never turned into a burn-in."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from nodemedic import operations
from nodemedic.contracts.incident import ENDED_STATUSES, Incident
from nodemedic_sandbox.local import LocalMode

from tests.conftest import require_slurm
from tests.e2e.support import OPERATOR, wait_for


@pytest.fixture
def fleet():
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01) as local:
        local.start_agents(heartbeat_s=0.5, poll_s=0.5)
        yield local


def ended(fleet: LocalMode, node: str, timeout: float = 90) -> Incident:
    return wait_for(lambda: next((i for i in fleet.incidents()
                                  if i.slurm_node == node and i.status in ENDED_STATUSES), None),
                    f"the burn-in of {node} to end", timeout)


def test_a_node_that_joins_takes_no_job_until_its_full_check_passes(fleet: LocalMode) -> None:
    result = fleet.agents.boot("gpu-2")
    assert result.held and result.reason.startswith("nodemedic:burn-in ")
    # slurmd registered after the hold: the node is drained from its first moment in the cluster
    assert "DRAIN" in fleet.scheduler.node("gpu-2")["State"]
    job = fleet.scheduler.submit(4)  # needs every node, gpu-2 included
    states = []
    deadline = time.monotonic() + 90
    while "DRAIN" in fleet.scheduler.node("gpu-2")["State"] and time.monotonic() < deadline:
        states.append(fleet.scheduler.job(job)["JobState"])
        time.sleep(0.2)
    assert states and set(states) == {"PENDING"}, states  # never started while the node was held
    incident = ended(fleet, "gpu-2")
    assert (incident.fault_code, incident.fault_class, incident.status) == ("NODE_JOINED", "burn_in", "closed")
    rungs = incident.stages["repair"].result["rungs"]
    assert [r["rung"] for r in rungs] == ["check"]  # checked as it is, nothing done to it
    assert rungs[0]["check"]["level"] == "full" and rungs[0]["check"]["healthy"]
    assert incident.stages["drain"].result["requeued_jobs"] == []
    wait_for(lambda: fleet.scheduler.job(job)["JobState"] == "RUNNING", "the job to start once gpu-2 passed")
    assert "gpu-2" in fleet.scheduler.hostnames(fleet.scheduler.job(job)["NodeList"])
    assert "DRAIN" not in fleet.scheduler.node("gpu-2")["State"]
    assert [i.slurm_node for i in fleet.incidents()] == ["gpu-2"]  # one join, one burn-in
    # a burn-in is no failure: recorded under its class, not in the cluster's MTTR (the alarm's metric)
    wait_for(lambda: fleet.metric_values("TimeToRecover", Cluster="local", FaultClass="burn_in"),
             "the burn-in's TimeToRecover")
    assert fleet.metric_values("TimeToRecover", Cluster="local") == []


def test_a_joined_node_that_fails_its_burn_in_climbs_the_ladder_and_an_operator_drain_is_kept(
        fleet: LocalMode) -> None:
    fleet.cluster.break_node("gpu-3", fixed_by="gpu_reset")
    # the operator's own drain, straight through scontrol
    subprocess.run(["scontrol", "update", "NodeName=gpu-1", "State=DRAIN", "Reason=rma ticket 42"],
                   env={**os.environ, **fleet.scheduler.env}, check=True)
    kept = fleet.agents.boot("gpu-1")
    assert not kept.held and kept.reason == "rma ticket 42" and not fleet.agents.marker("gpu-1").exists()
    assert fleet.agents.boot("gpu-3").held
    incident = ended(fleet, "gpu-3")
    rungs = incident.stages["repair"].result["rungs"]
    assert [(r["rung"], r["check"]["healthy"]) for r in rungs] == [("check", False), ("gpu_reset", True)]
    assert incident.status == "closed" and "DRAIN" not in fleet.scheduler.node("gpu-3")["State"]
    time.sleep(2)  # gpu-1's agent has polled several times: still no burn-in of an operator's node
    assert [i.slurm_node for i in fleet.incidents()] == ["gpu-3"]
    node = fleet.scheduler.node("gpu-1")
    assert "DRAIN" in node["State"] and node["Reason"].startswith("rma ticket 42")


def test_in_approval_mode_a_failed_burn_in_waits_for_an_operator_before_any_rung_changes_the_node() -> None:
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01,
                   extra_parameters={"RemediationMode": "approval"}) as local:
        local.start_agents(heartbeat_s=0.5, poll_s=0.5)
        sfn = local.aws.client("stepfunctions")
        local.cluster.break_node("gpu-2", fixed_by="replace")
        local.cluster.break_node("gpu-3", fixed_by="gpu_reset")
        before = {n: local.cluster.instance_of(n) for n in ("gpu-2", "gpu-3")}
        assert local.agents.boot("gpu-2").held and local.agents.boot("gpu-3").held

        def asking() -> dict[str, Incident] | None:
            waiting = {i.slurm_node: i for i in local.incidents()
                       if "approval" in i.stages and i.stages["approval"].result.get("task_token")}
            return waiting if len(waiting) == 2 else None
        waiting = wait_for(asking, "both failed burn-ins to ask for approval", 90)
        for node, incident in waiting.items():
            # the check of the node as it is ran (and failed); no rung has touched it
            assert [(r["rung"], r["check"]["healthy"]) for r in incident.stages["repair"].result["rungs"]] == [
                ("check", False)]
            assert incident.status == "open" and local.cluster.instance_of(node) == before[node]
            assert "DRAIN" in local.scheduler.node(node)["State"]
        # each request is recorded, then paged: a page may still be on its way (escalations() drains)
        pages: list[dict] = []
        wait_for(lambda: pages.extend(local.escalations()) or len(pages) >= 2, "both approval requests to be paged")
        assert sorted(m["Subject"] for m in pages) == ["NodeMedic: approve repair of gpu-2?",
                                                        "NodeMedic: approve repair of gpu-3?"]
        assert all("(gpu_reset -> reboot -> replace) waits for you" in m["Message"] for m in pages)

        operations.answer_approval(local.ledger, sfn, waiting["gpu-3"].incident_id, approve=True, by=OPERATOR,
                                   reason="reset it")
        operations.answer_approval(local.ledger, sfn, waiting["gpu-2"].incident_id, approve=False, by=OPERATOR,
                                   reason="keep it for the vendor")
        fixed, kept = ended(local, "gpu-3"), ended(local, "gpu-2")
        assert fixed.status == "closed" and "DRAIN" not in local.scheduler.node("gpu-3")["State"]
        rungs = fixed.stages["repair"].result["rungs"]
        assert [(r["rung"], r["check"]["healthy"]) for r in rungs] == [("check", False), ("gpu_reset", True)]
        assert kept.status == "denied" and "keep it for the vendor" in kept.outcome
        assert local.cluster.instance_of("gpu-2") == before["gpu-2"]  # not replaced
        node = local.scheduler.node("gpu-2")
        assert "DRAIN" in node["State"] and node["Reason"].startswith(f"nodemedic:{kept.incident_id}")
