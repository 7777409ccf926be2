"""EC2's warning that a Capacity Block ends, delivered to the default bus as EC2 does, through the
deployed template on a real Slurm: every node of the cluster in the block is drained before EC2
terminates it, the job on it checkpoints and moves to a spare outside the block, and nothing is
repaired or replaced into the block; the incidents end retired and the on-call is told once."""

from __future__ import annotations

import copy
import json
import time
from datetime import UTC, datetime, timedelta

from nodemedic import operations
from nodemedic.contracts.capacity_block import TERMINATION_LEAD

from tests.conftest import EVENTS
from tests.e2e.support import OPERATOR, stack, wait_for
from tests.e2e.test_checkpoint_drain import POLICY, _submit, moved_with_its_checkpoint

BLOCK = "cr-0a1b2c3d4e5f60718"


def _expiry_warning(end_in: timedelta) -> dict:
    event = copy.deepcopy(json.loads((EVENTS / "aws-ec2" / "capacity-block-expiration-warning.json").read_text()))
    now = datetime.now(UTC)
    event["time"] = now.isoformat()
    event["detail"]["end-date"] = (now + end_in).isoformat()
    return event


def _group(local) -> list[tuple[str, str]]:
    return sorted((i["InstanceId"], i["LifecycleState"]) for i in local.cluster.group_instances())


def test_a_capacity_block_ending_drains_its_nodes_with_the_job_checkpointed_and_replaces_nothing() -> None:
    with stack(nodes=3, spares=2, CheckpointPolicy=POLICY) as local:  # gpu-4 and gpu-5 are the spares
        job, nodes = _submit(local, nodes=3)
        assert nodes == ["gpu-1", "gpu-2", "gpu-3"]
        time.sleep(3)  # it trains a while: work a requeue without a checkpoint would lose
        in_block = {n: local.cluster.instance_of(n) for n in ("gpu-2", "gpu-4")}  # a worker and a spare
        local.aws.place_in_capacity_reservation(list(in_block.values()), BLOCK)
        group = _group(local)
        event = _expiry_warning(end_in=timedelta(minutes=40))
        # SNS cannot be reached for the first delivery: the function fails without saying it, and
        # takes back its claim to say it, so EventBridge's retry (the same warning again) says it
        sns_down = local.aws.throttle("sns", "Publish", caller="PlannedEvents", times=10_000)
        local.emit_as_aws(event)
        end = datetime.fromisoformat(event["detail"]["end-date"])
        said = {"pk": {"S": f"ANNOUNCED#capacity-block/{BLOCK}/{end:%Y%m%dT%H%M%SZ}"}}
        wait_for(lambda: sns_down.hits and "Item" not in local.aws.client("dynamodb").get_item(
            TableName=local.stack.table_name, Key=said), "the first delivery to fail", 60)
        sns_down.times = 0
        local.emit_as_aws(event)  # delivered at least once: the same warning twice

        def both_retired() -> list | None:
            done = sorted((i for i in local.incidents() if i.status == "retired"), key=lambda i: i.slurm_node)
            return done if len(done) == 2 else None

        retired = wait_for(both_retired, "both block nodes retired", 120)
        assert [i.slurm_node for i in retired] == ["gpu-2", "gpu-4"]
        assert len(local.incidents()) == 2, "the second delivery opened nothing"
        deadline = datetime.fromisoformat(event["detail"]["end-date"]) - TERMINATION_LEAD
        worker, spare = retired
        assert all(i.fault_code == "PLANNED_CAPACITY_END" and i.closed_at and i.closed_at < deadline for i in retired)
        # the job checkpointed on gpu-2, then moved to the spare outside the block and resumed from it
        moved_with_its_checkpoint(local, worker, job, "gpu-5", ["gpu-1", "gpu-3", "gpu-5"])
        # nothing repaired, nothing replaced into the block; both stay drained until EC2 takes them
        assert "repair" not in worker.stages and "repair" not in spare.stages
        assert {n: local.cluster.instance_of(n) for n in in_block} == in_block
        assert _group(local) == group, "no instance launched or terminated"
        assert all("DRAIN" in local.scheduler.node(n)["State"] for n in in_block)
        # said once, although EventBridge delivered the warning twice
        told = [m["Message"] for m in local.escalations() if m.get("Subject") == "NodeMedic: Capacity Block ending"]
        assert len(told) == 1, told
        assert BLOCK in told[0] and "(gpu-2, gpu-4)" in told[0]


def test_a_block_ending_while_a_fault_is_repaired_retires_the_node_instead_of_replacing_it() -> None:
    # approval mode holds the fault's incident after its drain: the warning arrives mid-incident
    with stack(nodes=3, RemediationMode="approval", BreakerMaxPercent="100") as local:
        old = local.cluster.instance_of("gpu-2")
        local.aws.place_in_capacity_reservation([old], BLOCK)
        local.put_event(local.health_event("gpu-2", "XID 79"))
        fault = wait_for(lambda: next((i for i in local.incidents() if "approval" in i.stages
                                       and i.stages["approval"].result.get("task_token")), None),
                         "the fault's incident to wait for approval", 60)
        group = _group(local)
        local.emit_as_aws(_expiry_warning(end_in=timedelta(minutes=40)))
        wait_for(lambda: "capacity_end" in local.incident(fault.incident_id).stages,
                 "the block's end noted on the open incident", 60)
        assert len(local.incidents()) == 1, "folded into the fault's incident, not a second one"

        operations.answer_approval(local.ledger, local.aws.client("stepfunctions"), fault.incident_id, approve=True,
                                   by=OPERATOR, reason="XID 79 confirmed")
        ended = wait_for(lambda: (i := local.incident(fault.incident_id)).status != "open" and i, "the incident to end", 60)
        assert ended.status == "retired", ended.outcome
        assert "its capacity ends (PLANNED_CAPACITY_END)" in ended.outcome
        assert local.cluster.instance_of("gpu-2") == old and _group(local) == group, "nothing replaced into the block"
        node = local.scheduler.node("gpu-2")
        assert "DRAIN" in node["State"] and node["Reason"].startswith(f"nodemedic:{fault.incident_id}")
