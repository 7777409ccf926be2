"""Repair: climb the incident's escalation ladder (GPU reset -> reboot -> replace), one rung per
invocation; a burn-in's ladder starts with ``check`` (nothing done, the node checked as it is).
Each rung is followed by a deep health check (the state machine's callback task);
a failed or unanswered check sends the state machine back here for the next rung.

The rungs and their checks are recorded in the ``repair`` stage, step by step, so a retried
invocation continues the rung it was on: one reboot, one termination, one replacement.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NoReturn

from nodemedic.contracts.incident import (
    REPLACEMENT_CLAIM,
    CheckRecord,
    Incident,
    IncidentRef,
    ResetRecord,
    Rung,
    RungRecord,
    rungs_result,
)
from nodemedic.contracts.stages import Destination, RepairOutput
from nodemedic.domain.checkpoint import CheckpointPolicy
from nodemedic.errors import (
    CapacityEndsError,
    EvictionPendingError,
    GpuClientsPendingError,
    IncidentStateError,
    InstanceGoneError,
    InstanceNotManagedError,
    NodeBusyError,
    NodeDrainingError,
    NodeGoneError,
    ReplacementFailedError,
    ReplacementPendingError,
)
from nodemedic.orchestrators.base import Orchestrator
from nodemedic.providers.base import Provider, runs_commands
from nodemedic.providers.run_command import Documents, RunCommand
from nodemedic.safety.gate import HandsOff, refuse_if_held
from nodemedic.stages.checkpoint import checkpoint_jobs, hard_fault_reason
from nodemedic.stages.drain import drain_reason, refuse_if_returned
from nodemedic.store.ledger import Ledger

# how long a GPU reset waits for the GPU clients (Kubernetes) to leave the node; NVIDIA's
# k8s-driver-manager gives each component five minutes for the same wait
GPU_CLIENTS_WAIT_S = 300
NO_ANSWER = [{"name": "answer", "ok": False, "detail": "the deep health check did not answer in time"}]


def repair(
    incident: IncidentRef,
    destination: Destination,
    *,
    provider: Provider,
    orchestrator: Orchestrator,
    runner: RunCommand,
    ledger: Ledger,
    documents: Documents,
    timeout_s: int,
    check_timeout_s: int,
    prefix: str,
    clock: Callable[[], datetime],
    checkpoints: CheckpointPolicy | None = None,
    hands_off: HandsOff = lambda node, instance: None,
) -> RepairOutput:
    """The next rung of the ladder. ``hands_off(node, instance)``: why automation must not touch
    the node now (:func:`nodemedic.safety.gate.hands_off`), asked right before each step."""
    record = ledger.start_stage(incident, "repair", clock())
    rungs = record.repair_rungs
    incident = serving(incident, rungs)
    ladder = incident.rungs
    if rungs and rungs[-1].done_at:
        last = rungs[-1]
        if last.check is None:  # a retried invocation: the rung is done, its check not started
            return _output(incident, len(rungs), last, check_timeout_s)
        if last.check.healthy is None:  # the check was started and never answered
            last.check = last.check.model_copy(update={"healthy": False, "checks": NO_ANSWER, "ended_at": clock()})
        elif last.check.healthy:
            raise IncidentStateError(f"incident {incident.incident_id}: {last.instance_id} passed its check; "
                                     "nothing left to repair")
        if len(rungs) >= len(ladder):
            raise IncidentStateError(f"incident {incident.incident_id}: the ladder {list(ladder)} is exhausted")
    if not rungs or rungs[-1].done_at:
        instance = rungs[-1].instance_id if rungs else incident.instance_id
        ending = capacity_ends(ledger.get(incident.incident_id), instance)
        if ending:
            raise CapacityEndsError(f"{incident.slurm_node} ({instance}): {ending}; no further rung, the node is retired")
        while len(rungs) < len(ladder) and not available(ladder[len(rungs)], provider):
            rungs.append(_skipped(ladder[len(rungs)], instance, clock()))
        if len(rungs) >= len(ladder):
            ledger.record_progress(incident, "repair", {**rungs_result(rungs), "destination": destination})
            raise IncidentStateError(f"incident {incident.incident_id}: no rung of the ladder {list(ladder)} "
                                     f"is left that the {provider.kind} provider can do")
        rungs.append(RungRecord(rung=ladder[len(rungs)], instance_id=instance, started_at=clock()))
        ledger.record_progress(incident, "repair", {**rungs_result(rungs), "destination": destination})
    current = rungs[-1]
    try:
        current.instance_id = _climb(incident, current, provider=provider, orchestrator=orchestrator,
                                     runner=runner, ledger=ledger, documents=documents, timeout_s=timeout_s,
                                     prefix=prefix, checkpoints=checkpoints or CheckpointPolicy(),
                                     progress=record.result,
                                     save=lambda: ledger.record_progress(incident, "repair", rungs_result(rungs)),
                                     clock=clock, hands_off=hands_off)
    except NodeGoneError as exc:  # the state machine retires the incident, saying this
        ledger.record_progress(incident, "repair", {"gone": str(exc)})
        raise
    current.done_at = clock()
    ledger.record_progress(incident, "repair", rungs_result(rungs))
    return _output(incident, len(rungs), current, check_timeout_s)


# the check rung of a DEGRADED node reads its jobs again up to 10 min apart (NodeDrainingError's
# retrier, statemachines/remediation.asl.json): a deadline nearer than this requeues them now
REQUEUE_BEFORE_AWS = timedelta(minutes=30)


def available(rung: str, provider: Provider) -> bool:
    """A GPU reset is a command run on the node: not there where SSM does not reach the nodes."""
    return rung != "gpu_reset" or runs_commands(provider)


def _skipped(rung: Rung, instance: str, now: datetime) -> RungRecord:
    """The record of a rung the provider cannot do: done at once, its check failed, so the ladder
    goes on to the next rung with nothing sent to the node."""
    why = "not possible here: SSM Run Command does not reach the nodes of this provider"
    return RungRecord(rung=rung, instance_id=instance, started_at=now, done_at=now, skipped=why,
                      check=CheckRecord(healthy=False, ended_at=now,
                                        checks=[{"name": rung, "ok": False, "detail": f"skipped: {why}"}]))


def capacity_ends(current: Incident, instance: str) -> str:
    """Why ``instance``'s capacity ends, if an end was noted on the incident for that instance
    (a replacement is another instance: the end named the one before); else ''."""
    note = current.stages.get("capacity_end")
    if note is None or note.result.get("instance_id") != instance:
        return ""
    return f"its capacity ends ({note.result.get('fault_code')})"


def serving(incident: IncidentRef, rungs: list[RungRecord]) -> IncidentRef:
    """The incident as its node is named now: a replacement that registered under a name of its
    own (Kubernetes) is the node the later rungs, the check and Resume act on."""
    named = next((r.node for r in reversed(rungs) if r.node), incident.slurm_node)
    return incident if named == incident.slurm_node else incident.model_copy(update={"slurm_node": named})


def _output(incident: IncidentRef, attempt: int, rung: RungRecord, check_timeout_s: int) -> RepairOutput:
    """Every node that comes back from a rung (reset, rebooted, a replacement, a joined node as it
    is) is judged by the full check before it takes work: the burn-in gate."""
    return RepairOutput(rung=rung.rung, attempt=attempt, instance_id=rung.instance_id, level="full",
                        last=attempt >= len(incident.rungs), check_timeout_s=check_timeout_s)


def _guard(incident: IncidentRef, orchestrator: Orchestrator, hands_off: HandsOff, instance: str,
           runner: RunCommand) -> None:
    """No step that changes a node while automation is paused or the node is excluded, and no
    destructive step on a node that runs a job, or that someone returned to service: checked
    right before each step, whatever the stages before it recorded. A node the cluster deleted
    (Kubernetes) runs nothing: with its instance ended too, nothing is left to repair
    (:class:`NodeGoneError`: the incident is retired); with its instance running, the ladder goes
    on (a reboot registers the node again)."""
    refuse_if_held(hands_off, incident.slurm_node, instance)
    try:
        why = orchestrator.busy(incident.slurm_node)
    except NodeGoneError as exc:
        if runner.gone(instance):
            raise NodeGoneError(f"{exc}; EC2 ended {instance} outside NodeMedic: nothing is left to repair, and "
                                "the instances the group launches in its place join through their own burn-in") from exc
        why = None
    if why:
        raise NodeBusyError(f"not touching {incident.slurm_node} ({instance}): {why}")


def _aws_acts_soon(incident: Incident, now: datetime) -> tuple[datetime, str] | None:
    """When AWS acts on the node and why, if within ``REQUEUE_BEFORE_AWS`` (a planned notice
    folded into the incident: a retirement, a Spot interruption, the end of its Capacity Block;
    the check rung reads the jobs again up to 10 min later); None otherwise."""
    acts = incident.aws_acts()
    if acts is None or acts[0] - now > REQUEUE_BEFORE_AWS:
        return None
    return acts[0], f"{acts[1]}: AWS acts on the node at {acts[0].isoformat()}"


def _after_jobs(incident: IncidentRef, rung: RungRecord, orchestrator: Orchestrator, ledger: Ledger,
                checkpoints: CheckpointPolicy, save: Callable[[], None], clock: Callable[[], datetime],
                progress: dict[str, Any]) -> None:
    """A DEGRADED node is drained after its jobs: wait for them to end, never cut them short,
    unless a hard fault came to the node since (a lost GPU: the jobs cannot run on there, and a
    job hung on it would hold the node for days): then they are requeued now. Or AWS acts on the
    node soon (a retirement notice for it): then they are asked to checkpoint first, as a drain
    asks (:func:`checkpoint_jobs`, its wait ending before AWS acts), and requeued."""
    jobs = orchestrator.jobs_on(incident.slurm_node)
    if not jobs:
        return
    current = ledger.get(incident.incident_id)
    why = hard_fault_reason(current.folded_faults, checkpoints)
    if not why:
        acts = _aws_acts_soon(current, clock())
        if acts is None:
            raise NodeDrainingError(f"{incident.slurm_node} is DEGRADED and drained after its job(s) "
                                    f"{', '.join(jobs)}; its check waits for them to end")
        checkpointed = checkpoint_jobs(incident, orchestrator=orchestrator, ledger=ledger, policy=checkpoints,
                                       clock=clock, progress=progress, hard="", stage="repair", deadline=acts[0])
        why = f"{acts[1]}; {checkpointed.policy}"
    moved = orchestrator.evacuate(incident.slurm_node, rung.started_at.timestamp() if rung.started_at else None)
    refuse_if_returned(incident, moved)
    rung.requeued = list(dict.fromkeys([*rung.requeued, *moved.requeued]))
    rung.requeued_because = why
    save()
    if moved.pending:
        raise EvictionPendingError(f"{incident.slurm_node}: still leaving: {'; '.join(moved.pending)[:800]}")


def _replaced_by_provider(incident: IncidentRef, rung: RungRecord, provider: Provider, save: Callable[[], None],
                          gone: InstanceGoneError) -> str:
    """The rung's instance left the cluster before the rung acted on it: with automatic node
    recovery, HyperPod replaced the node itself while the rung waited for it (ProviderBusyError).
    Where another instance serves the node's name now, that is the provider's replacement: the
    rung leaves it, and its check judges it before it takes work. Else nothing is left to act on:
    :class:`ReplacementFailedError` (the node stays drained, the on-call is told)."""
    successor = provider.member_by_node(incident.slurm_node)
    if successor is None or successor.instance_id == rung.instance_id:
        raise ReplacementFailedError(f"{incident.slurm_node}: {gone}; no instance serves the node now") from gone
    rung.replaced_by_provider = (f"{rung.instance_id} left the cluster before the {rung.rung} ({gone}); "
                                 f"{successor.instance_id} serves {incident.slurm_node} now")
    rung.instance_id = successor.instance_id  # the one the rung leaves, kept for a retry
    save()
    return successor.instance_id


def _forget(incident: IncidentRef, rung: RungRecord, lost: str, save: Callable[[], None]) -> NoReturn:
    """Someone else ended the replacement before it joined (an operator, a health check; EC2
    says it is shutting down or terminated): the provider's next instance is claimed in its
    place, at the next try. Waiting on this one failed the incident, and left the node without an
    instance and the one launched in its place unclaimed."""
    rung.progress = {k: v for k, v in rung.progress.items() if k != "new_instance_id"}
    rung.progress["lost_replacements"] = [*rung.progress.get("lost_replacements", []), lost]
    save()
    raise ReplacementPendingError(f"the replacement {lost} for {incident.slurm_node} was ended by someone else "
                                  "before it joined; the next instance is claimed")


def _climb(incident: IncidentRef, rung: RungRecord, *, provider: Provider, orchestrator: Orchestrator,
           runner: RunCommand, ledger: Ledger, documents: Documents, timeout_s: int, prefix: str,
           checkpoints: CheckpointPolicy, progress: dict[str, Any], save: Callable[[], None],
           clock: Callable[[], datetime], hands_off: HandsOff) -> str:
    """Do one rung (idempotently: each step is saved before the next); the instance it leaves."""
    instance = rung.instance_id
    if rung.rung == "check":  # the node as it is: only its check follows, which disturbs any job
        if incident.action == "degrade":
            _after_jobs(incident, rung, orchestrator, ledger, checkpoints, save, clock, progress)
        _guard(incident, orchestrator, hands_off, instance, runner)
        return instance
    if rung.rung == "gpu_reset":
        if rung.reset is None:
            # the command is recorded once sent: a retry whose wait ran out waits for that reset
            # instead of starting a second one on GPUs the first may still be resetting
            if not rung.reset_command:
                _guard(incident, orchestrator, hands_off, instance, runner)
                waiting = orchestrator.pause_gpu_clients(incident.slurm_node, incident.incident_id)
                if waiting:
                    if rung.clients_wait_since is None:
                        rung.clients_wait_since = clock()
                        save()
                    if (clock() - rung.clients_wait_since).total_seconds() < GPU_CLIENTS_WAIT_S:
                        raise GpuClientsPendingError(waiting)
                    # not reset: the check that follows finds the fault still there, and the ladder goes on
                    rung.reset = ResetRecord(status="Skipped", exit_code=-1,
                                             output=f"not reset after {GPU_CLIENTS_WAIT_S} s: {waiting}"[-300:])
                else:
                    try:
                        rung.reset_command = runner.send(instance, documents.gpu_reset, {}, timeout_s,
                                                         f"GPU reset {incident.slurm_node}")
                    except InstanceGoneError as exc:  # the check that follows says so too, and the ladder goes on
                        rung.reset = ResetRecord(status="Skipped", exit_code=-1, output=str(exc)[-300:])
                save()
            if rung.reset is None:
                result = runner.wait(instance, rung.reset_command, timeout_s)
                rung.reset = ResetRecord(status=result.status, exit_code=result.exit_code,
                                         output=(result.stderr or result.stdout).strip()[-300:])
                save()
        if not rung.clients_resumed:  # reset or not: the node's GPU clients come back before its check
            orchestrator.resume_gpu_clients(incident.slurm_node, incident.incident_id)
            rung.clients_resumed = True
            save()
        return instance
    if rung.replaced_by_provider:  # a retry: the provider's replacement is the instance the rung leaves
        return instance
    if rung.rung == "reboot":
        if not rung.rebooted:
            _guard(incident, orchestrator, hands_off, instance, runner)
            try:
                provider.reboot([instance])
            except InstanceGoneError as exc:
                return _replaced_by_provider(incident, rung, provider, save, exc)
            rung.rebooted = True
            save()
        return instance
    if not rung.progress.get("requested_at"):  # before the instance is terminated or stopped
        _guard(incident, orchestrator, hands_off, instance, runner)
    try:
        step = provider.replace(instance, incident.slurm_node, dict(rung.progress),
                                claim=lambda candidate: ledger.claim(REPLACEMENT_CLAIM, candidate, incident.incident_id))
    except InstanceGoneError as exc:
        return _replaced_by_provider(incident, rung, provider, save, exc)
    rung.progress = step.progress
    save()
    if step.instance_id is None:
        raise ReplacementPendingError(f"the replacement for {instance} ({incident.slurm_node}) is not running yet")
    if not rung.joined:
        began = rung.started_at.timestamp() if rung.started_at else None
        try:
            node = orchestrator.adopt(incident.slurm_node, step.instance_id, drain_reason(prefix, incident), began)
        except (InstanceNotManagedError, InstanceGoneError):  # Slurm's join: SSM cannot reach it
            if not runner.gone(step.instance_id):
                raise  # still booting
            _forget(incident, rung, step.instance_id, save)
        if node is None:  # Kubernetes: its node has not registered
            if runner.gone(step.instance_id):
                _forget(incident, rung, step.instance_id, save)
            raise ReplacementPendingError(f"the replacement {step.instance_id} for {incident.slurm_node} has not "
                                          "joined the cluster yet")
        rung.node = node
        rung.joined = True
        save()
    return step.instance_id
