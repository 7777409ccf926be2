"""One job's several failed nodes use several spares (issue 15), real Slurm."""

from tests.e2e.support import OPEN, job_running, running_job, stack


def test_both_failed_nodes_of_a_two_node_job_take_a_spare_and_the_job_runs_on_them() -> None:
    with stack(nodes=4, spares=2, boot_seconds=3, **OPEN) as local:
        job, nodes = running_job(local)
        other_job, _ = running_job(local)  # the cluster is full: only spares can run the job again
        for node in nodes:
            local.put_event(local.health_event(node, "XID 79"))
        executions = local.wait_for_executions(2, timeout=150)

        assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
        spares = sorted(local.incident(e["name"]).stages["spare"].result["spare"] for e in executions)
        assert spares == ["gpu-5", "gpu-6"]
        restarted = job_running(local, job, timeout=60)
        assert sorted(local.scheduler.hostnames(restarted["NodeList"])) == ["gpu-5", "gpu-6"]
        assert job_running(local, other_job)["Restarts"] == "0"
        # both repaired nodes refilled the pool
        assert local.cluster.spare_pool() == sorted(nodes)
