"""The scheduler the local cluster runs: a real local Slurm when possible, else a simulation.

Both are reached the same way - ``scontrol``/``squeue``/``sbatch`` on PATH with the
environment from :attr:`env` - so the pipeline's Slurm adapter runs unchanged on either.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Protocol

from nodemedic_sandbox import slurm_cluster


class Scheduler(Protocol):
    kind: str  # "slurm" | "simulated"
    nodes: list[str]
    root: Path

    @property
    def env(self) -> dict[str, str]: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def start_node(self, node: str) -> None: ...

    def stop_node(self, node: str) -> None: ...

    def submit(self, nodes: int, name: str = "train", seconds: int = 3600) -> str: ...

    def hostnames(self, nodelist: str) -> list[str]: ...

    def job(self, job_id: str) -> dict[str, str]: ...

    def node(self, node: str) -> dict[str, str]: ...


def create(nodes: list[str], root: Path | None = None, prefer: str = "auto") -> tuple[Scheduler, str]:
    """A scheduler for ``nodes`` and a sentence saying which one and why."""
    root = root or Path(tempfile.mkdtemp(prefix="nodemedic-cluster-"))
    why = slurm_cluster.unavailable_reason()
    if prefer == "slurm" and why:
        raise RuntimeError(f"a real local Slurm was asked for but cannot start: {why}")
    if prefer != "simulated" and why is None:
        sched: Scheduler = slurm_cluster.LocalSlurm(root, nodes)
        note = f"real Slurm {slurm_cluster.version()} (slurmctld + {len(nodes)} slurmd on this machine)"
    else:
        from nodemedic_sandbox.simulated_slurm import SimulatedSlurm

        sched = SimulatedSlurm(root, nodes)
        note = "simulated scheduler (" + (why or "asked for") + "); the same scontrol commands run against it"
    (root / "cluster.json").write_text(json.dumps({"kind": sched.kind, "nodes": nodes}))
    return sched, note


def load(root: Path) -> Scheduler:
    """The scheduler described by ``root/cluster.json`` (used by the node-side commands)."""
    info = json.loads((root / "cluster.json").read_text())
    if info["kind"] == "slurm":
        sched = slurm_cluster.LocalSlurm(root, info["nodes"])
        sched.port_base = int(info["port_base"])
        return sched
    from nodemedic_sandbox.simulated_slurm import SimulatedSlurm

    return SimulatedSlurm(root, info["nodes"])
