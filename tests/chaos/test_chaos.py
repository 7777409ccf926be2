"""Chaos (issue 15): a fault injected right before each stage of a real incident, on the local
stack with real Slurm; then the reconciler runs once. Whatever the fault and the stage:

- the incident ends in a terminal state, and nothing is left for the reconciler to find again;
- no lock or claim outlives its incident (except the locks quarantined/escalated keep on purpose);
  the incident's end releases its claims itself, before the reconciler runs;
- a node NodeMedic acted on and did not return is drained;
- the job that ran on the node is never killed: it runs, or waits to run again;
- an operator's drain is never lifted;
- a job an operator let land on the node mid-repair is never killed by a destructive step;
- a node whose instance someone else terminated is replaced: the incident closes;
- once an operator pauses automation, nothing more is done to the node: no drain, requeue,
  spare, reset, reboot or replace (the incident ends escalated, the node as it was), unless only
  its return was left.

On Kubernetes (a real kube-apiserver), the node's instance ended by someone else right before
each stage: the cloud controller deletes the node, and the incident is retired, not failed.

``make test`` runs the scenarios not marked ``chaos_full``; ``make chaos`` runs them all.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from nodemedic import operations
from nodemedic.reconciler import KEEPS_LOCK
from nodemedic_sandbox.local import LocalMode

from tests.e2e.support import OPEN, control, running_job, stack

# the stage, as the function that runs it and the Resume function's step
STAGES: dict[str, tuple[str, Callable[[dict[str, Any]], bool]]] = {
    "drain": ("DrainFunction", lambda e: True),
    "spare": ("SparesFunction", lambda e: True),
    "repair": ("RepairFunction", lambda e: True),
    "resume": ("ResumeFunction", lambda e: e.get("step", "return") == "return"),
}
# each AWS service a stage calls, throttled at that stage for as long as the incident lasts:
# DynamoDB (the ledger) and SSM (the Slurm controller) by every stage, EC2 and Auto Scaling by Repair
THROTTLED = {"dynamodb": tuple(STAGES), "ssm": tuple(STAGES), "ec2": ("repair",), "autoscaling": ("repair",)}
FAULTS = ("controller-down", *(f"{service}-throttled" for service in THROTTLED), "operator-drain", "operator-resume",
          "instance-terminated", "operator-pause")
SMOKE = {("controller-down", "drain"), ("dynamodb-throttled", "repair"), ("operator-resume", "repair"),
         ("operator-drain", "resume"), ("ssm-throttled", "resume"), ("instance-terminated", "repair"),
         ("operator-pause", "drain"), ("operator-pause", "resume")}
# the fault reported: a lost GPU (its ladder: replace); where the node's instance is terminated by
# someone else, one whose ladder begins with rungs on the instance itself (reset, reboot, replace)
REPORTED = {"instance-terminated": "XID 48"}
SCENARIOS = [(f, s) for f in FAULTS for s in STAGES
             if not f.endswith("-throttled") or s in THROTTLED[f.removesuffix("-throttled")]]


def _scontrol(local: LocalMode, *args: str) -> None:
    subprocess.run(["scontrol", *args], env={**os.environ, **local.scheduler.env}, check=False, timeout=30,
                   capture_output=True)  # e.g. resuming a node not drained yet: Slurm refuses, nothing happens


def _inject(local: LocalMode, fault: str, stage: str, sick: str, started: list[str]) -> Any:
    function, when = STAGES[stage]
    if fault.endswith("-throttled"):
        return local.aws.throttle(fault.removesuffix("-throttled"), caller=function.removesuffix("Function"),
                                  times=10_000)

    def act(event: dict[str, Any]) -> None:
        if fault == "controller-down":  # stopped, its state saved: what it knew comes back with it
            local.scheduler.stop_controller(graceful=True)
        elif fault == "operator-drain":
            _scontrol(local, "update", f"nodename={sick}", "state=drain", "reason=operator:chaos RMA")
        elif fault == "operator-resume":  # lifts NodeMedic's drain by hand, and a job lands there
            _scontrol(local, "update", f"nodename={sick}", "state=resume")
            started.append(local.scheduler.submit(1, name="operator", on=sick))
        elif fault == "instance-terminated":  # the group's health check (or an operator) ends the instance
            local.aws.client("autoscaling").terminate_instance_in_auto_scaling_group(
                InstanceId=local.cluster.instance_of(sick), ShouldDecrementDesiredCapacity=False)
        elif fault == "operator-pause":  # the big red button, after the incident passed its gate
            operations.pause(control(local), by="chaos@example.com", reason="chaos: a rollout is suspected")
    return local.aws.before_invoke(function, act, when=when)


@pytest.mark.parametrize("fault,stage", [
    pytest.param(f, s, marks=() if (f, s) in SMOKE else (pytest.mark.chaos_full,), id=f"{f}@{s}")
    for f, s in SCENARIOS])
def test_invariants_hold_whatever_fails_at_each_stage(fault: str, stage: str, record_property: Any) -> None:
    with stack(nodes=4, spares=1, boot_seconds=1, **OPEN) as local:
        job, nodes = running_job(local)
        sick = nodes[0]
        original = local.cluster.instance_of(sick)
        pool = local.cluster.spare_pool()
        started: list[str] = []  # jobs an operator let land on the node
        injected = _inject(local, fault, stage, sick, started)
        local.put_event(local.health_event(sick, REPORTED.get(fault, "XID 79")))
        [execution] = local.wait_for_executions(1, timeout=240)
        if fault == "controller-down":
            local.scheduler.start_controller()
        left = [c for c in local.ledger.bookkeeping(local.cluster.name).claims if c.incident_id == execution["name"]]
        report = local.reconcile()
        if report["replacements_started"]:  # the node's instance ended after its check: it gets the group's new one
            local.wait_for_executions(1 + len(report["replacements_started"]), timeout=240)
        again = local.reconcile()
        incident = local.incident(execution["name"])
        books = local.ledger.bookkeeping(local.cluster.name)
        statuses = local.ledger.statuses(sorted({x.incident_id for x in [*books.locks, *books.claims]}))
        state = local.scheduler.node(sick)
        job_state = local.scheduler.job(job)["JobState"]
        broken: list[str] = []

        def check(ok: bool, what: str) -> None:
            if not ok:
                broken.append(what)
        check(incident.status != "open", "the incident ended")
        check(not books.open_incidents, "no incident left open")
        check(all(statuses.get(x.incident_id) in KEEPS_LOCK for x in books.locks), "no lock outlives its incident")
        check(all(statuses.get(x.incident_id) == "open" for x in books.claims), "no claim outlives its incident")
        if fault != "dynamodb-throttled" and incident.status != "open":  # throttled: the reconciler releases them
            check(not left, f"the incident's end released its claims ({', '.join(c.key for c in left)})")
        check(not any(again[k] for k in ("incidents_failed", "locks_released", "claims_released", "drains_reasserted")),
              "a second reconciler run finds nothing")
        check(job_state in ("RUNNING", "PENDING", "REQUEUED", "CONFIGURING"), f"the job lives ({job_state})")
        paused_before_drain = fault == "operator-pause" and stage == "drain" and bool(injected)
        if paused_before_drain:  # the node is the operator's: not drained, its job not requeued
            check("DRAIN" not in state["State"] and job_state == "RUNNING",
                  f"the node was neither drained nor its job requeued after the pause ({state['State']}, {job_state})")
        elif incident.status != "closed" and "drain" in incident.stages:
            check("DRAIN" in state["State"], f"the node stays drained ({state['State']})")
        if fault == "operator-drain" and injected:
            check("DRAIN" in state["State"] and state.get("Reason", "").startswith("operator:chaos"),
                  "the operator's drain was never lifted")
        if fault == "instance-terminated":  # nothing reaches the instance: the ladder goes on to its replace
            check(incident.status == "closed", f"the incident closed ({incident.status}: {incident.outcome})")
            try:  # ended after its check (before Resume): the reconciler's INSTANCE_LOST gives it the new one
                local.cluster.instance_of(sick)
            except LookupError as exc:
                broken.append(f"an instance backs {sick} at the end ({exc})")
        if fault == "operator-pause" and injected and stage in ("drain", "spare"):
            check(local.cluster.spare_pool() == pool, f"no spare was taken after the pause ({local.cluster.spare_pool()})")
        if fault == "operator-pause" and injected:  # at Resume: the repaired node is not returned
            check((stage == "resume" or local.cluster.instance_of(sick) == original) and incident.status == "escalated"
                  and "automation paused by chaos@example.com" in incident.outcome,
                  f"nothing was done to the node after the pause ({incident.status}: {incident.outcome[:120]})")
        for landed in started:  # the operator's job on the node mid-incident was never killed
            check(local.scheduler.job(landed)["JobState"] in ("RUNNING", "PENDING", "COMPLETED"),
                  f"job {landed} placed by the operator lives")
        if fault.endswith("-throttled"):
            check(len(injected.hits) > 0, "the throttle was hit")
        elif not injected:
            broken.append(f"the fault was never injected ({stage} did not run)")
        record_property("chaos", {  # the run lists it (tests/conftest.py)
            "scenario": f"{fault} @ {stage}",
            "rank": FAULTS.index(fault) * len(STAGES) + list(STAGES).index(stage),  # its place in the table
            "incident": incident.status + (f" ({incident.failure['stage']}: {incident.failure['error']})"
                                           if incident.failure else ""),
            "node": state["State"] + (f" ({state.get('Reason', '').split(' [')[0]})" if "DRAIN" in state["State"]
                                      else ""),
            "job": job_state,
            "invariants": "all hold" if not broken else "BROKEN: " + "; ".join(broken),
        })
        assert not broken, (broken, report)


@pytest.mark.chaos_full
@pytest.mark.parametrize("stage", list(STAGES))
def test_a_kubernetes_node_whose_instance_ends_at_each_stage_is_retired_not_failed(
        stage: str, record_property: Any) -> None:
    """On Kubernetes (a real kube-apiserver), the sick node's instance ended by someone else right
    before each stage: the cloud controller deletes its node, and the incident no longer fails on
    the API server's 404 and pages. It is retired (nothing left to repair; the group's own
    instance joins through its burn-in), its lock and claims released, the job moved on."""
    from nodemedic_sandbox import kube_apiserver
    from nodemedic_sandbox.kube_cluster import KubeScheduler

    from tests.conftest import require
    from tests.e2e.support import wait_for

    require("the real kube-apiserver", kube_apiserver.unavailable_reason())
    with LocalMode(nodes=3, spares=1, scheduler="kubernetes", retry_time_scale=0.01, extra_parameters=OPEN) as local:
        kube = local.scheduler
        assert isinstance(kube, KubeScheduler)
        job = kube.submit(3, name="llm")  # one worker on each of gpu-1..3; gpu-4 is the spare
        wait_for(lambda: kube.job(job)["JobState"] == "RUNNING", "the job to run")
        sick = "gpu-2"
        old = kube.instance_of(sick)

        def end_it(_: dict[str, Any]) -> None:  # the group's health check (or an operator) ends the instance
            local.aws.client("autoscaling").terminate_instance_in_auto_scaling_group(
                InstanceId=old, ShouldDecrementDesiredCapacity=False)
            wait_for(lambda: sick not in kube.node_names(), "the cloud controller to delete the node")

        function, when = STAGES[stage]
        injected = local.aws.before_invoke(function, end_it, when=when)
        local.put_event(local.health_event(sick, "XID 48"))  # a GPU reset first: its check passes
        [execution] = local.wait_for_executions(1, timeout=240)
        local.reconcile()
        again = local.reconcile()
        incident = local.incident(execution["name"])
        books = local.ledger.bookkeeping(local.cluster.name)
        statuses = local.ledger.statuses(sorted({x.incident_id for x in [*books.locks, *books.claims]}))
        job_state = kube.job(job)["JobState"]
        pages = [m.get("Subject", "") for m in local.escalations()]
        broken = [what for ok, what in (
            (bool(injected), f"the fault was never injected ({stage} did not run)"),
            (execution["status"] == "SUCCEEDED", f"the execution succeeded ({execution['status']})"),
            (incident.status == "retired" and f"has no node {sick}: it was deleted" in incident.outcome
             and ("it was gone before it could be returned" if stage == "resume"
                  else f"EC2 ended {old} outside NodeMedic") in incident.outcome,
             f"the incident was retired ({incident.status}: {incident.outcome[:160]})"),
            (not books.open_incidents, "no incident left open"),
            (all(statuses.get(x.incident_id) in KEEPS_LOCK for x in books.locks), "no lock outlives its incident"),
            (local.ledger.node_lock(incident.cluster, old) is None, "the incident's lock is released"),
            (all(statuses.get(x.incident_id) == "open" for x in books.claims), "no claim outlives its incident"),
            (not any(again[k] for k in ("incidents_failed", "locks_released", "claims_released", "drains_reasserted")),
             "a second reconciler run finds nothing"),
            (job_state in ("RUNNING", "PENDING"), f"the job lives ({job_state})"),
            (pages == [], f"nobody is paged ({pages})"),
            (kube.errors == [], f"the cluster's controllers ran clean ({kube.errors[:2]})"),
        ) if not ok]
        record_property("chaos", {
            "scenario": f"instance-terminated @ {stage} (Kubernetes)",
            "rank": len(FAULTS) * len(STAGES) + list(STAGES).index(stage),
            "incident": incident.status + (f" ({incident.failure['stage']}: {incident.failure['error']})"
                                           if incident.failure else ""),
            "node": "deleted" if sick not in kube.node_names() else kube.node(sick)["State"],
            "job": job_state,
            "invariants": "all hold" if not broken else "BROKEN: " + "; ".join(broken),
        })
        assert not broken, broken
