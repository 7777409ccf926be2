"""The interface every orchestrator adapter implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

# Slurm's node state flags (scontrol(1), "NODE STATE") under which a node cannot take a job now:
# powered down or powering (a cloud node to be launched), a reboot pending, registered with less
# than configured (a GPU missing), in a maintenance reservation, its network counters in use; and
# drained, down, unanswering or failing. The Kubernetes adapter speaks the same words.
UNREADY = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "NOT_RESPONDING", "FAIL", "POWER_DOWN", "POWERED_DOWN",
                     "POWERING_DOWN", "POWERING_UP", "REBOOT_REQUESTED", "REBOOT_ISSUED", "INVALID_REG",
                     "MAINTENANCE", "PERFCTRS"})
SERVING = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})


@dataclass(frozen=True)
class NodeStatus:
    name: str
    state: str  # e.g. "IDLE+DRAIN", "MIXED", "DOWN*+DRAIN"
    reason: str  # "" when none

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state

    @property
    def serving(self) -> bool:
        """In service: it runs jobs or can take one now."""
        flags = set(self.state.split("+"))
        return bool(flags & SERVING) and not flags & UNREADY

    def drained_by(self, owner: str) -> bool:
        """True when the node is drained with a reason that starts with ``owner``'s tag."""
        return self.drained and (self.reason == owner or self.reason.startswith(f"{owner} "))


@dataclass(frozen=True)
class EvacuationResult:
    requeued: list[str]
    not_requeued: list[str]
    job_nodes: dict[str, list[str]] = field(default_factory=dict)  # each requeued job's nodes then
    pending: list[str] = field(default_factory=list)  # still leaving (Kubernetes: a budget, a wait): call again
    # Kubernetes: each requeued workload's live pods before its evictions; restarted, it runs as many again
    job_members: dict[str, int] = field(default_factory=dict)
    # the node was no longer drained (cordoned) when the requeue came, so none was: someone returned
    # it to service meanwhile (e.g. during a checkpoint wait); its state, read by the same command
    not_drained: str = ""


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # RUNNING, PENDING, ... or GONE when the scheduler no longer knows it
    started_at: float | None  # epoch seconds of the current run's start, when it has one
    members: int | None = None  # Kubernetes: its live pods; None where the scheduler runs a job as one (Slurm)


@dataclass(frozen=True)
class RunningJob:
    """A job running on a node, and its checkpoint marker."""

    job_id: str
    group: str  # Slurm: its partition(s); Kubernetes: its namespace (the checkpoint policy's key)
    started_at: float | None  # epoch seconds of its current run's start
    marker: float | None  # epoch of the last checkpoint it reported (its own clock), None if never
    now: float  # the cluster's clock when this was read: work since the marker is measured on it


class Orchestrator(Protocol):
    def node_status(self, node: str) -> NodeStatus: ...

    def nodes(self) -> list[NodeStatus]:
        """Every node the scheduler knows."""
        ...

    def drain(self, node: str, reason: str, takeover: str = "-") -> bool:
        """Drain ``node`` with ``reason`` unless another drain is there whose reason does not start
        with ``takeover`` (``-``: none is taken over), in one scheduler operation. True when the
        node is drained with ``reason`` now."""
        ...

    def evacuate(self, node: str, started_at: float | None = None) -> EvacuationResult:
        """Requeue the jobs running on ``node`` and make them eligible to start at once, only while
        it is drained (checked by the same command: else nothing is requeued, ``not_drained``). What
        cannot leave yet is ``pending``: the caller calls again (``started_at``: the drain's start,
        epoch seconds, from which a scheduler's eviction timeouts count). Where the scheduler can
        tell (Slurm: the requeue commands sent since ``started_at``), a later call for the same
        drain also reports the jobs an earlier one requeued, whose answer may have been lost."""
        ...

    def busy(self, node: str) -> str | None:
        """Why no destructive step may touch ``node`` right now (a job runs there, or it is not
        drained); None when it may. One scheduler read, made right before the step."""
        ...

    def jobs_on(self, node: str) -> list[str]:
        """Ids of the jobs running (or completing) on ``node``; reads only."""
        ...

    def running_jobs(self, node: str) -> list[RunningJob]:
        """The jobs running on ``node``, each with its last checkpoint marker; reads only."""
        ...

    def request_checkpoint(self, node: str, job_ids: list[str], signal: str, scope: str) -> list[str]:
        """Ask each job to checkpoint (Slurm: ``signal`` to its ``scope`` step(s); Kubernetes: the
        annotation on its pods on ``node``). The ids of the jobs that could not be asked."""
        ...

    def resume(self, node: str, owner: str = "*") -> bool:
        """Lift the drain if ``owner`` set it (``*``: any), in one scheduler operation."""
        ...

    def job_states(self, job_ids: list[str]) -> dict[str, JobState]: ...

    def spares(self) -> list[NodeStatus]:
        """The hot-spare pool: nodes held out of general scheduling, ready to take a job."""
        ...

    def take_spare(self, node: str) -> None: ...

    def adopt(self, node: str, instance_id: str, reason: str, since: float | None = None) -> str | None:
        """The node the replacement ``instance_id`` of ``node`` serves as, drained with ``reason``
        (held out until its check passes); None while it has not joined yet. Slurm: it joins under
        ``node``'s own name; Kubernetes: it registers under a name of its own (its providerID).
        ``since``: when this replacement began (epoch seconds), so that a retry can tell what it
        already did from what an earlier replacement did."""
        ...

    def add_spare(self, node: str, owner: str) -> bool: ...

    def pause_gpu_clients(self, node: str, owner: str) -> str | None:
        """Before a GPU reset: stop what holds ``node``'s GPUs open outside any job, recorded as
        ``owner``'s; None once nothing does, else what is still there (call again). Slurm: None
        (the reset command stops the host's services itself). Kubernetes: the GPU operator's
        components and NVML clients, paused through their deploy labels."""
        ...

    def resume_gpu_clients(self, node: str, owner: str = "*") -> bool:
        """Undo ``owner``'s :meth:`pause_gpu_clients` (``*``: any); True when there was one."""
        ...

    def gpu_clients_paused(self) -> dict[str, str]:
        """Node -> owner of every pause of GPU clients not undone yet (the reconciler's list)."""
        ...

    def stray_autoscaler_holds(self) -> list[str]:
        """The nodes that still carry the autoscaler holds NodeMedic set while holding them, though
        it no longer holds them (returned to service outside NodeMedic; the reconciler's list)."""
        ...

    def release_autoscaler_holds(self, node: str) -> bool:
        """Remove those holds from ``node`` if it is still in service and no spare, in one
        scheduler operation; True when there were some."""
        ...


class HostGpuClients:
    """For a scheduler whose GPU reset command stops what holds the GPUs itself (Slurm: the
    host's services, stopped by gpu-reset): nothing to pause through the scheduler."""

    def pause_gpu_clients(self, node: str, owner: str) -> str | None:
        return None

    def resume_gpu_clients(self, node: str, owner: str = "*") -> bool:
        return False

    def gpu_clients_paused(self) -> dict[str, str]:
        return {}


class NoAutoscalers:
    """For a scheduler whose nodes no autoscaler removes when they are empty (Slurm: NodeMedic
    sets no autoscaler holds there)."""

    def stray_autoscaler_holds(self) -> list[str]:
        return []

    def release_autoscaler_holds(self, node: str) -> bool:
        return False
