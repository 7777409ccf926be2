"""Slurm through SSM Run Command on the controller instance, running ``scontrol``/``squeue``.

No network path into the VPC is needed; every command is a short shell script whose output
is parsed here. Names and reasons are validated by the contracts and quoted with ``shlex``.
"""

from __future__ import annotations

import re
import shlex

from nodemedic.errors import CommandFailedError, DrainFailedError, ResumeFailedError
from nodemedic.orchestrators.base import EvacuationResult, JobState, NodeStatus
from nodemedic.providers.run_command import RunCommand

_FIELD_SPLIT = re.compile(r"\s+(?=[A-Za-z][\w/:]*=)")
_REASON_SUFFIX = re.compile(r"\s*\[[^\]]*@[^\]]*\]$")


def parse_scontrol_record(line: str) -> dict[str, str]:
    """Parse one ``scontrol show ... -o`` line into ``{key: value}`` (values may hold spaces)."""
    fields: dict[str, str] = {}
    for part in _FIELD_SPLIT.split(line.strip()):
        key, sep, value = part.partition("=")
        if sep:
            fields[key] = value.strip()
    return fields


def _node_status(fields: dict[str, str]) -> NodeStatus:
    """A node's status from its ``scontrol show node -o`` record (the reason without its stamp)."""
    reason = _REASON_SUFFIX.sub("", fields.get("Reason", "")).strip()
    return NodeStatus(name=fields["NodeName"], state=fields.get("State", ""), reason=reason)


class SlurmViaSSM:
    """:class:`~nodemedic.orchestrators.base.Orchestrator` for Slurm, driven with SSM."""

    def __init__(self, runner: RunCommand, controller_instance_id: str, timeout_s: int,
                 spare_reservation: str = "nodemedic_spares") -> None:
        self._run = runner
        self._controller = controller_instance_id
        self._timeout = timeout_s
        self._reservation = spare_reservation

    def _sh(self, script: str, comment: str) -> str:
        return self._run.run_checked(self._controller, script, self._timeout, comment)

    def node_status(self, node: str) -> NodeStatus:
        out = self._sh(f"scontrol show node {shlex.quote(node)} -o", f"show node {node}")
        fields = parse_scontrol_record(out.strip().splitlines()[-1] if out.strip() else "")
        if fields.get("NodeName") != node:
            raise CommandFailedError(f"scontrol did not describe node {node}: {out.strip()[:300]}")
        return _node_status(fields)

    def drain(self, node: str, reason: str) -> None:
        try:
            self._sh(
                f"scontrol update nodename={shlex.quote(node)} state=drain reason={shlex.quote(reason)}",
                f"drain {node}",
            )
        except CommandFailedError as exc:
            raise DrainFailedError(str(exc)) from exc

    def evacuate(self, node: str) -> EvacuationResult:
        # Requeue each job on the node, then release it at once: a requeued job is otherwise
        # held until requeue time + cred_expire (120 s by default, Reason=BeginTime). The
        # release only sticks once the job has left COMPLETING, so wait for that (<= 15 s), and it
        # starts 2 s later: a node of the old allocation that still holds the previous run as
        # killed refuses an immediate relaunch ("Job N already killed, do not launch batch job").
        script = (
            f"jobs=$(squeue -h -w {shlex.quote(node)} -t R,CG,CF -o %A)\n"
            'for j in $jobs; do if out=$(scontrol requeue "$j" 2>&1); then echo "requeued $j"; '
            'else echo "not_requeued $j $out"; fi; done\n'
            "for j in $jobs; do for _ in $(seq 150); do "
            '[ "$(squeue -h -j "$j" -o %T 2>/dev/null)" = COMPLETING ] || break; sleep 0.1; done; '
            'scontrol update jobid="$j" starttime=now+2 >/dev/null 2>&1 || true; done'
        )
        out = self._sh(script, f"requeue jobs on {node}")
        requeued, not_requeued = [], []
        for line in out.splitlines():
            word, _, rest = line.partition(" ")
            if word == "requeued":
                requeued.append(rest.strip())
            elif word == "not_requeued":
                not_requeued.append(rest.strip())
        return EvacuationResult(requeued=requeued, not_requeued=not_requeued)

    def jobs_on(self, node: str) -> list[str]:
        out = self._sh(f"squeue -h -w {shlex.quote(node)} -t R,CG,CF -o %A", f"jobs on {node}")
        return [line.strip() for line in out.splitlines() if line.strip()]

    def resume(self, node: str) -> None:
        try:
            self._sh(f"scontrol update nodename={shlex.quote(node)} state=resume", f"resume {node}")
        except CommandFailedError as exc:
            raise ResumeFailedError(str(exc)) from exc

    # -- jobs -----------------------------------------------------------------------------
    def job_states(self, job_ids: list[str]) -> dict[str, JobState]:
        if not job_ids:
            return {}
        # StartTime is the controller's local time: ``date`` turns it into epoch seconds there
        script = (
            f"for j in {' '.join(shlex.quote(j) for j in job_ids)}; do "
            'line=$(squeue -h -j "$j" -o "%T|%S" 2>/dev/null | head -1); '
            'state=${line%%|*}; start=${line#*|}; epoch=""; '
            '[ "$state" = RUNNING ] && epoch=$(date -d "$start" +%s 2>/dev/null); '
            'echo "$j|${state:-GONE}|$epoch"; done'
        )
        out = self._sh(script, "job states")
        states: dict[str, JobState] = {}
        for line in out.splitlines():
            job, _, rest = line.strip().partition("|")
            state, _, epoch = rest.partition("|")
            if job:
                states[job] = JobState(job, state, float(epoch) if epoch.strip() else None)
        return states

    # -- hot spares: the nodes of one Slurm reservation -----------------------------------
    def _pool_nodes(self) -> str:
        """Shell that sets ``$old`` to the spare reservation's nodes, one per line (empty if none)."""
        return (
            f"cur=$(scontrol show reservation {shlex.quote(self._reservation)} -o 2>/dev/null "
            "| grep -o ' Nodes=[^ ]*' | cut -d= -f2)\n"
            '[ "$cur" = "(null)" ] && cur=""\n'
            'old=""; [ -n "$cur" ] && old=$(scontrol show hostnames "$cur")\n'
        )

    def _spares_script(self, change: str) -> str:
        """Read the reservation's nodes, apply ``change`` (a shell filter over one name per line),
        write the reservation back: all under a lock, since Slurm 22.05 cannot add or remove a
        single node (no Nodes+=/-=) and two incidents may change the pool at once."""
        r = shlex.quote(self._reservation)
        return (
            f"exec 9>/tmp/nodemedic-{self._reservation}.lock && flock -w 60 9\n"
            + self._pool_nodes()
            + f'new=$(printf "%s\\n" "$old" | {change} | grep -v "^$" | sort -u | paste -sd, -)\n'
            'if [ "$new" = "$(printf "%s\\n" "$old" | grep -v "^$" | sort -u | paste -sd, -)" ]; then :\n'
            f'elif [ -z "$new" ]; then scontrol delete reservationname={r}\n'
            f'elif [ -z "$old" ]; then scontrol create reservation reservationname={r} nodes="$new" users=root '
            'starttime=now duration=infinite flags=ignore_jobs >/dev/null\n'
            f'else scontrol update reservationname={r} nodes="$new"; fi\n'
        )

    def spares(self) -> list[NodeStatus]:
        """The nodes in the spare reservation, with their state (a drained or down one is no spare)."""
        out = self._sh(self._pool_nodes() + 'for n in $old; do scontrol show node "$n" -o; done', "list spares")
        records = [parse_scontrol_record(line) for line in out.splitlines()]
        return [_node_status(fields) for fields in records if fields.get("NodeName")]

    def take_spare(self, node: str) -> None:
        """Take ``node`` out of the spare reservation: pending jobs (the requeued one first, by
        its age) can start on it at once."""
        self._sh(self._spares_script(f"grep -vx {shlex.quote(node)}"), f"take spare {node}")

    def add_spare(self, node: str) -> None:
        """Put ``node`` into the spare reservation, then undrain it: it is idle but only jobs
        that name the reservation can use it. The drain is lifted only once Slurm shows the node
        reserved (a new reservation becomes active a few seconds after ``starttime=now``), and
        the call returns once the node answers: a pending job never sees it free in between."""
        q = shlex.quote(node)
        show = f"scontrol show node {q} -o"
        self._sh(self._spares_script(f"{{ cat; echo {q}; }}")
                 + f"for _ in $(seq 100); do {show} | grep -q 'State=[^ ]*RESERVED' && break; sleep 0.2; done\n"
                 + f"{show} | grep -q 'State=[^ ]*RESERVED' || {{ echo '{node} is not reserved' >&2; exit 1; }}\n"
                 + f"if {show} | grep -q 'State=[^ ]*DRAIN'; then scontrol update nodename={q} state=resume; fi\n"
                 + f"for _ in $(seq 100); do {show} | grep -q NOT_RESPONDING || break; sleep 0.2; done",
                 f"add spare {node}")
