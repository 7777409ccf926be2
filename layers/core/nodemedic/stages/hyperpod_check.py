"""The deep health check of a SageMaker HyperPod node, by HyperPod itself.

SSM Run Command does not reach HyperPod nodes (docs/recovery.md), so NodeMedic's own check cannot
run there. HyperPod has its own: ``StartClusterHealthCheck`` runs its instance-level deep health
check (``InstanceStress``: hardware stress, DCGM diagnostics, EFA loopback) on named nodes, and
``DescribeClusterNode`` shows it as the node's status ``DeepHealthCheckInProgress``, then
``Running`` (passed) or ``Failure`` (with a message).
https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_StartClusterHealthCheck.html

The state machine waits on the check's task token as for the SSM check, but no event says when
HyperPod's check ends: each invocation reads the node's status once (:func:`judge`), answers the
token itself when HyperPod has decided, and otherwise raises :class:`HealthCheckPendingError`,
which the state machine retries with growing waits. What it saw is kept on the check's record, so
the retries build one judgement: a deep check is asked for once, and passes only if HyperPod was
seen running it since this check began.

``quick`` (the check that verifies an ambiguous fault, on a node that may still run a job) asks
for nothing: HyperPod's status of the node decides (``Running`` healthy, ``Failure`` not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from nodemedic.contracts.incident import CheckRecord, IncidentRef
from nodemedic.contracts.stages import CheckLevel, HealthCheckOutput, Purpose
from nodemedic.errors import HealthCheckPendingError
from nodemedic.providers.hyperpod import INSTANCE_STRESS, ClusterNodeStatus, HyperPodProvider
from nodemedic.safety.gate import HandsOff, refuse_if_held
from nodemedic.stages.health_check import answer, check_record, record_on_rung, save_check_record, stage_of, verified
from nodemedic.store.control import ControlStore
from nodemedic.store.ledger import Ledger

CHANNEL = "hyperpod"
IN_PROGRESS = "DeepHealthCheckInProgress"
# the node is leaving the cluster, or has left it: it will not pass
LEAVING = frozenset({"ShuttingDown", "NotFound", "DetachInProgress"})
# a deep check asked for and never seen running after this long was not run
START_GRACE = timedelta(minutes=10)
# after a reboot, HyperPod's status may still read Running from before it: the deep check is asked
# for once the node was seen out of Running, or this long after the check began
REBOOT_SETTLE = timedelta(minutes=5)


class HyperPodProgress(BaseModel):
    """What one check has seen of the node so far, across the state machine's retries."""

    started_at: datetime
    requested_at: datetime | None = None  # when NodeMedic asked HyperPod for its deep check
    left_running: bool = False  # seen in another status than Running since the check began
    seen_deep_check: bool = False  # seen DeepHealthCheckInProgress since the check began


@dataclass(frozen=True)
class Verdict:
    healthy: bool | None  # None: HyperPod has not decided yet
    detail: str
    request: bool = False  # ask HyperPod for its deep check now


def judge(node: ClusterNodeStatus | None, level: CheckLevel, progress: HyperPodProgress, now: datetime, *,
          after_reboot: bool) -> Verdict:
    """The check's verdict from HyperPod's status of the node (None: no such node), updating
    ``progress`` with what this reading shows."""
    if node is None or node.status in LEAVING:
        return Verdict(False, f"the node is not in the HyperPod cluster ({node.status if node else 'not found'})")
    state, message = node.status, node.message
    if state == "Failure":
        return Verdict(False, f"HyperPod reports Failure: {message[:500] or 'no message'}")
    if state != "Running":
        progress.left_running = True
        if state == IN_PROGRESS:
            progress.seen_deep_check = True
            return Verdict(None, "HyperPod's deep health check is running")
        return Verdict(None, f"HyperPod reports the node {state}")
    if level == "quick":
        return Verdict(True, "HyperPod reports the node Running")
    if progress.seen_deep_check:
        return Verdict(True, f"HyperPod's deep health check ({INSTANCE_STRESS}) passed: the node is Running again")
    if progress.requested_at is None:
        if after_reboot and not progress.left_running and now - progress.started_at < REBOOT_SETTLE:
            return Verdict(None, "the reboot has not shown in HyperPod's status yet")
        progress.requested_at = now
        return Verdict(None, f"HyperPod's deep health check ({INSTANCE_STRESS}) asked for", request=True)
    if now - progress.requested_at < START_GRACE:
        return Verdict(None, "HyperPod has not started the deep health check yet")
    return Verdict(False, f"HyperPod never showed the deep health check asked for at "
                          f"{progress.requested_at.isoformat()} running; the node is not judged healthy")


def hyperpod_check(
    incident: IncidentRef,
    instance_id: str,
    level: CheckLevel,
    task_token: str,
    *,
    purpose: Purpose = "recovery",
    hyperpod: HyperPodProvider,
    ledger: Ledger,
    control: ControlStore,
    stepfunctions: Any,
    clock: Callable[[], datetime],
    hands_off: HandsOff = lambda node, instance: None,
) -> HealthCheckOutput:
    """One reading of HyperPod's check of ``instance_id``: the answer to ``task_token`` once
    HyperPod has decided (recorded like the SSM check's: on the rung, or as the verification),
    else :class:`HealthCheckPendingError`."""
    now = clock()
    record = ledger.start_stage(incident, stage_of(purpose), now)
    rungs, check = check_record(record, purpose)
    if purpose == "verify" and record.completed_at:  # answered already, the answer lost: the same answer again
        healthy = record.result.get("healthy")
        checks = record.result.get("checks")
        check = check.model_copy(update={"healthy": healthy if isinstance(healthy, bool) else None,
                                         "checks": checks if isinstance(checks, list) else []})
    if check.channel != CHANNEL or check.instance_id != instance_id:
        check = CheckRecord(channel=CHANNEL, level=level, instance_id=instance_id, started_at=now,
                            command_id=f"{CHANNEL}:{instance_id}:{now.isoformat()}",
                            progress=HyperPodProgress(started_at=now).model_dump(mode="json"))
    if check.healthy is None:
        progress = HyperPodProgress.model_validate(check.progress)
        # a reboot shows in HyperPod's status a while after it was asked for; a rung whose node
        # HyperPod had replaced itself rebooted nothing
        after_reboot = (purpose == "recovery" and bool(rungs) and rungs[-1].rung == "reboot"
                        and not rungs[-1].replaced_by_provider)
        node = hyperpod.node_status(instance_id)
        verdict = judge(node, level, progress, now, after_reboot=after_reboot)
        if verdict.request and node is not None:
            if purpose == "recovery":  # its deep check takes the node's GPUs: not while hands are off
                refuse_if_held(hands_off, incident.slurm_node, instance_id)
            hyperpod.start_deep_check(instance_id, node.instance_group)
        check = check.model_copy(update={"progress": progress.model_dump(mode="json"), "detail": verdict.detail})
        save_check_record(incident, purpose, rungs, check, ledger)
        if verdict.healthy is None:
            raise HealthCheckPendingError(f"{incident.slurm_node} ({instance_id}): {verdict.detail}")
        out = HealthCheckOutput(instance_id=instance_id, healthy=verdict.healthy, level=level,
                                checks=[{"name": "hyperpod", "ok": verdict.healthy, "detail": verdict.detail}])
        if purpose == "verify":
            out = verified(incident, out, ledger=ledger, control=control, now=now)
        else:
            record_on_rung(incident, check.command_id, out, ledger, now)
    else:
        out = HealthCheckOutput(instance_id=instance_id, healthy=check.healthy, level=level, checks=list(check.checks))
    answer(stepfunctions, task_token, out)
    return out
