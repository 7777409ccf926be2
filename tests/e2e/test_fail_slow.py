"""Fail-slow on real Slurm: of four busy nodes running one job, the one whose GPU runs 20 % slower
than its peers is marked DEGRADED from its heartbeats and drained after the job, never requeued
or killed; once the job ends its full check runs, and a pass returns it to service."""

from __future__ import annotations

import os
import subprocess
import time

from nodemedic.contracts.incident import ENDED_STATUSES
from nodemedic_cli.report import build, render_html
from nodemedic_sandbox.local import LocalMode

from tests.conftest import require_slurm
from tests.e2e.support import job_running, wait_for

SWEEP_S = 0.5


def test_a_node_20_percent_slower_than_its_peers_is_degraded_without_killing_the_job() -> None:
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01, schedule_scale=SWEEP_S / 60,
                   extra_parameters={"FailSlowSamples": "4"}) as fleet:
        fleet.start_agents(heartbeat_s=0.5, poll_s=0.5)
        job = fleet.scheduler.submit(4)
        started = job_running(fleet, job)["StartTime"]
        for node in fleet.scheduler.nodes:  # the job keeps every GPU busy
            fleet.agents.inject(node, "busy")
        fleet.agents.inject("gpu-3", "slow", gpu=5)  # GPU 5 at 80 % of its clock
        incident = wait_for(lambda: next((i for i in fleet.incidents() if i.slurm_node == "gpu-3"), None),
                            "a fail-slow incident for gpu-3", 60)
        assert (incident.fault_code, incident.fault_class, incident.action) == ("FAIL_SLOW", "fail_slow", "degrade")
        evidence = incident.stages["detect"].result["evidence"]
        assert evidence["percent_below"] >= 15 and evidence["peers"] == 3
        # DEGRADED: drained after its job (Slurm DRAINING); the job runs on, not requeued, not restarted
        wait_for(lambda: "DRAIN" in fleet.scheduler.node("gpu-3")["State"], "gpu-3 draining")
        node = fleet.scheduler.node("gpu-3")
        assert "DEGRADED FAIL_SLOW" in node["Reason"]
        time.sleep(3)  # the check rung keeps waiting for the job
        info = fleet.scheduler.job(job)
        assert (info["JobState"], info["StartTime"], info["Restarts"]) == ("RUNNING", started, "0")
        assert fleet.incident(incident.incident_id).status == "open"
        assert [i.slurm_node for i in fleet.incidents()] == ["gpu-3"]  # the peers are not slow
        # the job ends; the check runs on the idle node (its GPU came back to full clock meanwhile)
        fleet.agents.inject("gpu-3", "clear")
        subprocess.run(["scancel", job], env={**os.environ, **fleet.scheduler.env}, check=True)
        done = wait_for(lambda: next((i for i in fleet.incidents()
                                      if i.incident_id == incident.incident_id and i.status in ENDED_STATUSES), None),
                        "the fail-slow incident to end", 90)
        assert done.status == "closed"
        assert [r["rung"] for r in done.stages["repair"].result["rungs"]] == ["check"]
        assert "DRAIN" not in fleet.scheduler.node("gpu-3")["State"]
        # the report names it, with the evidence
        page = render_html(build(fleet.incidents()), fleet.incidents(), "fleet")
        assert "fail_slow" in page and "below the median of 3 busy" in page


def test_a_gpu_lost_on_a_degraded_node_requeues_its_job_instead_of_waiting_for_it() -> None:
    """The DEGRADED node's job runs on; then a GPU of that node falls off the bus (Xid 79): the job
    cannot run on there. The check rung stops waiting, the job is requeued through the stack's
    own Repair role and document, and the node's ladder goes on."""
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01, schedule_scale=SWEEP_S / 60,
                   extra_parameters={"FailSlowSamples": "4"}) as fleet:
        fleet.start_agents(heartbeat_s=0.5, poll_s=0.5)
        job = fleet.scheduler.submit(4)
        job_running(fleet, job)
        for node in fleet.scheduler.nodes:
            fleet.agents.inject(node, "busy")
        fleet.agents.inject("gpu-3", "slow", gpu=5)
        incident = wait_for(lambda: next((i for i in fleet.incidents() if i.slurm_node == "gpu-3"), None),
                            "a fail-slow incident for gpu-3", 60)
        wait_for(lambda: "DRAIN" in fleet.scheduler.node("gpu-3")["State"], "gpu-3 draining")
        wait_for(lambda: "repair" in fleet.incident(incident.incident_id).stages, "the check rung waiting for the job")
        assert fleet.scheduler.job(job)["JobState"] == "RUNNING"

        fleet.agents.inject("gpu-3", "xid", xid=79, gpu=2)

        rung = wait_for(lambda: next((r for r in fleet.incident(incident.incident_id).repair_rungs if r.requeued), None),
                        "the job requeued by the check rung", 60)
        assert rung.rung == "check" and rung.requeued == [job] and "XID 79" in rung.requeued_because
        assert fleet.scheduler.job(job)["Restarts"] == "1"
        current = fleet.incident(incident.incident_id)
        assert [f.fault_code for f in current.folded_faults] == ["XID 79"]
        assert [i.incident_id for i in fleet.incidents()] == [incident.incident_id]  # folded, not a second incident
