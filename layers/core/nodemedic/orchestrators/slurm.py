"""Slurm through SSM Run Command on the controller instance: the stack's typed documents
(``nodemedic-<cluster>-slurm-*``, ``-spare-*``) run ``scontrol``/``squeue`` there.

No network path into the VPC is needed. What the adapter sends are parameter values (a node
name, a reason), which the documents' ``allowedPattern`` checks; the scripts live in
``template.yaml`` and fail on any failed Slurm command. Their output is parsed here.
"""

from __future__ import annotations

import re

from nodemedic.domain.scontrol import drain_reason, expand_hostlist, parse_scontrol_record
from nodemedic.errors import CommandFailedError, DrainFailedError, ResumeFailedError
from nodemedic.orchestrators.base import EvacuationResult, HostGpuClients, JobState, NoAutoscalers, NodeStatus, RunningJob
from nodemedic.providers.run_command import Commands, Documents

_REASON_UNSAFE = re.compile(r"[^A-Za-z0-9 :._#/@=+,()-]")  # what the drain document's allowedPattern refuses
JOBS_PARAMETER_LIMIT = 4000  # the slurm-signal and slurm-query documents' jobs: allowedPattern {1,4000}


def job_lists(job_ids: list[str], limit: int = JOBS_PARAMETER_LIMIT) -> list[str]:
    """``job_ids`` as space-separated lists of at most ``limit`` characters each: SSM refuses a
    SendCommand whose parameter its document's pattern does not match (about 440 jobs a list)."""
    lists: list[str] = []
    for job in job_ids:
        if lists and len(lists[-1]) + 1 + len(job) <= limit:
            lists[-1] += f" {job}"
        else:
            lists.append(job)
    return lists


def _node_status(fields: dict[str, str]) -> NodeStatus:
    """A node's status from its ``scontrol show node -o`` record (the reason without its stamp)."""
    return NodeStatus(name=fields["NodeName"], state=fields.get("State", ""), reason=drain_reason(fields))


def _seconds(text: str, what: str, out: str) -> float | None:
    """An epoch a Slurm document printed ("-": none). Anything else is the command failing (a cut
    or garbled answer), named with what it printed; never a number read from junk (``float``
    alone also takes "nan", "inf" and non-ASCII digits)."""
    if text == "-":
        return None
    if not re.fullmatch(r"[0-9]{1,12}(?:\.[0-9]{1,9})?", text):
        raise CommandFailedError(f"{what}: {text[:40]!r} is no epoch time: {out.strip()[:300]}")
    return float(text)


def _requeue_result(lines: list[str]) -> EvacuationResult:
    """What the slurm-requeue document printed (``requeued <job> <nodes>``, ``not_requeued <job>
    <why>``, or ``not_drained <state>`` alone), over one or more commands: a job one of them
    requeued is requeued."""
    requeued: list[str] = []
    refused: dict[str, str] = {}
    job_nodes: dict[str, list[str]] = {}
    not_drained = ""
    for line in lines:
        word, _, rest = line.partition(" ")
        job, _, nodes = rest.strip().partition(" ")
        if word == "not_drained":
            not_drained = rest.strip() or "?"
        elif word == "requeued" and job not in job_nodes:
            requeued.append(job)
            try:
                job_nodes[job] = expand_hostlist(nodes)
            except ValueError:  # the job is requeued all the same; only its other nodes are unknown
                job_nodes[job] = []
        elif word == "not_requeued":
            refused[job] = rest.strip()
    not_requeued = [why for job, why in refused.items() if job not in job_nodes]
    return EvacuationResult(requeued=requeued, not_requeued=not_requeued, job_nodes=job_nodes,
                            not_drained="" if requeued else not_drained)


class SlurmViaSSM(HostGpuClients, NoAutoscalers):
    """:class:`~nodemedic.orchestrators.base.Orchestrator` for Slurm, driven with the stack's
    documents: on the controller through ``runner`` (SSM Run Command, or the relay where SSM cannot
    reach it), on a new instance (its join) through ``nodes_runner`` (SSM; ``runner`` when not given)."""

    def __init__(self, runner: Commands, controller_instance_id: str, timeout_s: int, documents: Documents,
                 spare_reservation: str = "nodemedic_spares", nodes_runner: Commands | None = None) -> None:
        self._run = runner
        self._nodes = nodes_runner or runner
        self._controller = controller_instance_id
        self._timeout = timeout_s
        self._docs = documents
        self._reservation = spare_reservation

    def _send(self, document: str, comment: str, **parameters: str) -> str:
        return self._run.run_checked(self._controller, document, parameters, self._timeout, comment)

    def _query(self, operation: str, comment: str, **parameters: str) -> str:
        return self._send(self._docs.slurm_query, comment, operation=operation, **parameters)

    def node_status(self, node: str) -> NodeStatus:
        out = self._query("node", f"show node {node}", node=node)
        fields = parse_scontrol_record(out.strip().splitlines()[-1] if out.strip() else "")
        if fields.get("NodeName") != node:
            raise CommandFailedError(f"scontrol did not describe node {node}: {out.strip()[:300]}")
        return _node_status(fields)

    def adopt(self, node: str, instance_id: str, reason: str, since: float | None = None) -> str | None:
        """The replacement joins Slurm as ``node`` (the node-join document on the instance); the
        controller keeps the node's drain across the new slurmd's registration. A retry (the join
        outlasted the wait; SSM was throttled) reads the join this replacement already sent (since
        ``since``): done, or waited for, rather than a second join started beside the first; one
        that failed is sent again."""
        given = {"slurmNode": node}
        sent = self._nodes.sent_since(instance_id, self._docs.node_join, given, since) if since is not None else []
        if sent and self._nodes.wait(instance_id, sent[-1], self._timeout).ok:
            return node
        self._nodes.run_checked(instance_id, self._docs.node_join, given, self._timeout, f"join {node}")
        return node

    def nodes(self) -> list[NodeStatus]:
        """Every node the controller knows, a page (what fits in SSM's 24,000 characters of
        output, a few hundred nodes) per command: the document ends each page with
        ``next <record>`` or ``end <records>``, so a cut or cut-short list is never read as whole."""
        statuses: list[NodeStatus] = []
        offset = 0
        while True:
            out = self._query("nodes", f"show nodes from {offset}", offset=str(offset))
            lines = [line for line in out.splitlines() if line.strip()]
            last = lines.pop().split() if lines else []
            records = [parse_scontrol_record(line) for line in lines]
            if len(last) != 2 or last[0] not in ("next", "end") or not last[1].isdigit() \
                    or any("NodeName" not in r for r in records):
                raise CommandFailedError(f"scontrol did not list the nodes: {out.strip()[:300]}")
            statuses += [_node_status(fields) for fields in records]
            if last[0] == "end":
                if not statuses or len(statuses) != int(last[1]):
                    raise CommandFailedError(f"scontrol listed {len(statuses)} of {last[1]} nodes (the list "
                                             f"changed between pages?): {out.strip()[:300]}")
                return statuses
            if int(last[1]) <= offset:
                raise CommandFailedError(f"the node list did not advance past record {offset}: {out.strip()[:300]}")
            offset = int(last[1])

    def drain(self, node: str, reason: str, takeover: str = "-") -> bool:
        """Drain ``node`` with ``reason`` unless it is drained already by someone whose reason does
        not start with ``takeover`` (``-``: nobody's drain is taken over), checked and acted on in
        one scheduler command. True when the node is drained with ``reason`` now."""
        try:
            out = self._send(self._docs.slurm_drain, f"drain {node}", node=node,
                             reason=_REASON_UNSAFE.sub("_", reason)[:200], takeover=takeover)
        except CommandFailedError as exc:
            raise DrainFailedError(str(exc)) from exc
        last = out.strip().splitlines()[-1] if out.strip() else ""
        if last != "drained" and not last.startswith("kept"):
            raise DrainFailedError(f"the drain of {node} did not say what it did: {out.strip()[:300]}")
        return last == "drained"

    def evacuate(self, node: str, started_at: float | None = None) -> EvacuationResult:
        """Requeue each job on the node, then release it at once (a requeued job is otherwise held
        until requeue time + cred_expire, 120 s by default); see the slurm-requeue document. Slurm
        requeues in one command: nothing is ever pending.

        A retried drain (``started_at``: its start) first reads the requeue commands it sent since
        then: a job they requeued has left the node, and an answer the earlier invocation never read
        (it timed out waiting for a slow controller; SSM was throttled) would be lost with it, and
        the job's spare with it. One that succeeded is the answer (a command still running is
        waited for); what a failed one printed is kept, and a new command requeues the rest."""
        earlier: list[str] = []
        if started_at is not None:
            for command_id in self._run.sent_since(self._controller, self._docs.slurm_requeue, {"node": node},
                                                   started_at):
                result = self._run.wait(self._controller, command_id, self._timeout)
                lines = result.stdout.splitlines()
                if result.ok and not result.cut:
                    return _requeue_result([*earlier, *lines])
                earlier += lines[:-1] if result.cut else lines  # a cut answer's last line may be cut too
        out = self._send(self._docs.slurm_requeue, f"requeue jobs on {node}", node=node)
        return _requeue_result([*earlier, *out.splitlines()])

    def busy(self, node: str) -> str | None:
        """Why no destructive step may touch ``node`` now (it runs a job, or it is no longer
        drained), read in one command right before the step; None when it may."""
        out = self._query("guard", f"guard {node}", node=node)
        lines = out.strip().splitlines()
        fields = parse_scontrol_record(lines[0] if lines else "")
        if fields.get("NodeName") != node:
            raise CommandFailedError(f"scontrol did not describe node {node}: {out.strip()[:300]}")
        status = _node_status(fields)
        jobs = [line.split()[1] for line in lines[1:] if line.startswith("job ")]
        if jobs:
            return f"{node} runs job(s) {', '.join(jobs)} ({status.state})"
        if not status.drained:
            return f"{node} is no longer drained ({status.state}): someone returned it to service"
        return None

    def jobs_on(self, node: str) -> list[str]:
        out = self._query("jobs-on", f"jobs on {node}", node=node)
        return [line.strip() for line in out.splitlines() if line.strip()]

    def running_jobs(self, node: str) -> list[RunningJob]:
        """The jobs running on ``node`` with their partition, start and checkpoint marker (the last
        ``nodemedic-checkpoint=<epoch>`` in the job's comment), and the controller's clock."""
        out = self._query("running-jobs", f"running jobs on {node}", node=node)
        lines = out.strip().splitlines()
        if not lines or not lines[0].startswith("now "):
            raise CommandFailedError(f"the running jobs on {node} were not listed: {out.strip()[:300]}")
        now = _seconds((lines[0].split() + ["-"])[1], "the controller's clock", out)
        if now is None:
            raise CommandFailedError(f"the running jobs on {node} were listed without the controller's clock: "
                                     f"{out.strip()[:300]}")
        jobs = []
        for line in lines[1:]:
            word, job, group, start, marker = (line.split() + ["-"] * 5)[:5]
            if word == "job":
                jobs.append(RunningJob(job, group, _seconds(start, f"job {job}'s start", out),
                                       _seconds(marker, f"job {job}'s checkpoint marker", out), now))
        return jobs

    def request_checkpoint(self, node: str, job_ids: list[str], signal: str, scope: str) -> list[str]:
        """``scancel --signal`` to each job's ``scope`` step(s); the jobs that could not be signalled."""
        signalled = {line.split()[1] for jobs in job_lists(job_ids)
                     for line in self._send(self._docs.slurm_signal, f"checkpoint jobs on {node}", jobs=jobs,
                                            signal=signal, scope=scope).splitlines()
                     if line.startswith("signalled ")}
        return [j for j in job_ids if j not in signalled]

    def resume(self, node: str, owner: str = "*") -> bool:
        """Resume ``node`` if its drain reason is ``owner``'s (``*``: any drain, an operator's own
        resume), checked and acted on in one scheduler command. True when it was resumed."""
        try:
            out = self._send(self._docs.slurm_resume, f"resume {node}", node=node, owner=owner)
        except CommandFailedError as exc:
            raise ResumeFailedError(str(exc)) from exc
        return "resumed" in out.split()

    # -- jobs -----------------------------------------------------------------------------
    def job_states(self, job_ids: list[str]) -> dict[str, JobState]:
        """Each job's state, and the epoch start of a running one (``date`` converts StartTime,
        the controller's local time, there)."""
        if not job_ids:
            return {}
        states: dict[str, JobState] = {}
        for jobs in job_lists(job_ids):
            out = self._query("job-states", "job states", jobs=jobs)
            for line in out.splitlines():
                job, _, rest = line.strip().partition("|")
                state, _, epoch = rest.partition("|")
                if job:
                    states[job] = JobState(job, state, _seconds(epoch.strip() or "-", f"job {job}'s start", out))
        return states

    # -- hot spares: the nodes of one Slurm reservation -----------------------------------
    def spares(self) -> list[NodeStatus]:
        """The nodes in the spare reservation, with their state (a drained or down one is no spare)."""
        out = self._query("spares", "list spares", reservation=self._reservation)
        records = [parse_scontrol_record(line) for line in out.splitlines()]
        return [_node_status(fields) for fields in records if fields.get("NodeName")]

    def take_spare(self, node: str) -> None:
        """Take ``node`` out of the spare reservation: pending jobs (the requeued one first, by
        its age) can start on it at once."""
        self._send(self._docs.spare_take, f"take spare {node}", node=node, reservation=self._reservation)

    def add_spare(self, node: str, owner: str) -> bool:
        """Put ``node`` into the spare reservation, then lift its drain if ``owner`` set it: it is
        idle but only jobs that name the reservation can use it. The drain is lifted only once
        Slurm shows the node reserved, and the call returns once the node answers: a pending job
        never sees it free. True when the drain was lifted."""
        out = self._send(self._docs.spare_add, f"add spare {node}", node=node, reservation=self._reservation,
                         owner=owner)
        return "resumed" in out.split()
