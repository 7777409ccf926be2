"""Safety rails on the local stack over a real Slurm cluster: the breaker in a storm, lemons,
corroboration, dry run, approval, and drains that belong to operators."""

import os
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
from nodemedic import operations
from nodemedic_sandbox.local import LocalMode

from tests.e2e.support import OPERATOR, control, job_running, latest, put_all, running_job, stack, wait_for


def test_a_flapping_node_is_quarantined_on_its_third_incident_not_replaced_again() -> None:
    with stack(4, LemonIncidents="3", NodeCooldownMinutes="0", BreakerMaxPercent="100") as local:
        for n in range(1, 3):
            local.put_event(local.health_event("gpu-3", "XID 79"))
            assert local.incident(latest(local.wait_for_executions(n, timeout=120))["name"]).status == "closed"
        replaced = local.cluster.instance_of("gpu-3")
        group = {i["InstanceId"] for i in local.cluster.group_instances()}

        local.put_event(local.health_event("gpu-3", "XID 79"))
        executions = local.wait_for_executions(3, timeout=120)

        third = local.incident(latest(executions)["name"])
        assert third.status == "quarantined" and "incident 3 of node:gpu-3" in third.outcome
        assert local.cluster.instance_of("gpu-3") == replaced  # not replaced again
        assert {i["InstanceId"] for i in local.cluster.group_instances()} == group
        node = local.scheduler.node("gpu-3")
        assert "DRAIN" in node["State"] and node["Reason"].startswith(f"nodemedic:{third.incident_id}")
        [page] = local.escalations()
        assert "quarantined gpu-3" in page["Message"]
        # the node lock stays: a fourth event is folded into the quarantined incident
        local.put_event(local.health_event("gpu-3", "XID 79"))
        assert local.detect_decision(latest(local.wait_for_executions(4, timeout=60))) == "deduplicated"


def test_an_ambiguous_fault_is_checked_first_and_a_second_signal_corroborates_it(local: LocalMode) -> None:
    # the sweeper alone says gpu-1 is silent: check it before touching it; it is healthy
    local.put_event(local.health_event("gpu-1", "HEARTBEAT_MISSING", check="heartbeat"), source="nodemedic.sweeper")
    [execution] = local.wait_for_executions(1)
    incident = local.incident(execution["name"])
    assert incident.status == "closed" and incident.outcome.startswith("not corroborated")
    assert incident.stages["verify"].result["healthy"] is True
    assert local.scontrol_commands("state=drain") == []

    # minutes later the agent reports a read-only file system: two independent signals, act
    local.put_event(local.health_event("gpu-1", "FS_READONLY", check="storage"))
    second = local.incident(latest(local.wait_for_executions(2))["name"])
    assert second.status == "closed" and "verify" not in second.stages
    assert "nodemedic.sweeper:HEARTBEAT_MISSING" in second.stages["gate"].result["rules"][-1]["detail"]
    assert len(local.scontrol_commands("state=drain")) == 1


def test_dry_run_records_a_full_incident_and_touches_nothing() -> None:
    with stack(4, RemediationMode="dry_run") as local:
        job, nodes = running_job(local)
        before = local.cluster.instance_of(nodes[0])
        local.put_event(local.health_event(nodes[0], "XID 79"))
        [execution] = local.wait_for_executions(1)

        incident = local.incident(execution["name"])
        assert incident.status == "dry_run"
        actions = incident.stages["shadow"].result["actions"]
        assert [a.split(":")[0] for a in actions] == ["drain", "requeue", "repair", "resume"]
        assert f"jobs {job}" in actions[1]
        # Slurm and EC2 untouched: no scontrol update, the job still running where it was, same instance
        assert [c for c in local.scontrol_commands("scontrol update")] == []
        assert local.scheduler.job(job)["Restarts"] == "0" and job_running(local, job)
        assert "DRAIN" not in local.scheduler.node(nodes[0])["State"]
        assert local.cluster.instance_of(nodes[0]) == before


def test_approval_waits_then_approve_continues_and_deny_ends_with_the_node_drained() -> None:
    with stack(4, RemediationMode="approval", BreakerMaxPercent="100") as local:
        sfn = local.aws.client("stepfunctions")
        old = local.cluster.instance_of("gpu-1")
        put_all(local, [local.health_event("gpu-1", "XID 79"), local.health_event("gpu-2", "XID 79")])
        waiting = _wait_for_approval_requests(local, 2)
        assert all(e["status"] == "RUNNING" for e in local.executions())
        # each request is recorded, then sent: the second page may still be on its way
        asked: list[str] = []
        wait_for(lambda: asked.extend(m["Message"] for m in local.escalations()) or len(asked) >= 2,
                 "both approval requests to be paged")
        assert len(asked) == 2 and all("nodemedic approve" in m for m in asked)
        assert local.cluster.instance_of("gpu-1") == old  # nothing replaced while waiting

        by_node = {i.slurm_node: i.incident_id for i in waiting}
        with pytest.raises(operations.OperatorError, match="reason"):
            operations.answer_approval(local.ledger, sfn, by_node["gpu-1"], approve=True, by=OPERATOR, reason="")
        operations.answer_approval(local.ledger, sfn, by_node["gpu-1"], approve=True, by=OPERATOR,
                                   reason="XID 79 confirmed in the kernel log")
        operations.answer_approval(local.ledger, sfn, by_node["gpu-2"], approve=False, by=OPERATOR,
                                   reason="vendor wants the node for RMA analysis")
        local.wait_for_executions(2, timeout=120)

        approved, denied = local.incident(by_node["gpu-1"]), local.incident(by_node["gpu-2"])
        assert approved.status == "closed" and local.cluster.instance_of("gpu-1") != old
        assert approved.stages["approval"].result["by"] == OPERATOR
        assert denied.status == "denied" and "RMA analysis" in denied.outcome
        node = local.scheduler.node("gpu-2")
        assert "DRAIN" in node["State"] and node["Reason"].startswith(f"nodemedic:{denied.incident_id}")
        with pytest.raises(operations.OperatorError, match="waits for no approval"):
            operations.answer_approval(local.ledger, sfn, denied.incident_id, approve=True, by=OPERATOR,
                                       reason="changed my mind")


def test_a_pause_during_the_approval_wait_stops_the_approved_incident_before_it_touches_the_node() -> None:
    """The on-call pauses automation (a driver rollout is suspected) while an incident waits for
    approval; a second operator, who did not see the pause, approves it past the CLI (which refuses
    an approval while paused: tests/e2e/test_cli.py), e.g. from a chat bot. The Repair function reads
    the pause right before the replace: nothing is terminated, the incident ends escalated naming
    the pause, and the node stays drained with NodeMedic's reason (through the deployed template:
    the Repair role reads the policy and the control item under the strict local IAM)."""
    with stack(4, RemediationMode="approval", BreakerMaxPercent="100") as local:
        sfn = local.aws.client("stepfunctions")
        old = local.cluster.instance_of("gpu-1")
        local.put_event(local.health_event("gpu-1", "XID 79"))
        [waiting] = _wait_for_approval_requests(local, 1)
        operations.pause(control(local), by="alice@example.com", reason="driver 580 rollout suspected")
        operations.answer_approval(local.ledger, sfn, waiting.incident_id, approve=True, by=OPERATOR,
                                   reason="XID 79 confirmed in the kernel log")
        [execution] = local.wait_for_executions(1, timeout=120)

        incident = local.incident(waiting.incident_id)
        assert execution["status"] == "SUCCEEDED" and incident.status == "escalated", incident.outcome
        assert "automation paused by alice@example.com" in incident.outcome
        assert local.cluster.instance_of("gpu-1") == old
        assert old in {i["InstanceId"] for i in local.cluster.group_instances()}
        node = local.scheduler.node("gpu-1")
        assert "DRAIN" in node["State"] and node["Reason"].startswith(f"nodemedic:{waiting.incident_id}")


def test_a_pause_after_the_gpu_reset_keeps_the_deep_check_off_the_node() -> None:
    """The ladder reset the GPUs of gpu-2; right before its deep check (DCGM diagnostics take the
    GPUs, on a node the on-call may be working on) automation is paused. No check is sent: the
    incident ends escalated naming the pause, the node stays drained (the DeepHealthCheck role
    reads the policy and the instance's tags under the strict local IAM; the state machine's
    waitForTaskToken Catch routes HandsOffError to Escalate)."""
    with stack(4, BreakerMaxPercent="100", NodeCooldownMinutes="0") as local:
        local.aws.before_invoke("DeepHealthCheck", lambda _: operations.pause(
            control(local), by="alice@example.com", reason="driver 580 rollout suspected"),
            when=lambda event: event.get("purpose") != "verify")
        local.put_event(local.health_event("gpu-2", "XID 48"))  # its ladder begins with a GPU reset
        [execution] = local.wait_for_executions(1, timeout=120)

        incident = local.incident(execution["name"])
        assert execution["status"] == "SUCCEEDED" and incident.status == "escalated", incident.outcome
        assert "automation paused by alice@example.com" in incident.outcome
        [rung] = incident.stages["repair"].result["rungs"]
        assert rung["rung"] == "gpu_reset" and not rung.get("check", {}).get("command_id")
        checks = [c for c in local.aws.client("ssm").list_commands()["Commands"]
                  if c["DocumentName"] == local.stack.resources["HealthCheckDocument"]]
        assert checks == []
        assert "DRAIN" in local.scheduler.node("gpu-2")["State"]


def _wait_for_approval_requests(local: LocalMode, count: int, timeout: float = 60.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        asking = [i for i in local.incidents() if "approval" in i.stages and i.stages["approval"].result.get("task_token")]
        if len(asking) == count:
            return asking
        time.sleep(0.2)
    raise AssertionError(f"{count} approval requests not recorded after {timeout}s")


def test_an_operators_drain_survives_an_incident_on_that_node(local: LocalMode) -> None:
    subprocess.run(["scontrol", "update", "nodename=gpu-3", "state=drain", "reason=maintenance: BIOS update ticket=42"],
                   env={**os.environ, **local.scheduler.env}, check=True)
    local.put_event(local.health_event("gpu-3", "XID 48"))  # a reboot-class fault
    [execution] = local.wait_for_executions(1)

    assert execution["status"] == "SUCCEEDED", execution.get("cause")
    incident = local.incident(execution["name"])
    assert incident.status == "closed" and incident.stages["resume"].result["resumed"] is False
    node = local.scheduler.node("gpu-3")
    assert "DRAIN" in node["State"] and node["Reason"].startswith("maintenance: BIOS update ticket=42 [")


def test_a_node_returned_to_service_during_repair_is_never_touched() -> None:
    """An operator resumes the node while it reboots (its first rung) and a job lands on it; the
    reboot does not fix it, and the next rung (replace) re-checks the node right before acting,
    finds the job, and stops: the instance is not terminated under the job (escalated)."""
    import json

    from tests.conftest import load_event

    with stack(4, boot_seconds=6, BreakerMaxPercent="100", HealthCheckTimeoutSeconds="60") as local:
        local.cluster.break_node("gpu-2", fixed_by="replace")
        local.aws.client("stepfunctions").start_execution(
            stateMachineArn=local.stack.state_machine_arn, name="reboot-gpu-2",
            input=json.dumps(load_event("runbooks/reboot-node.json")))

        def rebooted() -> bool:
            incidents = local.incidents()
            repair = incidents[0].stages.get("repair") if incidents else None
            return bool(repair and any(r.get("rebooted") for r in repair.result.get("rungs", [])))

        wait_for(rebooted, what="the reboot rung", timeout=60)
        subprocess.run(["scontrol", "update", "nodename=gpu-2", "state=resume"], env={**os.environ, **local.scheduler.env},
                       check=True)
        job = local.scheduler.submit(4)  # all four nodes: it runs on gpu-2 too
        job_running(local, job)
        [execution] = local.wait_for_executions(1, timeout=120)

        incident = local.incident("reboot-gpu-2")
        assert incident.status == "escalated", incident.outcome
        assert "stopped before a destructive step" in incident.outcome and "runs job(s)" in incident.outcome
        rungs = incident.stages["repair"].result["rungs"]
        assert [r["rung"] for r in rungs] == ["reboot", "replace"] and not rungs[-1].get("progress")
        assert local.cluster.instance_of("gpu-2") == incident.instance_id  # never terminated
        assert local.scheduler.job(job)["JobState"] == "RUNNING"  # never killed


def test_the_resume_document_lifts_only_the_owners_drain_in_one_command(local: LocalMode) -> None:
    """Check-and-act in one scheduler command: the drain is lifted only if its reason is the
    incident's own, read inside the same command that resumes (no window for an operator's drain)."""
    from nodemedic.orchestrators.slurm import SlurmViaSSM
    from nodemedic.providers.run_command import Documents, RunCommand

    slurm = SlurmViaSSM(RunCommand(local.aws.client("ssm"), 0.1), local.cluster.controller_id, 60,
                        Documents(local.cluster.name))
    env = {**os.environ, **local.scheduler.env}
    subprocess.run(["scontrol", "update", "nodename=gpu-1", "state=drain", "reason=maintenance: bob swaps a cable"],
                   env=env, check=True)
    assert slurm.resume("gpu-1", "nodemedic:inc-1") is False
    assert "DRAIN" in local.scheduler.node("gpu-1")["State"]  # the operator's drain stays
    subprocess.run(["scontrol", "update", "nodename=gpu-2", "state=drain", "reason=nodemedic:inc-10 XID 79"],
                   env=env, check=True)
    assert slurm.resume("gpu-2", "nodemedic:inc-1") is False  # a prefix of another incident's tag is not ours
    subprocess.run(["scontrol", "update", "nodename=gpu-2", "state=drain", "reason=nodemedic:inc-1 XID 79"],
                   env=env, check=True)
    assert slurm.resume("gpu-2", "nodemedic:inc-1") is True
    assert "DRAIN" not in local.scheduler.node("gpu-2")["State"]
    assert slurm.resume("gpu-1", "*") is True  # an operator's own resume lifts any drain


def test_a_fault_the_cooldown_held_is_remediated_once_the_cooldown_ends() -> None:
    """A one-off Xid line during the node's cooldown was held and forgotten: the agent never sends
    it again, and the node stayed in service with it. The gate keeps it, and the reconciler offers
    it again when the cooldown ends; every write goes through the stack's own IAM."""
    with stack(4, NodeCooldownMinutes="0.25", BreakerMaxPercent="100") as local:
        remediated = datetime.now(UTC) - timedelta(seconds=5)  # gpu-3's slot, 5 s ago (its lineage)
        control(local).append_lineage(["node:gpu-3"], "inc-earlier", remediated)
        local.put_event(local.health_event("gpu-3", "XID 79"))
        held = local.incident(latest(local.wait_for_executions(1, timeout=60))["name"])
        assert held.status == "held" and "decided again after" in held.outcome
        assert local.scheduler.node("gpu-3")["State"].startswith("IDLE")  # in service, with its fault
        if datetime.now(UTC) < remediated + timedelta(seconds=12):  # 3 s for the run itself: not due yet
            assert local.reconcile()["rechecks_offered"] == []  # the cooldown (15 s) goes on

        time.sleep(max(0.0, (remediated + timedelta(seconds=16) - datetime.now(UTC)).total_seconds()))
        assert local.reconcile()["rechecks_offered"] == ["gpu-3"]
        again = local.incident(latest(local.wait_for_executions(2, timeout=120))["name"])
        assert (again.fault_code, again.source, again.observed_at) == ("XID 79", "nodemedic.agent", held.observed_at)
        assert again.status == "closed" and again.evidence("recheck_of") == held.incident_id
        assert local.reconcile()["rechecks_offered"] == []  # decided once
