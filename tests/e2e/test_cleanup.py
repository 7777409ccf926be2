"""A local stack leaves nothing behind: no daemon, no job step, no job process, no temp dir, no
lock file."""

import tempfile
from pathlib import Path

from nodemedic_sandbox.slurm_cluster import processes_of

from tests.e2e.support import running_job, stack


def test_leaving_the_local_stack_kills_every_job_process_and_removes_its_dir() -> None:
    with stack(nodes=2) as local:
        running_job(local, nodes=2)
        root = local.scheduler.root
        assert processes_of(root), "the job's slurmstepd and script run under the cluster's dir"
    assert processes_of(root) == []
    assert not root.exists()


def test_the_spare_documents_lock_files_stay_in_the_cluster_dir() -> None:
    before = set(Path(tempfile.gettempdir()).glob("nodemedic-*.lock"))
    with stack(nodes=3, spares=1) as local:
        _, [sick] = running_job(local, nodes=1)
        local.put_event(local.health_event(sick, "XID 79"))
        [execution] = local.wait_for_executions(1, timeout=90)
        assert execution["status"] == "SUCCEEDED"
        [incident] = local.incidents()
        assert incident.stages["spare"].result["spare"]  # the spare-take and spare-add documents ran
        assert local.ledger.bookkeeping(local.cluster.name).claims == []  # the spare and the replacement let go
        root = local.scheduler.root
        assert list(root.glob("nodemedic-*.lock"))  # their lock, in the cluster's dir (TMPDIR)
    assert set(Path(tempfile.gettempdir()).glob("nodemedic-*.lock")) == before and not root.exists()
