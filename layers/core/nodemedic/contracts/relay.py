"""The relay: how the pipeline runs its Slurm documents on a controller that SSM Run Command
cannot reach (a SageMaker HyperPod cluster's: SSM reaches HyperPod nodes only through Session
Manager). A function records a :class:`RelayRequest` in the incident table (``RELAY#<command id>``) and
puts its id on the stack's relay queue (SQS); ``nodemedic-agent relay`` on the controller reads
the record, runs the named document as SSM's agent would (its parameters checked against the
document's ``allowedValues`` / ``allowedPattern``, never shell text), and writes the outcome to it.

Shared by the pipeline (:mod:`nodemedic.providers.relay_command`) and the agent
(``nodemedic_agent.relay``), so both read the same shapes."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RelayStatus = Literal["Pending", "InProgress", "Success", "Failed", "TimedOut"]
RELAY_TERMINAL = frozenset({"Success", "Failed", "TimedOut"})
RELAY_OUTPUT_LIMIT = 24_000  # as SSM's GetCommandInvocation: the first 24,000 characters of stdout
RELAY_STDERR_LIMIT = 8_000


def relay_key(command_id: str) -> str:
    """The incident table's key of a relayed command."""
    return f"RELAY#{command_id}"


class RelayRequest(BaseModel):
    """One document to run on one instance, as recorded by the function that sends it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    instance_id: str = Field(pattern=r"^(i|mi)-[0-9a-f]{8,17}$")
    document: str = Field(pattern=r"^nodemedic-[A-Za-z0-9_-]{1,63}-[a-z-]{1,32}$")
    parameters: dict[str, list[str]] = Field(default_factory=dict, max_length=32)
    timeout_s: int = Field(ge=1, le=3600)
    sent_at: datetime
