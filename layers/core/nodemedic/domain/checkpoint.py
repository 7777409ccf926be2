"""The checkpoint policy: which drains ask the job to checkpoint before it is requeued, how, and
for how long they wait for it (``CHECKPOINT_POLICY``, from the template's ``CheckpointPolicy``).

A drain whose node can still run the job (a planned event, a slow node, a soft fault the
operator lists) signals each job on the node, waits for the job's checkpoint marker up to the
rule's grace, then requeues. A hard fault (the GPU is gone) is requeued at once: nothing on the
node can write a checkpoint any more. The marker is what the job reports when its checkpoint is
durable (Slurm: ``nodemedic-checkpoint=<epoch>`` in the job's comment; Kubernetes: the pod
annotation ``nodemedic.io/checkpointed``), see docs/checkpoints.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from nodemedic.contracts.problems import describe
from nodemedic.errors import PolicyError

MAX_GRACE_SECONDS = 3000  # the Drain state retries CheckpointPendingError for 3,600 s at most


class CheckpointRule(BaseModel):
    """How the jobs of one Slurm partition (Kubernetes: namespace) are asked to checkpoint.

    ``signal``: sent to the job (Slurm ``scancel --signal``; on Kubernetes the annotation is the
    signal); ``scope``: which of its processes get it (``batch``: the batch script, ``steps``: every
    step but the batch script, ``full``: both); ``grace_seconds``: the longest wait for the marker."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    signal: Literal["USR1", "USR2", "TERM", "INT", "HUP", "URG", "CONT"] = "USR1"
    scope: Literal["batch", "steps", "full"] = "batch"
    grace_seconds: int = Field(default=300, ge=0, le=MAX_GRACE_SECONDS)

    def describe(self) -> str:
        return f"SIG{self.signal} to the {self.scope} step(s), up to {self.grace_seconds}s for the marker"


class CheckpointPolicy(BaseModel):
    """``default``: the rule of every partition not listed (None: requeue at once); ``partitions``:
    per partition (namespace), a rule or None (that one is requeued at once); ``fault_classes``:
    the fault classes whose node can still run the job (a hard fault never waits); ``rebalance``:
    ask the jobs on a Spot node to checkpoint when EC2 recommends rebalancing it (nothing drained:
    :mod:`nodemedic.rebalance`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    default: CheckpointRule | None = None
    partitions: dict[str, CheckpointRule | None] = Field(default_factory=dict)
    fault_classes: frozenset[str] = frozenset({"planned", "fail_slow"})
    rebalance: StrictBool = False  # JSON true/false only: "no" or 0 is refused, not read as a bool

    def rule(self, partition: str) -> CheckpointRule | None:
        """The rule for a job of ``partition`` (a job in several: the first one listed)."""
        for name in partition.split(","):
            if name in self.partitions:
                return self.partitions[name]
        return self.default

    @property
    def enabled(self) -> bool:
        return self.default is not None or any(self.partitions.values())


def parse_checkpoint_policy(text: str) -> CheckpointPolicy:
    try:
        return CheckpointPolicy.model_validate_json(text or "{}")
    except ValidationError as exc:
        raise PolicyError(f"invalid checkpoint policy (CHECKPOINT_POLICY): {describe(exc, 'policy')}") from exc


def work_since(marker: float | None, started_at: float | None, until: float) -> float:
    """Seconds of the job's work from its last checkpoint ``marker`` (from its start when it has
    none) to ``until``; never negative. The work a new checkpoint saved is the work from the
    previous marker to the new one: both are the job's own clock, so a skewed node clock does
    not change that figure."""
    origin = marker if marker is not None else started_at
    return 0.0 if origin is None else max(0.0, until - origin)
