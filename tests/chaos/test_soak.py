"""Soak: many faults at once, in a random order a seed fixes, on the local stack with real Slurm
and with a real kube-apiserver.

Where test_chaos.py injects one fault before one stage, a soak run lets several incidents run
together while the world misbehaves around them: faults on nodes already in an incident, on spares
and on replacements; events delivered again; clocks fast and slow; events sent late; an operator
draining, returning and pausing; the Slurm controller restarting or crashing (and, one soak in
three, the relay that reaches it); instances terminated by someone else; AWS throttling; AWS
announcing a scheduled retirement or a Spot interruption (EC2 ending the instance 20 s later),
and delivering the notice again; an operator running a runbook step (nodemedic remediate) on a
node automation may be working on. On
Kubernetes the operator cordons and uncordons (kubectl), the control plane is the API server
(restarted or killed; etcd keeps what it stored), a PodDisruptionBudget blocks a job's evictions
for a while, and EKS's DescribeCluster is throttled too. When it is all over and the reconciler
has run, the same invariants must hold as after one fault.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
import urllib3
from botocore.exceptions import BotoCoreError, ClientError
from kubernetes.client.rest import ApiException
from nodemedic import operations
from nodemedic.errors import NodeMedicError
from nodemedic.orchestrators.kubernetes import DRAIN_TAINT, REASON
from nodemedic.providers.base import SLURM_NODE_TAG
from nodemedic.reconciler import KEEPS_LOCK
from nodemedic_cli.operator import ACTIONS as RUNBOOK_ACTIONS
from nodemedic_cli.operator import OPERATOR_DRAIN_PREFIX, remediate
from nodemedic_cli.target import Target
from nodemedic_sandbox import kube_apiserver
from nodemedic_sandbox.kube_cluster import KubeScheduler
from nodemedic_sandbox.local import TERMINAL, LocalMode

from tests.chaos.test_chaos import _scontrol
from tests.conftest import require
from tests.e2e.support import OPEN, control, stack
from tests.e2e.test_planned_events import _retirement
from tests.e2e.test_spot_interruption import _warning
from tests.kube.test_cli import operator

# NODEMEDIC_SOAK_SEEDS=100:140 NODEMEDIC_SOAK_ACTIONS=30 make chaos: other seeds, longer soaks
FIRST, _, LAST = os.environ.get("NODEMEDIC_SOAK_SEEDS", "0:12").partition(":")
SEEDS = range(int(FIRST), int(LAST))
SMOKE = {7}  # make test runs this one (a slurmctld crash, a runbook reboot racing faults on its node); make chaos runs all
KUBE_SMOKE = {1}  # and this one on Kubernetes
ACTIONS_PER_SOAK = int(os.environ.get("NODEMEDIC_SOAK_ACTIONS", "14"))
CODES = ("XID 79", "XID 48", "ECC_DBE", "XID 79", "NVSWITCH_FATAL", "THERMAL_VIOLATION")
ACTIONS = ("fault", "fault", "fault", "replay", "skewed", "late", "operator-drain", "operator-resume", "pause",
           "controller-restart", "controller-crash", "terminate", "throttle", "submit", "retirement", "spot", "aws-replay",
           "scale-in", "runbook")
KUBE_ACTIONS = (*ACTIONS, "budget")


@dataclass
class World:
    """What the soak did, to judge the end by."""
    sent: list[dict[str, Any]] = field(default_factory=list)
    aws_sent: list[dict[str, Any]] = field(default_factory=list)  # AWS Health and EC2 notices
    operator_drained: set[str] = field(default_factory=set)  # drained by the operator, not returned since
    jobs: list[str] = field(default_factory=list)
    terminated: set[str] = field(default_factory=set)  # nodes whose instance someone else ended
    spot: list[tuple[float, str, str]] = field(default_factory=list)  # (warned at, node, instance) EC2 ends next
    crashed: bool = False  # slurmctld crashed: a job submitted in its last seconds may be lost
    relaunched: bool = True  # an Auto Scaling group launches an instance in an ended one's place; plain EC2 none
    log: list[str] = field(default_factory=list)
    runbook_crashes: list[str] = field(default_factory=list)  # a runbook step that failed without saying why
    runbook_target: Target | None = None  # the operator's CLI target, made at their first runbook step


def _scontrol_ok(local: LocalMode, *args: str) -> None:
    """An operator's scontrol command, tried again while the controller restarts."""
    for _ in range(60):
        done = subprocess.run(["scontrol", *args], env={**os.environ, **local.scheduler.env}, check=False,
                              timeout=30, capture_output=True, text=True)
        if done.returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"scontrol {' '.join(args)}: {done.stderr}")


def _kube(local: LocalMode) -> KubeScheduler | None:
    return local.scheduler if isinstance(local.scheduler, KubeScheduler) else None


def _kube_ok(call: Callable[[], Any]) -> Any:
    """An operator's kubectl command, tried again while the API server restarts (and, where the
    node changed since the command read it, 409) until it answers: what it returns, or None where
    the node is gone (its instance ended)."""
    for _ in range(60):
        try:
            return call()
        except ApiException as exc:
            if exc.status == 404:
                return None
        except urllib3.exceptions.HTTPError:  # the API server is down
            pass
        time.sleep(0.5)
    raise AssertionError("the API server did not take an operator's command in 30 s")


def _cordon(kube: KubeScheduler, node: str) -> bool:
    """kubectl cordon, on the node as read (its resourceVersion). False where it was cordoned
    already: cordoning it again changes nothing the API server records, so nobody, NodeMedic
    included, can tell that the operator wants it out (nodemedic remediate --action drain says so)."""
    def cordon() -> bool:
        raw = kube.core.read_node(node)
        if raw.spec.unschedulable:
            return False
        kube.core.patch_node(node, {"metadata": {"resourceVersion": raw.metadata.resource_version},
                                    "spec": {"unschedulable": True}})
        return True

    return _kube_ok(cordon) is True


def _end_instance(local: LocalMode, world: World, node: str, instance: str, scale_in: bool = False) -> bool:
    """Someone else (EC2, the group's health check, an operator) ends ``instance``, and the group
    launches another in its place (``scale_in``: it does not, its desired capacity one less; with
    plain EC2 nothing does). False where it was ended already (replaced by NodeMedic, or terminated
    by someone)."""
    try:
        if not world.relaunched:
            ec2 = local.aws.client("ec2")
            [state] = [i["State"]["Name"] for r in ec2.describe_instances(InstanceIds=[instance])["Reservations"]
                       for i in r["Instances"]]
            if state in ("shutting-down", "terminated"):
                return False
            ec2.terminate_instances(InstanceIds=[instance])
        else:
            local.aws.client("autoscaling").terminate_instance_in_auto_scaling_group(
                InstanceId=instance, ShouldDecrementDesiredCapacity=scale_in)
    except ClientError:
        return False
    world.terminated.add(node)
    return True


def _ec2_interrupts(local: LocalMode, world: World, after: float) -> None:
    """EC2 acts on its Spot warnings (two minutes on AWS; ``after`` seconds here)."""
    due = [w for w in world.spot if time.monotonic() - w[0] >= after]
    for warning in due:
        _, node, instance = warning
        world.spot.remove(warning)
        if _end_instance(local, world, node, instance):
            world.log.append(f"EC2 interrupts {node} ({instance})")


def _act(local: LocalMode, rng: random.Random, world: World, action: str) -> None:
    kube = _kube(local)
    _ec2_interrupts(local, world, after=20)
    # on Kubernetes a replacement joins under a name of its own: any node there now (none, once
    # scale-ins and interruptions have ended every instance: nothing launches one in their place)
    names = local.node_names if kube is None else sorted(kube.node_names())
    if not names:
        world.log.append(f"{action}: no node left")
        return
    node = rng.choice(names)
    if action in ("fault", "skewed", "late"):
        code, shift = rng.choice(CODES), timedelta(minutes=rng.choice([-10, -1, 2]))  # drawn first: a seed is one order
        try:
            local.cluster.instance_of(node)
        except LookupError:  # being replaced: no instance to report from
            return
        now = datetime.now(UTC)
        if action == "fault":
            detail = local.health_event(node, code)
            note = ""
        elif action == "skewed":  # the node's clock is off: both its times are
            detail = local.health_event(node, code, observed_at=now + shift, sent_at=(now + shift).isoformat())
            note = f" (its clock {int(shift.total_seconds() // 60):+d} min)"
        else:  # seen minutes ago, sent now (the agent's spool after an outage)
            shift = -abs(shift)
            detail = local.health_event(node, code, observed_at=now + shift)
            note = f" (seen {-int(shift.total_seconds() // 60)} min ago)"
        world.sent.append(detail)
        local.put_event(detail)
        world.log.append(f"{action} {detail['fault_code']} on {node}{note}")
    elif action == "replay" and world.sent:
        detail = rng.choice(world.sent)
        local.put_event(detail)
        world.log.append(f"replay {detail['fault_code']} on {detail['node'].get('slurm_node') or detail['node']['k8s_node']}")
    elif action == "operator-drain":
        if kube is None:
            _scontrol_ok(local, "update", f"nodename={node}", "state=drain", "reason=operator:soak RMA")
        elif not _cordon(kube, node):
            world.log.append(f"operator cordons {node}, cordoned already: nothing changes")
            return
        world.operator_drained.add(node)
        world.log.append(f"operator drains {node}")
    elif action == "operator-resume":
        if kube is None:
            _scontrol(local, "update", f"nodename={node}", "state=resume")  # refused where not drained: nothing
        else:  # kubectl uncordon: NodeMedic's taint, if any, stays
            _kube_ok(lambda: kube.core.patch_node(node, {"spec": {"unschedulable": False}}))
        world.operator_drained.discard(node)
        world.log.append(f"operator resumes {node}")
    elif action == "pause":
        operations.pause(control(local), by="soak@example.com", reason="soak")
        time.sleep(rng.uniform(0.5, 3))
        operations.resume_automation(control(local), local.ledger, by="soak@example.com", reason="soak over")
        world.log.append("pause, then resume automation")
    elif action in ("controller-restart", "controller-crash"):
        # a crash loses what slurmctld had not saved yet: an operator's drain of the last seconds too
        local.scheduler.stop_controller(graceful=action == "controller-restart")
        if action == "controller-crash" and kube is None:  # an API server's etcd has stored it all
            world.operator_drained.clear()
            world.crashed = True
        time.sleep(rng.uniform(0.5, 3))
        if kube is not None and action == "controller-crash":  # its RBAC unsynced for a while (kubernetes#121635)
            kube.start_controller(unsynced_s=0.5)
        else:
            local.scheduler.start_controller()
        world.log.append(action)
    elif action in ("terminate", "scale-in"):
        try:
            instance = local.cluster.instance_of(node)
        except LookupError:
            return
        if _end_instance(local, world, node, instance, scale_in=action == "scale-in"):
            world.log.append(f"{action} {node} ({instance})")
    elif action == "throttle":  # the next attempts of every stage's calls to one service
        service = rng.choice(("dynamodb", "ssm", "ec2", "autoscaling", *(("eks",) if kube else ())))
        times = rng.randint(5, 60)
        local.aws.throttle(service, times=times)
        world.log.append(f"throttle {service} x{times}")
    elif action in ("retirement", "spot"):  # AWS announces it: a scheduled retirement, a Spot interruption
        try:
            instance = local.cluster.instance_of(node)
        except LookupError:
            return
        if action == "retirement":
            event = _retirement([instance], starts_in=timedelta(hours=rng.choice([1, 48])))
        else:
            event = _warning(instance, "terminate")
            world.spot.append((time.monotonic(), node, instance))
        world.aws_sent.append(event)
        local.emit_as_aws(event)
        world.log.append(f"{action} notice for {node} ({instance})")
    elif action == "aws-replay" and world.aws_sent:  # AWS delivers at least once
        local.emit_as_aws(rng.choice(world.aws_sent))
        world.log.append("an AWS notice again")
    elif action == "relay-restart" and local.relay is not None:  # the controller's relay restarts
        local.stop_relay(local.relay)
        time.sleep(rng.uniform(0.5, 3))
        local.relay = local.start_relay(local.cluster.controller_id)
        world.log.append("relay restart")
    elif action == "runbook":
        _runbook(local, world, node, rng.choice(RUNBOOK_ACTIONS))
    elif action == "submit":
        world.jobs.append(local.scheduler.submit(rng.choice([1, 2])))
        world.log.append(f"submit job {world.jobs[-1]}")
    elif action == "budget" and kube is not None:  # a job's PodDisruptionBudget allows no eviction for a while
        job, seconds = rng.choice(world.jobs), rng.uniform(1, 8)
        _kube_ok(lambda: kube.budget(job, allowed=0))
        time.sleep(seconds)
        _kube_ok(lambda: kube.budget(job, allowed=1))
        world.log.append(f"{job} allows no disruption for {seconds:.0f} s")


def _runbook(local: LocalMode, world: World, node: str, action: str) -> None:
    """An operator's runbook step (nodemedic remediate), racing automation: it acts, or it is
    refused with a clear error (the CLI prints it and exits 2); it never fails without saying why."""
    if world.runbook_target is None:  # on Kubernetes a person's IAM user in NodeMedic's remediator group
        session = boto3.Session() if _kube(local) is None else operator(local, "soak", ["nodemedic:remediator"])[0]
        world.runbook_target = Target(local.stack.name, session=session)
    target = world.runbook_target
    try:
        done = remediate(target, node, action, reason="soak runbook", by="soak@example.com")
    except (NodeMedicError, ClientError, BotoCoreError) as exc:
        world.log.append(f"runbook {action} {node}: refused ({str(exc)[:80]})")
        return
    except Exception as exc:  # what the CLI would print as a traceback
        world.runbook_crashes.append(f"runbook {action} {node}: {exc!r}")
        world.log.append(f"runbook {action} {node}: crashed ({exc!r:.80})")
        return
    if action == "drain":
        world.operator_drained.add(node)
    elif action == "resume":
        world.operator_drained.discard(node)
    opened = "" if done.get("opened", True) else ", Detect not seen opening it"
    world.log.append(f"runbook {action} {node}" + (f" (incident {done['incident']}{opened})" if "incident" in done else ""))


def _owner_kept(reason: str, incidents: dict[str, Any]) -> tuple[bool, str]:
    """A drain NodeMedic owns (its reason ``nodemedic:<incident> …``) belongs to an incident that
    kept the node out: failed, escalated, or closed without returning it (on Kubernetes, a
    replacement of a node an operator had cordoned stays cordoned); never to one that closed
    having returned it, or to none."""
    owner = incidents.get(reason.removeprefix("nodemedic:").split()[0]) if reason else None
    if owner is None:
        return False, "none"
    resume = owner.stages.get("resume")
    left_out = resume is not None and resume.result.get("resumed") is False
    return owner.status != "closed" or left_out, owner.status + (" (left it out)" if left_out else "")


def _unnamed(local: LocalMode) -> list[str]:
    """The group's instances that back no node (launched in place of one someone ended)."""
    ids = [i["InstanceId"] for i in local.cluster.group_instances()]
    found = local.aws.client("ec2").describe_instances(InstanceIds=ids)["Reservations"] if ids else []
    return [i["InstanceId"] for r in found for i in r["Instances"] if i["State"]["Name"] in ("pending", "running")
            and not any(t["Key"] == SLURM_NODE_TAG for t in i.get("Tags", []))]


def _slurm_nodes_hold(local: LocalMode, world: World, incidents: dict[str, Any], held: set[str], check: Any) -> None:
    unnamed = _unnamed(local)
    pages = [m["Message"] for m in local.escalations()]
    for node in local.node_names:
        try:
            local.cluster.instance_of(node)
            backed = True
        except LookupError as exc:  # none: a replacement still booting is waited for by its incident
            check("0 running" in str(exc), f"one instance backs {node} ({exc}): none orphaned")
            backed = False
        state = local.scheduler.node(node)
        reason = state.get("Reason", "")
        # a node whose instance someone ended is given the one its group launched in its place,
        # unless an incident holds it (failed, escalated: the on-call was told) or an operator's
        # drain does (one a controller crash may have lost is not in world.operator_drained)
        operators = "DRAIN" in state["State"] and not reason.startswith("nodemedic:")
        check(backed or node in held or operators or not unnamed or not world.relaunched,  # plain EC2: no group
              f"{node} has no instance and nothing holds it, while the group's {unnamed} back no node")
        # with plain EC2 nothing launches one in its place: the on-call is told
        check(backed or world.relaunched or node in held or operators
              or any("have no instance" in p and f" {node} (" in p for p in pages), f"{node} has no instance and nobody was told")
        if node in world.operator_drained:
            check("DRAIN" in state["State"] and reason.startswith("operator:soak"),
                  f"the operator's drain of {node} was never lifted ({state['State']} {reason})")
        if reason.startswith("nodemedic:burn-in ") and "DRAIN" in state["State"]:
            # a burn-in still held after the last reconciler run: only of a node someone ended the
            # instance of, with none behind it now (nothing to check; the reconciler pages it), or
            # one a storm holds (the breaker open at the end: the operator resets it)
            check((not backed and node in world.terminated) or node in held,
                  f"{node} is held for a burn-in nobody ran ({reason[:60]})")
        elif reason.startswith("nodemedic:") and "DRAIN" in state["State"]:
            kept, status = _owner_kept(reason, incidents)
            check(kept, f"{node} is drained by an incident that did not keep it ({reason[:60]}: {status})")


def _kube_nodes_hold(kube: KubeScheduler, world: World, incidents: dict[str, Any], check: Any) -> None:
    """Each node there now (a replaced one is gone, its replacement has a name of its own)."""
    for raw in kube.core.list_node().items:
        node, cordoned = raw.metadata.name, bool(raw.spec.unschedulable)
        reason = (raw.metadata.annotations or {}).get(REASON, "")
        tainted = any(t.key == DRAIN_TAINT for t in raw.spec.taints or [])
        if node in world.operator_drained:
            check(cordoned, f"the operator's cordon of {node} was never lifted")
        if cordoned or tainted:
            if reason.startswith("nodemedic:"):
                kept, status = _owner_kept(reason, incidents)
                check(kept, f"{node} is held by an incident that did not keep it ({reason[:60]}: {status})")
            else:  # or an operator's drain through nodemedic remediate, which taints as NodeMedic's does
                check(not tainted or reason.startswith(f"{OPERATOR_DRAIN_PREFIX}:"),
                      f"{node} carries NodeMedic's taint without naming its incident ({reason!r})")


# what a reconciler run may start (a burn-in for a node held for one, a fault offered again after
# its cooldown): an incident of its own, run to its end before the next run
STARTS = ("burn_ins_started", "rechecks_offered", "replacements_started")


def _quiet(local: LocalMode, timeout: float) -> list[dict[str, Any]]:
    """Wait until every execution has ended (none started in the last seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        executions = local.executions()
        if all(e["status"] in TERMINAL for e in executions):
            time.sleep(5)
            again = local.executions()
            if len(again) == len(executions) and all(e["status"] in TERMINAL for e in again):
                return again
        time.sleep(1)
    raise AssertionError("executions still running: " + ", ".join(
        e["name"] for e in local.executions() if e["status"] not in TERMINAL))


def _soaks() -> list[Any]:
    """Every seed on Slurm; every other seed on Kubernetes too."""
    return [pytest.param(scheduler, seed, id=f"{scheduler}-{seed}",
                         marks=() if seed in smoke else (pytest.mark.chaos_full,))
            for scheduler, seeds, smoke in (("slurm", SEEDS, SMOKE), ("kubernetes", SEEDS[1::2], KUBE_SMOKE))
            for seed in seeds]


def _stack(scheduler: str, seed: int) -> tuple[LocalMode, bool, bool]:
    """Five nodes and a spare; one Slurm soak in three reaches slurmctld through the relay, one in
    five runs on plain EC2 instances (Provider=ec2: replace is a stop and start, and nothing
    launches an instance in place of one someone ends). The last: whether a group relaunches."""
    if scheduler == "kubernetes":
        require("the real kube-apiserver", kube_apiserver.unavailable_reason())
        return LocalMode(nodes=5, spares=1, scheduler="kubernetes", retry_time_scale=0.01, boot_seconds=1,
                         extra_parameters=OPEN), False, True
    relay, ec2 = seed % 3 == 2, seed % 5 == 4
    return stack(nodes=5, spares=1, boot_seconds=1, **OPEN, **({"SlurmChannel": "relay"} if relay else {}),
                 **({"Provider": "ec2"} if ec2 else {})), relay, not ec2


@pytest.mark.parametrize(("scheduler", "seed"), _soaks())
def test_invariants_hold_after_a_soak(scheduler: str, seed: int, record_property: Any) -> None:
    rng = random.Random(seed)
    soak, relay, relaunched = _stack(scheduler, seed)
    world = World(relaunched=relaunched)
    actions = (*ACTIONS, "relay-restart") if relay else KUBE_ACTIONS if scheduler == "kubernetes" else ACTIONS
    with soak as local:
        world.jobs.append(local.scheduler.submit(2))
        world.jobs.append(local.scheduler.submit(1))
        for _ in range(ACTIONS_PER_SOAK):
            world.log.append(datetime.now(UTC).strftime("%H:%M:%S.%f"))
            _act(local, rng, world, rng.choice(actions))
            time.sleep(rng.uniform(0, 2.5))
        _ec2_interrupts(local, world, after=0)
        local.aws.throttles.clear()  # the world calms down: the reconciler's runs are not throttled
        runs: list[dict[str, Any]] = []
        while len(runs) < 2 or any(runs[-1][k] for k in STARTS):  # what a run started runs to its end first
            _quiet(local, timeout=400)
            runs.append(local.reconcile())
            assert len(runs) < 6, runs
        _quiet(local, timeout=400)
        first, again = runs[0], runs[-1]
        first_counts = {k: sum(len(r[k]) for r in runs[:-1]) for k, v in first.items()
                        if isinstance(v, list) and k not in ("pages", "errors")}
        books = local.ledger.bookkeeping(local.cluster.name)
        incidents = {i.incident_id: i for i in local.incidents()}
        executions = {e["name"]: e["status"] for e in local.executions()}
        broken: list[str] = []

        def check(ok: bool, what: str) -> None:
            if not ok:
                broken.append(what)
        check(all(i.status != "open" for i in incidents.values()),
              "every incident ended: " + ", ".join(f"{i.incident_id} {i.status}" for i in incidents.values()))
        check(not books.open_incidents, "no incident left open")
        check(not world.runbook_crashes, f"every runbook step acts or says why not ({world.runbook_crashes})")
        check(all(incidents[x.incident_id].status in KEEPS_LOCK for x in books.locks if x.incident_id in incidents),
              "no lock outlives its incident")
        check(not books.claims, f"no claim outlives its incident ({books.claims})")
        check(not any(again[k] for k in ("incidents_failed", "locks_released", "claims_released", "drains_reasserted",
                                         "returns_reasserted", *STARTS)),
              f"the last reconciler run finds nothing ({again})")
        for job in world.jobs:
            try:
                record = local.scheduler.job(job)
            except RuntimeError as exc:
                if world.crashed and "Invalid job id" in str(exc):
                    continue
                raise
            state = record["JobState"]
            # NODE_FAIL: an instance someone else terminated under it, not NodeMedic's doing
            check(state in ("RUNNING", "PENDING", "REQUEUED", "CONFIGURING", "COMPLETED")
                  or (state == "NODE_FAIL" and bool(world.terminated)),
                  f"job {job} lives ({state}: " + ", ".join(f"{k} {record.get(k)}" for k in (
                      "Reason", "ExitCode", "NodeList", "BatchHost", "Restarts", "StartTime", "EndTime")) + ")")
        kube = _kube(local)
        if kube is None:
            _slurm_nodes_hold(local, world, incidents, {lock.slurm_node for lock in books.locks}, check)
        else:
            _kube_nodes_hold(kube, world, incidents, check)
        by_status = Counter(i.status for i in incidents.values())
        record_property("soak", {  # the run lists it (tests/conftest.py)
            "seed": f"{seed}{' (relay)' if relay else ''}{' (EC2)' if not relaunched else ''}{' (Kubernetes)' if kube else ''}",
            "rank": (bool(kube), seed),
            "actions": "; ".join(line for line in world.log if not line[:1].isdigit()),
            "incidents": ", ".join(f"{n} {status}" for status, n in sorted(by_status.items())) or "none",
            "reconciler": ", ".join(f"{kind} {n}" for kind, n in first_counts.items() if n) or "nothing to repair",
            "invariants": "all hold" if not broken else "BROKEN: " + "; ".join(broken)})
        runs_said = [f"reconciler run {n}: {run}" for n, run in enumerate(runs, 1)]
        incidents_said = [f"{i.incident_id} {i.slurm_node} {i.fault_code} {i.status} (detected {i.detected_at:%H:%M:%S}, "
                          f"execution {executions.get(i.incident_id, 'none')}): {i.outcome}" for i in incidents.values()]
        print(*world.log, *runs_said, *incidents_said, sep="\n")  # pytest -rP shows it for a soak that passed
        assert not broken, "\n".join([*broken, "", "what happened:", *world.log, *runs_said, "", "incidents:",
                                       *incidents_said])
