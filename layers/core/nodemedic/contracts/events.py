"""The inputs that start a remediation: agent health events, CloudWatch alarms, SageMaker
HyperPod's node health events, runbook requests.

Every input reaches the state machine as an EventBridge event (``source``, ``detail-type``,
``detail``); operators who start an execution by hand send the same envelope. The ``source``
field selects the model.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

AGENT_SOURCE = "nodemedic.agent"
SWEEPER_SOURCE = "nodemedic.sweeper"
# the burn-in of a node held for one that nobody checks; a fault the cooldown held, offered again
RECONCILER_SOURCE = "nodemedic.reconciler"
# the reconciler's: a Slurm node has lost its instance to EC2 (a Spot termination, its group's health
# check, an operator) and no instance backs it (joined anew)
INSTANCE_LOST = "INSTANCE_LOST"
# an AWS Health scheduled change or a Capacity Block's end, one event per affected node
PLANNED_SOURCE = "nodemedic.planned"
HEALTH_DETAIL_TYPE = "Node Health Event"
HEARTBEAT_DETAIL_TYPE = "Node Heartbeat"
OPERATOR_SOURCE = "nodemedic.operator"
RUNBOOK_DETAIL_TYPE = "Remediation Request"
# Detect records its decision on every event it decided on under this key (the ledger's partition
# key): a redelivery of an event it acted on changes nothing, and an agent reads whether the
# pipeline took its event (AgentPublishPolicy allows GetItem on EVENT#nodemedic.agent/* only).
ACKNOWLEDGEMENT_PREFIX = "EVENT#"


def acknowledgement_key(source: str, event_id: str) -> str:
    """The ledger item holding Detect's decision on event ``event_id`` from ``source``."""
    return f"{ACKNOWLEDGEMENT_PREFIX}{source}/{event_id}"

SCHEMA_VERSION = "1"
MAX_EVIDENCE_BYTES = 4096
MAX_CLOCK_SKEW = timedelta(minutes=5)
# what the agent says its node runs, in every event's evidence: the safety gate names the values
# many failing nodes share (a rollout). Longer than SOFTWARE_VERSION_MAX is no version
SOFTWARE_KEYS = ("gpu_driver", "kernel")
SOFTWARE_VERSION_MAX = 64

INSTANCE_ID = r"^i-[0-9a-f]{8,17}$"
NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"  # a Kubernetes node name is a DNS subdomain (253)
CLUSTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
FAULT_CODE = r"^[A-Z][A-Z0-9_]*( [0-9]{1,5})?$"  # "XID 79", "SXID 12028", "ECC_DBE"
EVENT_ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"  # a UUID, or another printable id
EARLIEST, LATEST = datetime(2020, 1, 1, tzinfo=timezone.utc), datetime(2100, 1, 1, tzinfo=timezone.utc)


_NUMBER = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*")


def _iso_text(value: object) -> object:
    """A timestamp is an ISO 8601 string: no epoch numbers, no other types coerced. Pydantic reads
    a number, and a string of digits too, as Unix time: neither is taken."""
    if isinstance(value, datetime):  # built in Python (the agent, boto3's answers, the tests): already a timestamp
        return value
    if not isinstance(value, str) or len(value) > 40 or _NUMBER.fullmatch(value):
        raise ValueError("must be an ISO 8601 date-time string with a time zone")
    return value


def _plausible(value: datetime) -> datetime:
    """A date no real fault has: a garbled or forged event (a node whose clock is merely off is
    corrected against the bus's time by Detect, see nodemedic.domain.freshness)."""
    if not EARLIEST <= value < LATEST:
        raise ValueError(f"{value.isoformat()} is not a plausible time (before {EARLIEST.year} or after {LATEST.year})")
    return value


Timestamp = Annotated[AwareDatetime, BeforeValidator(_iso_text), AfterValidator(_plausible)]


def clip(limit: int) -> BeforeValidator:
    """AWS's free text that NodeMedic only shows (a reason, a recommendation): a longer one than
    expected is cut, never a reason to refuse AWS's event and leave its node unremediated."""
    return BeforeValidator(lambda value: value[:limit] if isinstance(value, str) else value)


Check = Literal["nvml", "dcgm", "kernel_log", "efa", "storage", "heartbeat", "ec2_status", "manual", "burn_in",
                "fail_slow", "aws_health", "capacity_block", "ec2_scheduled_event", "spot_interruption",
                "reservation_interruption", "recheck"]
Severity = Literal["info", "warning", "error", "critical"]
# JSON has no NaN or infinity (RFC 8259, section 6): EventBridge refuses a Detail that holds one
EvidenceValue = str | int | Annotated[float, Field(allow_inf_nan=False)] | bool | None
MAX_COUNT = 1_000_000  # occurrences one event may say it folds


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeIdentity(_Strict):
    """Who the node is, in every system that names it."""

    instance_id: str = Field(pattern=INSTANCE_ID, description="EC2 instance id")
    hostname: str = Field(min_length=1, max_length=253)
    slurm_node: str | None = Field(default=None, pattern=NODE_NAME,
                                   description="the node's name in its scheduler: Slurm NodeName, or Kubernetes node name")
    k8s_node: str | None = Field(default=None, pattern=NODE_NAME,
                                 description="Kubernetes node name (read where slurm_node is absent)")
    hyperpod_node_id: str | None = Field(default=None, max_length=256)


class Component(_Strict):
    """The part of the node that failed: a GPU, a NIC, a disk, a file system or the node."""

    kind: Literal["gpu", "nic", "disk", "filesystem", "node"]
    index: StrictInt | None = Field(default=None, ge=0, le=255)
    uuid: str | None = Field(default=None, max_length=128)
    name: Annotated[str, clip(256)] | None = None  # a device, a mount point, a link: shown, so a longer one is cut


class NodeHealthEvent(_Strict):
    """Node Health Event v1: what the agent on a GPU node publishes (``detail`` of the event)."""

    schema_version: Literal["1"] = Field(description="Contract version; only '1' exists")
    event_id: str = Field(pattern=EVENT_ID, description="Unique per event: a redelivery of it is deduplicated")
    cluster: str = Field(pattern=CLUSTER_NAME)
    node: NodeIdentity
    check: Check = Field(description="The check that saw the fault")
    component: Component | None = None
    fault_code: str = Field(pattern=FAULT_CODE, max_length=48, description="e.g. 'XID 79', 'ECC_DBE', 'GPU_LOST'")
    severity: Severity
    observed_at: Timestamp = Field(description="When the fault happened (kernel log / NVML), node clock")
    sent_at: Timestamp = Field(description="When the agent sent the event, node clock")
    count: StrictInt = Field(default=1, ge=1, le=MAX_COUNT, description="Occurrences folded into this event")
    evidence: dict[str, EvidenceValue] = Field(
        default_factory=dict, description=f"Raw facts; at most {MAX_EVIDENCE_BYTES} bytes as JSON"
    )

    @field_validator("evidence")
    @classmethod
    def _evidence_fits(cls, value: dict[str, EvidenceValue]) -> dict[str, EvidenceValue]:
        size = len(json.dumps(value, separators=(",", ":")).encode())
        if size > MAX_EVIDENCE_BYTES:
            raise ValueError(f"evidence is {size} bytes; the limit is {MAX_EVIDENCE_BYTES}")
        return value

    @model_validator(mode="after")
    def _observed_before_sent(self) -> NodeHealthEvent:
        if self.observed_at - self.sent_at > MAX_CLOCK_SKEW:
            raise ValueError("observed_at is later than sent_at by more than the allowed clock skew")
        return self


class PerfSample(_Strict):
    """What a heartbeat says about the node's speed; the sweeper compares it with the node's peers
    (fail-slow, :mod:`nodemedic.domain.fail_slow`)."""

    sm_clock_ratio: StrictFloat | StrictInt = Field(ge=0, le=2, description="Slowest GPU: SM clock / its max SM clock")
    utilization_pct: StrictFloat | StrictInt = Field(ge=0, le=100, description="Mean GPU utilization")
    slowest_gpu: StrictInt | None = Field(default=None, ge=0, le=255)
    instance_type: str = Field(default="", max_length=32, description="Peers are nodes of the same type")


class NodeHeartbeat(_Strict):
    """Node Heartbeat v1 (``detail``): the agent is alive. The cloud side turns silence into a
    ``HEARTBEAT_MISSING`` health event (source ``nodemedic.sweeper``)."""

    schema_version: Literal["1"]
    cluster: str = Field(pattern=CLUSTER_NAME)
    node: NodeIdentity
    sent_at: Timestamp
    status: Literal["running", "stopping"] = Field(
        default="running", description="'stopping' on a clean shutdown: stop watching this node")
    interval_seconds: StrictFloat | StrictInt = Field(gt=0, le=3600, description="When the next heartbeat is due")
    agent_version: str = Field(default="", max_length=32)
    perf: PerfSample | None = Field(default=None, description="The node's speed now (busy GPUs only count)")


RunbookAction = Literal["replace", "reboot"]


# an operator's reason, wherever one is given (a runbook start, the CLI's --reason): it may reach a
# Slurm drain reason through a Run Command document's parameter, which takes no quote or shell character
REASON_MAX = 200
REASON = r"^[^\x00-\x1f'\"`$\\]+$"
OPERATOR_MAX = 128


class RemediationRequest(_Strict):
    """An operator's request to remediate a node by hand (``detail`` of a runbook start)."""

    schema_version: Literal["1"]
    cluster: str = Field(pattern=CLUSTER_NAME)
    slurm_node: str | None = Field(default=None, pattern=NODE_NAME)
    instance_id: str | None = Field(default=None, pattern=INSTANCE_ID)
    action: RunbookAction
    reason: str = Field(min_length=3, max_length=REASON_MAX, pattern=REASON)
    requested_by: str = Field(min_length=1, max_length=OPERATOR_MAX)
    observed_at: Timestamp | None = Field(
        default=None, description="When the operator saw the fault; defaults to the request time"
    )

    @model_validator(mode="after")
    def _names_a_node(self) -> RemediationRequest:
        if not (self.slurm_node or self.instance_id):
            raise ValueError("a remediation request names slurm_node or instance_id")
        return self


class AlarmState(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    value: Literal["ALARM", "OK", "INSUFFICIENT_DATA"]
    timestamp: Timestamp
    reason: str = ""


class AlarmMetric(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    namespace: str = ""
    name: str = ""
    dimensions: dict[str, str] = Field(default_factory=dict)


class AlarmMetricStat(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    metric: AlarmMetric


class AlarmMetricQuery(BaseModel):
    """One of an alarm's metrics: a metric (``metricStat``) or metric math (``expression``, no
    metric of its own)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    metricStat: AlarmMetricStat | None = None  # noqa: N815 - AWS's field name


class AlarmConfiguration(BaseModel):
    """A metric alarm's ``configuration`` (a composite alarm's has an ``alarmRule`` and no metrics).
    Shape: CloudWatch user guide, "Alarm events and EventBridge"."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    metrics: list[AlarmMetricQuery] = Field(default_factory=list)


class AlarmDetail(BaseModel):
    """The part of a CloudWatch ``Alarm State Change`` event that NodeMedic reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    alarmName: str = Field(min_length=1)  # noqa: N815 - AWS's field name
    state: AlarmState
    configuration: AlarmConfiguration = Field(default_factory=AlarmConfiguration)

    def _metrics(self) -> list[AlarmMetric]:
        return [m.metricStat.metric for m in self.configuration.metrics if m.metricStat]

    def metric_dimension(self, name: str) -> str | None:
        """The value of a dimension of the alarm's metric (first metric that has it)."""
        return next((m.dimensions[name] for m in self._metrics() if name in m.dimensions), None)

    def dimension_values(self, name: str) -> set[str]:
        """Every value a dimension has across the alarm's metrics (metric math may watch several)."""
        return {m.dimensions[name] for m in self._metrics() if name in m.dimensions}

    def metric_name(self) -> str | None:
        return next((m.name for m in self._metrics() if m.name), None)


class HyperPodHealthSummary(BaseModel):
    """HMA's verdict on a node. ``RepairAction`` is what HyperPod itself does about it (``None``
    where the cluster's NodeRecovery is not Automatic); ``Recommendation`` is its advice."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    HealthStatus: str = Field(min_length=1, max_length=64)  # noqa: N815 - AWS's field names
    HealthStatusReason: Annotated[str, clip(1024)] = ""  # noqa: N815
    RepairAction: str = Field(default="None", max_length=64)  # noqa: N815
    Recommendation: Annotated[str, clip(1024)] = ""  # noqa: N815


class HyperPodNodeHealth(BaseModel):
    """The part of a ``SageMaker HyperPod Cluster Node Health Event`` that NodeMedic reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    ClusterName: str = Field(pattern=CLUSTER_NAME)  # noqa: N815 - AWS's field names
    InstanceId: str = Field(pattern=INSTANCE_ID)  # noqa: N815
    HealthSummary: HyperPodHealthSummary  # noqa: N815


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    # EventBridge's ids are UUIDs; a runbook's hand-made envelope may hold anything, and the id
    # becomes part of a ledger key (DynamoDB: a partition key of at most 2048 bytes)
    id: str | None = Field(default=None, min_length=1, max_length=128)
    # EventBridge's clock, but PutEvents lets the sender set it (PutEventsRequestEntry ``Time``):
    # an aware time of the years a fault may have, as the detail's; one of year 9999 overflowed
    # Detect's arithmetic
    time: Timestamp | None = None


class HealthEventEnvelope(_Envelope):
    source: Literal["nodemedic.agent", "nodemedic.sweeper", "nodemedic.planned", "nodemedic.reconciler"]
    detail_type: Literal["Node Health Event"] = Field(alias="detail-type")
    detail: NodeHealthEvent


class AlarmEnvelope(_Envelope):
    source: Literal["aws.cloudwatch"]
    detail_type: Literal["CloudWatch Alarm State Change"] = Field(alias="detail-type")
    detail: AlarmDetail


class HyperPodNodeHealthEnvelope(_Envelope):
    """HyperPod's Health Monitoring Agent (HMA) on a node it finds unhealthy, to the default bus
    (SageMaker developer guide, "Events that Amazon SageMaker AI sends to Amazon EventBridge")."""

    source: Literal["aws.sagemaker"]
    detail_type: Literal["SageMaker HyperPod Cluster Node Health Event"] = Field(alias="detail-type")
    time: Timestamp  # when HyperPod found it: the event names no other time
    detail: HyperPodNodeHealth


class RunbookEnvelope(_Envelope):
    source: Literal["nodemedic.operator"]
    detail_type: Literal["Remediation Request"] = Field(alias="detail-type")
    detail: RemediationRequest


TriggerEvent = Annotated[
    HealthEventEnvelope | AlarmEnvelope | HyperPodNodeHealthEnvelope | RunbookEnvelope, Field(discriminator="source")
]

