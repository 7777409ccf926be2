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
    kind: str  # "slurm" | "simulated" | "kubernetes"
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
    """A scheduler for ``nodes`` and a sentence saying which one and why. ``prefer``: ``auto``
    (a real Slurm when it can start here, else the simulation), ``slurm``, ``simulated`` or
    ``kubernetes`` (a real kube-apiserver; the local mode plays kubelets and operators)."""
    if prefer == "kubernetes":
        # the Kubernetes client loads only when asked for: not in each node-side command of a Slurm
        # cluster (``python -m nodemedic_sandbox.node``), where its import was most of the start-up
        from nodemedic_sandbox import kube_apiserver, kube_cluster

        why_not = kube_apiserver.unavailable_reason()
        if why_not:
            raise RuntimeError(f"a Kubernetes cluster was asked for but cannot start: {why_not}")
        kube = kube_cluster.KubeScheduler(Path(tempfile.mkdtemp(prefix="nodemedic-cluster-")), nodes)
        return kube, (f"Kubernetes: a real kube-apiserver {kube_apiserver.VERSION} with etcd and RBAC, EKS's IAM "
                      "token authentication played locally; no kubelet runs: the local mode plays kubelets, "
                      "the training operator and the scheduler")
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
