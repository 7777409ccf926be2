"""A health event on the bus of the locally deployed template remediates a real Slurm node."""

import boto3
import pytest
from nodemedic_cli.operator import remediate
from nodemedic_cli.target import Target
from nodemedic_sandbox.local import LocalMode

from tests.e2e.support import OPERATOR, job_running, latest, running_job, wait_for


def test_xid79_on_a_running_job_is_remediated_end_to_end(local: LocalMode) -> None:
    job, job_nodes = running_job(local)
    sick = job_nodes[0]
    old_instance = local.cluster.instance_of(sick)

    local.put_event(local.health_event(sick, "XID 79"))
    [execution] = local.wait_for_executions(1)

    assert execution["status"] == "SUCCEEDED", execution.get("cause")
    # drained with the pipeline's reason, the job requeued and running again on healthy nodes
    [drain] = local.scontrol_commands("state=drain")
    assert f"reason='nodemedic:{execution['name']} XID 79'" in drain
    restarted = job_running(local, job)
    assert int(restarted["Restarts"]) == 1
    # on healthy nodes: none drained (the repaired node itself may take it, backed by a new instance)
    assert all("DRAIN" not in local.scheduler.node(n)["State"] for n in local.scheduler.hostnames(restarted["NodeList"]))
    # a replacement instance exists in the Auto Scaling group and backs the node now
    group = {i["InstanceId"] for i in local.cluster.group_instances()}
    assert old_instance not in group and len(group) == 4
    new_instance = local.cluster.instance_of(sick)
    assert new_instance in group and new_instance != old_instance
    # the node is resumed
    state = wait_for(lambda: (s := local.scheduler.node(sick)["State"]) in ("IDLE", "MIXED", "ALLOCATED") and s,
                     "node to be back in service")
    assert "DRAIN" not in state
    # the ledger has every stage timestamp, in order
    incident = local.incident(execution["name"])
    assert incident.status == "closed"
    # its close let go of the replacement it claimed: nothing is left for the reconciler
    assert local.ledger.bookkeeping(local.cluster.name).claims == []
    stamps = [incident.stages[s] for s in ("detect", "drain", "spare", "repair", "resume")]
    assert all(s.completed_at for s in stamps)
    assert [s.completed_at for s in stamps] == sorted(s.completed_at for s in stamps)
    assert incident.closed_at >= stamps[-1].completed_at
    # TimeToRecover is in the emulated CloudWatch with the incident's dimensions
    recover = local.metric_values("TimeToRecover", Cluster="local", FaultClass="gpu_lost")
    expected = (incident.closed_at - incident.observed_at).total_seconds()
    assert recover and abs(recover[0] - expected) < 1.0
    [rung] = incident.stages["repair"].result["rungs"]
    assert (rung["rung"], rung["instance_id"], rung["check"]["healthy"]) == ("replace", new_instance, True)
    assert rung["check"]["level"] == "full"  # a replacement joins: its burn-in is the full check
    jobs = incident.stages["jobs"].result
    assert list(jobs["running"]) == [job] and jobs["job_downtime_s"] > 0
    for name in ("TimeToDetect", "TimeToDrain", "TimeToRepair", "TimeToResume", "JobDowntime"):
        assert local.metric_values(name, Cluster="local", FaultClass="gpu_lost"), name


def test_mttd_and_mttr_are_measured_from_observed_at(local: LocalMode) -> None:
    from datetime import UTC, datetime, timedelta

    observed = datetime.now(UTC) - timedelta(seconds=42)
    local.put_event(local.health_event("gpu-3", "XID 79", observed_at=observed))
    [execution] = local.wait_for_executions(1)
    assert execution["status"] == "SUCCEEDED", execution.get("cause")
    [detect] = local.metric_values("TimeToDetect", Cluster="local", FaultClass="gpu_lost")
    [recover] = local.metric_values("TimeToRecover", Cluster="local", FaultClass="gpu_lost")
    assert 42 <= detect < 52
    assert detect < recover < 62


def test_a_replacement_that_fails_its_deep_check_is_quarantined_and_escalated(local: LocalMode) -> None:
    local.cluster.fail_replacement_of("gpu-2")
    local.put_event(local.health_event("gpu-2", "XID 79"))
    [execution] = local.wait_for_executions(1)

    assert execution["status"] == "SUCCEEDED", execution.get("cause")
    incident = local.incident(execution["name"])
    assert incident.status == "quarantined"
    [rung] = incident.stages["repair"].result["rungs"]
    assert rung["rung"] == "replace" and rung["check"]["healthy"] is False
    assert "resume" not in incident.stages
    # the node stays drained with the pipeline's reason; nothing resumed it
    node = local.scheduler.node("gpu-2")
    assert "DRAIN" in node["State"] and node["Reason"].startswith(f"nodemedic:{execution['name']}")
    assert local.scontrol_commands("state=resume") == []
    # the on-call was paged, with the node, the replacement and what failed
    [message] = local.escalations()
    assert "gpu-2" in message["Message"] and rung["instance_id"] in message["Message"]
    assert "gpu_count" in message["Message"] and "stays drained" in message["Message"]
    # a later event for the node folds into the quarantined incident: nothing acts on it again
    local.put_event(local.health_event("gpu-2", "XID 79"))
    local.wait_for_executions(2)
    assert local.detect_decision(latest(local.wait_for_executions(2))) == "deduplicated"


def test_after_an_operator_resumes_a_quarantined_node_its_next_fault_opens_an_incident(local: LocalMode) -> None:
    """The runbook's exit: the on-call fixes the node by hand and resumes it. The quarantine's lock
    goes with its drain; kept, the node's next fault folded into the ended incident and nothing
    drained the node, which ran jobs with a lost GPU."""
    local.cluster.fail_replacement_of("gpu-2")
    local.put_event(local.health_event("gpu-2", "XID 79"))
    [execution] = local.wait_for_executions(1)
    quarantined = local.incident(execution["name"])
    assert quarantined.status == "quarantined"
    target = Target(local.stack.name, session=boto3.Session())
    with local.aws.lambdas_held():
        resumed = remediate(target, "gpu-2", "resume", "GPU reseated and checked by hand", OPERATOR)
    assert "DRAIN" not in resumed["state"]
    assert resumed["released"] == [quarantined.incident_id]

    local.put_event(local.health_event("gpu-2", "XID 79"))
    second = latest(local.wait_for_executions(2))
    assert local.detect_decision(second) == "remediate"
    assert local.incident(second["name"]).slurm_node == "gpu-2"
    assert local.incident(quarantined.incident_id).status == "quarantined"  # the ledger keeps what happened


def test_a_second_event_for_the_node_within_a_second_opens_no_second_incident(local: LocalMode) -> None:
    local.put_event(local.health_event("gpu-4", "XID 79"))
    local.put_event(local.health_event("gpu-4", "XID 48"))
    executions = local.wait_for_executions(2)

    assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
    decisions = sorted(local.detect_decision(e) for e in executions)
    assert decisions == ["deduplicated", "remediate"]
    [incident] = local.incidents()
    assert incident.duplicate_events == 1
    assert len(local.scontrol_commands("state=drain")) == 1


def test_a_cloudwatch_alarm_starts_the_same_pipeline(local: LocalMode) -> None:
    instance = local.cluster.instance_of("gpu-1")
    cw = local.aws.client("cloudwatch")
    cw.put_metric_alarm(
        AlarmName="nodemedic-status-gpu-1", Namespace="AWS/EC2", MetricName="StatusCheckFailed_System",
        Dimensions=[{"Name": "InstanceId", "Value": instance}], Statistic="Maximum", Period=60,
        EvaluationPeriods=1, Threshold=1, ComparisonOperator="GreaterThanOrEqualToThreshold")
    cw.set_alarm_state(AlarmName="nodemedic-status-gpu-1", StateValue="ALARM", StateReason="test")
    [execution] = local.wait_for_executions(1)

    assert execution["status"] == "SUCCEEDED", execution.get("cause")
    incident = local.incident(execution["name"])
    assert (incident.fault_code, incident.action, incident.source) == (
        "STATUS_CHECK_SYSTEM", "replace", "aws.cloudwatch")
    assert local.cluster.instance_of("gpu-1") != instance


@pytest.mark.parametrize(("sample", "action", "node"), [("runbooks/reboot-node.json", "reboot", "gpu-2"),
                                                     ("runbooks/replace-node.json", "replace", "gpu-2")])
def test_a_runbook_sample_starts_an_execution_that_succeeds(local: LocalMode, sample: str, action: str,
                                                            node: str) -> None:
    import json

    from tests.conftest import load_event

    sfn = local.aws.client("stepfunctions")
    sfn.start_execution(stateMachineArn=local.stack.state_machine_arn, name=f"runbook-{action}-{node}",
                        input=json.dumps(load_event(sample)))
    [execution] = local.wait_for_executions(1)
    assert execution["status"] == "SUCCEEDED", execution.get("cause")
    incident = local.incident(f"runbook-{action}-{node}")
    assert (incident.action, incident.fault_class, incident.slurm_node, incident.status) == (
        action, "manual", node, "closed")
    assert "oncall@example.com" in incident.reason
    assert [r["rung"] for r in incident.stages["repair"].result["rungs"]] == [action]


def test_a_runbook_started_by_hand_for_a_quarantined_node_acts() -> None:
    """A runbook started from the console, not the CLI: the CLI released a quarantine's lock before it
    started the execution, a hand-started one did not, so the request folded into the quarantined
    incident and the execution "succeeded" having done nothing. Now Detect releases it: the request
    is the act the quarantine waits for (one for a node whose incident is still open is refused:
    tests/stages/test_operator_requests.py)."""
    import json

    from tests.conftest import load_event
    from tests.e2e.support import OPEN, stack

    with stack(4, **OPEN) as local:
        local.cluster.fail_replacement_of("gpu-2")
        local.put_event(local.health_event("gpu-2", "XID 79"))
        [first] = local.wait_for_executions(1)
        quarantined = local.incident(first["name"])
        assert quarantined.status == "quarantined"
        bad = local.cluster.instance_of("gpu-2")

        local.aws.client("stepfunctions").start_execution(
            stateMachineArn=local.stack.state_machine_arn, name="runbook-replace-gpu-2",
            input=json.dumps(load_event("runbooks/replace-node.json")))
        second = latest(local.wait_for_executions(2, timeout=120))
        assert second["status"] == "SUCCEEDED", second.get("cause")
        replaced = local.incident("runbook-replace-gpu-2")
        assert (replaced.action, replaced.status) == ("replace", "closed"), replaced.outcome
        assert local.cluster.instance_of("gpu-2") != bad
        assert local.incident(quarantined.incident_id).status == "quarantined"  # the ledger keeps what happened
