"""Members named by the orchestrator instead of by the ``nodemedic:slurm-node`` tag.

On Slurm an instance's node name is the tag NodeMedic's provisioning puts on it. On Kubernetes the
kubelet names its node and the node's ``spec.providerID`` names the instance, so the orchestrator
is the directory: :class:`NamedByOrchestrator` asks it, and leaves everything else (membership,
size, reboot, replace) to the capacity provider it wraps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from nodemedic.providers.base import Member, Provider, ReplaceStep


class NodeDirectory(Protocol):
    def instance_of(self, node: str) -> str | None:
        """The instance behind ``node``; None when there is no such node."""
        ...

    def node_of(self, instance_id: str) -> str | None:
        """The node ``instance_id`` backs; None when none does."""
        ...

    def node_names(self) -> dict[str, str]:
        """Each instance's node (instance id -> node name), in one read."""
        ...

    def registered_before(self, moment: datetime) -> set[str]:
        """The instances whose nodes registered before ``moment``."""
        ...


class NamedByOrchestrator:
    """:class:`~nodemedic.providers.base.Provider` whose members carry the orchestrator's node name."""

    def __init__(self, inner: Provider, directory: NodeDirectory) -> None:
        self._inner = inner
        self._directory = directory
        self.kind = inner.kind
        self.knows_new_instances = inner.knows_new_instances

    def member(self, instance_id: str) -> Member | None:
        member = self._inner.member(instance_id)
        if member is None:
            return None
        return dataclasses.replace(member, slurm_node=self._directory.node_of(instance_id))

    def member_by_node(self, slurm_node: str) -> Member | None:
        instance = self._directory.instance_of(slurm_node)
        return self.member(instance) if instance else None

    def members(self) -> list[Member]:
        names = self._directory.node_names()
        return [dataclasses.replace(m, slurm_node=names.get(m.instance_id)) for m in self._inner.members()]

    def size(self) -> int:
        return self._inner.size()

    def reboot(self, instance_ids: list[str]) -> None:
        self._inner.reboot(instance_ids)

    def replace(self, instance_id: str, slurm_node: str, progress: dict[str, Any],
                claim: Callable[[str], bool]) -> ReplaceStep:
        """The provider's replacement, except that an instance that already served as a node
        before the replacement was asked for is never taken for it: on Slurm an instance backing a
        node carries the node tag, here nothing marks it but its node, which a healthy peer has. A
        provider that tells new instances by their launch (HyperPod, Karpenter) needs no such
        check; a node's creation time, kept to the second, would only blur its answer."""
        if self._inner.knows_new_instances:
            return self._inner.replace(instance_id, slurm_node, progress, claim)
        since = datetime.fromisoformat(progress["requested_at"]) if progress.get("requested_at") else datetime.now(UTC)
        served = self._directory.registered_before(since)  # one read of the nodes per step

        def new_and_claimed(candidate: str) -> bool:
            return candidate not in served and claim(candidate)

        return self._inner.replace(instance_id, slurm_node, progress, new_and_claimed)
