"""Slurm through SSM Run Command on the controller instance, running ``scontrol``/``squeue``.

No network path into the VPC is needed; every command is a short shell script whose output
is parsed here. Names and reasons are validated by the contracts and quoted with ``shlex``.
"""

from __future__ import annotations

import re
import shlex

from nodemedic.errors import CommandFailedError, DrainFailedError, ResumeFailedError
from nodemedic.orchestrators.base import EvacuationResult, NodeStatus
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


class SlurmViaSSM:
    """:class:`~nodemedic.orchestrators.base.Orchestrator` for Slurm, driven with SSM."""

    def __init__(self, runner: RunCommand, controller_instance_id: str, timeout_s: int) -> None:
        self._run = runner
        self._controller = controller_instance_id
        self._timeout = timeout_s

    def _sh(self, script: str, comment: str) -> str:
        return self._run.run_checked(self._controller, script, self._timeout, comment)

    def node_status(self, node: str) -> NodeStatus:
        out = self._sh(f"scontrol show node {shlex.quote(node)} -o", f"show node {node}")
        fields = parse_scontrol_record(out.strip().splitlines()[-1] if out.strip() else "")
        if fields.get("NodeName") != node:
            raise CommandFailedError(f"scontrol did not describe node {node}: {out.strip()[:300]}")
        reason = _REASON_SUFFIX.sub("", fields.get("Reason", "")).strip()
        return NodeStatus(name=node, state=fields.get("State", ""), reason=reason)

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
