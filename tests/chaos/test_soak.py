"""Soak: many faults at once, in a random order a seed fixes, on the local stack with real Slurm.

Where test_chaos.py injects one fault before one stage, a soak run lets several incidents run
together while the world misbehaves around them: faults on nodes already in an incident, on spares
and on replacements; events delivered again; clocks fast and slow; events sent late; an operator
draining, returning and pausing; the Slurm controller restarting or crashing (and, one soak in
three, the relay that reaches it); instances terminated by someone else; AWS throttling. When it
is all over and the reconciler has run, the same invariants must hold as after one fault.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nodemedic import operations
from nodemedic.reconciler import KEEPS_LOCK
from nodemedic_sandbox.local import TERMINAL, LocalMode

from tests.chaos.test_chaos import _scontrol
from tests.e2e.support import OPEN, control, stack

# NODEMEDIC_SOAK_SEEDS=100:140 NODEMEDIC_SOAK_ACTIONS=30 make chaos: other seeds, longer soaks
FIRST, _, LAST = os.environ.get("NODEMEDIC_SOAK_SEEDS", "0:12").partition(":")
SEEDS = range(int(FIRST), int(LAST))
SMOKE = {7}  # make test runs this one (two slurmctld crashes, replays, operator drains); make chaos runs all
ACTIONS_PER_SOAK = int(os.environ.get("NODEMEDIC_SOAK_ACTIONS", "14"))
CODES = ("XID 79", "XID 48", "ECC_DBE", "XID 79", "NVSWITCH_FATAL", "THERMAL_VIOLATION")
ACTIONS = ("fault", "fault", "fault", "replay", "skewed", "late", "operator-drain", "operator-resume", "pause",
           "controller-restart", "controller-crash", "terminate", "throttle", "submit")


@dataclass
class World:
    """What the soak did, to judge the end by."""
    sent: list[dict[str, Any]] = field(default_factory=list)
    operator_drained: set[str] = field(default_factory=set)  # drained by the operator, not returned since
    jobs: list[str] = field(default_factory=list)
    terminated: set[str] = field(default_factory=set)  # nodes whose instance someone else ended
    crashed: bool = False  # slurmctld crashed: a job submitted in its last seconds may be lost
    log: list[str] = field(default_factory=list)


def _scontrol_ok(local: LocalMode, *args: str) -> None:
    """An operator's scontrol command, tried again while the controller restarts."""
    for _ in range(60):
        done = subprocess.run(["scontrol", *args], env={**os.environ, **local.scheduler.env}, check=False,
                              timeout=30, capture_output=True, text=True)
        if done.returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"scontrol {' '.join(args)}: {done.stderr}")


def _act(local: LocalMode, rng: random.Random, world: World, action: str) -> None:
    node = rng.choice(local.node_names)
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
        world.log.append(f"replay {detail['fault_code']} on {detail['node']['slurm_node']}")
    elif action == "operator-drain":
        _scontrol_ok(local, "update", f"nodename={node}", "state=drain", "reason=operator:soak RMA")
        world.operator_drained.add(node)
        world.log.append(f"operator drains {node}")
    elif action == "operator-resume":
        _scontrol(local, "update", f"nodename={node}", "state=resume")  # refused where not drained: nothing
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
        if action == "controller-crash":
            world.operator_drained.clear()
            world.crashed = True
        time.sleep(rng.uniform(0.5, 3))
        local.scheduler.start_controller()
        world.log.append(action)
    elif action == "terminate":
        try:
            instance = local.cluster.instance_of(node)
        except LookupError:
            return
        local.aws.client("autoscaling").terminate_instance_in_auto_scaling_group(
            InstanceId=instance, ShouldDecrementDesiredCapacity=False)
        world.terminated.add(node)
        world.log.append(f"terminate {node} ({instance})")
    elif action == "throttle":  # the next attempts of every stage's calls to one service
        service = rng.choice(("dynamodb", "ssm", "ec2", "autoscaling"))
        times = rng.randint(5, 60)
        local.aws.throttle(service, times=times)
        world.log.append(f"throttle {service} x{times}")
    elif action == "relay-restart" and local.relay is not None:  # the controller's relay restarts
        local.stop_relay(local.relay)
        time.sleep(rng.uniform(0.5, 3))
        local.relay = local.start_relay(local.cluster.controller_id)
        world.log.append("relay restart")
    elif action == "submit":
        world.jobs.append(local.scheduler.submit(rng.choice([1, 2])))
        world.log.append(f"submit job {world.jobs[-1]}")


# what a reconciler run may start (a burn-in for a node held for one, a fault offered again after
# its cooldown): an incident of its own, run to its end before the next run
STARTS = ("burn_ins_started", "rechecks_offered")


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


@pytest.mark.parametrize("seed", [pytest.param(seed, marks=() if seed in SMOKE else (pytest.mark.chaos_full,))
                                  for seed in SEEDS])
def test_invariants_hold_after_a_soak(seed: int, record_property: Any) -> None:
    rng = random.Random(seed)
    world = World()
    relay = seed % 3 == 2  # one soak in three reaches slurmctld through the relay (SlurmChannel relay), not SSM
    actions = (*ACTIONS, "relay-restart") if relay else ACTIONS
    with stack(nodes=5, spares=1, boot_seconds=1, **OPEN, **({"SlurmChannel": "relay"} if relay else {})) as local:
        world.jobs.append(local.scheduler.submit(2))
        world.jobs.append(local.scheduler.submit(1))
        for _ in range(ACTIONS_PER_SOAK):
            world.log.append(datetime.now(UTC).strftime("%H:%M:%S.%f"))
            _act(local, rng, world, rng.choice(actions))
            time.sleep(rng.uniform(0, 2.5))
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
        check(all(incidents[x.incident_id].status in KEEPS_LOCK for x in books.locks if x.incident_id in incidents),
              "no lock outlives its incident")
        check(not books.claims, f"no claim outlives its incident ({books.claims})")
        check(not any(again[k] for k in ("incidents_failed", "locks_released", "claims_released", "drains_reasserted",
                                         "returns_reasserted", *STARTS)),
              f"the last reconciler run finds nothing ({again})")
        for job in world.jobs:
            try:
                state = local.scheduler.job(job)["JobState"]
            except RuntimeError as exc:
                if world.crashed and "Invalid job id" in str(exc):
                    continue
                raise
            # NODE_FAIL: an instance someone else terminated under it, not NodeMedic's doing
            check(state in ("RUNNING", "PENDING", "REQUEUED", "CONFIGURING", "COMPLETED")
                  or (state == "NODE_FAIL" and bool(world.terminated)), f"job {job} lives ({state})")
        for node in local.node_names:
            try:
                local.cluster.instance_of(node)
            except LookupError as exc:  # none: a replacement still booting is waited for by its incident
                check("0 running" in str(exc), f"one instance backs {node} ({exc}): none orphaned")
            state = local.scheduler.node(node)
            reason = state.get("Reason", "")
            if node in world.operator_drained:
                check("DRAIN" in state["State"] and reason.startswith("operator:soak"),
                      f"the operator's drain of {node} was never lifted ({state['State']} {reason})")
            if reason.startswith("nodemedic:") and "DRAIN" in state["State"]:
                owner = incidents.get(reason.removeprefix("nodemedic:").split()[0])
                check(owner is not None and owner.status != "closed",
                      f"{node} is drained by an incident that did not keep it "
                      f"({reason[:60]}: {owner.status if owner else 'none'})")
        by_status = Counter(i.status for i in incidents.values())
        record_property("soak", {  # the run lists it (tests/conftest.py)
            "seed": f"{seed}{' (relay)' if relay else ''}", "rank": seed,
            "actions": "; ".join(line for line in world.log if not line[:1].isdigit()),
            "incidents": ", ".join(f"{n} {status}" for status, n in sorted(by_status.items())) or "none",
            "reconciler": ", ".join(f"{kind} {n}" for kind, n in first_counts.items() if n) or "nothing to repair",
            "invariants": "all hold" if not broken else "BROKEN: " + "; ".join(broken)})
        runs_said = [f"reconciler run {n}: {run}" for n, run in enumerate(runs, 1)]
        incidents_said = [f"{i.incident_id} {i.slurm_node} {i.fault_code} {i.status} (detected {i.detected_at:%H:%M:%S}, "
                          f"execution {executions.get(i.incident_id, 'none')}): {i.outcome}" for i in incidents.values()]
        assert not broken, "\n".join([*broken, "", "what happened:", *world.log, *runs_said, "", "incidents:",
                                       *incidents_said])
