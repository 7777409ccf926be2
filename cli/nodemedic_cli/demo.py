"""The local end-to-end demo: deploy template.yaml into the embedded AWS, run a cluster,
inject faults, show the remediation live and print per-incident MTTD/MTTR."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nodemedic.contracts.incident import Incident
from nodemedic_sandbox.local import TERMINAL, LocalMode
from rich.console import Console
from rich.live import Live
from rich.table import Table


@dataclass(frozen=True)
class Injection:
    node: str
    fault_code: str
    note: str
    bad_replacement: bool = False


def _secs(a: datetime | None, b: datetime | None) -> str:
    return f"{(b - a).total_seconds():.1f}" if a and b else "-"


def incident_table(incidents: list[Incident]) -> Table:
    table = Table(title="Incidents (seconds; every duration starts at the fault's observed_at)")
    for col in ("incident", "node", "fault", "action", "status", "MTTD", "drain", "replace",
                "health check", "resume", "MTTR"):
        table.add_column(col, justify="right" if col[0].isupper() or col in (
            "drain", "replace", "health check", "resume") else "left")
    for inc in sorted(incidents, key=lambda i: i.detected_at):
        stages = inc.stages

        def end(name: str, stages: dict[str, Any] = stages) -> datetime | None:
            return stages[name].completed_at if name in stages else None

        prev = inc.detected_at
        cells = []
        for name in ("drain", "replace", "health_check", "resume"):
            cells.append(_secs(prev, end(name)))
            prev = end(name) or prev
        status = {"closed": "[green]recovered[/]", "failed": "[red]failed, escalated[/]"}.get(
            inc.status, "[yellow]open[/]")
        table.add_row(inc.incident_id[:8], inc.slurm_node, inc.fault_code, inc.action, status,
                      _secs(inc.observed_at, inc.detected_at), *cells,
                      _secs(inc.observed_at, inc.closed_at))
    return table


def executions_table(local: LocalMode, labels: dict[str, str]) -> Table:
    table = Table(title="Step Functions executions (live)")
    for col in ("execution", "trigger", "status", "stage / outcome"):
        table.add_column(col)
    sfn = local.aws.client("stepfunctions")
    for e in sorted(local.executions(), key=lambda e: e["startDate"]):
        d = sfn.describe_execution(executionArn=e["executionArn"])
        status = d["status"]
        if status == "RUNNING":
            events = sfn.get_execution_history(executionArn=e["executionArn"], reverseOrder=True,
                                               maxResults=20)["events"]
            entered = next((ev["stateEnteredEventDetails"]["name"] for ev in events
                            if "stateEnteredEventDetails" in ev), "starting")
            where = f"[yellow]{entered}[/]"
        elif status == "SUCCEEDED":
            where = f"[green]{local.detect_decision(d) or 'done'}[/]"
        else:
            where = f"[red]{d.get('error', '')}[/]"
        table.add_row(e["name"][:8], labels.get(e["name"], "runbook/alarm"), status, where)
    return table


def run_demo(console: Console, nodes: int = 6, scheduler: str = "auto") -> int:
    console.rule("[bold]NodeMedic local demo")
    started = time.monotonic()
    with console.status("Starting the embedded AWS, the local cluster, and deploying template.yaml..."):
        local = LocalMode(nodes=nodes, scheduler=scheduler, retry_time_scale=0.01)
        local.__enter__()
    try:
        console.print(f"[bold]Scheduler:[/] {local.scheduler_note}")
        console.print(f"[bold]Stack:[/] {local.stack.name} from template.yaml "
                      f"({len(local.stack.resources)} resources) in {time.monotonic() - started:.1f}s; "
                      f"bus [cyan]{local.stack.bus_name}[/]")
        jobs = [local.scheduler.submit(2, name=f"train-{i}") for i in range(2)]
        with console.status("Waiting for 2 training jobs (2 nodes each) to start..."):
            deadline = time.monotonic() + 60
            while any(local.scheduler.job(j)["JobState"] != "RUNNING" for j in jobs):
                if time.monotonic() > deadline:
                    raise RuntimeError("the demo's jobs did not start within 60 s")
                time.sleep(0.2)
        job_nodes = [local.scheduler.hostnames(local.scheduler.job(j)["NodeList"]) for j in jobs]
        for j, ns in zip(jobs, job_nodes, strict=True):
            console.print(f"  job {j} RUNNING on {', '.join(ns)}")
        idle = [n for n in local.node_names if not any(n in ns for ns in job_nodes)]
        plan = [
            Injection(job_nodes[0][0], "XID 79", "GPU fell off the bus under job 1 -> drain, replace"),
            Injection(job_nodes[0][0], "XID 79", "the same fault reported again -> deduplicated"),
            Injection(job_nodes[1][1], "XID 48", "double-bit ECC under job 2 -> drain, reboot"),
            Injection(idle[0], "XID 13", "application fault -> monitored, node untouched"),
            Injection(idle[-1], "GPU_LOST", "GPU lost; its replacement fails the health check -> escalate",
                      bad_replacement=True),
        ]
        labels: dict[str, str] = {}
        console.print("\n[bold]Injecting faults[/] (Node Health Events put on the bus, as the agent does):")
        for inj in plan:
            console.print(f"  {inj.node}: [bold]{inj.fault_code}[/] - {inj.note}")
            if inj.bad_replacement:
                local.cluster.fail_next_replacements(1)
            before = {e["name"] for e in local.executions()}
            local.put_event(local.health_event(inj.node, inj.fault_code))
            for name in {e["name"] for e in local.executions()} - before:
                labels[name] = f"{inj.node} {inj.fault_code}"
            time.sleep(0.3)
        with Live(executions_table(local, labels), console=console, refresh_per_second=4) as live:
            deadline = time.monotonic() + 120
            while True:
                live.update(executions_table(local, labels))
                execs = local.executions()
                if len(execs) >= len(plan) and all(e["status"] in TERMINAL for e in execs):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("executions still running after 120 s")
                time.sleep(0.25)
        console.print(incident_table(local.incidents()))
        for j in jobs:
            info = local.scheduler.job(j)
            console.print(f"  job {j}: {info['JobState']} on {info.get('NodeList') or '-'} "
                          f"(restarts: {info.get('Restarts', '0')})")
        for message in local.escalations():
            console.print(f"[red]SNS escalation:[/] {message.get('Subject')}: {message['Message'][:200]}")
        values = local.metric_values("TimeToRecover", Cluster="local", FaultClass="gpu_lost")
        console.print(f"[bold]CloudWatch[/] NodeMedic/TimeToRecover (Cluster=local, FaultClass=gpu_lost): "
                      f"{', '.join(f'{v:.1f}s' for v in values) or 'none'}")
        console.print(f"Demo finished in {time.monotonic() - started:.1f}s.")
        return 0
    finally:
        local.__exit__()
