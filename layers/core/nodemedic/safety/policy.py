"""The safety policy of one cluster: what automation may do, and when it must stop.

It is one JSON document in SSM Parameter Store (``SafetyPolicyParameter`` in template.yaml,
seeded from the template's parameters). Operators change it with ``aws ssm put-parameter``;
the gate reads it at most every ``POLICY_CACHE_SECONDS``. An invalid document is never half
applied: the gate holds the incident and names the bad field.
"""

from __future__ import annotations

import fnmatch
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nodemedic.contracts.problems import describe, read_json
from nodemedic.errors import PolicyError

Mode = Literal["automatic", "dry_run", "approval"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Breaker(_Section):
    """Stop every destructive action when too many nodes are under remediation."""

    max_percent: float = Field(default=10, gt=0, le=100,
                               description="of the cluster's nodes, remediated within the window")
    max_nodes: int = Field(default=8, ge=1, description="absolute cap; the smaller limit wins")
    window_minutes: float = Field(default=60, gt=0, le=7 * 24 * 60)
    planned_percent: float = Field(
        default=50, gt=0, le=100, description="of the limit, what planned work (AWS maintenance acted on before "
                                              "AWS acts) may take within the window, at least one node; the "
                                              "rest stays for faults")


# the most incidents the lemon rule may count: a lineage keeps only its newest ones (store.control)
MAX_LEMON_INCIDENTS = 100


class Lemon(_Section):
    """A node slot (or EC2 host) with this many incidents in the window is quarantined."""

    incidents: int = Field(default=3, ge=2, le=MAX_LEMON_INCIDENTS)
    window_hours: float = Field(default=72, gt=0, le=90 * 24)


class Exclusions(_Section):
    """Nodes automation never touches: Slurm node names or globs, and an instance tag."""

    nodes: list[str] = Field(default_factory=list, description="e.g. ['gpu-7', 'login-*']")
    tag_key: str = Field(default="nodemedic:exclude", min_length=1,
                         description="an instance with this tag set to 'true' is excluded")

    def excludes(self, slurm_node: str, tags: dict[str, str]) -> str | None:
        """Why the node is excluded, or None."""
        for pattern in self.nodes:
            if fnmatch.fnmatchcase(slurm_node, pattern):
                return f"{slurm_node} matches exclusion {pattern!r}"
        if tags.get(self.tag_key, "").lower() == "true":
            return f"instance tag {self.tag_key}=true"
        return None


class SafetyPolicy(_Section):
    mode: Mode = Field(default="automatic", description="dry_run: record only; approval: ask first")
    breaker: Breaker = Field(default_factory=Breaker)
    max_concurrent: int = Field(default=4, ge=1, description="remediations in progress at once")
    node_cooldown_minutes: float = Field(default=30, ge=0,
                                         description="no new remediation of a node within this")
    lemon: Lemon = Field(default_factory=Lemon)
    corroboration_minutes: float = Field(
        default=10, ge=0, description="how recent an independent second signal must be")
    exclusions: Exclusions = Field(default_factory=Exclusions)

    def breaker_limit(self, cluster_size: int) -> int:
        """Most nodes the window may hold before the breaker trips (at least one)."""
        by_share = int(cluster_size * self.breaker.max_percent / 100)
        return max(1, min(self.breaker.max_nodes, by_share))


def parse_policy(text: str, origin: str = "safety policy") -> SafetyPolicy:
    """Validate a policy document; a bad one raises :class:`PolicyError` naming the fields."""
    try:
        data = read_json(text or "{}")
    except json.JSONDecodeError as exc:
        raise PolicyError(f"{origin} is not JSON: {exc}") from exc
    try:
        return SafetyPolicy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(f"{origin} is invalid: {describe(exc, 'policy')}") from exc
