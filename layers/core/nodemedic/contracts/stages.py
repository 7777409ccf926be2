"""Input and output of each stage Lambda. Handlers validate input here and return ``model_dump``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from nodemedic.contracts.events import TriggerEvent
from nodemedic.contracts.incident import IncidentRef, IncidentStatus, Rung


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DetectInput(BaseModel):
    """The trigger event as EventBridge delivered it, plus the execution's name (= incident id).

    ``event`` is validated by :func:`nodemedic.stages.detect.parse_trigger` so that a bad event
    is reported as ``InvalidEventError`` with the reason, not as a crash of the handler.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    event: dict[str, object]
    incident_id: str = Field(min_length=1, max_length=80)


Decision = Literal["remediate", "monitor", "deduplicated"]


class DetectOutput(_Model):
    decision: Decision
    reason: str
    incident: IncidentRef | None = None
    existing_incident_id: str | None = None
    fault_class: str | None = Field(default=None, description="of a monitored fault ('unknown': a code no table knows)")
    recheck_of: str | None = Field(default=None, description="the incident whose fault the cooldown held, decided again")


class StageInput(_Model):
    incident: IncidentRef


GateVerdict = Literal["proceed", "verify", "quarantine", "hold", "dry_run"]


class GateOutput(_Model):
    """What the safety gate decided, and every rule it evaluated on the way."""

    verdict: GateVerdict
    reason: str
    rules: list[dict[str, str]] = Field(description="[{rule, result, detail}] in evaluation order")
    needs_approval: bool = Field(default=False, description="an operator approves before replace/reboot")
    approve_repairs: bool = Field(default=False, description="burn-in in approval mode: an operator approves "
                                                             "before the first rung that changes the node")
    notify: str = Field(default="", description="a notification the state machine publishes, if any")
    would: str = Field(default="", description="dry run: the verdict automation would have reached")


class JobCheckpoint(_Model):
    """What became of one job's checkpoint before it was requeued."""

    job_id: str
    outcome: Literal["checkpointed", "grace_expired", "ended"] = Field(
        description="its marker came; none came within the grace; it ended while the drain waited")
    work_saved_s: float = Field(ge=0, description="work the new checkpoint kept (since the one before, or the start)")
    work_lost_s: float = Field(ge=0, description="work since its last checkpoint when it was requeued")


class CheckpointRecord(_Model):
    """How the drain treated the node's jobs before requeueing them (docs/checkpoints.md)."""

    policy: str = Field(description="what was done: the signal, scope and grace, or why the jobs were requeued at once")
    requested_at: AwareDatetime | None = Field(default=None, description="when the jobs were signalled")
    waited_s: float = Field(default=0, ge=0, description="from the signal to the requeue")
    jobs: list[JobCheckpoint] = Field(default_factory=list)

    @property
    def work_saved_s(self) -> float:
        return sum(j.work_saved_s for j in self.jobs)

    @property
    def work_lost_s(self) -> float:
        return sum(j.work_lost_s for j in self.jobs)


class DrainOutput(_Model):
    slurm_node: str
    drained_by_pipeline: bool = Field(description="False when an operator had drained it first")
    requeued_jobs: list[str]
    jobs_not_requeued: list[str]
    job_sizes: dict[str, int] = Field(default_factory=dict, description="how many nodes each requeued job had")
    job_members: dict[str, int] = Field(default_factory=dict, description=(
        "Kubernetes: each requeued workload's live pods before its evictions; it is back when it runs as many again"))
    checkpoint: CheckpointRecord | None = Field(default=None, description="None: no checkpoint policy applied")
    node_gone: bool = Field(default=False, description=(
        "Kubernetes: the API server no longer had the node (its instance ended): nothing was cordoned, and its "
        "pods were deleted as the pod garbage collector would"))

    @model_validator(mode="before")
    @classmethod
    def _counts_from_names(cls, data: Any) -> Any:
        """A drain recorded before the result kept counts listed each job's nodes (``job_nodes``):
        read as counts, so a retry across an upgrade and the report still read it."""
        if isinstance(data, dict) and isinstance(names := data.get("job_nodes"), dict) and "job_sizes" not in data:
            rest = {k: v for k, v in data.items() if k != "job_nodes"}
            return {**rest, "job_sizes": {job: len(n) if isinstance(n, list) else n for job, n in names.items()}}
        return data


Destination = Literal["service", "pool"]
CheckLevel = Literal["quick", "full"]


class SpareOutput(_Model):
    spare: str | None = Field(description="the hot spare swapped into service, or None (pool empty or off)")
    destination: Destination = Field(description="where the repaired node goes: the pool if a spare replaced it")
    pool: list[str] = Field(description="the pool's nodes after the swap")
    reason: str


class JobsOutput(_Model):
    running: dict[str, float] = Field(description="requeued job -> seconds from the fault to its new start")
    pending: list[str] = Field(description="requeued jobs not running when the wait ended")
    job_downtime_s: float | None = Field(description="the longest downtime of the running jobs")


class RepairInput(_Model):
    incident: IncidentRef
    destination: Destination = "service"


class RepairOutput(_Model):
    rung: Rung
    attempt: int = Field(description="1-based index of the rung in the incident's ladder")
    instance_id: str = Field(description="the instance now backing the Slurm node")
    level: CheckLevel = Field(description="always full: the burn-in every node passes before it takes work")
    last: bool = Field(description="no rung is left if this one's check fails")
    check_timeout_s: int = Field(description="how long the state machine waits for the check's answer")


class ShadowInput(_Model):
    incident: IncidentRef
    gate: GateOutput


class ShadowOutput(_Model):
    would: str = Field(description="the gate's verdict had the mode been automatic")
    actions: list[str] = Field(description="what each stage would have done, in order")


class ApprovalInput(_Model):
    incident: IncidentRef
    task_token: str = Field(min_length=1)


class DenialInput(_Model):
    incident: IncidentRef
    denial: dict[str, str | None] = Field(description="the Catch's error: {Error, Cause}")


Purpose = Literal["recovery", "verify"]


class HealthCheckInput(_Model):
    incident: IncidentRef
    instance_id: str
    purpose: Purpose = Field(
        default="recovery", description="verify: check an ambiguous fault before acting")
    level: CheckLevel = "quick"
    task_token: str = Field(min_length=1, description="the callback token; the result comes back through "
                                                      "SSM's status-change event")


class HealthCheckOutput(_Model):
    instance_id: str
    healthy: bool
    checks: list[dict[str, object]]
    level: CheckLevel = "quick"


class ResumeInput(_Model):
    incident: IncidentRef
    step: Literal["return", "jobs", "quarantine", "escalate", "fail", "retire"] = Field(
        default="return", description="return the node (pool or service) and close; or only await the "
                                      "requeued jobs; or end the incident quarantined / escalated / failed; "
                                      "or retired (the node's capacity ends)")
    destination: Destination = "service"
    error: dict[str, str | None] | None = Field(default=None, description="escalate, fail: the Catch's error")
    reason: str = Field(default="", max_length=2000,
                        description="quarantine by the lemon rule: the gate's reason (the ladder was not tried)")


class ResumeOutput(_Model):
    slurm_node: str
    resumed: bool = Field(description="False when the drain was an operator's: it is left alone")
    destination: Destination = "service"
    node_state: str
    time_to_recover_s: float
    jobs: JobsOutput | None = None
    retired: bool = Field(default=False, description="its capacity ends: kept drained (retired), not returned")


class EndOutput(_Model):
    status: IncidentStatus
    message: str = Field(description="what the on-call is paged with")


__all__ = [
    "DenialInput",
    "DetectInput",
    "DetectOutput",
    "DrainOutput",
    "GateOutput",
    "ApprovalInput",
    "HealthCheckInput",
    "HealthCheckOutput",
    "EndOutput",
    "JobsOutput",
    "RepairInput",
    "RepairOutput",
    "ResumeInput",
    "SpareOutput",
    "ResumeOutput",
    "ShadowInput",
    "ShadowOutput",
    "StageInput",
    "TriggerEvent",
]
