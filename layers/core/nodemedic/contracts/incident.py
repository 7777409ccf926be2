"""The incident: one per remediation, one ledger item, one execution."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

# burn_in: a node that joined is checked before it takes work; degrade: a node that still works,
# slower (fail-slow), is drained after its job, never requeued, then checked; retire: capacity AWS
# takes back at a known time (a Capacity Block's end, a Spot interruption): drained, its job moved, nothing repaired
Action = Literal["monitor", "replace", "reboot", "burn_in", "degrade", "retire"]
NON_DISRUPTIVE: frozenset[str] = frozenset({"burn_in", "degrade"})  # never requeue or kill a job
# check: the node as it is, not repaired: the first rung of a burn-in (a node that joined)
Rung = Literal["check", "gpu_reset", "reboot", "replace"]
RUNGS: tuple[Rung, ...] = ("check", "gpu_reset", "reboot", "replace")  # every rung, in escalation order
Confidence = Literal["high", "ambiguous"]
# retired: the node's capacity ends (it stays drained until AWS takes it back)
IncidentStatus = Literal["open", "closed", "failed", "held", "quarantined", "denied", "dry_run", "escalated",
                         "retired"]
ENDED_STATUSES: frozenset[str] = frozenset({"closed", "failed", "held", "quarantined", "denied", "dry_run",
                                            "escalated", "retired"})
# capacity_end: no stage but a note: the node's capacity ends while this incident repairs it (it
# is retired instead of resumed)
Stage = Literal["detect", "gate", "verify", "drain", "approval", "spare", "jobs", "repair", "resume", "shadow",
                "capacity_end"]
STAGES: tuple[Stage, ...] = ("detect", "gate", "verify", "drain", "approval", "spare", "jobs", "repair",
                             "resume", "shadow")  # the stages that run, in order


def default_ladder(action: Action) -> tuple[Rung, ...]:
    """The rungs tried in order until the node passes its deep health check."""
    if action in NON_DISRUPTIVE:  # checked as it is first, then the whole ladder
        return RUNGS
    if action == "retire":  # the capacity goes away: nothing to repair
        return ()
    return ("replace",) if action == "replace" else ("reboot", "replace")


class IncidentRef(BaseModel):
    """What every stage needs to know about the incident it works on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    incident_id: str = Field(min_length=1, max_length=80)
    cluster: str
    instance_id: str
    slurm_node: str
    fault_code: str
    fault_class: str
    action: Action
    source: str
    observed_at: AwareDatetime
    confidence: Confidence = Field(
        default="high", description="ambiguous: needs a second signal before destructive action")
    ladder: tuple[Rung, ...] = Field(
        default=(), description="escalation ladder, first rung first; empty = the default for the action")

    @property
    def rungs(self) -> tuple[Rung, ...]:
        return self.ladder or default_ladder(self.action)


class LedgerRecord(BaseModel):
    """Progress a stage keeps in the ledger. It is read back by whichever version runs next (an
    upgrade mid-incident): a field it does not know is left out, never a reason to lose the record."""

    model_config = ConfigDict(extra="ignore")

    def saved(self) -> dict[str, Any]:
        """The record as the ledger keeps it: JSON, the fields still at their default left out."""
        return self.model_dump(mode="json", exclude_defaults=True)


class CheckRecord(LedgerRecord):
    """A deep health check of a node, where its rung (or the verification) keeps it: sent, then
    answered. Each field is saved before the next step, so a retried invocation goes on from it."""

    channel: str = Field(default="", description="hyperpod: HyperPod's own check; empty: the SSM check")
    level: str = ""
    instance_id: str = ""
    command_id: str = Field(default="", description="the SSM command (HyperPod: a name for the reading)")
    token: str = Field(default="", description="a hash of the task token the check answers: sent once per wait")
    started_at: AwareDatetime | None = None
    progress: dict[str, Any] = Field(default_factory=dict, description="HyperPod: what the reading has seen so far")
    detail: str = ""
    healthy: bool | None = Field(default=None, description="None until answered")
    checks: list[dict[str, Any]] = Field(default_factory=list)
    ended_at: AwareDatetime | None = None


class ResetRecord(LedgerRecord):
    """How a GPU reset command ended (Skipped: the GPU's clients never left the node)."""

    status: str
    exit_code: int
    output: str = ""


class RungRecord(LedgerRecord):
    """One rung of an incident's repair ladder: what was done to which instance, step by step, and
    the check that judged it."""

    rung: Rung
    instance_id: str = Field(min_length=1, description="the instance the rung acts on, then the one it leaves")
    started_at: AwareDatetime | None = None
    done_at: AwareDatetime | None = None
    skipped: str = Field(default="", description="why the provider cannot do this rung (then its check failed)")
    check: CheckRecord | None = None
    reset_command: str = Field(default="", description="gpu_reset: the SSM command sent")
    reset: ResetRecord | None = None
    clients_wait_since: AwareDatetime | None = Field(default=None, description="gpu_reset: waiting for the GPU's clients")
    clients_resumed: bool = False
    rebooted: bool = False
    replaced_by_provider: str = Field(default="", description="the provider had replaced the rung's instance itself "
                                                              "before the rung acted (HyperPod's own recovery)")
    progress: dict[str, Any] = Field(default_factory=dict, description="replace: the provider's own steps")
    node: str = Field(default="", description="replace: the name the replacement registered under")
    joined: bool = False
    requeued: list[str] = Field(default_factory=list,
                                description="check of a slow node: the jobs requeued because a hard fault came")
    requeued_because: str = ""

    @property
    def healthy(self) -> bool | None:
        """The verdict of the rung's check; None while it has none."""
        return self.check.healthy if self.check else None


def rungs_result(rungs: list[RungRecord]) -> dict[str, Any]:
    """The repair stage's record of its rungs, as the ledger keeps it."""
    return {"rungs": [r.saved() for r in rungs]}


class StageRecord(BaseModel):
    """When a stage started and finished, and what it reported."""

    model_config = ConfigDict(extra="forbid")
    started_at: AwareDatetime
    completed_at: AwareDatetime | None = None
    result: dict[str, object] = Field(default_factory=dict)

    @property
    def repair_rungs(self) -> list[RungRecord]:
        """The repair rungs this (repair) stage recorded, first first (new models of the same rungs)."""
        rungs = self.result.get("rungs")
        return [r for r in map(_rung, rungs) if r is not None] if isinstance(rungs, list) else []


def _rung(record: object) -> RungRecord | None:
    """A recorded rung; None for an entry that is no rung (written by hand, or corrupt): the
    reconciler reads every open incident's rungs and must not stop at one."""
    try:
        return RungRecord.model_validate(record)
    except ValidationError:
        return None


def deadline_in(evidence: Mapping[str, object]) -> datetime | None:
    """When AWS acts on the node, as a planned event's evidence says (``deadline``, with a
    timezone); None when it names none."""
    value = evidence.get("deadline")
    try:
        deadline = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return deadline if deadline is not None and deadline.tzinfo is not None else None


FOLDED_KEPT = 8  # distinct fault codes noted per incident


class FoldedFault(BaseModel):
    """A fault folded into an open incident (its node had one already) whose own remediation
    would take the node's jobs off it: a reboot, a replace, the end of its capacity. An incident
    that lets the jobs run on (a slow node drained after its job, a wait for a checkpoint) reads
    these: a hard fault (a lost GPU) ends the wait at once, an AWS deadline (a retirement, a Spot
    interruption) ends it before AWS acts."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    fault_code: str
    fault_class: str
    action: Action
    observed_at: AwareDatetime
    deadline: AwareDatetime | None = None  # when AWS acts on the node: a planned notice's
    event: str = ""

    def hard(self, soft_classes: frozenset[str]) -> bool:
        """Whether the node's jobs cannot run on: a class the checkpoint policy does not let run on."""
        return self.fault_class not in soft_classes and self.action in ("reboot", "replace")


class Incident(IncidentRef):
    """The ledger item of an incident."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    status: IncidentStatus
    detected_at: AwareDatetime
    reason: str = Field(description="Why the pipeline acted: the fault and its classification")
    stages: dict[str, StageRecord] = Field(default_factory=dict)
    duplicate_events: int = 0
    closed_at: AwareDatetime | None = None
    outcome: str = Field(default="", description="Why the incident ended as it did (held, not corroborated, ...)")
    failed_at: AwareDatetime | None = None
    failure: dict[str, str] | None = None
    folded_faults: list[FoldedFault] = Field(
        default_factory=list, description="faults folded in whose remediation would take the jobs off the node, oldest first")

    def duration_from_fault(self, moment: datetime) -> float:
        """Seconds from the fault (``observed_at``) to ``moment``: the origin of every metric."""
        return (moment - self.observed_at).total_seconds()

    def evidence_recorded(self) -> dict[str, object]:
        """The evidence the event that opened the incident carried (Detect's record)."""
        detect = self.stages.get("detect")
        evidence = detect.result.get("evidence") if detect else None
        return dict(evidence) if isinstance(evidence, dict) else {}

    def evidence(self, key: str) -> object:
        """One value of the evidence the event that opened the incident carried (Detect's record)."""
        return self.evidence_recorded().get(key)

    @property
    def deadline(self) -> datetime | None:
        """When AWS acts on the node, as the planned event that opened the incident said."""
        return deadline_in(self.evidence_recorded())

    def aws_acts(self) -> tuple[datetime, str] | None:
        """When AWS acts on the node, and whose notice says so: the earliest ``deadline`` of the
        planned notices that opened the incident or were folded into it (a retirement, a Spot
        interruption, the end of its Capacity Block), whoever relayed it (the planned-events
        function, or the node's agent reading its instance metadata). None when none names one.
        Only a planned notice's deadline counts: a "deadline" in a fault's evidence is not AWS's."""
        own = [(d, self.fault_code)] if self.fault_class == "planned" and (d := self.deadline) else []
        folded = [(f.deadline, f.fault_code) for f in self.folded_faults if f.deadline and f.fault_class == "planned"]
        return min(own + folded, default=None)

    @property
    def stage(self) -> Stage:
        """The latest stage the incident has begun (pipeline order)."""
        return next((s for s in reversed(STAGES) if s in self.stages), "detect")

    @property
    def repair_rungs(self) -> list[RungRecord]:
        """The repair rungs recorded on the incident, first first."""
        repaired = self.stages.get("repair")
        return repaired.repair_rungs if repaired else []

    @property
    def instances(self) -> list[str]:
        """Every instance the incident locked, first first: its own, then each its repair rungs
        left the node on (a replacement)."""
        return list(dict.fromkeys([self.instance_id, *(r.instance_id for r in self.repair_rungs)]))

    @property
    def claims(self) -> list[Claim]:
        """What the incident's records say it claimed: the hot spare its spare stage took, the
        replacement instance each replace rung found (and any found before it that someone else
        ended before it joined)."""
        spare = self.stages.get("spare")
        taken = [(SPARE_CLAIM, spare.result.get("spare") if spare else None)]
        for rung in self.repair_rungs:
            lost = rung.progress.get("lost_replacements")
            taken += [(REPLACEMENT_CLAIM, key) for key in [*(lost if isinstance(lost, list) else []),
                                                         rung.progress.get("new_instance_id")]]
        return [Claim(kind=kind, key=key, incident_id=self.incident_id) for kind, key in taken
                if isinstance(key, str) and key]


SPARE_CLAIM = "spare"  # CLAIM#spare#<node>: a hot spare taken for an incident's jobs
REPLACEMENT_CLAIM = "replacement"  # CLAIM#replacement#<instance>: the new instance a replace rung found


class NodeLock(BaseModel):
    """``NODE#<cluster>#<instance>``: the one incident active for an instance."""

    instance_id: str
    incident_id: str
    slurm_node: str


class Claim(BaseModel):
    """``CLAIM#<kind>#<key>``: a hot spare or a replacement instance taken by one incident."""

    kind: str
    key: str
    incident_id: str


class DrainHold(BaseModel):
    """``DRAINHOLD#<cluster>#<node>``: NodeMedic keeps this node drained with ``reason``."""

    cluster: str
    slurm_node: str
    instance_id: str
    incident_id: str
    reason: str
    since: AwareDatetime


class Recheck(BaseModel):
    """``RECHECK#<cluster>#<node>#<fault code>``: a fault the cooldown held (``incident_id``, the
    latest such), decided again from ``due``, when the cooldown ends. ``offers``: how often the
    reconciler has offered it since."""

    cluster: str
    slurm_node: str
    fault_code: str
    incident_id: str
    due: AwareDatetime
    offers: int = 0


class UnwatchedNode(BaseModel):
    """A node in service that NodeMedic cannot watch (``why``), since ``since``."""

    node: str
    why: str
    since: AwareDatetime
    paged: bool = False


class UnwatchedNodes(BaseModel):
    """``UNWATCHED#<cluster>``: the reconciler's record of :class:`UnwatchedNode`, by instance id."""

    nodes: dict[str, UnwatchedNode] = Field(default_factory=dict)


class Bookkeeping(BaseModel):
    """What the reconciler checks: every lock, claim and drain hold, the open incidents, and the
    faults the cooldown held."""

    locks: list[NodeLock] = Field(default_factory=list)
    claims: list[Claim] = Field(default_factory=list)
    holds: list[DrainHold] = Field(default_factory=list)
    open_incidents: list[Incident] = Field(default_factory=list)
    rechecks: list[Recheck] = Field(default_factory=list)
