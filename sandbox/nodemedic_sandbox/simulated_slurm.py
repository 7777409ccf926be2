"""A simulated Slurm for machines where a real one cannot start (no root, no packages).

It puts ``scontrol``, ``squeue``, ``sbatch`` and ``sinfo`` on PATH that implement the subset
NodeMedic's Slurm adapter, the tests and the demo use, over a JSON state file, with Slurm's
observable behaviour: drain keeps running jobs (DRAINING), a requeued job is held
(``Reason=BeginTime``) until ``starttime=now``, drains survive a slurmd restart.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

TOOLS = ("scontrol", "squeue", "sbatch", "sinfo")
HOLD_S = 120  # cred_expire default: a requeued job waits this long unless released


@contextmanager
def _state(path: Path) -> Iterator[dict[str, Any]]:
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads(path.read_text())
        yield state
        _schedule(state)
        path.write_text(json.dumps(state))


def _schedule(state: dict[str, Any]) -> None:
    now = time.time()
    busy = {n for j in state["jobs"].values() if j["state"] == "RUNNING" for n in j["nodes"]}
    for job_id in sorted(state["jobs"], key=int):
        job = state["jobs"][job_id]
        if job["state"] != "PENDING" or job["begin"] > now:
            continue
        free = [n for n, s in state["nodes"].items() if not s["drain"] and s["up"] and n not in busy]
        if len(free) >= job["size"]:
            job.update(state="RUNNING", nodes=free[: job["size"]], reason="None")
            busy.update(job["nodes"])


def _node_line(state: dict[str, Any], name: str) -> str:
    node = state["nodes"][name]
    running = any(name in j["nodes"] for j in state["jobs"].values() if j["state"] == "RUNNING")
    base = "ALLOCATED" if running else "IDLE"
    if not node["up"]:
        base = "DOWN*"
    flag = ("+DRAIN" if not running else "+DRAINING") if node["drain"] else ""
    reason = f" Reason={node['reason']} [root@{node['reason_time']}]" if node["drain"] else ""
    return f"NodeName={name} Arch=x86_64 State={base}{flag} Partitions=gpu{reason}"


def _job_line(job_id: str, job: dict[str, Any]) -> str:
    return (f"JobId={job_id} JobName={job['name']} JobState={job['state']} Reason={job['reason']} "
            f"Requeue=1 Restarts={job['restarts']} NodeList={','.join(job['nodes'])} "
            f"StartTime={datetime.fromtimestamp(job['begin'], UTC).strftime('%Y-%m-%dT%H:%M:%S')}")


def _kv(args: list[str]) -> dict[str, str]:
    return {k.lower(): v for k, _, v in (a.partition("=") for a in args)}


def main(tool: str, args: list[str], path: Path) -> int:
    with _state(path) as st:
        if tool == "sinfo":
            for name in st["nodes"]:
                print(name, _node_line(st, name).split("State=")[1].split()[0].lower())
            return 0
        if tool == "sbatch":
            opts = _kv([a.lstrip("-") for a in args if a.startswith("--")])
            job_id = str(st["next_job"])
            st["next_job"] += 1
            st["jobs"][job_id] = {"name": opts.get("job-name", "job"), "size": int(opts.get("nodes", 1)),
                                  "state": "PENDING", "nodes": [], "begin": 0, "restarts": 0, "reason": "None"}
            print(job_id)
            return 0
        if tool == "squeue":
            node = args[args.index("-w") + 1] if "-w" in args else None
            job = args[args.index("-j") + 1] if "-j" in args else None
            for job_id, j in st["jobs"].items():
                if (node is None or node in j["nodes"]) and (job is None or job == job_id) \
                        and (node is None or j["state"] == "RUNNING"):
                    print(j["state"] if "%T" in args else ",".join(j["nodes"]) if "%N" in args else job_id)
            return 0
        # scontrol
        verb, rest = args[0], args[1:]
        if verb == "show" and rest[0] == "nodes":
            for name in st["nodes"]:
                print(_node_line(st, name))
        elif verb == "show" and rest[0] == "node":
            if rest[1] not in st["nodes"]:
                print(f"Node {rest[1]} not found", file=sys.stderr)
                return 1
            print(_node_line(st, rest[1]))
        elif verb == "show" and rest[0] == "job":
            print(_job_line(rest[1], st["jobs"][rest[1]]))
        elif verb == "show" and rest[0] == "hostnames":
            print("\n".join(rest[1].split(",")))
        elif verb == "requeue":
            job = st["jobs"][rest[0]]
            if job["state"] != "RUNNING":
                print(f"Job is pending execution for job {rest[0]}", file=sys.stderr)
                return 1
            job.update(state="PENDING", nodes=[], begin=time.time() + HOLD_S, reason="BeginTime",
                       restarts=job["restarts"] + 1)
        elif verb == "update" and "jobid" in _kv(rest):
            delay = _kv(rest).get("starttime", "now").removeprefix("now").removeprefix("+") or "0"
            st["jobs"][_kv(rest)["jobid"]].update(begin=time.time() + float(delay), reason="None")
        elif verb == "update" and "nodename" in _kv(rest):
            kv = _kv(rest)
            node = st["nodes"][kv["nodename"]]
            if kv["state"] == "drain":
                node.update(drain=True, reason=kv.get("reason", ""),
                            reason_time=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S"))
            elif kv["state"] == "resume":
                node.update(drain=False, reason="", up=True)
            elif kv["state"] == "down":
                node.update(up=False)
        else:
            print(f"simulated scontrol: unsupported: {' '.join(args)}", file=sys.stderr)
            return 2
    return 0


@dataclass
class SimulatedSlurm:
    root: Path
    nodes: list[str]
    kind: str = "simulated"

    @property
    def state_file(self) -> Path:
        return self.root / "simulated-slurm.json"

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.root / 'bin'}:{os.environ.get('PATH', '')}"}

    def start(self) -> None:
        (self.root / "bin").mkdir(parents=True, exist_ok=True)
        for tool in TOOLS:
            script = self.root / "bin" / tool
            script.write_text(f'#!/bin/sh\nexec {sys.executable} -m nodemedic_sandbox.simulated_slurm '
                              f'{self.state_file} {tool} "$@"\n')
            script.chmod(0o755)
        nodes = {n: {"drain": False, "up": True, "reason": "", "reason_time": ""} for n in self.nodes}
        self.state_file.write_text(json.dumps({"nodes": nodes, "jobs": {}, "next_job": 1}))

    def stop(self) -> None:
        return None

    def _call(self, tool: str, *args: str) -> str:
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            if main(tool, list(args), self.state_file) != 0:
                raise RuntimeError(f"simulated {tool} {' '.join(args)} failed")
        return out.getvalue()

    def start_node(self, node: str) -> None:
        with _state(self.state_file) as st:
            st["nodes"][node]["up"] = True

    def stop_node(self, node: str) -> None:
        with _state(self.state_file) as st:
            st["nodes"][node]["up"] = False

    def submit(self, nodes: int, name: str = "train", seconds: int = 3600) -> str:
        return self._call("sbatch", "--parsable", f"--nodes={nodes}", f"--job-name={name}").strip()

    def hostnames(self, nodelist: str) -> list[str]:
        return [n for n in nodelist.split(",") if n]

    def job(self, job_id: str) -> dict[str, str]:
        from nodemedic.domain.scontrol import parse_scontrol_record

        return parse_scontrol_record(self._call("scontrol", "show", "job", job_id))

    def node(self, node: str) -> dict[str, str]:
        from nodemedic.domain.scontrol import parse_scontrol_record

        return parse_scontrol_record(self._call("scontrol", "show", "node", node))


if __name__ == "__main__":
    sys.exit(main(sys.argv[2], sys.argv[3:], Path(sys.argv[1])))
