"""Nothing is left half-done (issue 15): with real Slurm and the deployed state machine, a stage
that fails ends its incident failed, releases its lock, leaves the node held drained, and the
reconciler repairs what could not be done at the time."""

import os
import subprocess

import boto3
import pytest
from nodemedic.operations import OperatorError
from nodemedic_cli import operator as operator_commands
from nodemedic_cli.target import Target

from tests.e2e.support import OPEN, OPERATOR, job_running, running_job, stack, wait_for


def test_controller_down_at_drain_then_restarted_without_its_state() -> None:
    with stack(**OPEN) as local:
        job, nodes = running_job(local)
        sick = nodes[0]
        instance = local.cluster.instance_of(sick)
        local.scheduler.stop_controller()
        local.put_event(local.health_event(sick, "XID 79"))
        [execution] = local.wait_for_executions(1, timeout=180)

        assert execution["status"] == "FAILED"
        incident = local.incident(execution["name"])
        assert (incident.status, incident.failure["stage"]) == ("failed", "drain")
        [page] = [e for e in local.escalations() if incident.incident_id in e["Message"]]
        assert "could not be drained now" in page["Message"] and "lock is released" in page["Message"]
        assert local.ledger.active_incident_id(local.cluster.name, instance) is None
        assert local.ledger.hold_of(local.cluster.name, sick).incident_id == incident.incident_id

        # the controller answers again: the reconciler drains the node (a drain only: the job runs on)
        local.scheduler.start_controller()
        report = local.reconcile()
        assert report["drains_reasserted"] == [sick], report
        [page] = [e for e in local.escalations() if "reconciler" in e.get("Subject", "")]  # one page a run
        assert page["Subject"].endswith("repaired 1 thing(s)") and f"drained {sick} again" in page["Message"]
        state = local.scheduler.node(sick)
        assert "DRAIN" in state["State"] and state["Reason"].startswith(f"nodemedic:{incident.incident_id} ")
        assert job_running(local, job)["JobState"] == "RUNNING"
        assert local.reconcile()["drains_reasserted"] == []  # nothing more to do

        # slurmctld restarts without its saved state: the drain is lost, and re-asserted; SNS cannot
        # be reached then (past the SDK's retries): the run fails and the next one sends its page
        local.scheduler.stop_controller()
        local.scheduler.start_controller(clear_state=True)
        assert "DRAIN" not in local.scheduler.node(sick)["State"]
        sns_down = local.aws.throttle("sns", "Publish", times=10_000)
        with pytest.raises(RuntimeError, match="Throttling"):
            local.reconcile()
        sns_down.times = 0  # SNS answers again
        assert "DRAIN" in local.scheduler.node(sick)["State"]
        assert local.reconcile()["drains_reasserted"] == []
        [late] = [e for e in local.escalations() if "reconciler" in e.get("Subject", "")]  # since the last look
        assert late["Subject"].endswith("(and 1 from earlier runs, not sent then)")
        assert f"drained {sick} again" in late["Message"]
        assert local.ledger.unsent_pages(local.cluster.name) == []

        # the drain is lost again, and the pages earlier runs kept cannot be read (DynamoDB
        # throttled past the SDK's retries on that item): this run's page goes out alone
        local.scheduler.stop_controller()
        local.scheduler.start_controller(clear_state=True)
        outbox_down = local.aws.throttle("dynamodb", "GetItem", caller="Reconciler", containing="OUTBOX#", times=10_000)
        assert local.reconcile()["drains_reasserted"] == [sick]
        outbox_down.times = 0
        assert outbox_down.hits
        [alone] = [e for e in local.escalations() if "reconciler" in e.get("Subject", "")]
        assert alone["Subject"].endswith("repaired 1 thing(s)") and f"drained {sick} again" in alone["Message"]
        assert "a later run sends them" in alone["Message"]

        # the lock was released: the next fault opens a new incident, which takes over the drain,
        # repairs the node and returns it; NodeMedic then holds nothing
        local.put_event(local.health_event(sick, "XID 79"))
        executions = local.wait_for_executions(2, timeout=180)
        [second] = [e for e in executions if e["name"] != execution["name"]]
        assert second["status"] == "SUCCEEDED", second.get("cause")
        assert local.incident(second["name"]).status == "closed"
        assert "DRAIN" not in local.scheduler.node(sick)["State"]
        assert local.ledger.hold_of(local.cluster.name, sick) is None
        assert local.reconcile()["drains_reasserted"] == []

        # slurmctld crashes after the close and restarts from state saved before the return: the
        # node reads drained by the closed incident again; the reconciler returns it, once
        subprocess.run(["scontrol", "update", f"nodename={sick}", "state=drain",
                        f"reason=nodemedic:{second['name']} XID 79"], env={**os.environ, **local.scheduler.env},
                       check=True, timeout=30)
        report = local.reconcile()
        assert report["returns_reasserted"] == [sick] and not report["errors"], report
        assert "DRAIN" not in local.scheduler.node(sick)["State"]
        [page] = [e for e in local.escalations() if "reconciler" in e.get("Subject", "")]
        assert f"returned {sick} again" in page["Message"]
        assert local.reconcile()["returns_reasserted"] == []


@pytest.mark.parametrize("function", ["DrainFunction", "SparesFunction", "RepairFunction", "ResumeFunction"])
def test_controller_down_for_a_moment_at_a_stage_the_fault_is_remediated_all_the_same(function: str) -> None:
    """slurmctld restarts as Drain, the spare's swap, Repair or Resume begins (an upgrade, a
    HyperPod controller's failover): the stage's scheduler command fails. Before, the incident
    failed at once: a real XID 79 was never repaired, its job waited with a spare left idle, or the
    repaired node stayed drained until a person returned it (Resume: found by
    tests/chaos/test_soak.py, seed 1293: "add spare gpu-2 ... is not reserved"), and the on-call was
    paged. The stage is tried again, the controller back by then: the node is drained, its job
    moves to the spare, the node is repaired and joins the spare pool, the incident closes, no page."""
    with stack(spares=1, **OPEN) as local:
        job, nodes = running_job(local)
        sick = nodes[0]

        def returning(event: dict) -> bool:  # Resume's stage proper (its function also waits for jobs)
            return event.get("step", "return") == "return"

        # stopped with its state saved (a restart, a failover): killed, slurmctld would also forget the
        # spare pool's last edit (gpu-5 taken), and Resume rightly return the node to service instead
        down = local.aws.before_invoke(function, lambda event: local.scheduler.stop_controller(graceful=True),
                                       when=returning)
        back = local.aws.before_invoke(function, lambda event: local.scheduler.start_controller(),
                                       when=lambda event: returning(event) and bool(down) and event is not down[0])
        local.put_event(local.health_event(sick, "XID 79"))
        [execution] = local.wait_for_executions(1, timeout=240)

        assert down and back  # the first try found no controller; the next found it back
        assert execution["status"] == "SUCCEEDED", execution.get("cause")
        incident = local.incident(execution["name"])
        assert incident.status == "closed" and incident.outcome.startswith("node back in the spare pool"), incident.outcome
        assert incident.stages["drain"].result["requeued_jobs"] == [job]
        assert incident.stages["spare"].result["spare"]
        state = local.scheduler.node(sick)
        assert "RESERVED" in state["State"] and "DRAIN" not in state["State"], state
        assert job_running(local, job)["JobState"] == "RUNNING"
        assert local.ledger.hold_of(local.cluster.name, sick) is None
        assert not [e for e in local.escalations() if incident.incident_id in e["Message"]]


def test_an_operator_keeps_a_node_nodemedic_drained_out_for_an_rma() -> None:
    with stack(boot_seconds=8, **OPEN) as local:
        job, nodes = running_job(local)
        sick = nodes[0]
        local.put_event(local.health_event(sick, "XID 79"))
        wait_for(lambda: "DRAIN" in local.scheduler.node(sick)["State"], "the drain", timeout=60)
        target = Target(local.stack.name, session=boto3.Session())
        # while the node is replaced (an 8 s boot), the on-call takes it for an RMA
        done = operator_commands.remediate(target, sick, "drain", "RMA bad HBM", OPERATOR)
        assert done["was"].startswith("nodemedic:")
        [execution] = local.wait_for_executions(1, timeout=120)
        assert execution["status"] == "SUCCEEDED", execution.get("cause")
        incident = local.incident(execution["name"])
        assert incident.status == "closed" and "drained by an operator: left drained" in incident.outcome
        state = local.scheduler.node(sick)
        assert "DRAIN" in state["State"] and state["Reason"].startswith(f"operator:{OPERATOR} RMA bad HBM")
        assert local.ledger.hold_of(local.cluster.name, sick) is None
        assert local.reconcile()["drains_reasserted"] == []
        job_running(local, job)  # requeued, and running elsewhere
        # another operator's drain is not taken over by a second one
        with pytest.raises(OperatorError, match="already drained by someone else"):
            operator_commands.remediate(target, sick, "drain", "mine now", "someone@example.com")
