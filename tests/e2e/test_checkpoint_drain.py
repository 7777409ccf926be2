"""Checkpoint-aware drain on a real Slurm, through the deployed template: the job traps the
signal the CheckpointPolicy names, writes its checkpoint and reports it (``scontrol update
comment=nodemedic-checkpoint=<epoch>``, the documented contract); only then is it requeued. A
hard fault is requeued at once."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import timedelta
from pathlib import Path

from nodemedic.contracts.incident import ENDED_STATUSES, Incident
from nodemedic_sandbox.local import LocalMode

from tests.e2e.support import OPEN, job_running, stack, wait_for
from tests.e2e.test_planned_events import _retirement

POLICY = json.dumps({"default": {"signal": "USR1", "scope": "batch", "grace_seconds": 30}})

# A training job as the contract asks: on SIGUSR1 it writes its checkpoint (here: a line in its
# output), then reports the marker; it counts its steps so the test sees where it resumed.
CHECKPOINTING_JOB = """
step=0
[ -f "$HOME_DIR/ckpt-$SLURM_JOB_ID" ] && step=$(cat "$HOME_DIR/ckpt-$SLURM_JOB_ID")
checkpoint() {
  echo "$step" > "$HOME_DIR/ckpt-$SLURM_JOB_ID"
  echo "checkpoint at step $step"
  scontrol update jobid="$SLURM_JOB_ID" comment="nodemedic-checkpoint=$(date +%s)"
}
trap checkpoint USR1
echo "start at step $step on $SLURMD_NODENAME restart ${SLURM_RESTART_COUNT:-0}"
while true; do step=$((step + 1)); sleep 0.2 & wait $!; done
"""


def _incident_ended(local: LocalMode, node: str, timeout: float = 90):
    return wait_for(lambda: next((i for i in local.incidents() if i.slurm_node == node
                                  and i.status in ENDED_STATUSES), None), f"the incident of {node} to end", timeout)


def _submit(local: LocalMode, nodes: int = 1) -> tuple[str, list[str]]:
    """A checkpointing job (not pinned: a requeued job must be free to move), and its nodes."""
    home = local.scheduler.root / "jobs"
    job = local.scheduler.submit(nodes, name="ckpt", body=f"HOME_DIR={home}\n{CHECKPOINTING_JOB}")
    wait_for(lambda: "start at step 0" in _output(local, job), f"job {job} to start")
    return job, local.scheduler.hostnames(job_running(local, job)["NodeList"])


def _output(local: LocalMode, job: str) -> str:
    path = Path(local.scheduler.root / "jobs" / f"ckpt-{job}.out")
    return path.read_text() if path.exists() else ""


def resumed_from_its_checkpoint(local: LocalMode, job: str) -> None:
    """The job's last run started from the step its checkpoint saved, not from step 0."""
    saved = int((local.scheduler.root / "jobs" / f"ckpt-{job}").read_text())
    assert saved > 0 and f"start at step {saved} on" in _output(local, job)


def moved_with_its_checkpoint(local: LocalMode, incident: Incident, job: str, spare: str, nodes: list[str]) -> None:
    """The job checkpointed on the incident's node before its requeue, moved to ``spare`` (it runs
    on ``nodes`` now) and resumed from its checkpoint."""
    [outcome] = incident.stages["drain"].result["checkpoint"]["jobs"]
    assert outcome["job_id"] == job and outcome["outcome"] == "checkpointed"
    assert incident.stages["spare"].result["spare"] == spare
    assert local.scheduler.hostnames(job_running(local, job)["NodeList"]) == nodes
    resumed_from_its_checkpoint(local, job)


def test_a_scheduled_retirement_checkpoints_the_job_moves_it_to_a_spare_and_replaces_the_node() -> None:
    with stack(nodes=4, spares=1, CheckpointPolicy=POLICY) as local:
        job, nodes = _submit(local, nodes=4)  # every node but the spare: only the spare is free
        node = nodes[-1]
        time.sleep(3)  # it trains a while: work a requeue without a checkpoint would lose
        retiring = local.cluster.instance_of(node)
        local.emit_as_aws(_retirement([retiring], starts_in=timedelta(days=14)))
        incident = _incident_ended(local, node)
        assert incident.status == "closed", incident.outcome
        drained = incident.stages["drain"].result
        [outcome] = drained["checkpoint"]["jobs"]
        assert outcome["job_id"] == job and outcome["outcome"] == "checkpointed"
        assert outcome["work_saved_s"] >= 3  # all of it since its start: the job had no checkpoint before
        assert "SIGUSR1" in drained["checkpoint"]["policy"] and drained["requeued_jobs"] == [job]
        # the job checkpointed on its node, then restarted from that checkpoint on the spare
        info = job_running(local, job)
        moved = local.scheduler.hostnames(info["NodeList"])
        assert info["Restarts"] == "1" and node not in moved
        assert incident.stages["spare"].result["spare"] in moved  # the hot spare took the node's place
        resumed_from_its_checkpoint(local, job)
        assert local.cluster.instance_of(node) != retiring  # replaced before AWS's window


def test_with_no_spare_a_retirement_still_waits_for_the_checkpoint_and_the_job_resumes_from_it() -> None:
    with stack(nodes=2, CheckpointPolicy=POLICY) as local:
        job, nodes = _submit(local, nodes=2)  # the whole cluster: nowhere else to go
        node = nodes[-1]
        time.sleep(3)
        retiring = local.cluster.instance_of(node)
        local.emit_as_aws(_retirement([retiring], starts_in=timedelta(days=14)))
        incident = _incident_ended(local, node)
        assert incident.status == "closed", incident.outcome
        assert incident.stages["spare"].result["spare"] is None
        drained = incident.stages["drain"].result
        [outcome] = drained["checkpoint"]["jobs"]
        assert outcome["outcome"] == "checkpointed" and drained["requeued_jobs"] == [job]
        # it waited for the replaced node, then went on from its checkpoint, not from step 0
        info = job_running(local, job)
        assert local.scheduler.hostnames(info["NodeList"]) == nodes and info["Restarts"] == "1"
        resumed_from_its_checkpoint(local, job)
        assert local.cluster.instance_of(node) != retiring


def test_a_degraded_node_is_drained_after_its_job_checkpointed_and_a_hard_fault_requeues_at_once() -> None:
    with stack(nodes=4, CheckpointPolicy=POLICY, **OPEN) as local:
        (slow, [slow_node]), (dead, [dead_node]) = _submit(local), _submit(local)
        local.put_event(local.health_event(slow_node, "FAIL_SLOW", check="fail_slow", component=None,
                                           severity="warning", evidence={"percent_below": 20}))
        degraded = wait_for(lambda: next((i for i in local.incidents() if i.slurm_node == slow_node
                                          and "drain" in i.stages and i.stages["drain"].completed_at), None),
                            f"{slow_node} drained", 60)
        assert degraded.action == "degrade"
        assert degraded.stages["drain"].result["checkpoint"]["jobs"][0]["outcome"] == "checkpointed"
        assert (local.scheduler.root / "jobs" / f"ckpt-{slow}").exists()  # not killed mid-step: it saved first
        assert degraded.stages["drain"].result["requeued_jobs"] == [slow]
        local.put_event(local.health_event(dead_node, "XID 79"))
        lost = _incident_ended(local, dead_node)
        assert "hard fault" in lost.stages["drain"].result["checkpoint"]["policy"]
        assert lost.stages["drain"].result["requeued_jobs"] == [dead]
        assert not (local.scheduler.root / "jobs" / f"ckpt-{dead}").exists()  # never asked: the GPU is gone


def test_a_node_returned_to_service_during_the_checkpoint_wait_keeps_its_job() -> None:
    """A retirement notice: the drain asks the job to checkpoint and waits for its marker (this
    job never reports one); meanwhile an operator returns the node to service (``scontrol update
    state=resume``). The requeue document reads the node undrained and requeues nothing, in the
    same command: the job is not cut short, and the incident ends escalated saying why."""
    policy = json.dumps({"default": {"signal": "USR1", "scope": "batch", "grace_seconds": 4}})
    with stack(nodes=4, CheckpointPolicy=policy) as local:
        job = local.scheduler.submit(1, name="nockpt", body="trap '' USR1\nwhile true; do sleep 0.2; done")
        [node] = local.scheduler.hostnames(job_running(local, job)["NodeList"])
        calls: list[int] = []

        def first_retry(_: dict) -> bool:  # the first call drained the node and signalled the job
            calls.append(1)
            return len(calls) == 2

        local.aws.before_invoke("DrainFunction", lambda _: subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=resume"], env={**os.environ, **local.scheduler.env},
            check=True, timeout=30), when=first_retry)
        local.emit_as_aws(_retirement([local.cluster.instance_of(node)], starts_in=timedelta(days=14)))
        incident = _incident_ended(local, node)

        assert incident.status == "escalated", incident.outcome
        assert "no longer drained" in incident.outcome and "returned it to service" in incident.outcome
        assert not incident.stages["drain"].result.get("requeued_jobs")
        assert job_running(local, job)["Restarts"] == "0"  # never requeued
