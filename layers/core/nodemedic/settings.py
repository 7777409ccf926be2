"""Runtime settings of the stage Lambdas, from environment variables set by template.yaml."""

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """One model over the environment; read lazily (``settings()``), never at import time."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", env_ignore_empty=True)

    cluster_name: str = Field(min_length=1)
    incidents_table: str = Field(min_length=1)
    autoscaling_group_name: str = Field(min_length=1)
    slurm_controller_instance_id: str = Field(min_length=1)
    drain_reason_prefix: str = Field(default="nodemedic", pattern=r"^[A-Za-z0-9_.-]+$")
    node_join_command: str = Field(min_length=1)
    deep_health_check_command: str = Field(min_length=1)
    fault_action_overrides: str = Field(default="{}", description="JSON: fault code -> action")
    command_timeout_seconds: int = Field(default=120, ge=5, le=3600)
    command_poll_interval_seconds: float = Field(default=1.0, gt=0, le=30)
    safety_policy_parameter: str = Field(default="", description="SSM parameter holding the policy JSON")
    escalation_topic_arn: str = ""
    # silent-node sweeper
    event_bus_name: str = ""
    heartbeat_queue_url: str = ""
    heartbeat_silence_seconds: float = Field(default=45, ge=1, le=3600)
    silence_sweeps_per_invocation: int = Field(default=6, ge=1, le=6)


@lru_cache(maxsize=1)
def settings() -> Settings:
    return Settings()  # type: ignore[call-arg]  # values come from the environment
