"""A real Slurm cluster on this machine: one slurmctld and one slurmd per node, in a temp dir.

Needs Debian's ``slurmctld``, ``slurmd`` and ``slurm-client`` and root (the daemons run as
``SlurmUser=root``). Authentication is ``auth/none`` on loopback: a throw-away test cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SLURM_BINARIES = ("slurmctld", "slurmd", "scontrol", "squeue", "sbatch")


def unavailable_reason() -> str | None:
    """Why a real local Slurm cannot start here, or None when it can."""
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    if missing:
        return f"Slurm is not installed (missing {', '.join(missing)}; Debian: slurmctld slurmd slurm-client)"
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (SlurmUser=root)"
    return None


def _free_port_base(count: int) -> int:
    """A base port with ``count + 1`` free ports above it (controller + one per slurmd)."""
    import socket

    for base in range(20000 + (os.getpid() % 200) * 50, 60000, 97):
        socks = []
        try:
            for p in range(base, base + count + 1):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range for the local Slurm cluster")


def processes_of(root: Path) -> list[int]:
    """Processes (other than this one) whose command line or environment names ``root``."""
    mark, found = str(root).encode(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark in (entry / "cmdline").read_bytes() or mark in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for its parent (PID 1 here) to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def version() -> str:
    out = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, check=False)
    return out.stdout.strip().split()[-1] if out.stdout.strip() else "unknown"


@dataclass
class LocalSlurm:
    """A running local cluster. ``env`` is what a shell needs to talk to it (``SLURM_CONF``)."""

    root: Path
    nodes: list[str]
    kind: str = "slurm"
    gpus_per_node: int = 8
    port_base: int = 0
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _node_port(self, node: str) -> int:
        return self.port_base + 1 + self.nodes.index(node)

    def write_config(self) -> None:
        for sub in ("state", "spool", "log", "run", "dev", "jobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for i in range(self.gpus_per_node):
            dev = self.root / "dev" / f"gpu{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # like /dev/null
        lines = [
            "ClusterName=nodemedic-local",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.port_base}",
            "AuthType=auth/none",
            "CredType=cred/none",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.root}/state",
            f"SlurmdSpoolDir={self.root}/spool/%n",
            f"SlurmctldPidFile={self.root}/run/slurmctld.pid",
            f"SlurmdPidFile={self.root}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={self.root}/log/slurmctld.log",
            f"SlurmdLogFile={self.root}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "GresTypes=gpu",
            "JobRequeue=1",
            "ReturnToService=1",
            "SchedulerParameters=sched_interval=1",
            "SlurmdTimeout=30",
            "MpiDefault=none",
            f"NodeName=DEFAULT CPUs=2 RealMemory=1000 Gres=gpu:{self.gpus_per_node} State=UNKNOWN",
        ]
        for node in self.nodes:
            lines.append(
                f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={self._node_port(node)}"
            )
        lines.append(f"PartitionName=gpu Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        gres = [
            "AutoDetect=off",
            f"NodeName={','.join(self.nodes)} Name=gpu File={self.root}/dev/gpu[0-{self.gpus_per_node - 1}]",
        ]
        (self.root / "gres.conf").write_text("\n".join(gres) + "\n")

    def _run(self, *args: str) -> str:
        out = subprocess.run(
            args, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30
        )
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout

    def start(self) -> None:
        self.port_base = self.port_base or _free_port_base(len(self.nodes))
        self.write_config()
        info = {"kind": self.kind, "nodes": self.nodes, "port_base": self.port_base}
        (self.root / "cluster.json").write_text(json.dumps(info))
        env = {**os.environ, **self.env}
        subprocess.run(["slurmctld", "-f", str(self.conf), "-c"], env=env, check=True, timeout=30)
        self._wait(lambda: self._ping_ok(), "slurmctld to answer")
        for node in self.nodes:
            self.start_node(node)
        self._wait(lambda: self.idle_nodes() >= set(self.nodes), "all nodes to be idle")

    def stop_controller(self, *, graceful: bool = False) -> None:
        """Stop slurmctld: every Slurm command fails until it starts again. SIGKILL (a crash: what
        it had not saved yet is lost), or ``graceful``: SIGTERM, and wait while it saves its state."""
        pidfile = self.root / "run" / "slurmctld.pid"
        if graceful and pidfile.exists():
            pid = int(pidfile.read_text().strip())
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self._kill([pidfile])

    def start_controller(self, *, clear_state: bool = False) -> None:
        """Start slurmctld again; ``clear_state`` loses what it had saved (drains, jobs,
        reservations), as a controller restarted without its state does."""
        env = {**os.environ, **self.env}
        subprocess.run(["slurmctld", "-f", str(self.conf), *(["-c"] if clear_state else [])], env=env, check=True,
                       timeout=30)
        self._wait(lambda: self._ping_ok(), "slurmctld to answer")
        self._wait(lambda: self.idle_nodes() | self._busy_nodes() >= set(self.nodes), "the nodes to register")

    def _busy_nodes(self) -> set[str]:
        out = self._run("sinfo", "-h", "-N", "-o", "%N %T")
        return {n for n, state in (line.split() for line in out.splitlines())
                if state.rstrip("*") in ("allocated", "mixed", "drained", "draining", "completing", "reserved")}

    def start_node(self, node: str) -> None:
        """Start (or restart) the slurmd of ``node``: a new instance joining under that name."""
        self.stop_node(node)
        subprocess.run(
            ["slurmd", "-f", str(self.conf), "-N", node],
            env={**os.environ, **self.env},
            check=True,
            timeout=30,
        )

    def stop_node(self, node: str) -> None:
        self._kill([self.root / "run" / f"slurmd-{node}.pid"])

    def _kill(self, pidfiles: list[Path]) -> None:
        """SIGKILL the daemons and wait until they are gone. This throw-away cluster has no state
        worth a clean shutdown (slurmctld takes over 5 s to save it on SIGTERM; each slurmd 2 s),
        and an instance that is replaced or terminated does not shut its slurmd down either."""
        pids = []
        for pidfile in pidfiles:
            if not pidfile.exists():
                continue
            try:
                pid = int(pidfile.read_text().strip())
                os.kill(pid, signal.SIGKILL)
                pids.append(pid)
            except (ValueError, ProcessLookupError):
                pass
            pidfile.unlink(missing_ok=True)
        deadline = time.monotonic() + 5
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            time.sleep(0.02)

    def stop(self) -> None:
        self._kill([self.root / "run" / f"slurmd-{n}.pid" for n in self.nodes]
                   + [self.root / "run" / "slurmctld.pid"])
        # what the daemons started outlives them: each job's slurmstepd (SLURM_CONF in its
        # environment) and the job's processes (its script under our spool): kill them all
        leftovers = processes_of(self.root)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while leftovers and time.monotonic() < deadline:
            leftovers = [p for p in leftovers if _alive(p)]
            time.sleep(0.02)

    def _ping_ok(self) -> bool:
        try:
            return "UP" in self._run("scontrol", "ping")
        except (RuntimeError, subprocess.TimeoutExpired):
            return False

    def idle_nodes(self) -> set[str]:
        out = self._run("sinfo", "-h", "-N", "-o", "%N %T")
        return {n for n, state in (line.split() for line in out.splitlines()) if state == "idle"}

    def _wait(self, cond: object, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():  # type: ignore[operator]
                return
            time.sleep(0.1)
        log = (self.root / "log" / "slurmctld.log").read_text()[-2000:] if (self.root / "log" / "slurmctld.log").exists() else ""
        raise RuntimeError(f"timed out waiting for {what}\n{log}")

    # -- jobs, for tests and the demo ---------------------------------------------------
    def submit(self, nodes: int, name: str = "train", seconds: int = 3600, on: str = "", body: str = "") -> str:
        """Submit a job of ``nodes`` nodes (``on``: onto this node list) that sleeps ``seconds``, or
        runs ``body`` (a bash script's lines)."""
        script = self.root / "jobs" / f"{name}.sh"
        script.write_text(f"#!/bin/bash\n{body or f'sleep {seconds}'}\n")
        script.chmod(0o755)
        out = self._run(
            "sbatch", "--parsable", "--requeue", "--exclusive", f"--nodes={nodes}", "--ntasks-per-node=1",
            f"--job-name={name}", f"--output={self.root}/jobs/{name}-%j.out", *([f"--nodelist={on}"] if on else []),
            str(script),
        )
        return out.strip().split(";")[0]

    def hostnames(self, nodelist: str) -> list[str]:
        """Expand a Slurm hostlist such as ``gpu-[1-2]``."""
        return self._run("scontrol", "show", "hostnames", nodelist).split() if nodelist else []

    def job(self, job_id: str) -> dict[str, str]:
        out = self._run("scontrol", "show", "job", job_id, "-o")
        return _parse_kv(out)

    def node(self, node: str) -> dict[str, str]:
        return _parse_kv(self._run("scontrol", "show", "node", node, "-o"))


def _parse_kv(line: str) -> dict[str, str]:
    from nodemedic.domain.scontrol import parse_scontrol_record

    return parse_scontrol_record(line)
