"""Input and output of each stage Lambda. Handlers validate input here and return ``model_dump``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from nodemedic.contracts.events import TriggerEvent
from nodemedic.contracts.incident import IncidentRef


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


class StageInput(_Model):
    incident: IncidentRef


GateVerdict = Literal["proceed", "verify", "quarantine", "hold", "dry_run"]


class GateOutput(_Model):
    """What the safety gate decided, and every rule it evaluated on the way."""

    verdict: GateVerdict
    reason: str
    rules: list[dict[str, str]] = Field(description="[{rule, result, detail}] in evaluation order")
    needs_approval: bool = Field(default=False, description="an operator approves before replace/reboot")
    notify: str = Field(default="", description="a notification the state machine publishes, if any")
    would: str = Field(default="", description="dry run: the verdict automation would have reached")


class DrainOutput(_Model):
    slurm_node: str
    drained_by_pipeline: bool = Field(description="False when an operator had drained it first")
    requeued_jobs: list[str]
    jobs_not_requeued: list[str]


class ReplaceOutput(_Model):
    action: Literal["replace", "reboot"]
    old_instance_id: str
    instance_id: str = Field(description="The instance now backing the Slurm node")


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


class HealthCheckInput(_Model):
    incident: IncidentRef
    instance_id: str
    purpose: Literal["recovery", "verify"] = Field(
        default="recovery", description="verify: check an ambiguous fault before acting; never raises")


class HealthCheckOutput(_Model):
    instance_id: str
    healthy: bool
    checks: list[dict[str, object]]


class ResumeOutput(_Model):
    slurm_node: str
    resumed: bool = Field(description="False when the drain was an operator's: it is left alone")
    node_state: str
    time_to_recover_s: float


__all__ = [
    "DenialInput",
    "DetectInput",
    "DetectOutput",
    "DrainOutput",
    "GateOutput",
    "ApprovalInput",
    "HealthCheckInput",
    "HealthCheckOutput",
    "ReplaceOutput",
    "ResumeOutput",
    "ShadowInput",
    "ShadowOutput",
    "StageInput",
    "TriggerEvent",
]
