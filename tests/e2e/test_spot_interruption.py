"""EC2's two-minute warning that it interrupts a Spot Instance, delivered to the default bus as EC2
does, through the deployed template on a real Slurm: the node is drained, the job on it
checkpoints and moves to a spare, all before EC2 acts; nothing is repaired or replaced (the
instance's Auto Scaling group replaces what EC2 takes), and the node stays drained. A Spot
Instance that EC2 hibernated (or stopped) and starts again when capacity comes back is checked
and returned to service."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

from nodemedic.contracts.incident import ENDED_STATUSES, Incident
from nodemedic_sandbox.local import LocalMode

from tests.conftest import EVENTS
from tests.e2e.support import stack, wait_for
from tests.e2e.test_capacity_block import _group
from tests.e2e.test_checkpoint_drain import POLICY, _incident_ended, _output, _submit, moved_with_its_checkpoint


def test_a_spot_interruption_checkpoints_the_job_moves_it_to_a_spare_and_retires_the_node() -> None:
    with stack(nodes=3, spares=1, CheckpointPolicy=POLICY) as local:  # gpu-4 is the spare
        job, nodes = _submit(local, nodes=3)
        assert nodes == ["gpu-1", "gpu-2", "gpu-3"]
        time.sleep(3)  # it trains a while: work a requeue without a checkpoint would lose
        instance = local.cluster.instance_of("gpu-2")
        group = _group(local)
        local.emit_as_aws(_warning(instance, "terminate"))

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


def test_a_node_whose_spot_instance_ec2_terminates_gets_the_instance_its_group_launched_checked() -> None:
    """Slurm on an Auto Scaling group: the group launches an instance in place of the one EC2
    took, but cannot tell it which node to be. The reconciler's next run has the node replaced by
    an incident of its own (INSTANCE_LOST): the group's new instance is claimed, named after the
    node, joined and checked, and the node returns to service. Once: another run starts nothing."""
    with stack(nodes=3) as local:
        instance = local.cluster.instance_of("gpu-2")
        local.emit_as_aws(_warning(instance, "terminate"))
        retired = _incident_ended(local, "gpu-2", timeout=120)
        assert retired.status == "retired"
        assert local.reconcile()["replacements_started"] == []  # the instance still runs: nothing lost yet
        local.aws.client("autoscaling").terminate_instance_in_auto_scaling_group(  # EC2 acts on its warning
            InstanceId=instance, ShouldDecrementDesiredCapacity=False)
        assert local.reconcile()["replacements_started"] == ["gpu-2"]
        executions = local.wait_for_executions(2, timeout=240)
        assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
        [lost] = [i for i in local.incidents() if i.incident_id != retired.incident_id]
        assert (lost.slurm_node, lost.fault_code, lost.status, lost.instance_id) == ("gpu-2", "INSTANCE_LOST", "closed",
                                                                                    instance), lost.outcome
        [rung] = lost.stages["repair"].result["rungs"]
        assert rung["rung"] == "replace"
        new = local.cluster.instance_of("gpu-2")
        assert new != instance and rung["progress"]["new_instance_id"] == new
        wait_for(lambda: "DRAIN" not in local.scheduler.node("gpu-2")["State"], "gpu-2 back in service")
        assert local.reconcile()["replacements_started"] == []
        assert len(local.incidents()) == 2
        # no failure: recorded under its own class, not in the cluster's MTTR (nor its alarm)
        wait_for(lambda: local.metric_values("TimeToRecover", Cluster="local", FaultClass="instance_lost"),
                 "the rejoin's TimeToRecover")
        assert local.metric_values("TimeToRecover", Cluster="local") == []


def test_a_spot_node_ec2_ends_before_its_gate_still_has_its_job_moved_and_gets_the_groups_new_instance() -> None:
    """EC2 acts on its warning before the retirement's gate ran (the gate waiting out throttling
    in a reclaim of many nodes): the incident no longer fails and pages "left the cluster"; its
    drain moves the job to the spare, it ends retired, and the node gets the group's new instance."""
    with stack(nodes=3, spares=1, CheckpointPolicy=POLICY) as local:  # gpu-4 is the spare
        job, nodes = _submit(local, nodes=3)
        instance = local.cluster.instance_of("gpu-2")

        def ec2_acts(_: dict) -> None:
            local.aws.client("autoscaling").terminate_instance_in_auto_scaling_group(
                InstanceId=instance, ShouldDecrementDesiredCapacity=False)

        acted = local.aws.before_invoke("GateFunction", ec2_acts)
        local.emit_as_aws(_warning(instance, "terminate"))
        retired = _incident_ended(local, "gpu-2", timeout=120)
        assert acted and retired.status == "retired", retired.outcome
        assert retired.stages["spare"].result.get("spare") == "gpu-4"
        wait_for(lambda: set(local.scheduler.hostnames(local.scheduler.job(job)["NodeList"])) == {"gpu-1", "gpu-3", "gpu-4"}
                 and local.scheduler.job(job)["JobState"] == "RUNNING", "the job to run on the spare")
        assert local.reconcile()["replacements_started"] == ["gpu-2"]
        local.wait_for_executions(2, timeout=240)
        assert local.cluster.instance_of("gpu-2") != instance
        assert [i.status for i in local.incidents() if i.incident_id != retired.incident_id] == ["closed"]


def _ec2_event(sample: str, instance: str, **detail: str) -> dict:
    """The sample from events/aws-ec2/, about ``instance``."""
    event = json.loads((EVENTS / "aws-ec2" / sample).read_text())
    event["detail"].update({"instance-id": instance, **detail})
    event["resources"] = [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance}"]
    return event


def _warning(instance: str, action: str) -> dict:
    return _ec2_event("spot-interruption-warning.json", instance, **{"instance-action": action})


def _running(instance: str) -> dict:
    return _ec2_event("instance-running.json", instance)


def test_a_hibernated_spot_instance_that_ec2_starts_again_is_checked_and_returned_to_service() -> None:
    """EC2 hibernates the instance as it warns, and alone starts it again once capacity is back
    (persistent Spot requests; the ec2 provider). Its "running" then opens the node's burn-in: the
    full check, then back in service. A "running" from before the interruption (a replay) and
    one for another instance change nothing."""
    with stack(nodes=3, Provider="ec2") as local:
        instance = local.cluster.instance_of("gpu-2")
        warned = datetime.now(UTC)
        local.emit_as_aws(_warning(instance, "hibernate"), at=warned)
        retired = _incident_ended(local, "gpu-2", timeout=120)
        assert (retired.status, retired.stages["detect"].result["evidence"]["instance_action"]) == ("retired", "hibernate")
        ec2 = local.aws.client("ec2")
        ec2.stop_instances(InstanceIds=[instance], Hibernate=True)  # EC2 hibernates it
        local.emit_as_aws(_running(instance), at=warned - timedelta(hours=1))  # its first start, replayed
        local.emit_as_aws(_running(local.cluster.instance_of("gpu-3")))  # an instance that runs no differently
        time.sleep(3)
        assert [i.incident_id for i in local.incidents()] == [retired.incident_id]
        assert "DRAIN" in local.scheduler.node("gpu-2")["State"]

        ec2.start_instances(InstanceIds=[instance])  # capacity is back: EC2 starts it again
        local.emit_as_aws(_running(instance))
        back = _checked_and_back(local, retired, instance)
        assert back.stages["detect"].result["evidence"]["returned_from"] == retired.incident_id


def test_a_stopped_spot_instance_back_without_its_running_event_is_found_by_the_reconciler() -> None:
    """EC2's "running" never came (a delivery lost, or it came while the retirement was still
    open): the reconciler sees the instance running with a launch time after the stop, and starts
    its burn-in, once."""
    with stack(nodes=3, Provider="ec2") as local:
        instance = local.cluster.instance_of("gpu-2")
        local.emit_as_aws(_warning(instance, "stop"), at=datetime.now(UTC) - timedelta(minutes=3))  # stopped 1 min ago
        retired = _incident_ended(local, "gpu-2", timeout=120)
        assert retired.status == "retired"
        ec2 = local.aws.client("ec2")
        ec2.stop_instances(InstanceIds=[instance])
        assert local.reconcile()["burn_ins_started"] == []  # stopped: not back
        ec2.start_instances(InstanceIds=[instance])
        assert local.reconcile()["burn_ins_started"] == ["gpu-2"]
        _checked_and_back(local, retired, instance)
        assert local.reconcile()["burn_ins_started"] == []  # once


def _checked_and_back(local: LocalMode, retired: Incident, instance: str) -> Incident:
    """The node's burn-in ran the full check and returned it to service; the retirement stays."""
    back = wait_for(lambda: next((i for i in local.incidents() if i.fault_code == "NODE_JOINED"
                                  and i.status in ENDED_STATUSES), None), "the burn-in of gpu-2 to end", 120)
    assert (back.slurm_node, back.instance_id, back.status) == ("gpu-2", instance, "closed"), back.outcome
    [rung] = back.stages["repair"].result["rungs"]
    assert (rung["rung"], rung["check"]["level"], rung["check"]["healthy"]) == ("check", "full", True)
    assert "DRAIN" not in local.scheduler.node("gpu-2")["State"]
    assert local.incident(retired.incident_id).status == "retired"  # the ledger keeps what happened
    assert len(local.incidents()) == 2
    return back


REBALANCE_POLICY = json.dumps({"default": {"signal": "USR1", "scope": "batch", "grace_seconds": 30}, "rebalance": True})


def _rebalance_results(local: LocalMode, count: int) -> list[dict]:
    """The planned-events function's answers to the first ``count`` rebalance recommendations."""
    def answered() -> list[dict] | None:
        done = [i.result or {"error": i.error_message} for i in local.aws.invocations
                if "PlannedEvents" in i.function and i.event.get("detail-type") == "EC2 Instance Rebalance Recommendation"]
        return done if len(done) >= count else None
    return wait_for(answered, f"{count} rebalance recommendation(s) handled")[:count]


def test_a_rebalance_recommendation_has_the_job_checkpoint_once_and_leaves_its_nodes_in_service() -> None:
    """EC2 says a Spot Instance is at elevated risk of interruption (EC2 User Guide, "EC2 instance
    rebalance recommendations"), for both nodes of a job and more than once, and gpu-1's agent
    reads it from its instance metadata first: the job checkpoints once, keeps running where it
    runs, and no node is drained; an idle node has nothing to ask."""
    with stack(nodes=3, CheckpointPolicy=REBALANCE_POLICY) as local:
        job, nodes = _submit(local, nodes=2)
        assert nodes == ["gpu-1", "gpu-2"]
        instance = local.cluster.instance_of("gpu-1")
        local.put_event({"schema_version": "1", "cluster": local.cluster.name,  # what the agent sends
                         "node": {"instance_id": instance, "hostname": "gpu-1", "slurm_node": "gpu-1"},
                         "notice_time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
                        detail_type="EC2 Instance Rebalance Recommendation")
        [first] = _rebalance_results(local, 1)
        assert (first["node"], first["asked"], first["ignored"]) == ("gpu-1", [job], ""), first
        wait_for(lambda: "checkpoint at step" in _output(local, job), "the job to checkpoint")
        assert "nodemedic-checkpoint=" in local.scheduler.job(job)["Comment"]
        # EC2's own event, and recommended for the job's other node: the job is not asked again
        local.emit_as_aws(_ec2_event("rebalance-recommendation.json", instance))
        local.emit_as_aws(_ec2_event("rebalance-recommendation.json", local.cluster.instance_of("gpu-2")))
        local.emit_as_aws(_ec2_event("rebalance-recommendation.json", local.cluster.instance_of("gpu-3")))
        _, again, other, idle = _rebalance_results(local, 4)
        for answer in (again, other):
            assert answer["asked"] == [] and answer["not_asked"] == {job: "asked within the last 30 min"}, answer
        assert (idle["node"], idle["asked"], idle["not_asked"]) == ("gpu-3", [], {})
        assert _output(local, job).count("checkpoint at step") == 1
        # nothing else: no incident, no drain, the job runs on where it ran
        assert local.incidents() == [] and local.drains() == []
        assert local.scheduler.job(job)["JobState"] == "RUNNING"
        assert local.scheduler.hostnames(local.scheduler.job(job)["NodeList"]) == nodes
        assert all("DRAIN" not in local.scheduler.node(n)["State"] for n in ("gpu-1", "gpu-2", "gpu-3"))
        # a recommendation redriven from the dead-letter queue an hour later asks nothing
        local.emit_as_aws(_ec2_event("rebalance-recommendation.json", local.cluster.instance_of("gpu-2")),
                          at=datetime.now(UTC) - timedelta(hours=1))
        assert "old news" in _rebalance_results(local, 5)[4]["ignored"]


def test_an_interruptible_reservations_reclaim_moves_the_job_with_its_checkpoint_and_the_node_gets_a_new_instance() -> None:
    """The owner of an interruptible Capacity Reservation reclaims it: EC2 warns two minutes before
    it terminates the instance (EC2 User Guide, "Monitor interruptible Capacity Reservations with
    EventBridge and CloudTrail"). The node is retired as for a Spot interruption: the job
    checkpoints, moves to the spare, all before the termination time; once EC2 has terminated the
    instance, the reconciler joins the group's new one as the node."""
    with stack(nodes=3, spares=1, CheckpointPolicy=POLICY) as local:  # gpu-4 is the spare
        job, nodes = _submit(local, nodes=3)
        time.sleep(3)  # it trains a while
        instance = local.cluster.instance_of("gpu-2")
        terminates = (datetime.now(UTC) + timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        local.emit_as_aws(_ec2_event("capacity-reservation-interruption-warning.json", instance,
                                     **{"instance-termination-time": terminates}))
        retired = _incident_ended(local, "gpu-2", timeout=120)
        assert (retired.status, retired.fault_code) == ("retired", "PLANNED_RESERVATION_INTERRUPTION"), retired.outcome
        assert retired.closed_at is not None and retired.closed_at < datetime.fromisoformat(terminates)
        moved_with_its_checkpoint(local, retired, job, "gpu-4", ["gpu-1", "gpu-3", "gpu-4"])
        assert "repair" not in retired.stages and local.cluster.instance_of("gpu-2") == instance
        assert local.reconcile()["replacements_started"] == []  # the instance still runs
        local.aws.client("autoscaling").terminate_instance_in_auto_scaling_group(  # EC2 reclaims it
            InstanceId=instance, ShouldDecrementDesiredCapacity=False)
        assert local.reconcile()["replacements_started"] == ["gpu-2"]
