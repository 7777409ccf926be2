"""The interface every capacity provider implements (Auto Scaling today; EC2, HyperPod later)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

SLURM_NODE_TAG = "nodemedic:slurm-node"


@dataclass(frozen=True)
class Member:
    """An instance that belongs to the cluster, and the Slurm node it backs."""

    instance_id: str
    slurm_node: str | None
    state: str


class Provider(Protocol):
    def member(self, instance_id: str) -> Member | None:
        """The instance if it belongs to the cluster, else None."""
        ...

    def member_by_node(self, slurm_node: str) -> Member | None: ...

    def start_replacement(self, instance_id: str) -> bool:
        """Ask for a replacement of ``instance_id``; False if it was already on its way out."""
        ...

    def replacement_candidates(self, exclude: str) -> list[str]:
        """In-service instances that back no Slurm node yet, oldest first."""
        ...

    def assign_node(self, instance_id: str, slurm_node: str) -> None: ...

    def reboot(self, instance_id: str) -> None: ...
