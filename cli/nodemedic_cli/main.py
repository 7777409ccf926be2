"""``nodemedic``: the operator CLI."""

from __future__ import annotations

import getpass
import json
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn

import boto3
import typer
from botocore.exceptions import BotoCoreError, ClientError
from nodemedic import operations
from nodemedic.errors import NodeMedicError
from nodemedic.operations import OperatorError
from rich.console import Console
from rich.table import Table

from nodemedic_cli import operator, report
from nodemedic_cli.console import console, plain
from nodemedic_cli.fleet.commands import app as fleet_app
from nodemedic_cli.fleet.model import parse_duration_hours
from nodemedic_cli.target import Target, TargetError, stack_from_samconfig
from nodemedic_cli.xid import app as xid_app

err_console = Console(stderr=True)

app = typer.Typer(help="NodeMedic: event-driven remediation of GPU training nodes.",
                  no_args_is_help=True, add_completion=False, rich_markup_mode="markdown")
app.add_typer(fleet_app, name="fleet")
app.add_typer(xid_app, name="xid")


@app.command()
def demo(
    nodes: Annotated[int, typer.Option(
        min=6, max=32, help="Nodes in the local cluster (two 2-node jobs plus two idle nodes).")] = 6,
    scheduler: Annotated[str, typer.Option(
        help="auto: real local Slurm if it can start (root + Debian packages), else simulated. slurm / simulated: "
             "that one. kubernetes (or k8s): an EKS-like cluster on a real kube-apiserver (`make kube` builds it), "
             "the stack deployed with Orchestrator=kubernetes.",
    )] = "auto",
    report_file: Annotated[Path, typer.Option("--report", help="Where the demo writes its HTML report.")] = Path(
        "nodemedic-demo-report.html"),
    provider: Annotated[str, typer.Option(
        help="Where the instances come from: autoscaling (an Auto Scaling group, a managed node group on "
             "Kubernetes) or, with --scheduler kubernetes, karpenter (a static NodePool; the demo plays "
             "Karpenter: a replace deletes the NodeClaim and a new instance joins).")] = "autoscaling",
) -> None:
    """Run the local end-to-end demo: deploy template.yaml into an embedded AWS, start a cluster,
    inject faults, show remediation live and print per-incident MTTD/MTTR."""
    scheduler = "kubernetes" if scheduler == "k8s" else scheduler
    if scheduler not in ("auto", "slurm", "simulated", "kubernetes"):
        raise typer.BadParameter("choose auto, slurm, simulated or kubernetes (k8s)", param_hint="--scheduler")
    if provider not in ("autoscaling", "karpenter") or (provider == "karpenter" and scheduler != "kubernetes"):
        raise typer.BadParameter("choose autoscaling, or karpenter with --scheduler kubernetes", param_hint="--provider")
    import logging

    from nodemedic_cli.demo import run_demo

    logging.getLogger("moto").setLevel(logging.CRITICAL)  # failed executions are shown, not logged

    raise typer.Exit(run_demo(console, nodes=nodes, scheduler=scheduler, report_path=report_file, provider=provider))


@app.command()
def schema(
    write: Annotated[bool, typer.Option(help="Write events/schema/*.json instead of printing.")] = False,
    directory: Annotated[Path, typer.Option(help="Where --write puts the files.")] = Path("events/schema"),
) -> None:
    """Print (or write) the JSON Schema of each event the agent sends and of the Remediation Request v1:
    Node Health Event, Node Heartbeat, EC2 Scheduled Events and EC2 rebalance notices (events/schema/)."""
    from nodemedic.contracts.schema import SCHEMAS, json_schema

    for name in SCHEMAS:
        text = json.dumps(json_schema(name), indent=2, sort_keys=True) + "\n"
        if write:
            (directory / name).write_text(text)
            console.print(f"wrote {directory / name}")
        else:
            console.print_json(text)


# -- operator commands against a deployed stack (AWS, or the local mode's embedded AWS) --------
def _target(ctx: typer.Context) -> Target:
    if isinstance(ctx.obj, Target):  # the local mode's tests hand one in
        return ctx.obj
    opts: dict[str, Any] = ctx.obj or {}
    stack = opts.get("stack") or stack_from_samconfig()
    if not stack:
        raise TargetError("no stack: pass --stack NAME, or run where samconfig.toml names one (sam deploy --guided)")
    session = boto3.Session(profile_name=opts.get("profile"), region_name=opts.get("region"))
    target = Target(stack, session=session, endpoint_url=opts.get("endpoint_url"))
    ctx.obj = target
    return target


def _fail(message: str, as_json: bool) -> NoReturn:
    if as_json:
        print(json.dumps({"error": message}))
    else:
        err_console.print(f"[red]error:[/] {plain(message)}")
    raise typer.Exit(2)


def _run(ctx: typer.Context, as_json: bool, work: Callable[[Target], Any], show: Callable[[Any], None]) -> None:
    """Run one command: resolve the stack, act, print (rich or JSON); a refusal exits 2 with why."""
    try:
        result = work(_target(ctx))
    except NodeMedicError as exc:  # OperatorError, TargetError, or the cluster refusing an action
        _fail(str(exc), as_json)
    except (ClientError, BotoCoreError) as exc:  # which call AWS refused and why, or no AWS: no traceback
        _fail(operator.aws_failure(exc), as_json)
    if as_json:
        print(json.dumps(_finite(result), indent=2, default=str, allow_nan=False))
    else:
        show(result)


def _finite(value: Any) -> Any:
    """``value`` with each NaN or infinity as null: JSON has neither (a node's report may hold one,
    and ``NaN`` in --json output stops jq and every strict parser)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


@app.callback()
def main(
    ctx: typer.Context,
    stack: Annotated[str | None, typer.Option(help="The NodeMedic stack (default: stack_name in ./samconfig.toml).")] = None,
    region: Annotated[str | None, typer.Option(help="AWS region (default: the usual AWS configuration).")] = None,
    profile: Annotated[str | None, typer.Option(help="AWS profile.")] = None,
    endpoint_url: Annotated[str | None, typer.Option(help="Send every AWS call here (an AWS emulator).")] = None,
) -> None:
    """NodeMedic: event-driven remediation of GPU training nodes."""
    if not isinstance(ctx.obj, Target):
        ctx.obj = {"stack": stack, "region": region, "profile": profile, "endpoint_url": endpoint_url}


AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for scripts (errors too, exit 2).")]
By = Annotated[str, typer.Option(help="Who is acting (recorded with the action).", envvar="NODEMEDIC_OPERATOR")]
Reason = Annotated[str, typer.Option(help="Why (recorded): 3 to 200 characters, without quotes, backquotes, $, "
                                          "backslashes or control characters.")]


@app.command()
def remediate(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="Slurm node name, e.g. gpu-12.")],
    action: Annotated[str, typer.Option(help="replace / reboot: start the state machine as the automatic path does. "
                                             "drain / resume / health-check: that one step, now. drain also takes "
                                             "over NodeMedic's own drain (keep a node out, e.g. for an RMA: "
                                             "automation never lifts an operator's drain). resume, replace and "
                                             "reboot also end the hold of an ended incident (quarantined, "
                                             "escalated, retired) on the node: its next fault opens a new "
                                             "incident. replace / reboot wait until the state machine has "
                                             "opened the incident (seconds), or say why it opened none.")],
    reason: Reason,
    by: By = "",
    level: Annotated[str, typer.Option(help="health-check: quick or full.")] = "quick",
    as_json: AsJson = False,
) -> None:
    """Remediate a node by hand (a runbook step)."""
    def show(r: dict[str, Any]) -> None:
        if r.get("started"):
            if r["opened"]:
                console.print(f"started incident [bold]{plain(r['incident'])}[/] ({plain(r['action'])} "
                              f"{plain(r['node'])}); follow it with `nodemedic show {plain(r['incident'])}`")
            else:
                why = (f"could not see whether Detect opened incident {plain(r['incident'])} ({plain(r['unseen'])})"
                       if r.get("unseen") else f"Detect has not opened incident {plain(r['incident'])} after "
                       f"{operator.DETECT_WAIT_S:.0f} s (AWS throttling, say)")
                console.print(f"started execution {plain(r['execution_arn'])} ({plain(r['action'])} "
                              f"{plain(r['node'])}); {why}: `aws stepfunctions describe-execution` says where it stands")
            _say_released(r)
        elif r["action"] == "health-check":
            colour = "green" if r["healthy"] else "red"
            console.print(f"{plain(r['node'])} ({plain(r['instance_id'])}) {plain(r['level'])} check: [{colour}]"
                          f"{'healthy' if r['healthy'] else 'UNHEALTHY'}[/]")
            for c in r["checks"]:
                console.print(f"  {'ok ' if c.get('ok') else 'FAIL'} {plain(c.get('name'))}: {plain(c.get('detail', ''))}")
        else:
            console.print(f"{plain(r['action'])} {plain(r['node'])}: now {plain(r['state'])}")
            _say_released(r)
    _run(ctx, as_json, lambda t: operator.remediate(t, node, action, reason, by or _user(), level), show)


def _say_released(r: dict[str, Any]) -> None:
    for incident in r.get("released", []):
        console.print(f"  incident {plain(incident)} (ended) no longer holds the node: its next fault opens a new "
                      "incident")


@app.command()
def incidents(
    ctx: typer.Context,
    open_: Annotated[bool, typer.Option("--open", help="Only incidents still in progress.")] = False,
    since: Annotated[str | None, typer.Option(
        help="Only incidents detected after this (server time): ISO time or a duration ago (24h, 7d).")] = None,
    as_json: AsJson = False,
) -> None:
    """List incidents, newest first."""
    def show(rows: list[dict[str, Any]]) -> None:
        table = Table(title=f"{len(rows)} incidents")
        for col in ("incident", "node", "fault", "status", "stage", "observed", "MTTR s"):
            table.add_column(col)
        for r in rows:
            mttr = (datetime.fromisoformat(r["closed_at"]) - datetime.fromisoformat(r["observed_at"])).total_seconds() \
                if r["closed_at"] and r["status"] == "closed" else None
            table.add_row(*(plain(r[k]) for k in ("incident", "node", "fault", "status", "stage")),
                          plain(r["observed_at"][:19]), f"{mttr:.1f}" if mttr is not None else "-")
        console.print(table)
    def work(t: Target) -> list[dict[str, Any]]:
        with _reading() as progress:
            return operator.list_incidents(t, open_, _since(since), progress)
    _run(ctx, as_json, work, show)


@contextmanager
def _reading() -> Iterator[Callable[[int], None]]:
    """A line on stderr (a terminal only) that counts the incidents read while the ledger is scanned."""
    with err_console.status("reading the ledger...") as status:
        yield lambda n: status.update(f"reading the ledger: {n:,} incidents so far")


@app.command("show")
def show_incident(
    ctx: typer.Context,
    incident: Annotated[str, typer.Argument(help="Incident id (the execution name).")],
    as_json: AsJson = False,
) -> None:
    """One incident: its stage timeline with durations, and what each stage decided and why."""
    def show(r: dict[str, Any]) -> None:
        console.print(f"[bold]{plain(r['incident'])}[/] {plain(r['node'])} ({plain(r['instance_id'])}) "
                      f"{plain(r['fault'])} {plain('[' + r['fault_class'] + ']')} - [bold]{plain(r['status'])}[/] "
                      f"{plain(r['outcome'])}")
        console.print(f"why: {plain(r['reason'])}; ladder: {plain(' > '.join(r['ladder']))}; duplicate events folded: "
                      f"{r['duplicate_events']}")
        table = Table()
        for col in ("stage", "took s", "done at (s from fault)", "decision"):
            table.add_column(col)
        for row in r["timeline"]:
            table.add_row(plain(row["stage"]), "-" if row["seconds"] is None else f"{row['seconds']:.1f}",
                          f"{row['from_fault_s']:.1f}", plain(row["decision"][:160]))
        console.print(table)
        if r["failure"]:
            console.print(f"[red]failed in {plain(r['failure'].get('stage'))}:[/] {plain(r['failure'].get('error'))}")
    _run(ctx, as_json, lambda t: operator.show(t, incident), show)


def _answer(ctx: typer.Context, incident: str, approve_it: bool, by: str, reason: str, as_json: bool) -> None:
    def show(r: dict[str, str]) -> None:
        console.print(f"incident {plain(r['incident'])}: {plain(r['decision'])} by {plain(r['by'])}")
    _run(ctx, as_json, lambda t: operator.approve(t, incident, approve_it, by or _user(), reason), show)


@app.command()
def approve(ctx: typer.Context, incident: Annotated[str, typer.Argument(help="Incident waiting for approval.")],
            reason: Reason, by: By = "", as_json: AsJson = False) -> None:
    """Approve an incident that waits (approval mode): it goes on to repair the node. Refused while
    automation is paused (the incident would stop before it touches the node); it waits meanwhile."""
    _answer(ctx, incident, True, by, reason, as_json)


@app.command()
def deny(ctx: typer.Context, incident: Annotated[str, typer.Argument(help="Incident waiting for approval.")],
         reason: Reason, by: By = "", as_json: AsJson = False) -> None:
    """Deny an incident that waits (approval mode): it ends, the node stays drained."""
    _answer(ctx, incident, False, by, reason, as_json)


def _status_line(r: dict[str, Any]) -> None:
    paused = r["paused"]
    automation = f"[yellow]PAUSED[/] by {plain(paused['by'])}: {plain(paused['reason'])}" if paused else "[green]on[/]"
    console.print(f"automation: {automation}")
    b = r["breaker"]
    console.print(f"breaker: {'[red]OPEN[/]' if b['state'] == 'open' else '[green]closed[/]'} (trips: {b['trips']}); "
                  f"remediations in progress: {len(r['in_progress'])}; waiting for a slot: {len(r['waiting_for_a_slot'])}; "
                  f"admitted within the breaker's window: {len(r['admitted_in_window'])}")


@app.command()
def pause(ctx: typer.Context, reason: Reason, by: By = "", as_json: AsJson = False) -> None:
    """Pause all automation: new incidents are recorded and held, no node is touched; an incident
    under way takes no spare and stops before its next step that changes its node (the drain, the
    requeue, a rung, the check after it): escalated, the node left as it is."""
    _run(ctx, as_json, lambda t: (operations.pause(t.control, by or _user(), reason), operator.control_status(t))[1],
         _status_line)


def _reenabled_lines(r: dict[str, Any]) -> None:
    _status_line(r)
    released = r["released_held"]
    if not released:
        return
    console.print(f"released {len(released)} held incident(s). Their faults are not looked at again: a node's next "
                  "event opens a new incident; a fault reported once (an XID) needs a remediation by hand:")
    for i in released:
        console.print(plain(f"  {i['node']} ({i['instance_id']}) {i['fault']}: held in {i['incident']} ({i['outcome']})"[:240]))
    console.print("  e.g. `nodemedic remediate <node> --action replace --reason ...` (docs/runbooks/replace-a-node.md)")


@app.command("resume")
def resume_automation(ctx: typer.Context, reason: Reason, by: By = "", as_json: AsJson = False) -> None:
    """Resume automation after a pause; lists the held incidents it releases (their faults are not
    looked at again, but for a node that lost its instance: the reconciler's next run rejoins it)."""
    _run(ctx, as_json, lambda t: operator.reenabled(t, operations.resume_automation(t.control, t.ledger, by or _user(),
                                                                                    reason)), _reenabled_lines)


agent_app = typer.Typer(help="The node agent's artifact: publish its wheelhouse where install-agent.sh fetches it.",
                        no_args_is_help=True, rich_markup_mode="markdown")
app.add_typer(agent_app, name="agent")


@agent_app.command("publish")
def agent_publish(
    ctx: typer.Context,
    wheelhouse: Annotated[Path | None, typer.Argument(
        help="The wheelhouse tar.gz (default: the newest dist/nodemedic-agent-wheelhouse-*.tar.gz, "
             "from `make agent-wheelhouse`).")] = None,
    as_json: AsJson = False,
) -> None:
    """Upload the agent's self-contained wheelhouse to the stack's bucket (`AgentArtifactsBucketName`,
    under agent/) and print the install-agent.sh line for the nodes: they fetch it with their
    instance role (the stack's AgentPublishPolicy), with no package index. The file is checked
    first: one that is not a wheelhouse is refused and nothing is uploaded."""
    from nodemedic_cli import agent_artifact

    def show(r: dict[str, Any]) -> None:
        console.print(f"published {plain(r['s3_url'])} ({r['bytes'] / 1e6:.1f} MB): agent {plain(r['agent'])}, "
                      f"CPython {plain(', '.join(r['pythons']))} on {plain(', '.join(r['archs']))}")
        console.print("install it on each GPU node (its instance role needs the stack's AgentPublishPolicy):")
        console.print(f"  {plain(r['install'])}")
    _run(ctx, as_json, lambda t: agent_artifact.publish(t, wheelhouse), show)


breaker_app = typer.Typer(help="The circuit breaker: status and reset.", no_args_is_help=True, rich_markup_mode="markdown")
app.add_typer(breaker_app, name="breaker")


@breaker_app.command("status")
def breaker_status(ctx: typer.Context, as_json: AsJson = False) -> None:
    """Whether automation is paused and the breaker open, and what is in progress."""
    _run(ctx, as_json, operator.control_status, _status_line)


@breaker_app.command("reset")
def breaker_reset(ctx: typer.Context, reason: Reason, by: By = "", as_json: AsJson = False) -> None:
    """Close a tripped breaker; nodes held while it was open take new incidents again. Lists the
    held incidents it releases (their faults are not looked at again, but for a node that lost its
    instance: the reconciler's next run rejoins it)."""
    _run(ctx, as_json, lambda t: operator.reenabled(t, operations.reset_breaker(t.control, t.ledger, by or _user(),
                                                                                reason)), _reenabled_lines)


@app.command()
def doctor(
    ctx: typer.Context,
    local: Annotated[bool, typer.Option(
        "--local", help="Deploy the local stack (embedded AWS, local cluster, one remediation) and check it.")] = False,
    as_json: AsJson = False,
) -> None:
    """Check a deployment after sam deploy: the JSON parameters and the safety policy valid; rules
    wired; each function's role allowed every call it makes (iam:SimulatePrincipalPolicy); the SSM
    documents; the alarm topic usable by CloudWatch; the alarm and dashboard metrics published with
    exactly the dimensions they query; every Slurm or Kubernetes node mapped to an instance; on
    Slurm, running instances that back no node (a warning: they run nothing while they cost); the
    agents' heartbeats, the nodes whose agent was never heard, and agents that name their node unlike
    the scheduler; the spare pool; the agent's wheelhouse published (a warning). A fix hint for each
    failed row; exit 1 when any check fails."""
    from nodemedic_cli import doctor as checks

    def show(rows: list[dict[str, str]]) -> None:
        table = Table(title="nodemedic doctor")
        for col in ("check", "status", "detail", "fix"):
            table.add_column(col, overflow="fold")
        colour = {"pass": "green", "warn": "yellow", "fail": "red"}
        for r in rows:
            table.add_row(plain(r["check"]), f"[{colour[r['status']]}]{r['status']}[/]", plain(r["detail"]), plain(r["fix"]))
        console.print(table)

    if local:
        rows = _doctor_local()
    else:
        def work(t: Target) -> list[dict[str, str]]:
            return [r.as_dict() for r in checks.run(t)]
        try:
            rows = work(_target(ctx))
        except TargetError as exc:
            _fail(str(exc), as_json)
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        show(rows)
    raise typer.Exit(1 if any(r["status"] == "fail" for r in rows) else 0)


def _doctor_local() -> list[dict[str, str]]:
    """The local stack, deployed from template.yaml, with agents heard and one incident remediated,
    checked with the local IAM evaluator in place of iam:SimulatePrincipalPolicy."""
    import logging
    import time

    from nodemedic_sandbox.local import LocalMode

    from nodemedic_cli import doctor as checks

    logging.getLogger("moto").setLevel(logging.CRITICAL)
    with LocalMode(nodes=4, schedule_scale=0.05) as stack:
        err_console.print(f"deployed {stack.stack.name} locally ({stack.scheduler_note or 'real Slurm'}); "
                          "agents heartbeating, one XID 79 being remediated...")
        stack.start_agents(heartbeat_s=1.0)
        stack.put_event(stack.health_event(stack.node_names[-1], "XID 79"))
        stack.wait_for_executions(1, timeout=120)
        time.sleep(4)  # a sweep or two records the heartbeats
        target = Target(stack.stack.name, session=boto3.Session())
        rows = checks.run(target, permissions=checks.LocalPermissions(target.client("iam")))
    return [r.as_dict() for r in rows]


@app.command("planned")
def planned_command(ctx: typer.Context, as_json: AsJson = False) -> None:
    """Planned notices (AWS retirements, stops, reboot maintenance) still waiting: for their lead
    time (PlannedLeadTimeHours), or for room under the circuit breaker, which a campaign of many
    nodes takes a few at a time; and the planned work released within the breaker's window."""
    def show(r: dict[str, Any]) -> None:
        table = Table(title=f"{len(r['waiting'])} planned notice(s) waiting")
        for col in ("node", "instance", "fault", "deadline", "acts at", "waits for"):
            table.add_column(col)
        for w in r["waiting"]:
            table.add_row(*(plain(w[k] or "-") for k in ("node", "instance", "fault")), plain((w["deadline"] or "-")[:16]),
                          plain(w["act_at"][:16]), plain(w["waits_for"]))
        console.print(table)
        released = ", ".join(f"{x['node']} ({x['at'][11:16]}Z)" for x in r["released"]) or "none"
        console.print(f"planned work released within the last {r['window_minutes']:g} min: {plain(released)}")
        if r["policy_error"]:
            console.print(f"[red]{plain(r['policy_error'])}[/red]")
    _run(ctx, as_json, operator.planned, show)


@app.command("spares")
def spares_command(ctx: typer.Context, as_json: AsJson = False) -> None:
    """The hot-spare pool: its nodes (Slurm: in the spare reservation; Kubernetes: with the spare
    taint) and whether each is ready."""
    def show(r: dict[str, Any]) -> None:
        console.print(f"hot spares: {r['ready']} ready of target {r['target_size']} ({plain(r['held_by'])})")
        for n in r["nodes"]:
            console.print(f"  {plain(n['node'])}: {plain(n['state'])}{'' if n['ready'] else ' [yellow](not ready)[/]'}")
    _run(ctx, as_json, operator.spares, show)


@app.command("report")
def report_command(
    ctx: typer.Context,
    since: Annotated[str | None, typer.Option(
        help="Only incidents detected after this (server time): an ISO time or a duration ago (24h, 7d).")] = None,
    html_file: Annotated[Path | None, typer.Option("--html", help="Also write a self-contained HTML report here.")] = None,
    as_json: AsJson = False,
) -> None:
    """MTTD/MTTR, job downtime and per-stage p50/p90 by fault class, and the training time the
    incidents cost (planned and unplanned: job downtime, work saved by checkpoints, work lost), from the ledger."""
    def work(t: Target) -> dict[str, Any]:
        with _reading() as progress:
            incidents_ = t.ledger.list_incidents(progress)
        built = report.build(incidents_, _since(since))
        if html_file:
            html_file.write_text(report.render_html(built, incidents_, f"NodeMedic report - {t.stack}"))
        return {**report.as_dict(built), "html": str(html_file) if html_file else None}

    def show(r: dict[str, Any]) -> None:
        table = Table(title=f"{r['incidents']} incidents; seconds from the fault")
        for col in ("fault class", "incidents", "recovered", "MTTD p50", "MTTD p90", "MTTR p50", "MTTR p90",
                    "job down p50", "job down p90"):
            table.add_column(col, justify="right")
        for c in [*r["by_fault_class"], r["overall"]]:
            table.add_row(c["fault_class"], str(c["incidents"]), str(c["recovered"]),
                          *(_n(c[k][q]) for k in ("mttd_s", "mttr_s", "job_downtime_s") for q in ("p50", "p90")))
        console.print(table)
        stages = Table(title="stage durations (s)")
        for col in ("stage", "n", "p50", "p90"):
            stages.add_column(col, justify="right")
        for s, v in r["overall"]["stages_s"].items():
            stages.add_row(s, str(v["n"]), _n(v["p50"]), _n(v["p90"]))
        console.print(stages)
        training = Table(title="training time (s): planned and unplanned incidents")
        for col in ("incidents", "n", "jobs requeued", "job downtime", "checkpointed first", "work saved", "work lost"):
            training.add_column(col, justify="right")
        for t in r["training_time"]:
            training.add_row(t["kind"], str(t["incidents"]), str(t["jobs_requeued"]), _n(t["job_downtime_s"]),
                             str(t["jobs_checkpointed"]), _n(t["work_saved_s"]), _n(t["work_lost_s"]))
        console.print(training)
        if r["html"]:
            console.print(f"wrote {plain(r['html'])}")
    _run(ctx, as_json, work, show)


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _since(text: str | None) -> datetime | None:
    """``--since``: a duration ago (the fleet commands' syntax: 30m, 24h, 7d) or an ISO time."""
    if not text:
        return None
    try:
        return datetime.now(UTC) - timedelta(hours=parse_duration_hours(text))
    except (ValueError, OverflowError):  # not a duration, or one further back than any date
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise OperatorError(f"--since {text!r}: give an ISO time (2026-11-22T08:00Z) or a duration ago (30m, 24h, 7d)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _user() -> str:
    return os.environ.get("USER") or getpass.getuser()


if __name__ == "__main__":
    app()
