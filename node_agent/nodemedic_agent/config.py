"""The agent's configuration file (TOML), validated at start: a bad file stops the agent with
an error that names the field."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Literal

from nodemedic.contracts.events import CLUSTER_NAME, INSTANCE_ID, NODE_NAME
from nodemedic.contracts.problems import describe
from nodemedic.domain.classification import parse_overrides
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 on older node images
    import tomli as tomllib

DEFAULT_PATH = Path("/etc/nodemedic/agent.toml")


class ConfigError(Exception):
    """The configuration file is missing, not TOML, or has an invalid field."""


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"{path!r} is not an absolute path (the agent runs from /, under systemd)")
    return path


def _url(url: str) -> str:
    if not re.fullmatch(r"https?://[^\s/?#]+(/\S*)?", url):
        raise ValueError(f"{url[:80]!r} is not an http(s) URL")
    return url


def _event_bus(name: str) -> str:
    # PutEvents' EventBusName, as the EventBridge API model gives it (NonPartnerEventBusNameOrArn)
    if not re.fullmatch(r"(arn:aws[\w-]*:events:[a-z]+-[a-z]+-[\w-]+:[0-9]{12}:event-bus/)?[.\-_A-Za-z0-9]+", name):
        raise ValueError(f"{name[:80]!r} is not an event bus name or ARN (the stack output EventBusName)")
    return name


def _whole(value: object) -> object:
    """A count written as a whole float is that count: Helm renders every number of its values
    as a float (``gpus = 8.0`` in the chart's ConfigMap). A fraction or a boolean stays an error."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# a count: an integer (or a whole float), never a boolean or a string
Count = Annotated[int, BeforeValidator(_whole)]
# a path on the node: absolute, so it does not depend on the directory the agent starts in
AbsolutePath = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(_absolute)]
# an AWS endpoint (a VPC endpoint, an emulator in tests): botocore takes only an http(s) URL
EndpointUrl = Annotated[str, Field(max_length=2048), AfterValidator(_url)]


class _Section(BaseModel):
    """Strict: TOML states each value's type, so a value of another type (``gpus = true``,
    ``poll_seconds = "10"``) is a mistake to name, not to convert; NaN and infinity are no
    interval, count or threshold."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class NodeSection(_Section):
    """Who this node is. Discovered (IMDSv2, hostname) when left out."""

    instance_id: str | None = Field(default=None, pattern=INSTANCE_ID)
    slurm_node: str | None = Field(default=None, pattern=NODE_NAME)
    hostname: str | None = Field(default=None, min_length=1, max_length=253)
    instance_type: str | None = Field(default=None, max_length=32,
                                      description="e.g. p5.48xlarge: fail-slow compares a node with peers of its type")


class Intervals(_Section):
    heartbeat_seconds: float = Field(default=15, gt=0, le=300)
    poll_seconds: float = Field(default=10, gt=0, le=3600)
    dedupe_window_seconds: float = Field(default=300, ge=0, le=86400)
    spot_seconds: float = Field(
        default=5, ge=0, le=60, description="on a Spot Instance, read EC2's interruption notice from instance "
                                           "metadata this often (AWS recommends 5 s); 0: never")
    scheduled_events_seconds: float = Field(
        default=300, ge=0, le=3600, description="read EC2's scheduled events for this instance (a retirement, "
                                                "a reboot or a maintenance: posted days ahead) from instance "
                                                "metadata this often, and send them when they change; 0: never")
    scheduled_events_resend_seconds: float = Field(
        default=3600, ge=0, le=86400, description="send active scheduled events again after this though unchanged: "
                                                  "a notice whose delivery the pipeline lost is planned at the next "
                                                  "one (the same event ids: deduplicated); 0: only when they change")
    reassert_seconds: float = Field(
        default=60, ge=0, le=3600, description="send a health event again (same event_id) after this, doubling "
                                               "each time: a delivery the pipeline could not act on is not lost; "
                                               "0: never")
    reasserts: Count = Field(default=3, ge=0, le=10, description="how many times, without "
                                                             "publish.acknowledgements_table; 0: never")
    reassert_within_seconds: float = Field(
        default=86400, ge=0, le=14 * 86400,
        description="with publish.acknowledgements_table: send an event again until the pipeline has "
                    "decided on it, for up to this long after its first send (the wait doubles from "
                    "reassert_seconds up to 15 minutes)")


class Expected(_Section):
    gpus: Count = Field(default=8, ge=0, le=64)
    efa_devices: Count = Field(default=0, ge=0, le=64)


DEFAULT_EFA_RATES = {  # errors per second, sustained for efa_debounce_polls polls: EFA_ERROR_RATE
    "rdma_read_wr_err": 1.0, "rdma_write_wr_err": 1.0, "unresponsive_remote_events": 1.0,
    "impaired_remote_conn_events": 1.0, "retrans_timeout_events": 10.0, "rx_drops": 1000.0,
}


class Thresholds(_Section):
    nvlink_errors_per_poll: Count = Field(default=100, ge=1)
    efa_errors_per_poll: Count = Field(default=100, ge=1, description="a one-poll jump of all EFA error counters "
                                                                     "together: recorded (EFA_HW_ERRORS)")
    efa_error_rates: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_EFA_RATES),
        description="EFA hardware counter -> errors per second; above it for efa_debounce_polls polls "
                    "in a row: EFA_ERROR_RATE")
    efa_debounce_polls: Count = Field(default=3, ge=1, le=100)
    boot_settle_seconds: float = Field(
        default=300, ge=0, le=3600,
        description="NVLINK_DOWN, GPU_FABRIC_NOT_READY, GPU_FABRIC_UNHEALTHY and GPU_FABRIC_DEGRADED are sent only "
                    "once the node has been up this long: until then NVLinks train and Fabric Manager registers the GPUs")
    check_stall_seconds: float = Field(
        default=300, ge=0, le=3600,
        description="a check (or the NVML Xid event wait) that has not returned for this long is CHECK_STALLED: a "
                    "driver call or a file system that hangs; 0: never. Longer than a healthy check may take")

    @field_validator("efa_error_rates")
    @classmethod
    def _known_counters(cls, value: dict[str, float]) -> dict[str, float]:
        from nodemedic_agent.hardware.host import EFA_COUNTERS

        unknown = sorted(set(value) - set(EFA_COUNTERS))
        if unknown:
            raise ValueError(f"unknown EFA counters {unknown}; known: {', '.join(EFA_COUNTERS)}")
        if any(v <= 0 for v in value.values()):
            raise ValueError("every EFA error rate threshold must be > 0")
        return value


class Storage(_Section):
    paths: list[AbsolutePath] = Field(default_factory=lambda: ["/"])
    min_free_percent: float = Field(default=5, ge=0, le=100)
    shared_mounts: list[AbsolutePath] = Field(default_factory=list, description="e.g. the FSx for Lustre mount")
    probe_timeout_seconds: float = Field(default=5, gt=0, le=120)


class KernelLog(_Section):
    source: Literal["kmsg", "journal", "file", "off"] = "kmsg"
    path: AbsolutePath = "/dev/kmsg"
    replay_seconds: float = Field(
        default=3600, ge=0, le=86400,
        description="at start, read the messages written while the agent was down (since boot when it has not "
                    "run in this boot; from a file, the lines after its cursor, dated by their own dates) that are "
                    "younger than this; 0 reads only what comes after the start")


class Hardware(_Section):
    backend: Literal["nvml", "simulated"] = "nvml"
    simulated_dir: AbsolutePath | None = Field(default=None, description="State of the simulated GPUs/EFA/disks")
    sysfs_root: AbsolutePath = "/sys"
    dcgm: bool = Field(default=True, description="Read DCGM health watches when dcgmi is installed")


class Publish(_Section):
    spool_dir: AbsolutePath = "/var/spool/nodemedic-agent"
    spool_max_events: Count = Field(default=10000, ge=10)
    max_backoff_seconds: float = Field(default=30, gt=0, le=600)
    endpoint_url: EndpointUrl | None = Field(default=None, description="EventBridge endpoint (VPC endpoint, tests)")
    acknowledgements_table: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.-]{3,255}$",
        description="the stack output IncidentsTableName: the agent reads there whether the pipeline decided "
                    "on each health event it sent, and sends it again until it has")
    dynamodb_endpoint_url: EndpointUrl | None = Field(default=None, description="DynamoDB endpoint (VPC endpoint, tests)")


class BurnIn(_Section):
    """The burn-in hold (``nodemedic-agent burn-in-hold``, run before slurmd starts)."""

    marker: AbsolutePath = Field(default="/run/nodemedic/burn-in-hold.json",
                                 description="left by the hold for the agent to publish NODE_JOINED; in /run, gone at boot")
    drain_prefix: str = Field(default="nodemedic", pattern=r"^[A-Za-z0-9_-]{1,32}$",
                              description="the stack's DrainReasonPrefix: the pipeline takes over only its own drains")
    scontrol: str = Field(default="scontrol", min_length=1)
    retry_seconds: float = Field(default=120, ge=0, le=3600,
                                 description="retry an unreachable controller this long, then fail (slurmd waits)")


class RelaySection(_Section):
    """``nodemedic-agent relay``, on a Slurm controller SSM Run Command cannot reach (the stack's
    ``SlurmChannel`` is ``relay``: a SageMaker HyperPod cluster)."""

    queue_url: str | None = Field(default=None, max_length=2048, pattern=r"^https://\S+$",
                                  description="the stack output RelayQueueUrl")
    table: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{3,255}$",
                              description="the stack output IncidentsTableName: where each request is recorded")
    sqs_endpoint_url: EndpointUrl | None = Field(default=None, description="SQS endpoint (VPC endpoint, tests)")
    ssm_endpoint_url: EndpointUrl | None = Field(default=None, description="SSM endpoint (VPC endpoint, tests)")


class AgentConfig(_Section):
    cluster: str = Field(pattern=CLUSTER_NAME)
    event_bus: Annotated[str, Field(min_length=1, max_length=1600), AfterValidator(_event_bus)]
    region: str | None = Field(default=None, pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")
    node: NodeSection = Field(default_factory=NodeSection)
    intervals: Intervals = Field(default_factory=Intervals)
    expected: Expected = Field(default_factory=Expected)
    thresholds: Thresholds = Field(default_factory=Thresholds)
    storage: Storage = Field(default_factory=Storage)
    kernel_log: KernelLog = Field(default_factory=KernelLog)
    hardware: Hardware = Field(default_factory=Hardware)
    publish: Publish = Field(default_factory=Publish)
    burn_in: BurnIn = Field(default_factory=BurnIn)
    relay: RelaySection = Field(default_factory=RelaySection)
    fault_overrides: dict[str, str] = Field(
        default_factory=dict, description='Fault code -> action, e.g. {"XID 74" = "monitor"}; same as the stack\'s')

    @field_validator("fault_overrides")
    @classmethod
    def _known_actions(cls, value: dict[str, str]) -> dict[str, str]:
        import json

        parse_overrides(json.dumps(value))
        return value

    @model_validator(mode="after")
    def _stall_after_the_slowest_healthy_check(self) -> AgentConfig:
        """A check may take this long and be healthy: the DCGM check's dcgmi calls, each to its
        timeout; the storage check, each shared mount's probe to its timeout. Anything shorter
        would call a slow healthy node stalled."""
        from nodemedic_agent.hardware.base import DCGMI_TIMEOUT_S

        limit = self.thresholds.check_stall_seconds
        slowest = max(3 * DCGMI_TIMEOUT_S * self.hardware.dcgm,
                      self.storage.probe_timeout_seconds * len(self.storage.shared_mounts))
        if 0 < limit <= slowest:
            raise ValueError(f"thresholds.check_stall_seconds ({limit:g}) must be longer than a healthy check may take "
                             f"({slowest:g}s: three dcgmi calls of up to {DCGMI_TIMEOUT_S}s each, or each shared mount's "
                             "probe_timeout_seconds); 0 turns it off")
        return self


def parse_config(data: dict[str, object], origin: str = "config") -> AgentConfig:
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {describe(exc, '(top level)', limit=None)}") from None


def load_config(path: Path) -> AgentConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(data, str(path))
