"""An in-memory Slurm behind the orchestrator interface, for the fast stage tier.

It keeps what the real adapter's documents read and change (state, drain reason, jobs, the spare
reservation) with the same check-and-act semantics (a drain keeps someone else's drain unless
taken over; a resume lifts only the owner's), and can be made unreachable (``down``) as a
controller that stopped answering is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nodemedic.errors import CommandFailedError, DrainFailedError, ResumeFailedError
from nodemedic.orchestrators.base import EvacuationResult, HostGpuClients, JobState, NoAutoscalers, NodeStatus, RunningJob


@dataclass
class _Node:
    drained: bool = False
    reason: str = ""
    jobs: list[str] = field(default_factory=list)
    reserved: bool = False
    flags: str = ""  # more state flags, e.g. "+NOT_RESPONDING"


class MemorySlurm(HostGpuClients, NoAutoscalers):
    def __init__(self, names: list[str], spares: tuple[str, ...] = ()) -> None:
        self.n = {name: _Node(reserved=name in spares) for name in names}
        self.down = False
        self.calls: list[str] = []
        self.now = 10_000.0  # the controller's clock (epoch seconds)
        self.started = 4_000.0  # when every job started
        self.markers: dict[str, float] = {}  # job -> its last checkpoint marker
        self.partition: dict[str, str] = {}  # job -> partition (default "gpu")
        self.signalled: list[tuple[str, str, str]] = []  # (job, signal, scope)
        self.checkpoint_takes: float | None = None  # a signalled job writes its marker this much later
        self.unsignalable: set[str] = set()  # jobs scancel --signal reports it could not signal
        self.evacuated: dict[tuple[str, float | None], dict[str, list[str]]] = {}  # per drain: job -> its nodes
        self.lost_lifts = 0  # the next lifts of a drain are acknowledged, then lost (a controller restart)

    def _up(self, what: str) -> None:
        self.calls.append(what)
        if self.down:
            raise CommandFailedError(f"{what}: the controller did not answer (timed out)")

    def _status(self, name: str) -> NodeStatus:
        node = self.n[name]
        base = "ALLOCATED" if node.jobs else "IDLE"
        flags = ("+DRAIN" if node.drained else "") + ("+RESERVED" if node.reserved else "") + node.flags
        return NodeStatus(name, base + flags, node.reason if node.drained else "")

    def node_status(self, node: str) -> NodeStatus:
        self._up(f"show {node}")
        if node not in self.n:
            raise CommandFailedError(f"scontrol did not describe node {node}")
        return self._status(node)

    def nodes(self) -> list[NodeStatus]:
        self._up("show nodes")
        return [self._status(name) for name in self.n]

    def drain(self, node: str, reason: str, takeover: str = "-") -> bool:
        try:
            self._up(f"drain {node}")
        except CommandFailedError as exc:
            raise DrainFailedError(str(exc)) from exc
        current = self.n[node]
        if current.drained and (takeover == "-" or not current.reason.startswith(takeover)):
            return False
        current.drained, current.reason = True, reason
        return True

    def evacuate(self, node: str, started_at: float | None = None) -> EvacuationResult:
        """As the real adapter: a later call for the same drain (``started_at``) also reports what
        the earlier ones requeued (it reads their requeue commands)."""
        self._up(f"requeue {node}")
        if earlier := self.evacuated.get((node, started_at)):  # an earlier command's answer, read again
            return EvacuationResult(requeued=list(earlier), not_requeued=[], job_nodes=earlier)
        if not self.n[node].drained:  # checked by the requeue command itself
            return EvacuationResult(requeued=[], not_requeued=[], not_drained=self._status(node).state)
        jobs = list(self.n[node].jobs)
        job_nodes = {j: [name for name, n in self.n.items() if j in n.jobs] for j in jobs}
        for n in self.n.values():  # a requeued job leaves all its nodes
            n.jobs = [j for j in n.jobs if j not in jobs]
        if started_at is not None:
            self.evacuated[(node, started_at)] = job_nodes
        return EvacuationResult(requeued=list(job_nodes), not_requeued=[], job_nodes=job_nodes)

    def busy(self, node: str) -> str | None:
        self._up(f"guard {node}")
        status = self._status(node)
        if self.n[node].jobs:
            return f"{node} runs job(s) {', '.join(self.n[node].jobs)}"
        return None if status.drained else f"{node} is no longer drained"

    def jobs_on(self, node: str) -> list[str]:
        self._up(f"jobs on {node}")
        return list(self.n[node].jobs)

    def running_jobs(self, node: str) -> list[RunningJob]:
        self._up(f"running jobs on {node}")
        return [RunningJob(j, self.partition.get(j, "gpu"), self.started, self.markers.get(j), self.now)
                for j in self.n[node].jobs]

    def request_checkpoint(self, node: str, job_ids: list[str], signal: str, scope: str) -> list[str]:
        self._up(f"signal {' '.join(job_ids)}")
        for job in job_ids:
            if job in self.unsignalable:
                continue
            self.signalled.append((job, signal, scope))
            if self.checkpoint_takes is not None:
                self.markers[job] = self.now + self.checkpoint_takes
        return [j for j in job_ids if j in self.unsignalable]

    def resume(self, node: str, owner: str = "*") -> bool:
        try:
            self._up(f"resume {node}")
        except CommandFailedError as exc:
            raise ResumeFailedError(str(exc)) from exc
        current = self.n[node]
        if not current.drained or not (owner == "*" or current.reason == owner
                                       or current.reason.startswith(f"{owner} ")):
            return False
        if self.lost_lifts:  # slurmctld restarts from a state saved before the lift: still drained
            self.lost_lifts -= 1
            return True
        current.drained, current.reason = False, ""
        return True

    def job_states(self, job_ids: list[str]) -> dict[str, JobState]:
        self._up("job states")
        running = {j for n in self.n.values() for j in n.jobs}
        return {j: JobState(j, "RUNNING", 0.0) if j in running else JobState(j, "PENDING", None) for j in job_ids}

    def spares(self) -> list[NodeStatus]:
        self._up("spares")
        return [self._status(name) for name, node in self.n.items() if node.reserved]

    def take_spare(self, node: str) -> None:
        self._up(f"take spare {node}")
        self.n[node].reserved = False

    def adopt(self, node: str, instance_id: str, reason: str, since: float | None = None) -> str | None:
        self._up(f"join {instance_id} as {node}")
        return node

    def add_spare(self, node: str, owner: str) -> bool:
        self._up(f"add spare {node}")
        self.n[node].reserved = True
        return self.resume(node, owner)
