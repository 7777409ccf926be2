"""EC2's two-minute warning that it interrupts a Spot Instance, delivered to the default bus as EC2
does, through the deployed template on a real Slurm: the node is drained, the job on it
checkpoints and moves to a spare, all before EC2 acts; nothing is repaired or replaced (the
instance's Auto Scaling group replaces what EC2 takes), and the node stays drained."""

from __future__ import annotations

import copy
import json
import time
from datetime import datetime

from tests.conftest import EVENTS
from tests.e2e.support import stack
from tests.e2e.test_capacity_block import _group
from tests.e2e.test_checkpoint_drain import POLICY, _incident_ended, _submit, moved_with_its_checkpoint


def test_a_spot_interruption_checkpoints_the_job_moves_it_to_a_spare_and_retires_the_node() -> None:
    with stack(nodes=3, spares=1, CheckpointPolicy=POLICY) as local:  # gpu-4 is the spare
        job, nodes = _submit(local, nodes=3)
        assert nodes == ["gpu-1", "gpu-2", "gpu-3"]
        time.sleep(3)  # it trains a while: work a requeue without a checkpoint would lose
        instance = local.cluster.instance_of("gpu-2")
        group = _group(local)
        warning = copy.deepcopy(json.loads((EVENTS / "aws-ec2" / "spot-interruption-warning.json").read_text()))
        warning["detail"]["instance-id"] = instance
        warning["resources"] = [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance}"]
        local.emit_as_aws(warning)

        retired = _incident_ended(local, "gpu-2", timeout=120)
        assert (retired.status, retired.fault_code) == ("retired", "PLANNED_SPOT_INTERRUPTION"), retired.outcome
        evidence = retired.stages["detect"].result["evidence"]
        assert evidence["instance_action"] == "terminate"
        assert retired.closed_at is not None and retired.closed_at < datetime.fromisoformat(evidence["deadline"])
        # the job checkpointed within the two minutes, moved to the spare and resumed from its checkpoint
        moved_with_its_checkpoint(local, retired, job, "gpu-4", ["gpu-1", "gpu-3", "gpu-4"])
        # nothing repaired or replaced: EC2 takes the instance, its group replaces it
        assert "repair" not in retired.stages
        assert local.cluster.instance_of("gpu-2") == instance and _group(local) == group
        assert "DRAIN" in local.scheduler.node("gpu-2")["State"]
        assert len(local.incidents()) == 1
