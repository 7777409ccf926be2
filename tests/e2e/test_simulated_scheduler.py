"""Where a real Slurm cannot start, the local mode runs the same adapter against a simulation."""

import time

from nodemedic_sandbox.local import LocalMode


def test_the_pipeline_remediates_on_the_simulated_scheduler_too() -> None:
    with LocalMode(nodes=4, scheduler="simulated", retry_time_scale=0.01) as local:
        assert local.scheduler.kind == "simulated" and "simulated" in local.scheduler_note
        job = local.scheduler.submit(2)
        node = local.scheduler.hostnames(local.scheduler.job(job)["NodeList"])[0]
        local.put_event(local.health_event(node, "XID 79"))
        [execution] = local.wait_for_executions(1)

        assert execution["status"] == "SUCCEEDED", execution.get("cause")
        deadline = time.monotonic() + 10
        while (info := local.scheduler.job(job))["JobState"] != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (info["JobState"], info["Restarts"]) == ("RUNNING", "1")  # released, not held 120 s
        assert all("DRAIN" not in local.scheduler.node(n)["State"] for n in local.scheduler.hostnames(info["NodeList"]))
        assert "DRAIN" not in local.scheduler.node(node)["State"]  # resumed (it may run the job again)
        assert local.incident(execution["name"]).status == "closed"


def test_the_simulation_keeps_an_operators_drain() -> None:
    with LocalMode(nodes=4, scheduler="simulated", retry_time_scale=0.01) as local:
        import os
        import subprocess

        env = {**os.environ, **local.scheduler.env}
        subprocess.run(["scontrol", "update", "nodename=gpu-2", "state=drain", "reason=bob: cable swap"],
                       env=env, check=True)
        local.put_event(local.health_event("gpu-2", "XID 48"))
        [execution] = local.wait_for_executions(1)
        assert execution["status"] == "SUCCEEDED", execution.get("cause")
        node = local.scheduler.node("gpu-2")
        assert "DRAIN" in node["State"] and node["Reason"].startswith("bob: cable swap")
        assert local.scontrol_commands("state=resume") == []
