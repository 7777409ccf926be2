"""AWS throttling at every stage (issue 15): each call is retried by the SDK, a call still throttled
makes the state machine retry the stage within a budget, and past the budget the incident fails
the one uniform way, never half-done. Real Slurm, the deployed template, injected throttling."""

from datetime import UTC, datetime

from nodemedic.aws_retries import MAX_ATTEMPTS
from nodemedic_sandbox.local import LocalMode

from tests.e2e.support import OPEN, job_running, latest, running_job, stack

PAST_THE_SDK = MAX_ATTEMPTS + 2  # one stage retry by the state machine, then the SDK absorbs the rest


def test_throttling_at_every_stage_past_the_sdks_retries_still_ends_in_a_repaired_node() -> None:
    with stack(**OPEN) as local:
        job, nodes = running_job(local)
        sick = nodes[0]
        old = local.cluster.instance_of(sick)
        throttles = [local.aws.throttle("autoscaling", caller="Detect", times=PAST_THE_SDK),
                     local.aws.throttle("dynamodb", caller="Gate", times=PAST_THE_SDK),
                     # the safety policy's read: throttled, it is retried, not read as a bad policy (held)
                     local.aws.throttle("ssm", "GetParameter", caller="Gate", times=PAST_THE_SDK),
                     local.aws.throttle("ssm", "GetParameter", caller="Repair", times=PAST_THE_SDK),
                     local.aws.throttle("dynamodb", caller="Drain", times=PAST_THE_SDK),
                     local.aws.throttle("ssm", "SendCommand", caller="Drain", times=3),
                     local.aws.throttle("ec2", "CreateTags", caller="Repair", times=PAST_THE_SDK),
                     local.aws.throttle("dynamodb", caller="Resume", times=PAST_THE_SDK)]
        local.put_event(local.health_event(sick, "XID 79"))
        [execution] = local.wait_for_executions(1, timeout=240)

        assert execution["status"] == "SUCCEEDED", execution.get("cause")
        assert [len(t.hits) for t in throttles] == [t.times for t in throttles]
        incident = local.incident(execution["name"])
        assert incident.status == "closed"
        # the replacement was tagged although CreateTags was throttled: no orphan, no empty slot
        [rung] = incident.stages["repair"].result["rungs"]
        new = rung["instance_id"]
        assert new != old and local.cluster.instance_of(sick) == new
        job_running(local, job)


def test_throttled_past_the_budget_the_incident_fails_cleanly_and_the_node_stays_drained() -> None:
    with stack(**OPEN) as local:
        job, nodes = running_job(local)
        sick = nodes[0]
        instance = local.cluster.instance_of(sick)
        forever = local.aws.throttle("autoscaling", caller="Repair", times=10_000)
        local.put_event(local.health_event(sick, "XID 79"))
        [execution] = local.wait_for_executions(1, timeout=240)

        assert execution["status"] == "FAILED"
        assert len(forever.hits) >= 2 * MAX_ATTEMPTS  # the SDK's retries, then the stage's
        incident = local.incident(execution["name"])
        assert (incident.status, incident.failure["stage"], incident.failure["error"]) == (
            "failed", "repair", "AwsThrottledError")
        assert local.ledger.active_incident_id(local.cluster.name, instance) is None
        assert local.ledger.hold_of(local.cluster.name, sick).incident_id == incident.incident_id
        state = local.scheduler.node(sick)
        assert "DRAIN" in state["State"] and state["Reason"].startswith(f"nodemedic:{incident.incident_id} ")
        assert local.cluster.instance_of(sick) == instance  # nothing was terminated
        [page] = [e for e in local.escalations() if incident.incident_id in e["Message"]]
        assert "failed in stage repair" in page["Message"] and "stays drained" in page["Message"]
        job_running(local, job)  # requeued by the drain, running elsewhere
        report = local.reconcile()
        assert report["incidents_failed"] == [] and report["drains_reasserted"] == []


def test_the_agents_resend_of_an_event_detect_could_not_act_on_opens_the_incident_once() -> None:
    with stack(**OPEN) as local:
        job, nodes = running_job(local)
        sick = nodes[0]
        forever = local.aws.throttle("autoscaling", caller="Detect", times=10_000)
        event = local.health_event(sick, "XID 79")
        local.put_event(event)
        [dropped] = local.wait_for_executions(1, timeout=240)
        assert dropped["status"] == "FAILED" and local.incidents() == []  # the on-call was told it was not opened
        local.aws.throttles.remove(forever)

        def resend() -> dict:  # what the agent does (intervals.reassert_seconds): same event, sent now
            before = len(local.executions())
            local.put_event({**event, "sent_at": datetime.now(UTC).isoformat()})
            executions = local.wait_for_executions(before + 1, timeout=180)
            return max(executions, key=lambda e: e["startDate"])

        opened = resend()
        assert opened["status"] == "SUCCEEDED", opened.get("cause")
        [incident] = local.incidents()
        assert incident.status == "closed" and incident.incident_id == opened["name"]
        again = resend()  # and once more: the pipeline remembers the event, nothing new
        assert LocalMode.detect_decision(again) != "remediate"
        assert len(local.incidents()) == 1
        job_running(local, job)


def test_a_fault_whose_gate_stayed_throttled_is_decided_again_at_the_reconcilers_next_run() -> None:
    """Auto Scaling throttled past the gate's budget: the incident fails without touching the node,
    and the fault is not lost (the agent stopped sending it once an incident opened): the
    reconciler offers it again, and the node is repaired. Three failures in a row, then no more."""
    with stack(**OPEN) as local:
        job, nodes = running_job(local)
        sick, other = nodes[0], nodes[1]
        forever = local.aws.throttle("autoscaling", caller="Gate", times=10_000)
        local.put_event(local.health_event(sick, "XID 79"))
        [first] = local.wait_for_executions(1, timeout=240)
        assert first["status"] == "FAILED"
        failed = local.incident(first["name"])
        assert (failed.status, failed.failure["stage"], failed.failure["error"]) == ("failed", "gate", "AwsThrottledError")
        assert "was not touched" in failed.outcome and "decides its XID 79 again" in failed.outcome
        assert "DRAIN" not in local.scheduler.node(sick)["State"]

        local.aws.throttles.remove(forever)  # AWS answers again
        assert local.reconcile()["rechecks_offered"] == [sick]
        fixed = local.incident(latest(local.wait_for_executions(2, timeout=240))["name"])
        assert fixed.status == "closed" and fixed.evidence("recheck_of") == failed.incident_id, fixed.outcome
        assert (fixed.fault_code, fixed.observed_at) == ("XID 79", failed.observed_at)
        assert local.reconcile()["rechecks_offered"] == []  # decided once
        job_running(local, job)

        local.aws.throttles.append(forever)  # throttled for good: offered three times, then the on-call decides
        local.put_event(local.health_event(other, "XID 79"))
        failed = local.incident(latest(local.wait_for_executions(3, timeout=240))["name"])
        for executions in (4, 5, 6):
            assert local.reconcile()["rechecks_offered"] == [other]
            retried = local.incident(latest(local.wait_for_executions(executions, timeout=240))["name"])
            assert retried.status == "failed" and retried.evidence("recheck_of") == failed.incident_id
            failed = retried
        assert "decides its XID 79 again" not in failed.outcome and "was not touched" in failed.outcome
        assert local.reconcile()["rechecks_offered"] == []
