"""The local end-to-end demo: deploy template.yaml into the embedded AWS, run a cluster,
inject faults, show the remediation live and print per-incident MTTD/MTTR."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from nodemedic import operations
from nodemedic.contracts.incident import Incident
from nodemedic.domain.classification import classify
from nodemedic.stages.resume import START_SLACK_S
from nodemedic.store.control import ControlStore
from nodemedic_sandbox.local import TERMINAL, LocalMode
from rich.console import Console
from rich.live import Live
from rich.table import Table

from nodemedic_cli import report
from nodemedic_cli.console import plain
from nodemedic_cli.fleet.model import spares_needed


@dataclass(frozen=True)
class Injection:
    """A fault injected into a node's simulated hardware; its agent detects and publishes it."""

    node: str
    fault: str  # a nodemedic-agent simulated fault, or "die" (the agent stops: a silent node)
    label: str
    note: str
    kwargs: dict[str, int] = field(default_factory=dict)
    starts_execution: bool = True
    bad_replacement: bool = False
    while_paused: bool = False  # an operator paused automation first: the incident is held


def _secs(a: datetime | None, b: datetime | None) -> str:
    return f"{(b - a).total_seconds():.1f}" if a and b else "-"


def _ladder(inc: Incident) -> str:
    mark = {True: "ok", False: "failed", None: "-"}
    return " > ".join(f"{r.rung} {mark[r.healthy]}" for r in inc.repair_rungs) or "-"


def incident_table(incidents: list[Incident]) -> Table:
    table = Table(title="Incidents (seconds from the fault's observed_at)")
    for col in ("incident", "node", "fault", "status", "MTTD", "drained", "spare", "job back", "ladder",
                "repaired", "MTTR"):
        table.add_column(col, justify="right" if col[0].isupper() or col in ("drained", "job back", "repaired")
                         else "left")
    for inc in sorted(incidents, key=lambda i: i.detected_at):
        stages = inc.stages

        def end(name: str, stages: dict[str, Any] = stages) -> datetime | None:
            return stages[name].completed_at if name in stages else None

        status = {"closed": "[green]recovered[/]", "failed": "[red]failed, escalated[/]",
                  "held": "[yellow]held[/]", "quarantined": "[red]quarantined, escalated[/]",
                  "escalated": "[red]escalated[/]", "denied": "[yellow]denied[/]",
                  "dry_run": "[cyan]dry run[/]", "retired": "[cyan]retired[/]"}.get(inc.status, "[yellow]open[/]")
        if inc.status == "closed" and inc.outcome.startswith("not corroborated"):
            status = "[cyan]not corroborated[/]"
        spare = stages["spare"].result.get("spare") if "spare" in stages else None
        jobs = stages["jobs"].result if "jobs" in stages else {}
        downtime = jobs.get("job_downtime_s")
        table.add_row(inc.incident_id[:8], inc.slurm_node, inc.fault_code, status,
                      _secs(inc.observed_at, inc.detected_at), _secs(inc.observed_at, end("drain")),
                      str(spare or "-"), f"{downtime:.1f}" if isinstance(downtime, float) else "-", _ladder(inc),
                      _secs(inc.observed_at, end("repair")),
                      _secs(inc.observed_at, inc.closed_at if inc.status == "closed" else None))
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
            where = f"[green]{plain(local.detect_decision(d) or 'done')}[/]"
        else:
            where = f"[red]{plain(d.get('error', ''))}[/]"
        table.add_row(e["name"][:8], labels.get(e["name"], "runbook/alarm"), status, where)
    return table


BOOT_SECONDS = 3.0  # a new or rebooted instance's boot: the published ~900 s, scaled down


def run_demo(console: Console, nodes: int = 6, scheduler: str = "auto", report_path: Path | None = None,
             provider: str = "autoscaling") -> int:
    console.rule("[bold]NodeMedic local demo")
    started = time.monotonic()
    with console.status("Starting the embedded AWS, the local cluster, and deploying template.yaml..."):
        # the silence sweeper fires every second; a node is silent after 4 s without a heartbeat.
        # The breaker allows 4 of the 6 demo nodes under remediation at once (a real cluster: ~10 %).
        local = LocalMode(nodes=nodes, scheduler=scheduler, retry_time_scale=0.01, schedule_scale=1 / 60,
                          spares=1, boot_seconds=BOOT_SECONDS, provider=provider,
                          extra_parameters={"HeartbeatSilenceSeconds": "4", "BreakerMaxPercent": "70",
                                            "NodeCooldownMinutes": "0"})
        local.__enter__()
    try:
        console.print(f"[bold]Scheduler:[/] {local.scheduler_note}")
        console.print("[bold]Capacity:[/] " + (
            f"a Karpenter NodePool ({local.cluster.node_pool}, static; the demo plays Karpenter): a replace deletes "
            "the node's NodeClaim and Karpenter launches another" if provider == "karpenter" else
            "an Auto Scaling group: a replace terminates the instance and the group launches another"))
        console.print(f"[bold]Stack:[/] {local.stack.name} from template.yaml "
                      f"({len(local.stack.resources)} resources) in {time.monotonic() - started:.1f}s; "
                      f"bus [cyan]{local.stack.bus_name}[/]")
        count, empty = spares_needed(256, 0.0005, 25 / 60)
        pool = ("tainted nodemedic.io/spare" if local.cluster.kubernetes
                else f"in Slurm reservation {local.cluster.spare_reservation}")
        console.print(f"[bold]Hot spares:[/] {', '.join(local.spare_names)} {pool} (HotSpares=1). Sizing: 256 p5 "
                      f"at 0.05 %/instance-hour with 25 min per repair need HotSpares={count} (pool empty for "
                      f"{empty:.2%} of failures; `nodemedic fleet spares`)")
        console.print(f"[bold]Boot time:[/] a new or rebooted instance answers after {BOOT_SECONDS:.0f} s "
                      "(the published ~900 s, scaled down)")
        agents = local.start_agents(heartbeat_s=1, poll_s=1)
        console.print(f"[bold]Agents:[/] nodemedic-agent on each of the {nodes} nodes (simulated GPUs, EFA and kernel "
                      "log), heartbeat every 1 s")
        jobs = [local.scheduler.submit(2, name=f"train-{i}") for i in range(2)]
        with console.status("Waiting for 2 training jobs (2 nodes each) to start..."):
            deadline = time.monotonic() + 60
            while any(local.scheduler.job(j)["JobState"] != "RUNNING" for j in jobs):
                if time.monotonic() > deadline:
                    raise RuntimeError("the demo's jobs did not start within 60 s")
                time.sleep(0.2)
        # a job counts as back once it starts again after its drain (less START_SLACK_S, for a
        # scheduler that gives starts in whole seconds): a fault in the jobs' first seconds would
        # read their first start as the restart
        time.sleep(START_SLACK_S + 1)
        job_nodes = [local.scheduler.hostnames(local.scheduler.job(j)["NodeList"]) for j in jobs]
        for j, ns in zip(jobs, job_nodes, strict=True):
            console.print(f"  job {j} RUNNING on {', '.join(ns)}")
        idle = [n for n in local.node_names if not any(n in ns for ns in job_nodes) and n not in local.spare_names]
        plan = [
            Injection(job_nodes[0][0], "xid", "XID 79", "GPU 3 fell off the bus under job 1 -> drain, the job moves "
                      "to the hot spare at once; the node is replaced behind it and joins the pool",
                      {"xid": 79, "gpu": 3}),
            Injection(job_nodes[0][0], "xid", "XID 79", "the same XID again -> folded by the agent, no second event",
                      {"xid": 79, "gpu": 3}, starts_execution=False),
            Injection(job_nodes[1][1], "ecc-dbe", "ECC_DBE", "double-bit ECC under job 2 -> drain; the pool is empty "
                      "now, so the ladder runs on the job's path: a GPU reset fixes it", {"gpu": 5}),
            Injection(idle[0], "xid", "XID 13", "application fault -> monitored, node untouched", {"xid": 13, "gpu": 0}),
            Injection(idle[-1], "gpu-lost", "GPU_LOST", "GPU 6 lost; its replacement fails the deep health check "
                      "-> quarantined, escalated", {"gpu": 6}, bad_replacement=True),
            Injection(idle[0], "die", "HEARTBEAT_MISSING", "the node hangs: heartbeats stop -> the sweeper reports it; "
                      "alone that is ambiguous, so a deep check first (it times out) -> drain, reboot"),
            Injection(job_nodes[1][0], "xid", "XID 48", "an operator paused automation for maintenance -> recorded, held, "
                      "node untouched", {"xid": 48, "gpu": 1}, while_paused=True),
        ]
        control = ControlStore(local.aws.client("dynamodb"), local.stack.table_name, local.cluster.name)
        labels: dict[str, str] = {}
        console.print("\n[bold]Injecting faults[/] into the nodes' simulated hardware; the agents detect and publish them:")
        for done, inj in enumerate(plan):
            console.print(f"  {inj.node}: [bold]{inj.label}[/] - {inj.note}")
            if inj.bad_replacement:
                local.cluster.fail_replacement_of(inj.node)
            if inj.while_paused:
                # every earlier fault's incident must have passed the gate first: on a loaded machine
                # a hang's silence can take longer to report than the wait below
                _wait_for_gates(local, [i for i in plan[:done] if i.starts_execution], timeout=120)
                operations.pause(control, "demo-operator", "switch firmware maintenance")
            before = {e["name"] for e in local.executions()}
            if inj.fault == "die":
                agents.kill(inj.node)
                local.cluster.hang(inj.node)
            else:
                agents.inject(inj.node, inj.fault, **inj.kwargs)
            wait = 30.0 if inj.starts_execution else 1.5  # for the label only; it stops at the first execution
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                new = {e["name"] for e in local.executions()} - before
                if new:
                    labels.update({name: f"{inj.node} {inj.label}" for name in new})
                    break
                time.sleep(0.1)
        expected = sum(inj.starts_execution for inj in plan)
        with Live(executions_table(local, labels), console=console, refresh_per_second=4) as live:
            deadline = time.monotonic() + 120
            while True:
                execs = local.executions()
                done = len(execs) >= expected and all(e["status"] in TERMINAL for e in execs)
                live.update(executions_table(local, labels))
                if done:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("executions still running after 120 s")
                time.sleep(0.25)
        if not console.is_terminal:  # Live leaves its last line open when it prints no cursor moves
            console.line()
        if control.read().paused:
            operations.resume_automation(control, local.ledger, "demo-operator", "maintenance done")
        incidents = local.incidents()
        console.print(incident_table(incidents))
        console.print("[bold]Safety gate decisions[/] (recorded in each incident):")
        for inc in sorted(incidents, key=lambda i: i.detected_at):
            gate = inc.stages.get("gate")
            if gate and gate.result:
                note = f"; {inc.outcome}" if inc.outcome and inc.outcome != gate.result["reason"] else ""
                said = f"{gate.result['reason']}{note}"[:200]
                console.print(f"  {inc.incident_id[:8]} {inc.slurm_node}: [bold]{gate.result['verdict']}[/] - {plain(said)}")
        # a job NodeMedic requeued runs again once its scheduler placed it (a Kubernetes pod is
        # scheduled, then started): on a loaded machine, seconds after its incident ended
        deadline = time.monotonic() + 30
        while any(local.scheduler.job(j)["JobState"] != "RUNNING" for j in jobs) and time.monotonic() < deadline:
            time.sleep(0.5)
        for j in jobs:
            info = local.scheduler.job(j)
            console.print(f"  job {j}: {info['JobState']} on {info.get('NodeList') or '-'} "
                          f"(restarts: {info.get('Restarts', '0')})")
        for message in local.escalations():
            console.print(f"[red]SNS escalation:[/] {plain(message.get('Subject'))}: {plain(message['Message'][:200])}")
        console.print(f"[bold]Hot-spare pool now:[/] {', '.join(local.cluster.spare_pool()) or 'empty'}")
        values = local.metric_values("TimeToRecover", Cluster="local", FaultClass="gpu_lost")
        console.print(f"[bold]CloudWatch[/] NodeMedic/TimeToRecover (Cluster=local, FaultClass=gpu_lost): "
                      f"{', '.join(f'{v:.1f}s' for v in values) or 'none'}")
        if report_path is not None:
            built = report.build(incidents)
            report_path.write_text(report.render_html(built, incidents, "NodeMedic demo report"))
            console.print(f"[bold]Report:[/] {report_path} (stage timeline per incident, MTTD/MTTR distribution; "
                          "`nodemedic report --html` writes the same for a deployed stack)")
        console.print(f"Demo finished in {time.monotonic() - started:.1f}s.")
        return 0
    finally:
        local.__exit__()


def _wait_for_gates(local: LocalMode, injected: list[Injection], timeout: float) -> None:
    """Until each injected fault that opens an incident (not a monitored one) has one past the
    gate, and every execution has ended. Not a count of executions: any extra one makes the count
    early (on a loaded machine a live node's heartbeats may stall past the demo's threshold, and
    that silence starts an execution folded into the node's incident), and the hang's own
    incident, still to come, was then held by the pause."""
    wanted = {(i.node, i.label) for i in injected if classify(i.label).action != "monitor"}
    deadline = time.monotonic() + timeout
    while True:
        gated = {(i.slurm_node, i.fault_code) for i in local.incidents() if "gate" in i.stages}
        if wanted <= gated and all(e["status"] in TERMINAL for e in local.executions()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"faults not past the gate after {timeout:.0f} s: {sorted(wanted - gated)}")
        time.sleep(0.2)
