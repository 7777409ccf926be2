"""Runtime settings of the stage Lambdas, from environment variables set by template.yaml."""

from functools import lru_cache
from typing import Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """One model over the environment; read lazily (``settings()``), never at import time."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", env_ignore_empty=True)

    cluster_name: str = Field(min_length=1)
    incidents_table: str = Field(min_length=1)
    provider: Literal["autoscaling", "ec2", "hyperpod", "karpenter"] = "autoscaling"
    autoscaling_group_name: str = ""
    hyperpod_cluster_name: str = ""
    karpenter_node_pool: str = Field(default="", description="PROVIDER=karpenter: the NodePool of the GPU nodes")
    orchestrator: Literal["slurm", "kubernetes"] = "slurm"
    slurm_controller_instance_id: str = Field(default="", description="ORCHESTRATOR=slurm: runs slurmctld")
    slurm_channel: Literal["ssm", "relay"] = Field(
        default="ssm", description="how the controller's documents reach it: SSM Run Command, or the relay queue "
                                   "(nodemedic-agent relay on the controller: HyperPod, whose nodes SSM cannot reach)")
    relay_queue_url: str = Field(default="", description="SLURM_CHANNEL=relay: the relay queue")
    eks_cluster_name: str = Field(default="", description="ORCHESTRATOR=kubernetes: the EKS cluster")
    kubernetes_drain_policy: str = Field(default="{}", description="JSON: how each namespace's pods leave a node")
    checkpoint_policy: str = Field(default="{}", description="JSON: which drains checkpoint the jobs first")
    drain_reason_prefix: str = Field(default="nodemedic", pattern=r"^[A-Za-z0-9_.-]+$")
    spare_reservation: str = Field(default="nodemedic_spares", pattern=r"^[A-Za-z0-9_.-]+$")
    hot_spares: int = Field(default=0, ge=0, le=1000, description="target size of the hot-spare pool")
    job_start_wait_seconds: float = Field(default=60, ge=0, le=600)
    fault_action_overrides: str = Field(default="{}", description="JSON: fault code -> action")
    max_event_age_seconds: int = Field(default=3600, ge=60, le=14 * 86400,
                                       description="older events (redeliveries, replays) are rejected as stale")
    unknown_node_page_minutes: int = Field(default=15, ge=1, le=1440,
                                           description="events naming unknown nodes page once per this window")
    command_timeout_seconds: int = Field(default=120, ge=5, le=3600)
    health_check_timeout_seconds: int = Field(
        default=1200, ge=10, le=86400, description="a rung's deep check must answer within this (boot included)")
    command_poll_interval_seconds: float = Field(default=1.0, gt=0, le=30)
    safety_policy_parameter: str = Field(default="", description="SSM parameter holding the policy JSON")
    escalation_topic_arn: str = ""
    state_machine_arn: str = Field(default="", description="the reconciler: whose executions it checks")
    # silent-node sweeper
    event_bus_name: str = ""
    heartbeat_queue_url: str = ""
    heartbeat_silence_seconds: float = Field(default=45, ge=1, le=3600)
    planned_lead_time_hours: float = Field(
        default=0, ge=0, le=720, description="act on a planned event this long before its deadline; 0: at once")
    planned_sweep_minutes: int = Field(
        default=60, ge=5, le=60, description="the planned-events sweep's period (its schedule in the template)")
    silence_sweeps_per_invocation: int = Field(default=6, ge=1, le=6)
    fail_slow_percent: float = Field(default=10, gt=0, lt=100, description="this much under the peers' median: slow")
    fail_slow_samples: int = Field(default=8, ge=2, le=10, description="for this many heartbeats in a row")

    @model_validator(mode="after")
    def _provider_named(self) -> Self:
        if self.provider == "autoscaling" and not self.autoscaling_group_name:
            raise ValueError("PROVIDER=autoscaling needs AUTOSCALING_GROUP_NAME")
        if self.provider == "hyperpod" and not self.hyperpod_cluster_name:
            raise ValueError("PROVIDER=hyperpod needs HYPERPOD_CLUSTER_NAME")
        if self.provider == "karpenter" and not (self.karpenter_node_pool and self.orchestrator == "kubernetes"):
            raise ValueError("PROVIDER=karpenter needs KARPENTER_NODE_POOL and ORCHESTRATOR=kubernetes")
        if self.orchestrator == "slurm" and not self.slurm_controller_instance_id:
            raise ValueError("ORCHESTRATOR=slurm needs SLURM_CONTROLLER_INSTANCE_ID")
        if self.slurm_channel == "relay" and not self.relay_queue_url:
            raise ValueError("SLURM_CHANNEL=relay needs RELAY_QUEUE_URL")
        if self.orchestrator == "kubernetes" and not self.eks_cluster_name:
            raise ValueError("ORCHESTRATOR=kubernetes needs EKS_CLUSTER_NAME")
        return self


@lru_cache(maxsize=1)
def settings() -> Settings:
    return Settings()  # values come from the environment
