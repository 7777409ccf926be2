"""A node's instance ended by someone else while its incident runs (its Auto Scaling group's health
check, an operator, EC2): the ladder goes on to what it can still do, not a failed incident.

Before, the GPU reset and the check after each rung were sent to the terminated instance. SSM
refused them as it refuses an instance still booting, the state machine retried the sends for
about 18 minutes, and the incident failed with the node drained and the on-call paged, while the
group had launched the instance that the replace rung would have taken. Now each check fails at
once ("terminated"), and the replace rung takes the group's new instance. On the local stack (real Slurm, the deployed
template and its strict IAM: the deep check's role reads EC2's state)."""

import pytest
from nodemedic import operations

from tests.e2e.support import OPEN, OPERATOR, control, stack, wait_for
from tests.e2e.test_safety import _wait_for_approval_requests


def test_a_node_terminated_under_its_incident_is_replaced_by_the_ladder_not_failed() -> None:
    with stack(4, RemediationMode="approval") as local:  # the incident waits for its approval
        old = local.cluster.instance_of("gpu-2")
        local.put_event(local.health_event("gpu-2", "XID 48"))  # a reboot first, then a replace
        [waiting] = _wait_for_approval_requests(local, 1)
        # meanwhile the group's health check ends the instance and launches another
        local.aws.client("autoscaling").terminate_instance_in_auto_scaling_group(
            InstanceId=old, ShouldDecrementDesiredCapacity=False)
        operations.answer_approval(local.ledger, local.aws.client("stepfunctions"), waiting.incident_id,
                                   approve=True, by=OPERATOR, reason="XID 48 in the kernel log")
        local.wait_for_executions(1, timeout=120)

        incident = local.incident(waiting.incident_id)
        assert incident.status == "closed", (incident.status, incident.failure, incident.outcome)
        *on_old, replaced = incident.stages["repair"].result["rungs"]
        # XID 48's ladder: a GPU reset (not sent: no command reaches the instance), a reboot
        # (EC2 ignores it), each check failed at once; then the replace
        assert [r["rung"] for r in on_old] == ["gpu_reset", "reboot"]
        assert on_old[0]["reset"]["status"] == "Skipped" and f"{old} is terminated" in on_old[0]["reset"]["output"]
        for rung in on_old:
            [gone] = rung["check"]["checks"]
            assert rung["instance_id"] == old and rung["check"]["healthy"] is False
            assert gone["name"] == "instance" and f"{old} is terminated" in gone["detail"]
        new = local.cluster.instance_of("gpu-2")
        assert new != old and (replaced["rung"], replaced["instance_id"]) == ("replace", new)
        assert replaced["check"]["healthy"] is True
        wait_for(lambda: "DRAIN" not in local.scheduler.node("gpu-2")["State"], "gpu-2 back in service")
        # nothing was ever run on the terminated instance
        assert not [c for c in local.cluster.commands if c.instance_id == old and "health-check" in c.script]


def test_a_replacement_someone_else_ends_before_it_joins_is_replaced_by_the_groups_next_instance() -> None:
    """The replace rung claimed the group's new instance, and someone else ends it while it boots
    (an operator, the group's health check). Before, the rung waited on it until its budget ran
    out: the incident failed, the node was left with no instance, and the instance the group
    launched in its place ran unclaimed. Now the rung claims that one."""
    with stack(4, boot_seconds=5, **OPEN) as local:
        old = local.cluster.instance_of("gpu-2")
        local.put_event(local.health_event("gpu-2", "XID 79"))
        [incident_id] = wait_for(lambda: [i.incident_id for i in local.incidents()], "the incident")

        def claimed() -> str | None:
            repair = local.incident(incident_id).stages.get("repair")
            rungs = repair.result.get("rungs", []) if repair else []
            return rungs[-1].get("progress", {}).get("new_instance_id") if rungs else None

        lost = wait_for(claimed, "the replace rung to claim the group's new instance", timeout=60)
        local.aws.client("autoscaling").terminate_instance_in_auto_scaling_group(
            InstanceId=lost, ShouldDecrementDesiredCapacity=False)
        [execution] = local.wait_for_executions(1, timeout=240)

        incident = local.incident(incident_id)
        assert execution["status"] == "SUCCEEDED" and incident.status == "closed", (lost, incident.outcome)
        [rung] = incident.stages["repair"].result["rungs"]
        new = local.cluster.instance_of("gpu-2")
        assert new not in (old, lost) and rung["instance_id"] == new and rung["check"]["healthy"] is True
        assert rung["progress"]["lost_replacements"] == [lost]
        assert not local.ledger.bookkeeping(local.cluster.name).claims  # the lost one's claim too
        wait_for(lambda: "DRAIN" not in local.scheduler.node("gpu-2")["State"], "gpu-2 back in service")


def test_a_node_whose_instance_the_group_replaced_outside_any_incident_gets_the_new_instance_and_returns() -> None:
    """No incident held gpu-2 when its group's health check ended its instance and launched another,
    which cannot know which node to be. Before, gpu-2 stayed down with no instance and the new
    instance ran unnamed, for good. Now the reconciler's next run has it replaced (INSTANCE_LOST):
    the new instance is claimed, named gpu-2, checked, and gpu-2 returns to service; its job, which
    Slurm saw its node fail under, runs again. A node the group scaled in (it launched none in its
    place) is left alone."""
    with stack(nodes=3) as local:
        autoscaling = local.aws.client("autoscaling")
        job = local.scheduler.submit(1, name="train", on="gpu-2")
        wait_for(lambda: local.scheduler.job(job)["JobState"] == "RUNNING", "the job to run on gpu-2")
        old, scaled_in = local.cluster.instance_of("gpu-2"), local.cluster.instance_of("gpu-3")
        autoscaling.terminate_instance_in_auto_scaling_group(InstanceId=scaled_in, ShouldDecrementDesiredCapacity=True)
        assert local.reconcile()["replacements_started"] == []  # the group launched nothing in its place
        autoscaling.terminate_instance_in_auto_scaling_group(InstanceId=old, ShouldDecrementDesiredCapacity=False)
        assert local.reconcile()["replacements_started"] == ["gpu-2"]  # one launched: one node given it

        [execution] = local.wait_for_executions(1, timeout=240)
        [lost] = local.incidents()
        assert execution["status"] == "SUCCEEDED", execution.get("cause")
        assert (lost.slurm_node, lost.fault_code, lost.status, lost.instance_id) == ("gpu-2", "INSTANCE_LOST", "closed",
                                                                                    old), lost.outcome
        [rung] = lost.stages["repair"].result["rungs"]
        new = local.cluster.instance_of("gpu-2")
        assert new != old and rung["progress"]["new_instance_id"] == new and rung["check"]["healthy"] is True
        wait_for(lambda: "DRAIN" not in local.scheduler.node("gpu-2")["State"], "gpu-2 back in service")
        assert local.reconcile()["replacements_started"] == [] and len(local.incidents()) == 1  # once
        assert lost.stages["drain"].result["requeued_jobs"] == [job]
        wait_for(lambda: local.scheduler.job(job)["JobState"] == "RUNNING" and local.scheduler.job(job)["Restarts"] == "1",
                 "the job to run again on gpu-2, on its new instance")
        with pytest.raises(LookupError):  # gpu-3 keeps no instance: nobody wants it back
            local.cluster.instance_of("gpu-3")


def test_a_lost_node_held_while_automation_was_paused_is_rejoined_once_it_resumes() -> None:
    """The group replaced gpu-2's instance while an operator had paused automation: its
    INSTANCE_LOST incident is held, nothing done. Before, nothing offered it again once automation
    resumed (the reconciler starts it once per lost instance): gpu-2 stayed without an instance for
    good. Now the reconciler's next run after the resume starts it again, and gpu-2 returns."""
    with stack(nodes=3) as local:
        old = local.cluster.instance_of("gpu-2")
        operations.pause(control(local), by=OPERATOR, reason="an AZ is in trouble")
        local.aws.client("autoscaling").terminate_instance_in_auto_scaling_group(
            InstanceId=old, ShouldDecrementDesiredCapacity=False)
        assert local.reconcile()["replacements_started"] == ["gpu-2"]
        local.wait_for_executions(1, timeout=120)
        [incident] = local.incidents()
        assert incident.status == "held", incident.outcome
        assert local.reconcile()["replacements_started"] == []  # still paused: the hold keeps the node
        operations.resume_automation(control(local), local.ledger, by=OPERATOR, reason="the AZ recovered")
        assert local.reconcile()["replacements_started"] == ["gpu-2"]
        executions = local.wait_for_executions(2, timeout=240)
        assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
        rejoined = next(i for i in local.incidents() if i.incident_id != incident.incident_id)
        assert (rejoined.fault_code, rejoined.status) == ("INSTANCE_LOST", "closed"), rejoined.outcome
        assert local.cluster.instance_of("gpu-2") != old
        wait_for(lambda: "DRAIN" not in local.scheduler.node("gpu-2")["State"], "gpu-2 back in service")
        assert local.reconcile()["replacements_started"] == [] and len(local.incidents()) == 2


def test_a_node_whose_plain_ec2_instance_ended_outside_any_incident_is_paged_once() -> None:
    """Provider=ec2: someone terminated gpu-2's instance while no incident held it, and nothing
    launches one in its place (NodeMedic's replace stops and starts the same instance). Before,
    gpu-2 stayed down with no instance and nobody was told. Now the reconciler's next run pages
    it, once, with what to do; no incident is opened and no node is touched (the reconciler's role,
    under the strict local IAM, lists the ended instances)."""
    with stack(nodes=3, Provider="ec2") as local:
        old = local.cluster.instance_of("gpu-2")
        local.escalations()  # whatever the stack said as it came up
        local.aws.client("ec2").terminate_instances(InstanceIds=[old])
        report = local.reconcile()
        assert (report["nodes_without_instance"], report["replacements_started"]) == (["gpu-2"], [])
        [page] = [m["Message"] for m in local.escalations() if "have no instance" in m["Message"]]
        assert f"gpu-2 ({old} ended outside NodeMedic" in page and "nodemedic:slurm-node=<node>" in page
        assert local.reconcile()["nodes_without_instance"] == [] and local.incidents() == []
        assert not [m for m in local.escalations() if "have no instance" in m["Message"]]  # told once
        assert all("DRAIN" not in local.scheduler.node(n)["State"] for n in ("gpu-1", "gpu-3"))


def test_a_plain_ec2_instance_terminated_under_its_incident_is_retired_and_its_node_paged_once() -> None:
    """Provider=ec2: someone terminates gpu-2's instance while its incident waits for approval.
    Nothing launches one in its place (the replace rung stops and starts the same instance).
    Before, the replace rung failed the incident ("cannot be stopped and started") and its page
    told the on-call to run a replace, which cannot work. Now the incident is retired, saying why
    and what to do, and the reconciler pages the node once, with the other nodes without instance."""
    with stack(3, Provider="ec2", RemediationMode="approval") as local:
        old = local.cluster.instance_of("gpu-2")
        local.put_event(local.health_event("gpu-2", "XID 48"))  # a GPU reset, a reboot, then a replace
        [waiting] = _wait_for_approval_requests(local, 1)
        local.aws.client("ec2").terminate_instances(InstanceIds=[old])
        operations.answer_approval(local.ledger, local.aws.client("stepfunctions"), waiting.incident_id,
                                   approve=True, by=OPERATOR, reason="XID 48 in the kernel log")
        [execution] = local.wait_for_executions(1, timeout=120)
        incident = local.incident(waiting.incident_id)
        assert execution["status"] == "SUCCEEDED" and incident.status == "retired", (incident.status, incident.failure)
        assert f"EC2 ended {old} (terminated) outside NodeMedic" in incident.outcome
        assert "nodemedic:slurm-node=<node>" in incident.outcome
        assert [r["rung"] for r in incident.stages["repair"].result["rungs"]] == ["gpu_reset", "reboot", "replace"]
        assert not [m for m in local.escalations() if "failed in stage" in m.get("Message", "")]
        assert local.reconcile()["nodes_without_instance"] == ["gpu-2"]
        [page] = [m["Message"] for m in local.escalations() if "have no instance" in m["Message"]]
        assert f"gpu-2 ({old} ended" in page and "DRAIN" in local.scheduler.node("gpu-2")["State"]
        assert local.reconcile()["nodes_without_instance"] == []  # told once


def test_a_fault_whose_instance_is_ended_before_its_gate_is_retired_unpaged_and_the_node_gets_the_next_instance() -> None:
    """gpu-2 reports XID 79; its group's health check ends the instance before the incident's gate
    runs. Before, the gate failed ("left cluster; nothing was drained") and paged the on-call about
    an instance that no longer exists. Now the incident is retired, nothing done to the node, its
    lock released, no page; the reconciler's next run gives gpu-2 the group's new instance."""
    with stack(nodes=3) as local:
        old = local.cluster.instance_of("gpu-2")

        def health_check_ends_it(_: dict) -> None:
            local.aws.client("autoscaling").terminate_instance_in_auto_scaling_group(
                InstanceId=old, ShouldDecrementDesiredCapacity=False)

        ended = local.aws.before_invoke("GateFunction", health_check_ends_it)
        local.put_event(local.health_event("gpu-2", "XID 79"))
        [execution] = local.wait_for_executions(1, timeout=120)
        [retired] = local.incidents()
        assert ended and execution["status"] == "SUCCEEDED", execution.get("cause")
        assert (retired.status, retired.fault_code) == ("retired", "XID 79"), retired.outcome
        assert f"EC2 ended {old} (terminated) outside NodeMedic before the gate" in retired.outcome
        assert "drain" not in retired.stages and local.drains() == []
        assert not [m for m in local.escalations() if "gpu-2" in m.get("Message", "")]
        assert local.reconcile()["replacements_started"] == ["gpu-2"]
        executions = local.wait_for_executions(2, timeout=240)
        assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
        lost = next(i for i in local.incidents() if i.fault_code == "INSTANCE_LOST")
        assert lost.status == "closed" and local.cluster.instance_of("gpu-2") != old, lost.outcome
