"""A local stack leaves nothing behind: no daemon, no job step, no job process, no temp dir."""

from nodemedic_sandbox.slurm_cluster import processes_of

from tests.e2e.support import running_job, stack


def test_leaving_the_local_stack_kills_every_job_process_and_removes_its_dir() -> None:
    with stack(nodes=2) as local:
        running_job(local, nodes=2)
        root = local.scheduler.root
        assert processes_of(root), "the job's slurmstepd and script run under the cluster's dir"
    assert processes_of(root) == []
    assert not root.exists()
