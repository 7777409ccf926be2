"""An AWS Health scheduled change, delivered to the default bus as AWS Health does, is
remediated by the deployed template before AWS acts: the retiring node is drained and replaced
and the incident closes; a resource that is not a node of the cluster is ignored; the same Health
event delivered again opens nothing."""

import copy
import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import boto3
from nodemedic.store.control import ControlStore
from nodemedic.store.deferred import DeferredPlans
from nodemedic.store.paced import PacedReleases
from nodemedic_cli.main import app
from nodemedic_cli.target import Target
from nodemedic_sandbox.local import LocalMode
from typer.testing import CliRunner

from tests.conftest import EVENTS, require_slurm
from tests.e2e.support import OPEN, job_running, wait_for


def _retirement(instances: list[str], starts_in: timedelta) -> dict:
    event = copy.deepcopy(json.loads((EVENTS / "aws-health" / "ec2-instance-retirement-scheduled.json").read_text()))
    start = datetime.now(UTC) + starts_in
    event["detail"]["startTime"] = format_datetime(start, usegmt=True)
    event["detail"]["endTime"] = format_datetime(start + timedelta(hours=4), usegmt=True)
    event["detail"]["affectedEntities"] = [{"entityValue": i, "statusCode": "PENDING"} for i in instances]
    event["resources"] = instances
    return event


def test_a_scheduled_retirement_replaces_the_node_before_aws_acts(local: LocalMode) -> None:
    retiring = local.cluster.instance_of("gpu-2")
    event = _retirement([retiring, "i-0fedcba9876543210"], starts_in=timedelta(days=14))
    local.emit_as_aws(event)
    local.emit_as_aws(event)  # AWS Health delivers at least once: the same event twice
    executions = local.wait_for_executions(2)
    assert len(local.incidents()) == 1
    [incident] = local.incidents()
    assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
    assert (incident.slurm_node, incident.fault_code, incident.source) == ("gpu-2", "PLANNED_RETIREMENT",
                                                                          "nodemedic.planned")
    assert incident.status == "closed"
    evidence = incident.stages["detect"].result["evidence"]
    assert evidence["aws_event_type"] == "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED"
    assert evidence["deadline"] > datetime.now(UTC).isoformat()  # acted on before AWS's window
    [rung] = incident.stages["repair"].result["rungs"]
    assert rung["rung"] == "replace" and local.cluster.instance_of("gpu-2") != retiring
    wait_for(lambda: "DRAIN" not in local.scheduler.node("gpu-2")["State"], "gpu-2 back in service")


def test_the_sweep_of_ec2_scheduled_events_finds_what_aws_health_did_not_deliver(local: LocalMode) -> None:
    retiring = local.cluster.instance_of("gpu-3")
    local.aws.schedule_instance_event(retiring, "instance-retirement", datetime.now(UTC) + timedelta(days=10))
    done = local.aws.schedule_instance_event(local.cluster.instance_of("gpu-1"), "instance-reboot",
                                             datetime.now(UTC) - timedelta(days=1),
                                             description="[Completed] Scheduled reboot")
    assert done
    local.fire_schedule("PlannedEventsFunction")  # its hourly sweep
    [execution] = local.wait_for_executions(1)
    [incident] = local.incidents()
    assert (incident.slurm_node, incident.fault_code, incident.status) == ("gpu-3", "PLANNED_RETIREMENT", "closed")
    evidence = incident.stages["detect"].result["evidence"]
    assert evidence["ec2_event_code"] == "instance-retirement" and evidence["deadline"] > datetime.now(UTC).isoformat()
    assert local.cluster.instance_of("gpu-3") != retiring  # replaced before EC2 retires it

    local.fire_schedule("PlannedEventsFunction")  # the next sweep: the old instance is gone, nothing new
    local.aws.schedule_instance_event(local.cluster.instance_of("gpu-3"), "system-maintenance",
                                      datetime.now(UTC) + timedelta(days=3), description="Scheduled network maintenance")
    local.fire_schedule("PlannedEventsFunction")
    local.fire_schedule("PlannedEventsFunction")  # seen by two sweeps: one event id, recorded once
    executions = local.wait_for_executions(3)
    assert len(local.incidents()) == 1, "network maintenance is recorded (monitor), no incident"
    assert sorted(local.detect_decision(e) or "" for e in executions) == ["monitor", "monitor", "remediate"]


def test_with_a_lead_time_a_far_notice_waits_and_the_sweep_acts_on_it_when_its_time_comes() -> None:
    """PlannedLeadTimeHours=48: a retirement 14 days out opens nothing yet (the job runs on; a
    fault meanwhile is a fault like any other); the hourly sweep that comes 48 h (and one sweep)
    before the deadline publishes it, observed then, and the node is replaced before AWS acts. A
    notice AWS closes meanwhile is withdrawn; one whose instance left the cluster meanwhile is
    dropped at its time."""
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01,
                   extra_parameters={"PlannedLeadTimeHours": "48"}) as local:
        waiting = DeferredPlans(local.aws.client("dynamodb"), local.stack.table_name, local.cluster.name)
        job_running(local, local.scheduler.submit(2, on="gpu-[2-3]"))  # no checkpoint: no slack to act early
        retiring, other = local.cluster.instance_of("gpu-2"), local.cluster.instance_of("gpu-3")
        first, second = _retirement([retiring], timedelta(days=14)), _retirement([other], timedelta(days=12))
        second["detail"]["eventArn"] += "-second"
        local.emit_as_aws(first)
        local.emit_as_aws(second)
        deferred = wait_for(lambda: len(found := waiting.waiting()) == 2 and found, "both notices to wait")
        deadline = datetime.now(UTC) + timedelta(days=14)
        assert abs(deferred[-1].act_at - (deadline - timedelta(hours=49))) < timedelta(minutes=5)
        local.fire_schedule("PlannedEventsFunction")  # a sweep before their time: nothing
        closed = copy.deepcopy(second)
        closed["detail"]["statusCode"] = "closed"
        closed["detail"]["lastUpdatedTime"] = format_datetime(datetime.now(UTC), usegmt=True)
        local.emit_as_aws(closed)  # AWS canceled the second
        wait_for(lambda: [d.event.node.slurm_node for d in waiting.waiting()] == ["gpu-2"], "the second withdrawn")
        # the notice's first version delivered again after the update (a retried delivery, a
        # replayed archive): older than the closed one, it changes nothing
        def ignored() -> float:
            return sum(local.metric_values("PlannedIgnored", "Sum", Cluster=local.cluster.name))

        before = ignored()
        local.emit_as_aws(second)
        wait_for(lambda: ignored() > before or len(waiting.waiting()) > 1, "the late notice handled")
        assert [d.event.node.slurm_node for d in waiting.waiting()] == ["gpu-2"]
        assert local.executions() == []

        # 12 days later (the stored time moved, as the clock would): the sweep's time has come
        [kept] = waiting.waiting()
        waiting.defer(kept.event, datetime.now(UTC) - timedelta(minutes=1))
        local.fire_schedule("PlannedEventsFunction")
        [execution] = local.wait_for_executions(1)
        assert execution["status"] == "SUCCEEDED", execution.get("cause")
        [incident] = local.incidents()
        assert (incident.slurm_node, incident.fault_code, incident.status) == ("gpu-2", "PLANNED_RETIREMENT", "closed")
        evidence = incident.stages["detect"].result["evidence"]
        assert evidence["noticed_at"] < incident.observed_at.isoformat() < evidence["deadline"]
        assert local.cluster.instance_of("gpu-2") != retiring and waiting.waiting() == []
        local.fire_schedule("PlannedEventsFunction")  # published once: nothing more
        assert len(local.wait_for_executions(1)) == 1

        # another notice that waited for the instance since replaced (here by the retirement; as
        # well by a fault's incident or an operator) is moot at its time: forgotten with the
        # reason, nothing opened, nobody paged about an instance that is no longer a member
        local.escalations()
        before = ignored()
        waiting.defer(kept.event.model_copy(update={"event_id": "moot-notice"}), datetime.now(UTC) - timedelta(minutes=1))
        local.fire_schedule("PlannedEventsFunction")
        wait_for(lambda: waiting.waiting() == [] and ignored() > before, "the moot notice forgotten")
        assert len(local.wait_for_executions(1)) == 1 and local.escalations() == []


def test_a_waiting_notice_is_acted_on_early_when_its_node_has_slack() -> None:
    """PlannedLeadTimeHours=48, a retirement 14 days out for three nodes: gpu-1 runs a job that
    just reported a checkpoint, gpu-2 one that has reported none, gpu-3 is idle. The next sweep
    acts on gpu-1 (its job loses at most the minutes since its checkpoint, where at the lead
    time it could lose a whole interval) and gpu-3 (nothing to lose), each saying why; gpu-2
    waits for its job's next checkpoint or its lead time. (Six nodes and a breaker open to all of
    them let planned work take three at once; the default's one would pace them: the test after
    this one.)"""
    require_slurm()
    with LocalMode(nodes=6, scheduler="slurm", retry_time_scale=0.01,
                   extra_parameters={**OPEN, "PlannedLeadTimeHours": "48"}) as local:
        waiting = DeferredPlans(local.aws.client("dynamodb"), local.stack.table_name, local.cluster.name)
        checkpointed = local.scheduler.submit(1, name="checkpointed", on="gpu-1", body=(
            'scontrol update jobid="$SLURM_JOB_ID" comment="nodemedic-checkpoint=$(date +%s)"\nsleep 3600'))
        busy = local.scheduler.submit(1, name="busy", on="gpu-2")
        for job in (checkpointed, busy):
            job_running(local, job)
        wait_for(lambda: "nodemedic-checkpoint=" in local.scheduler.job(checkpointed).get("Comment", ""),
                 "the job's checkpoint marker")
        retiring = [local.cluster.instance_of(n) for n in ("gpu-1", "gpu-2", "gpu-3")]
        local.emit_as_aws(_retirement(retiring, timedelta(days=14)))
        wait_for(lambda: len(waiting.waiting()) == 3, "the three notices to wait")

        local.fire_schedule("PlannedEventsFunction")
        executions = local.wait_for_executions(2)
        assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
        early = {i.slurm_node: i.stages["detect"].result["evidence"]["early"] for i in local.incidents()}
        assert early == {"gpu-1": "every job on the node (1) checkpointed within the last 60 min",
                         "gpu-3": "no job runs on the node"}
        assert [d.event.node.slurm_node for d in waiting.waiting()] == ["gpu-2"]
        assert local.scheduler.job(busy)["JobState"] == "RUNNING" and "gpu-2" in local.scheduler.job(busy)["NodeList"]
        local.fire_schedule("PlannedEventsFunction")  # still no slack on gpu-2: nothing more
        assert len(local.wait_for_executions(2)) == 2

        # AWS moves the window near (an update of the notice): gpu-2's event is due, acted on at
        # once, and the copy kept for the old window is gone: it never comes out a second time
        moved = _retirement(retiring, timedelta(hours=6))
        moved["detail"]["lastUpdatedTime"] = format_datetime(datetime.now(UTC), usegmt=True)
        local.emit_as_aws(moved)
        executions = local.wait_for_executions(3)
        assert sorted(i.slurm_node for i in local.incidents()) == ["gpu-1", "gpu-2", "gpu-3"]
        assert waiting.waiting() == []


def _an_hour_passes(local: LocalMode) -> None:
    """Move what the breaker's 60 min window counts (the gate's admissions, the planned work
    released) an hour into the past, as the clock would."""
    hour = timedelta(minutes=61)
    db = local.aws.client("dynamodb")
    ControlStore(db, local.stack.table_name, local.cluster.name).change(lambda state: state.admissions.update(
        {i: a.model_copy(update={"at": a.at - hour}) for i, a in state.admissions.items()}))
    paced = PacedReleases(db, local.stack.table_name, local.cluster.name)
    releases = paced.read()
    releases.releases = {i: r.model_copy(update={"at": r.at - hour}) for i, r in releases.releases.items()}
    paced.save(releases)


def test_a_campaign_of_retirements_is_paced_under_the_breaker_not_tripping_it() -> None:
    """AWS retires three of four nodes' hosts at once, one AWS Health event each, delivered
    together. The breaker allows one node within its 60 min window (10 % of 4, at least one), so
    planned work takes one: one node is drained and replaced, the other two notices wait, and
    the breaker stays closed (tripped, it would stop every repair, faults' too, until an operator
    reset it); `nodemedic planned` lists the two and what they wait for. Each later sweep with
    room (the window since passed) takes the next waiting one, the nearest deadline first."""
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01) as local:
        waiting = DeferredPlans(local.aws.client("dynamodb"), local.stack.table_name, local.cluster.name)
        control = ControlStore(local.aws.client("dynamodb"), local.stack.table_name, local.cluster.name)
        retiring = {n: local.cluster.instance_of(n) for n in ("gpu-1", "gpu-2", "gpu-3")}
        deadlines = {"gpu-1": 9, "gpu-2": 5, "gpu-3": 7}  # days away
        for node, days in deadlines.items():
            event = _retirement([retiring[node]], timedelta(days=days))
            event["detail"]["eventArn"] += f"-{node}"
            local.emit_as_aws(event)
        [execution] = local.wait_for_executions(1)
        assert execution["status"] == "SUCCEEDED", execution.get("cause")
        wait_for(lambda: len(waiting.waiting()) == 2, "the other two notices to wait")
        [first] = local.incidents()  # the notice whose delivery came first took the room
        assert first.status == "closed"
        rest = sorted(set(deadlines) - {first.slurm_node}, key=deadlines.__getitem__)
        assert control.read().breaker.state == "closed"
        assert sum(local.metric_values("PlannedPaced", "Sum", Cluster=local.cluster.name)) >= 2
        # what an operator sees: nodemedic planned
        target = Target(local.stack.name, session=boto3.Session())
        shown = CliRunner().invoke(app, ["planned", "--json"], obj=target)
        assert shown.exit_code == 0, shown.output
        listed = json.loads(shown.output)
        assert [(w["node"], w["waits_for"]) for w in listed["waiting"]] == [
            (n, "room under the circuit breaker") for n in sorted(rest)]  # both due: in the order they came
        assert [r["node"] for r in listed["released"]] == [first.slurm_node] and listed["window_minutes"] == 60
        table = CliRunner().invoke(app, ["planned"], obj=target)
        assert "2 planned notice(s) waiting" in table.output and "room under the circuit" in table.output
        # a safety policy that cannot be read releases no planned work: the operator still sees what
        # waits, and why (before, the command failed on the policy and showed nothing)
        ssm, name = local.aws.client("ssm"), target.output("SafetyPolicyParameterName")
        good = ssm.get_parameter(Name=name)["Parameter"]["Value"]
        ssm.put_parameter(Name=name, Value="{not json", Overwrite=True)
        try:
            broken = CliRunner().invoke(app, ["planned", "--json"], obj=target)
        finally:
            ssm.put_parameter(Name=name, Value=good, Overwrite=True)
        assert broken.exit_code == 0, broken.output
        assert len(json.loads(broken.output)["waiting"]) == 2 and "is not JSON" in json.loads(broken.output)["policy_error"]

        # AWS moves one waiting notice's window to 30 min from now: there is still no room, and AWS
        # will act before the next sweep. The on-call is told, once however often it is delivered
        local.escalations()
        soon = _retirement([retiring[rest[0]]], timedelta(minutes=30))
        soon["detail"]["eventArn"] += f"-{rest[0]}"
        soon["detail"]["lastUpdatedTime"] = format_datetime(datetime.now(UTC), usegmt=True)
        local.emit_as_aws(soon)
        [page] = wait_for(lambda: local.escalations(), "the on-call told")
        assert page["Subject"] == "NodeMedic: planned work runs late"
        assert f"{rest[0]} ({retiring[rest[0]]}, PLANNED_RETIREMENT" in page["Message"]
        function = local.stack.resources["PlannedEventsFunction"]

        def planned_runs() -> int:
            return sum(i.function == function for i in local.aws.invocations)

        before = planned_runs()
        local.emit_as_aws(soon)
        local.fire_schedule("PlannedEventsFunction")
        wait_for(lambda: planned_runs() >= before + 2, "both handled")
        assert local.escalations() == [] and len(local.executions()) == 1

        local.fire_schedule("PlannedEventsFunction")  # within the window: no room yet
        assert len(local.wait_for_executions(1)) == 1 and len(waiting.waiting()) == 2

        _an_hour_passes(local)
        local.fire_schedule("PlannedEventsFunction")
        local.wait_for_executions(2)
        assert sorted(i.slurm_node for i in local.incidents()) == sorted([first.slurm_node, rest[0]])
        _an_hour_passes(local)
        local.fire_schedule("PlannedEventsFunction")
        executions = local.wait_for_executions(3)
        assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
        assert {i.slurm_node: i.status for i in local.incidents()} == {"gpu-1": "closed", "gpu-2": "closed",
                                                                        "gpu-3": "closed"}
        assert all(local.cluster.instance_of(n) != i for n, i in retiring.items())  # all replaced before AWS acts
        assert waiting.waiting() == [] and control.read().breaker.state == "closed"


def test_a_campaign_the_pace_cannot_finish_before_aws_acts_is_said_at_once_not_at_the_last_sweep() -> None:
    """Three retirements in 2 h, 2 h 30 and 2 h 50 on four nodes: planned work may take one node
    every 2 hours (the breaker's 60 min window, then the next hourly sweep). The first is acted on
    now, the second at the next sweep with room; the third cannot start before AWS acts. The
    on-call was told only at the last sweep before its deadline (maybe minutes before); now as the
    notices come (each delivery judged with the queue waiting before it), hours ahead, naming it
    and the pace, and only it, once however often a sweep finds it again."""
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01) as local:
        retiring = {n: local.cluster.instance_of(n) for n in ("gpu-1", "gpu-2", "gpu-3")}
        local.escalations()
        for node, starts_in in {"gpu-1": timedelta(hours=2), "gpu-2": timedelta(hours=2, minutes=30),
                                "gpu-3": timedelta(hours=2, minutes=50)}.items():
            event = _retirement([retiring[node]], starts_in)
            event["detail"]["eventArn"] += f"-{node}"
            local.emit_as_aws(event)
        [execution] = local.wait_for_executions(1)
        assert execution["status"] == "SUCCEEDED", execution.get("cause")
        assert [i.slurm_node for i in local.incidents()] == ["gpu-1"]
        [page] = wait_for(lambda: local.escalations(), "the on-call told")
        assert page["Subject"] == "NodeMedic: planned work runs late"
        assert f"cannot act on 1 planned event(s) of cluster {local.cluster.name}" in page["Message"]
        assert f"gpu-3 ({retiring['gpu-3']}, PLANNED_RETIREMENT" in page["Message"] and "gpu-2" not in page["Message"]
        assert "1 node(s) every 120 min" in page["Message"] and "breaker.planned_percent" in page["Message"]
        for _ in range(2):  # the whole queue, at each sweep: not said again
            local.fire_schedule("PlannedEventsFunction")
        assert len(local.wait_for_executions(1)) == 1 and local.escalations() == []


def test_a_waiting_notice_whose_node_left_the_cluster_makes_no_other_look_late() -> None:
    """gpu-1 retires in 2 h (acted on now), gpu-2 in 2 h 30 (waits for the room the next sweep
    has). Then gpu-2's instance is terminated (an operator, its Auto Scaling group): its notice is
    moot, though still in the queue until a sweep forgets it. gpu-3's retirement in 2 h 50 comes:
    the next room is its own, before its deadline. Counted, the moot notice took that room and the
    on-call was paged that gpu-3 runs late, for work that fits."""
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01) as local:
        waiting = DeferredPlans(local.aws.client("dynamodb"), local.stack.table_name, local.cluster.name)
        retiring = {n: local.cluster.instance_of(n) for n in ("gpu-1", "gpu-2", "gpu-3")}
        local.escalations()
        for node, starts_in in {"gpu-1": timedelta(hours=2), "gpu-2": timedelta(hours=2, minutes=30)}.items():
            event = _retirement([retiring[node]], starts_in)
            event["detail"]["eventArn"] += f"-{node}"
            local.emit_as_aws(event)
            wait_for(local.executions, "gpu-1's notice acted on")
        wait_for(waiting.waiting, "gpu-2's notice to wait for room")
        assert [d.event.node.slurm_node for d in waiting.waiting()] == ["gpu-2"]
        local.aws.client("ec2").terminate_instances(InstanceIds=[retiring["gpu-2"]])
        function = local.stack.resources["PlannedEventsFunction"]
        before = sum(i.function == function for i in local.aws.invocations)
        third = _retirement([retiring["gpu-3"]], timedelta(hours=2, minutes=50))
        third["detail"]["eventArn"] += "-gpu-3"
        local.emit_as_aws(third)
        wait_for(lambda: sum(i.function == function for i in local.aws.invocations) > before, "gpu-3's notice handled")
        wait_for(lambda: len(waiting.waiting()) == 2, "gpu-3's notice to wait for room")
        assert local.escalations() == []  # gpu-3 fits: nobody paged
        [execution] = local.wait_for_executions(1)
        assert execution["status"] == "SUCCEEDED", execution.get("cause")


def test_planned_work_whose_room_a_fault_took_meanwhile_yields_instead_of_tripping_the_breaker() -> None:
    """Four nodes: the breaker's limit is one node. The sweep releases gpu-1's retirement into the
    room it read; before its incident reaches the gate, an Xid 79 on gpu-3 is admitted and takes
    it. The planned incident tripped the breaker then: every repair stopped, faults' too, until an
    operator reset it. Now it is held, the breaker stays closed and the fault is remediated; the
    first sweep with room (EC2 still lists the retirement) offers it again, and gpu-1 is replaced."""
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01) as local:
        control = ControlStore(local.aws.client("dynamodb"), local.stack.table_name, local.cluster.name)
        retiring, sick = local.cluster.instance_of("gpu-1"), local.cluster.instance_of("gpu-3")

        def a_fault_first(_: dict) -> None:
            local.put_event(local.health_event("gpu-3", "XID 79"))
            wait_for(lambda: any(a.slurm_node == "gpu-3" for a in control.read().admissions.values()),
                     "the fault admitted before the planned work")

        raced = local.aws.before_invoke("GateFunction", a_fault_first,
                                        when=lambda event: event["incident"]["slurm_node"] == "gpu-1")
        local.aws.schedule_instance_event(retiring, "instance-retirement", datetime.now(UTC) + timedelta(days=5))
        local.fire_schedule("PlannedEventsFunction")
        executions = local.wait_for_executions(2)
        assert raced and all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
        by_node = {i.slurm_node: i for i in local.incidents()}
        assert by_node["gpu-3"].status == "closed" and local.cluster.instance_of("gpu-3") != sick
        held = by_node["gpu-1"]
        assert held.status == "held" and held.outcome.startswith("planned_room: 2 nodes would be under remediation")
        assert control.read().breaker.state == "closed" and local.escalations() == []
        assert local.cluster.instance_of("gpu-1") == retiring and "DRAIN" not in local.scheduler.node("gpu-1")["State"]

        _an_hour_passes(local)
        local.fire_schedule("PlannedEventsFunction")
        executions = local.wait_for_executions(3)
        assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
        [again] = [i for i in local.incidents() if i.slurm_node == "gpu-1" and i.incident_id != held.incident_id]
        assert again.status == "closed" and local.cluster.instance_of("gpu-1") != retiring
        assert again.stages["detect"].result["evidence"]["offered_again_after"] == held.incident_id


def test_a_campaign_waiting_for_its_lead_time_starts_early_enough_to_be_done_by_then() -> None:
    """PlannedLeadTimeHours=48, two retirements whose time to act comes in 30 min, on nodes whose
    jobs report no checkpoint (no slack). The breaker's room is one node per two hours (its 60
    min window, then the next sweep), so both cannot start at their time: the sweep now starts one,
    saying why, and the other waits for its time. Kept waiting past its window, it is forgotten."""
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01,
                   extra_parameters={"PlannedLeadTimeHours": "48"}) as local:
        waiting = DeferredPlans(local.aws.client("dynamodb"), local.stack.table_name, local.cluster.name)
        job_running(local, local.scheduler.submit(2, on="gpu-[1-2]"))
        local.emit_as_aws(_retirement([local.cluster.instance_of(n) for n in ("gpu-1", "gpu-2")],
                                      timedelta(hours=49, minutes=30)))
        wait_for(lambda: len(waiting.waiting()) == 2, "both notices to wait for their lead time")
        local.fire_schedule("PlannedEventsFunction")
        [execution] = local.wait_for_executions(1)
        assert execution["status"] == "SUCCEEDED", execution.get("cause")
        [incident] = local.incidents()
        early = incident.stages["detect"].result["evidence"]["early"]
        assert early.startswith("paced: 2 waiting notice(s)") and "1 node(s) at a time, 120 min apart" in early
        [other] = waiting.waiting()
        assert other.event.node.slurm_node != incident.slurm_node and other.act_at > datetime.now(UTC)

        # it waits on past its window (here: its time come and its window moved into the past, as
        # after days of paused automation): AWS has done what it announced, so it is forgotten, and
        # its node, still a member running its job, is not touched
        ended = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
        waiting.defer(other.event.model_copy(update={"evidence": {**other.event.evidence, "window_end": ended}}),
                      datetime.now(UTC) - timedelta(minutes=1))
        local.fire_schedule("PlannedEventsFunction")
        wait_for(lambda: waiting.waiting() == [], "the notice whose window ended forgotten")
        assert len(local.wait_for_executions(1)) == 1


def test_a_notice_the_sweep_finds_again_after_its_incident_takes_no_room_from_the_others() -> None:
    """gpu-1 is excluded from automation; EC2 lists retirements for gpu-1 (the nearer) and gpu-2.
    The sweep acts on gpu-1 first (the breaker's room here is one node): the gate holds it, and EC2
    goes on listing it. Every later sweep finds it again; Detect took it already, so it takes no
    room, and gpu-2 is replaced at the next sweep with room. Before, gpu-1 took the room at every
    sweep, and gpu-2 waited until AWS retired it under its job."""
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01,
                   extra_parameters={"ExcludedNodes": '["gpu-1"]'}) as local:
        now = datetime.now(UTC)
        local.aws.schedule_instance_event(local.cluster.instance_of("gpu-1"), "instance-retirement", now + timedelta(days=3))
        retiring = local.cluster.instance_of("gpu-2")
        local.aws.schedule_instance_event(retiring, "instance-retirement", now + timedelta(days=6))
        local.fire_schedule("PlannedEventsFunction")
        [held] = local.wait_for_executions(1)
        [incident] = local.incidents()
        assert (incident.slurm_node, incident.status) == ("gpu-1", "held")
        _an_hour_passes(local)
        local.fire_schedule("PlannedEventsFunction")
        executions = local.wait_for_executions(3)  # gpu-1's again (deduplicated), gpu-2's
        assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
        replaced = [i for i in local.incidents() if i.slurm_node == "gpu-2"]
        assert [i.status for i in replaced] == ["closed"] and local.cluster.instance_of("gpu-2") != retiring


def test_a_notice_held_for_a_reason_that_passes_is_offered_again_once_it_has() -> None:
    """gpu-1 is rebooted for EC2's reboot maintenance; moments later EC2 schedules its retirement.
    The gate holds the retirement (the node slot's 30 min cooldown). Detect remembers the
    notice's event for 15 days, so offered again under its id it would only be deduplicated, and
    AWS would retire the node under its job. The first sweep after the cooldown offers it under a
    new id, saying after which held incident: the node is replaced."""
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01) as local:
        retiring = local.cluster.instance_of("gpu-1")
        local.aws.schedule_instance_event(retiring, "instance-reboot", datetime.now(UTC) + timedelta(days=2))
        local.fire_schedule("PlannedEventsFunction")
        [rebooted] = local.wait_for_executions(1)
        local.aws.schedule_instance_event(retiring, "instance-retirement", datetime.now(UTC) + timedelta(days=9))
        local.fire_schedule("PlannedEventsFunction")
        local.wait_for_executions(3)  # the reboot notice again (EC2 still lists it: deduplicated), the retirement
        [reboot] = [i for i in local.incidents() if i.fault_code == "PLANNED_REBOOT"]
        [held] = [i for i in local.incidents() if i.fault_code == "PLANNED_RETIREMENT"]
        assert (reboot.status, held.status) == ("closed", "held") and held.outcome.startswith("cooldown:")
        # half an hour later (the slot's remediation moved back, as the clock would)
        control = ControlStore(local.aws.client("dynamodb"), local.stack.table_name, local.cluster.name)
        remediated = control.lineage("node:gpu-1")
        local.aws.client("dynamodb").put_item(TableName=local.stack.table_name, Item={
            "pk": {"S": f"LINEAGE#{local.cluster.name}#node:gpu-1"}, "incidents": {"L": [
                {"S": json.dumps({"incident": i, "at": (at - timedelta(minutes=31)).isoformat()})}
                for i, at in remediated]}})

        local.fire_schedule("PlannedEventsFunction")
        executions = local.wait_for_executions(5)  # the reboot notice again, the retirement offered again
        assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
        [again] = [i for i in local.incidents() if i.fault_code == "PLANNED_RETIREMENT" and i.incident_id != held.incident_id]
        assert again.status == "closed" and local.cluster.instance_of("gpu-1") != retiring
        assert again.stages["detect"].result["evidence"]["offered_again_after"] == held.incident_id


def _node_notice(local: LocalMode, node: str, *, named: str | None = None) -> dict:
    """What a node's agent sends after reading a retirement from its instance metadata."""
    notice = json.loads((EVENTS / "scheduled-events" / "ec2-scheduled-events.json").read_text())["detail"]
    notice["cluster"] = local.cluster.name
    notice["node"] = {"instance_id": local.cluster.instance_of(node), "hostname": node, "slurm_node": named or node}
    notice["events"][0]["not_before"] = (datetime.now(UTC) + timedelta(days=10)).isoformat()
    return notice


def test_a_nodes_own_reading_of_a_scheduled_retirement_replaces_it_and_a_forged_one_touches_nothing(
        local: LocalMode) -> None:
    """The agent's notice (source nodemedic.agent, detail-type EC2 Scheduled Events: what a HyperPod
    node alone can read) reaches the planned-events function through the template's rule on
    NodeMedic's bus; sent twice (an agent restarted), it opens one incident. A notice naming the
    instance of another node than the one it backs drains nothing."""
    def ignored() -> float:
        return sum(local.metric_values("PlannedIgnored", "Sum", Cluster=local.cluster.name))

    local.put_event(_node_notice(local, "gpu-1", named="gpu-2"), detail_type="EC2 Scheduled Events")
    wait_for(lambda: ignored() >= 1, "the forged notice ignored")
    assert local.executions() == []

    retiring = local.cluster.instance_of("gpu-3")
    notice = _node_notice(local, "gpu-3")
    local.put_event(notice, detail_type="EC2 Scheduled Events")
    local.put_event(notice, detail_type="EC2 Scheduled Events")
    executions = local.wait_for_executions(2)
    assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
    [incident] = local.incidents()
    assert (incident.slurm_node, incident.fault_code, incident.status) == ("gpu-3", "PLANNED_RETIREMENT", "closed")
    evidence = incident.stages["detect"].result["evidence"]
    assert evidence["ec2_event_id"] == notice["events"][0]["event_id"]
    assert local.cluster.instance_of("gpu-3") != retiring  # replaced before EC2 retires it


def test_a_retirement_a_real_agent_reads_from_its_instance_metadata_replaces_its_node(local: LocalMode) -> None:
    """The whole path a HyperPod node relies on: EC2 schedules a retirement; the node's agent (signed
    as the nodes' role, held to AgentPublishPolicy) reads it from its instance metadata (the local
    mode's shows what its EC2 holds) and sends it; no sweep runs; the node is replaced before EC2
    acts, and the agents go on without sending it again."""
    retiring = local.cluster.instance_of("gpu-2")
    event_id = local.aws.schedule_instance_event(retiring, "instance-retirement", datetime.now(UTC) + timedelta(days=10))
    local.start_agents(heartbeat_s=5.0, scheduled_s=0.5)
    [execution] = local.wait_for_executions(1, timeout=60)
    assert execution["status"] == "SUCCEEDED", execution.get("cause")
    [incident] = local.incidents()
    assert (incident.slurm_node, incident.fault_code, incident.status) == ("gpu-2", "PLANNED_RETIREMENT", "closed")
    evidence = incident.stages["detect"].result["evidence"]
    assert (evidence["ec2_event_id"], evidence["read_from"]) == (event_id, "instance metadata")
    assert local.cluster.instance_of("gpu-2") != retiring
    assert len(local.wait_for_executions(1)) == 1


def test_a_retirement_folded_into_a_repair_under_way_is_acted_on_once_that_repair_returned_the_node() -> None:
    """gpu-1's GPU reset for an ECC error is under way when EC2 schedules its retirement: the
    notice is folded into that incident, which then returns the same instance to service. The
    notice counted as taken for good, and AWS retired the instance under its next job. Now the
    next sweep (EC2 still lists the retirement) offers it again, and gpu-1 is replaced."""
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01, extra_parameters=OPEN) as local:
        retiring = local.cluster.instance_of("gpu-1")

        def aws_schedules_the_retirement(_: dict) -> None:
            local.aws.schedule_instance_event(retiring, "instance-retirement", datetime.now(UTC) + timedelta(days=5))
            local.fire_schedule("PlannedEventsFunction")
            wait_for(lambda: local.incidents()[0].duplicate_events == 1, "the notice folded into the repair under way")

        folded = local.aws.before_invoke("RepairFunction", aws_schedules_the_retirement,
                                         when=lambda event: event["incident"]["slurm_node"] == "gpu-1")
        local.put_event(local.health_event("gpu-1", "ECC_DBE"))
        executions = local.wait_for_executions(2)
        assert folded and all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
        [repaired] = local.incidents()
        assert repaired.status == "closed" and repaired.duplicate_events == 1
        assert local.cluster.instance_of("gpu-1") == retiring  # reset, not replaced: AWS still retires it

        _an_hour_passes(local)
        local.fire_schedule("PlannedEventsFunction")
        executions = local.wait_for_executions(3)
        assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
        [planned] = [i for i in local.incidents() if i.incident_id != repaired.incident_id]
        assert (planned.fault_code, planned.status) == ("PLANNED_RETIREMENT", "closed")
        assert planned.stages["detect"].result["evidence"]["offered_again_after"] == repaired.incident_id
        assert local.cluster.instance_of("gpu-1") != retiring
