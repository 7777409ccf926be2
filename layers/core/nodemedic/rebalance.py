"""EC2's rebalance recommendation for a Spot Instance: its risk of interruption rose. The
two-minute interruption warning may follow, minutes or hours later, or never (EC2 User Guide, "EC2
instance rebalance recommendations"). What NodeMedic does with it is the least that pays either
way: where the CheckpointPolicy says so (``rebalance``), it asks the jobs on the instance's node to
checkpoint now. Nothing is drained, requeued or replaced: a node EC2 then never interrupts loses
one checkpoint's time, and one it does interrupt has a fresh checkpoint to resume from, however
little of the two minutes the warning's own checkpoint gets.

A job is asked once within ``QUIET`` whatever asks it (a redelivered recommendation, or another
node of the same job recommended too: EC2 recommends rebalancing for a capacity pool, so many of a
job's nodes at once). That is a conditional write per job before the signal, so a job is never
signalled twice, even by deliveries at the same moment; a signal the scheduler reports it could
not send is taken back and raised, so EventBridge's retry sends it. A job is asked through its
node's orchestrator, as a checkpoint-aware drain asks it (docs/checkpoints.md): Slurm signals the
job, Kubernetes annotates its pods on the node.

The same recommendation may come from the node itself: its agent reads it from instance metadata
and sends it to NodeMedic's bus (:class:`NodeRebalanceEnvelope`), so a delivery EventBridge loses
does not lose it; the two ask the job once. A node's notice that names another cluster, or a node
other than the one its instance backs, is not believed.

Nothing is asked for a node automation keeps its hands off: automation paused, the safety policy
in dry run, the node excluded, or an incident holding the node (its drain asks its jobs itself).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from nodemedic.contracts.spot_interruption import NodeRebalanceEnvelope, RebalanceEnvelope
from nodemedic.domain.checkpoint import CheckpointPolicy, CheckpointRule
from nodemedic.errors import CommandFailedError, CommandPendingError
from nodemedic.orchestrators.base import Orchestrator
from nodemedic.providers.base import Provider
from nodemedic.safety.policy import SafetyPolicy
from nodemedic.store.control import ControlState
from nodemedic.store.ledger import Ledger

Recommendation = RebalanceEnvelope | NodeRebalanceEnvelope  # EC2's on EventBridge, or a node's reading of its metadata
QUIET = timedelta(minutes=30)  # a job asked to checkpoint for a recommendation is not asked again within this
STALE = timedelta(minutes=10)  # a recommendation read later than this (a redrive, a replay) asks nothing


class RebalanceOutcome(BaseModel):
    """What one recommendation did: the jobs asked, those not asked (why), or why nothing was."""

    model_config = ConfigDict(extra="forbid")
    instance_id: str
    node: str | None = None
    asked: list[str] = Field(default_factory=list)
    not_asked: dict[str, str] = Field(default_factory=dict, description="job id -> why it was not asked")
    ignored: str = ""


def unwanted(envelope: Recommendation, checkpoints: CheckpointPolicy, now: datetime) -> str:
    """Why the recommendation asks nothing whatever the cluster's state; "" when it may."""
    if not checkpoints.rebalance:
        return "the CheckpointPolicy asks no checkpoint on a rebalance recommendation (rebalance: false)"
    if not checkpoints.enabled:
        return "the CheckpointPolicy has no rule to ask a job by (default and partitions are null)"
    if now - envelope.recommended_at > STALE:
        return (f"recommended at {envelope.recommended_at.isoformat()}, more than {STALE.total_seconds() / 60:.0f} "
                "min before it was read (a redrive, a replay, an agent reading it again): the risk it told of is old news")
    return ""


def ask_to_checkpoint(envelope: Recommendation, *, cluster: str, provider: Provider, orchestrator: Orchestrator,
                      ledger: Ledger, checkpoints: CheckpointPolicy, safety: SafetyPolicy, control: ControlState,
                      now: datetime) -> RebalanceOutcome:
    """Ask the jobs on the recommended instance's node to checkpoint (each once within ``QUIET``),
    once :func:`unwanted` said nothing against it. Raises :class:`CommandFailedError` when the
    scheduler could not signal one of them (that one's claim taken back first, so the retried
    delivery asks it); a signal command that failed is raised with the claims of the jobs it and
    the later ones would have asked taken back (but for a command sent whose answer was lost)."""
    instance = envelope.instance_id
    outcome = RebalanceOutcome(instance_id=instance)
    said_cluster, said_node = envelope.named
    if said_cluster not in (None, cluster):
        outcome.ignored = f"the notice is for cluster {str(said_cluster)[:64]}; this pipeline serves {cluster}"
        return outcome
    member = provider.member(instance)
    if member is None or member.slurm_node is None:
        outcome.ignored = f"not a member of cluster {cluster}" if member is None else "backs no node of the cluster"
        return outcome
    if said_node is not None and said_node != member.slurm_node:  # one node cannot get another's jobs signalled
        outcome.ignored = f"the notice names node {said_node}, but {instance} backs {member.slurm_node}: not believed"
        return outcome
    outcome.node = node = member.slurm_node
    if why := _hands_off(node, member.tags, safety, control, ledger.node_lock(cluster, instance)):
        outcome.ignored = why
        return outcome
    rules: dict[str, CheckpointRule] = {}
    for job in orchestrator.running_jobs(node):
        if (rule := checkpoints.rule(job.group)) is None:
            outcome.not_asked[job.job_id] = f"no checkpoint rule for {job.group}"
        elif not ledger.claim_rebalance_checkpoint(cluster, job.job_id, now, QUIET):
            outcome.not_asked[job.job_id] = f"asked within the last {QUIET.total_seconds() / 60:.0f} min"
        else:
            rules[job.job_id] = rule
    failed: list[str] = []
    answered: list[str] = []
    for signal, scope in sorted({(r.signal, r.scope) for r in rules.values()}):
        ids = [j for j, r in rules.items() if (r.signal, r.scope) == (signal, scope)]
        try:
            failed += orchestrator.request_checkpoint(node, ids, signal, scope)
        except Exception as exc:
            # a command sent whose answer was lost (CommandPendingError: a slow controller) keeps its
            # jobs' claims: a second signal could mean a second checkpoint, or a requeue, to a job.
            # One never sent (SSM throttled, refused) and those not sent yet are taken back, so the
            # retried delivery asks them
            sent = ids if isinstance(exc, CommandPendingError) else []
            for job_id in rules:
                if job_id in failed or job_id not in answered + sent:
                    ledger.release_rebalance_checkpoint(cluster, job_id)
            raise
        answered += ids
    outcome.asked = [j for j in rules if j not in failed]
    if failed:
        for job_id in failed:
            ledger.release_rebalance_checkpoint(cluster, job_id)
        raise CommandFailedError(f"{node}: job(s) {', '.join(failed)} could not be asked to checkpoint "
                                 f"(asked: {', '.join(outcome.asked) or 'none'})")
    return outcome


def _hands_off(node: str, tags: dict[str, str], safety: SafetyPolicy, control: ControlState,
               lock: tuple[str, str] | None) -> str:
    """Why automation leaves the node's jobs alone now; "" when it may ask them."""
    if control.paused is not None:
        return f"automation is paused ({control.paused.reason})"
    if safety.mode == "dry_run":
        return "the safety policy is in dry run: nothing is signalled"
    if why := safety.exclusions.excludes(node, tags):
        return f"excluded from automation: {why}"
    if lock is not None:
        return f"incident {lock[0]} holds the node: its drain asks the jobs to checkpoint"
    return ""
