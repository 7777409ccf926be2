"""``nodemedic fleet``: cluster MTBF, the published two-policy comparison, and the Monte Carlo
simulation of a training run under the manual, HyperPod-like and NodeMedic policies."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from nodemedic_cli.console import console
from nodemedic_cli.fleet import model
from nodemedic_cli.fleet.policies import NodeMedicInputs, hyperpod, manual, nodemedic
from nodemedic_cli.fleet.simulate import Effects, simulate

app = typer.Typer(help="What failures cost a training run, and what NodeMedic saves.", no_args_is_help=True,
                  rich_markup_mode="markdown")

MAX_INSTANCES = 100_000
MAX_SIMULATED_FAILURES = 50_000_000
Instances = Annotated[int, typer.Option(min=1, max=MAX_INSTANCES, help="Instances in the cluster.")]
Rate = Annotated[str, typer.Option(help="Failures per instance-hour: a fraction (0.0005) or a percentage (0.05%).")]
GpuHours = Annotated[float, typer.Option(min=1, max=1e12, help="GPU-hours the training run needs.")]
Gpus = Annotated[int, typer.Option(min=1, max=64, help="GPUs per instance.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def _rate(text: str) -> float:
    try:
        return model.parse_rate(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--failure-rate") from None


def _hours(text: str, hint: str) -> float:
    try:
        return model.parse_duration_hours(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from None


@app.command()
def mtbf(instances: Instances, failure_rate: Rate, as_json: AsJson = False) -> None:
    """Cluster MTBF in hours: 1 / (instances x failure rate)."""
    hours = model.cluster_mtbf_hours(instances, _rate(failure_rate))
    if as_json:
        print(json.dumps({"instances": instances, "failure_rate": _rate(failure_rate), "mtbf_hours": hours}))
    else:
        console.print(f"{hours:.2f} hours between failures ({instances} instances at {_rate(failure_rate):.4%} "
                      "per instance-hour)")


@app.command()
def spares(
    instances: Instances, failure_rate: Rate,
    repair: Annotated[str, typer.Option(help="How long a failed node stays out of the pool: replacement boot + "
                                              "full deep health check, e.g. 25m.")] = "25m",
    risk: Annotated[float, typer.Option(min=0.0001, max=0.5, help="Accepted chance that a failure finds the "
                                                                   "pool empty.")] = 0.01,
    as_json: AsJson = False,
) -> None:
    """Size the hot-spare pool (template parameter HotSpares) from the failure rate."""
    rate, hours = _rate(failure_rate), _hours(repair, "--repair")
    count, empty = model.spares_needed(instances, rate, hours, risk)
    expected = instances * rate * hours
    if as_json:
        print(json.dumps({"instances": instances, "failure_rate": rate, "repair_hours": hours, "risk": risk,
                          "failures_per_repair_window": expected, "spares": count, "p_pool_empty": empty}))
        return
    console.print(f"HotSpares={count}: {instances} instances at {rate:.4%}/instance-hour fail "
                  f"{expected:.3f} times per {hours * 60:.0f}-minute repair window on average; with {count} "
                  f"spare(s) a failure finds the pool empty with probability {empty:.2%} (asked: <= {risk:.2%}).")


@app.command()
def compare(
    instances: Instances, failure_rate: Rate, gpu_hours: GpuHours, gpus_per_instance: Gpus = 8,
    downtime_a: Annotated[str, typer.Option(help="Downtime per failure under policy A, e.g. 280m.")] = "280m",
    downtime_b: Annotated[str, typer.Option(help="Downtime per failure under policy B, e.g. 40m.")] = "40m",
    price_per_gpu_hour: Annotated[float | None, typer.Option(min=0, max=10_000, help="$ per GPU-hour, for cost_saved.")] = None,
    as_json: AsJson = False,
) -> None:
    """The published analytic model: training time, days lost and improvement of B over A."""
    c = model.compare(instances, _rate(failure_rate), gpu_hours, gpus_per_instance,
                      _hours(downtime_a, "--downtime-a"), _hours(downtime_b, "--downtime-b"), price_per_gpu_hour)
    if as_json:
        print(json.dumps(c.as_dict(), indent=2))
        return
    table = Table(title=f"{instances} instances x {gpus_per_instance} GPUs, {gpu_hours:,.0f} GPU-hours, "
                        f"{c.failure_rate:.4%} failures per instance-hour (MTBF {c.cluster_mtbf_hours:.1f} h)")
    for col in ("", "policy A", "policy B"):
        table.add_column(col, justify="right")
    table.add_row("downtime per failure", f"{c.downtime_a_hours * 60:.0f} min", f"{c.downtime_b_hours * 60:.0f} min")
    table.add_row("failure-free days", f"{c.failure_free_days:.1f}", f"{c.failure_free_days:.1f}")
    table.add_row("days lost", f"{c.days_lost_a:.1f}", f"{c.days_lost_b:.1f}")
    table.add_row("total days", f"{c.total_days_a:.1f}", f"{c.total_days_b:.1f}")
    console.print(table)
    saved = f", ${c.cost_saved:,.0f} saved" if c.cost_saved is not None else ""
    console.print(f"B is {c.improvement_pct:.1f}% faster: {c.days_saved:.1f} days saved{saved}.")


@app.command(name="simulate")
def simulate_cmd(
    failure_rate: Rate = "0.05%", gpu_hours: GpuHours = 10_000_000, gpus_per_instance: Gpus = 8,
    sizes: Annotated[str, typer.Option(help="Cluster sizes, comma-separated.")] = "16,32,64,128,256,512,1024",
    runs: Annotated[int, typer.Option(min=1, max=100_000, help="Simulated training runs per size and policy.")] = 200,
    spares: Annotated[int, typer.Option(min=0, max=MAX_INSTANCES, help="NodeMedic hot spares per cluster.")] = 2,
    replacement_boot: Annotated[str, typer.Option(help="New instance boot + join time.")] = "15m",
    full_check: Annotated[str, typer.Option(help="Full deep health check of a spare/replacement.")] = "30m",
    job_restart: Annotated[str, typer.Option(help="Requeued job -> training again (NodeMedic; assumed).")] = "10m",
    checkpoint_interval: Annotated[str, typer.Option(
        help="A failure loses the work since the last checkpoint; 0s = none.")] = "1h",
    failed_replacement_rate: Annotated[float, typer.Option(min=0, max=0.9, help="Chance a replacement fails its check.")] = 0.05,
    planned_share: Annotated[float, typer.Option(
        min=0, max=1, help="Share of node losses announced ahead (retirement, maintenance, Capacity Block end); "
                           "NodeMedic checkpoints and moves the job before the deadline.")] = 0.0,
    lead_time: Annotated[str, typer.Option(help="How far ahead they are announced.")] = "14d",
    extras: Annotated[bool, typer.Option(help="--no-extras: fixed durations, no failures during repair, no pool "
                                               "exhaustion, no failed replacements, no lost work (= analytic model).")] = True,
    png: Annotated[Path | None, typer.Option(help="Write the overhead-vs-size plot here.")] = None,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same result).")] = 1,
    as_json: AsJson = False,
) -> None:
    """Monte Carlo: training time under the manual, HyperPod-like and NodeMedic policies."""
    rate = _rate(failure_rate)
    try:
        size_list = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"{sizes!r} is not a comma-separated list of integers", param_hint="--sizes") from None
    if not size_list or not all(1 <= size <= MAX_INSTANCES for size in size_list):
        raise typer.BadParameter(f"{sizes!r}: give one or more cluster sizes of 1 to {MAX_INSTANCES:,} instances",
                                 param_hint="--sizes")
    inputs = NodeMedicInputs(spares=spares, replacement_boot_min=60 * _hours(replacement_boot, "--replacement-boot"),
                             full_check_min=60 * _hours(full_check, "--full-check"),
                             job_restart_min=60 * _hours(job_restart, "--job-restart"))
    effects = Effects(failed_replacement_rate=failed_replacement_rate,
                      checkpoint_interval_h=_hours(checkpoint_interval, "--checkpoint-interval"),
                      planned_share=planned_share, lead_time_h=_hours(lead_time, "--lead-time")) \
        if extras else Effects.none()
    policies = [manual(), hyperpod(), nodemedic(inputs)]
    # the run time grows with the failures simulated: the default run (2.6 million) takes about 11 s on 2 cores
    failures = gpu_hours / gpus_per_instance * rate * runs * len(size_list) * len(policies)
    if failures > MAX_SIMULATED_FAILURES:
        raise typer.BadParameter(f"that is about {failures:,.0f} simulated failures, more than {MAX_SIMULATED_FAILURES:,} "
                                 "(minutes of work): lower --gpu-hours or --runs, or give fewer --sizes",
                                 param_hint="--gpu-hours")
    summaries = []
    with console.status("simulating...") as status:
        for size in size_list:
            for policy in policies:
                status.update(f"simulating {policy.name} on {size} instances ({runs} runs)...")
                summaries.append(simulate(policy, size, rate, gpu_hours, gpus_per_instance, runs, effects, seed))
    if png:
        from nodemedic_cli.fleet.plot import overhead_plot

        overhead_plot(summaries, png, f"{gpu_hours:,.0f} GPU-hours, {rate:.3%} failures/instance-hour, "
                                      f"{'with' if extras else 'no'} extra effects, {runs} runs per point")
    if as_json:
        print(json.dumps({"policies": {p.name: p.source for p in policies}, "effects": asdict(effects),
                          "results": [asdict(s) for s in summaries]}, indent=2))
        return
    table = Table(title=f"Monte Carlo: {gpu_hours:,.0f} GPU-hours at {rate:.3%} failures per instance-hour, "
                        f"{runs} runs per row")
    for col in ("instances", "policy", "failures", "min down / failure", "days lost", "p10-p90 total days",
                "overhead", "lost work (days)", "pool empty", "ETTR", "GPU-h lost / day"):
        table.add_column(col, justify="right")
    for s in summaries:
        table.add_row(str(s.instances), s.policy, f"{s.mean_failures:.0f}", f"{s.downtime_per_failure_min:.1f}",
                      f"{s.mean_days_lost:.1f}", f"{s.p10_total_days:.1f}-{s.p90_total_days:.1f}",
                      f"{s.overhead_pct:.1f}%", f"{s.mean_lost_work_days:.1f}", f"{s.mean_pool_empty_failures:.1f}",
                      f"{s.ettr_pct:.2f}%", f"{s.gpu_hours_lost_per_day:,.0f}")
    console.print(table)
    for p in policies:
        console.print(f"[bold]{p.name}[/]: {p.source}")
    if png:
        console.print(f"plot written to {png}")
