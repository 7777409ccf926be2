"""The capacity provider's read side in memory: which instance backs which node, and where it
runs (its topology). What the stages that only look members up need."""

from __future__ import annotations

from nodemedic.providers.base import Member


class MemoryProvider:
    kind = "memory"
    knows_new_instances = True

    def __init__(self, *members: Member) -> None:
        self.by_id = {m.instance_id: m for m in members}

    def member(self, instance_id: str) -> Member | None:
        return self.by_id.get(instance_id)

    def member_by_node(self, slurm_node: str) -> Member | None:
        return next((m for m in self.by_id.values() if m.slurm_node == slurm_node), None)

    def members(self) -> list[Member]:
        return list(self.by_id.values())

    def size(self) -> int:
        return len(self.by_id)
