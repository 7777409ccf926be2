"""The fleet simulator reproduces the published model and converges to it."""

from __future__ import annotations

import json

import pytest
from nodemedic_cli.fleet.model import compare, parse_duration_hours, parse_rate
from nodemedic_cli.fleet.policies import hyperpod, manual, nodemedic
from nodemedic_cli.fleet.simulate import Effects, Policy, Stage, simulate
from nodemedic_cli.main import app
from typer.testing import CliRunner

runner = CliRunner()
WORKED = ["--instances", "256", "--failure-rate", "0.05%", "--gpu-hours", "10000000", "--gpus-per-instance", "8"]


def test_the_published_worked_example_is_reproduced():
    c = compare(256, 0.0005, 10_000_000, 8, 280 / 60, 40 / 60, price_per_gpu_hour=5)
    assert c.failure_free_days == pytest.approx(203.5, abs=0.05)
    assert c.days_lost_b == pytest.approx(17, abs=0.5) and c.days_lost_a == pytest.approx(121, abs=1)
    assert c.total_days_b == pytest.approx(221, abs=0.5) and c.total_days_a == pytest.approx(325, abs=0.5)
    assert round(c.improvement_pct) == 32 and round(c.days_saved) == 104
    assert c.cost_saved == pytest.approx(25.6e6, rel=0.005)


def test_compare_json_has_the_documented_fields():
    result = runner.invoke(app, ["fleet", "compare", *WORKED, "--downtime-a", "280m", "--downtime-b", "40m",
                                 "--price-per-gpu-hour", "5", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for key in ("failure_free_days", "days_lost_a", "days_lost_b", "total_days_a", "total_days_b",
                "improvement_pct", "days_saved", "cost_saved"):
        assert key in out
    assert round(out["days_saved"]) == 104


def test_mtbf_of_512_instances_at_0_04_percent_is_about_5_hours():
    result = runner.invoke(app, ["fleet", "mtbf", "--instances", "512", "--failure-rate", "0.0004", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["mtbf_hours"] == pytest.approx(4.88, abs=0.01)


@pytest.mark.parametrize(("args", "message"), [
    (["--downtime-a", "280"], "not a duration"),
    (["--downtime-b", "forty"], "not a duration"),
])
def test_bad_durations_are_clear_errors(args, message):
    result = runner.invoke(app, ["fleet", "compare", *WORKED, *args])
    assert result.exit_code == 2 and message in result.output


@pytest.mark.parametrize(("command", "args", "named"), [
    # a traceback (ZeroDivisionError), and results for clusters that cannot exist
    ("simulate", ["--sizes", "0"], "--sizes"), ("simulate", ["--sizes", "-5"], "--sizes"),
    ("simulate", ["--sizes", ","], "--sizes"),
    # a simulation that never ends, and JSON that is not JSON (NaN, Infinity)
    ("simulate", ["--gpu-hours", "1e300"], "--gpu-hours"), ("simulate", ["--gpu-hours", "1e9"], "simulated failures"),
    ("compare", [*WORKED, "--gpu-hours", "inf"], "--gpu-hours"),
    ("compare", [*WORKED, "--price-per-gpu-hour", "inf"], "--price-per-gpu-hour"),
])
def test_inputs_no_run_could_have_are_refused_at_once(command, args, named):
    result = runner.invoke(app, ["fleet", command, *args, "--json"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and named in result.output and "Traceback" not in result.output


def test_a_failure_rate_out_of_range_is_refused():
    with pytest.raises(ValueError, match="fraction per instance-hour"):
        parse_rate("5")
    assert parse_rate("0.05%") == pytest.approx(0.0005) and parse_duration_hours("90s") == pytest.approx(0.025)


@pytest.mark.parametrize("downtime_min", [40, 280])
def test_monte_carlo_converges_to_the_analytic_model_with_the_extras_off(downtime_min):
    policy = Policy("fixed", detect=Stage(0), replace=Stage(downtime_min / 60), resume=Stage(0))
    mc = simulate(policy, 256, 0.0005, 10_000_000, 8, runs=300, effects=Effects.none(), seed=3)
    analytic = compare(256, 0.0005, 10_000_000, 8, downtime_min / 60, downtime_min / 60)
    assert mc.mean_days_lost == pytest.approx(analytic.days_lost_a, rel=0.02)
    assert mc.mean_total_days == pytest.approx(analytic.total_days_a, rel=0.005)


def test_the_extras_cost_time_and_spares_save_it():
    base = dict(instances=512, rate=0.0005, gpu_hours=10_000_000, gpus_per_instance=8, runs=100)
    none = simulate(hyperpod(), effects=Effects.none(), **base)
    extras = simulate(hyperpod(), effects=Effects(), **base)
    assert extras.mean_days_lost > none.mean_days_lost  # lost work, failures during repair, bad replacements
    with_spares = simulate(nodemedic(), effects=Effects(), **base)
    assert with_spares.downtime_per_failure_min < extras.downtime_per_failure_min
    assert simulate(manual(), effects=Effects(), **base).overhead_pct > extras.overhead_pct


def test_simulate_writes_a_png_plot(tmp_path):
    png = tmp_path / "overhead.png"
    result = runner.invoke(app, ["fleet", "simulate", "--sizes", "16,64", "--runs", "5", "--png", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "NodeMedic" in result.output and "HyperPod-like" in result.output


def test_spare_pool_sizing_follows_the_poisson_occupancy_of_repairs() -> None:
    import math

    from nodemedic_cli.fleet.model import spares_needed

    # 256 instances at 0.05 %/h, 25 min per repair: 0.0533 spares out on average
    n, empty = spares_needed(256, 0.0005, 25 / 60, risk=0.01)
    mean = 256 * 0.0005 * 25 / 60
    assert n == 2 and math.isclose(empty, 1 - math.exp(-mean) * (1 + mean))
    assert spares_needed(256, 0.0005, 25 / 60, risk=0.10)[0] == 1  # 5.2 % empty with one spare
    assert spares_needed(4096, 0.0005, 25 / 60, risk=0.01)[0] > n  # a bigger fleet needs more


def test_ettr_is_the_failure_free_time_over_the_wall_time():
    mc = simulate(hyperpod(), 256, 0.0005, 10_000_000, 8, runs=50, effects=Effects())
    assert mc.ettr_pct == pytest.approx(100 * mc.failure_free_days / mc.mean_total_days, rel=0.01)
    assert 0 < mc.ettr_pct < 100
    gpus = 256 * 8
    assert mc.gpu_hours_lost_per_day == pytest.approx((1 - mc.ettr_pct / 100) * gpus * 24, rel=0.01)


def test_announced_node_losses_cost_nodemedic_no_work_and_the_baselines_all_of_it():
    base = dict(instances=256, rate=0.0005, gpu_hours=10_000_000, gpus_per_instance=8, runs=100)
    crash_only, planned = Effects(), Effects(planned_share=0.5)
    nm, nm_planned = simulate(nodemedic(), effects=crash_only, **base), simulate(nodemedic(), effects=planned, **base)
    assert nm_planned.mean_planned == pytest.approx(0.5 * nm_planned.mean_failures, rel=0.1)
    assert nm_planned.mean_lost_work_days == pytest.approx(0.5 * nm.mean_lost_work_days, rel=0.1)
    assert nm_planned.ettr_pct > nm.ettr_pct
    hp, hp_planned = simulate(hyperpod(), effects=crash_only, **base), simulate(hyperpod(), effects=planned, **base)
    assert hp_planned.mean_planned == 0 and hp_planned.ettr_pct == hp.ettr_pct  # met at the deadline like a crash
    short = simulate(nodemedic(), effects=Effects(planned_share=0.5, lead_time_h=0.25), **base)
    assert short.ettr_pct < nm_planned.ettr_pct  # under one checkpoint interval ahead: an extra checkpoint write


def test_simulate_prints_ettr_and_takes_the_planned_share():
    result = runner.invoke(app, ["fleet", "simulate", "--sizes", "16", "--runs", "3", "--planned-share", "0.2",
                                 "--lead-time", "14d", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["effects"]["planned_share"] == 0.2 and out["effects"]["lead_time_h"] == 336
    by_policy = {r["policy"]: r for r in out["results"]}
    assert 0 < by_policy["manual"]["ettr_pct"] < by_policy["NodeMedic"]["ettr_pct"] <= 100
    bad = runner.invoke(app, ["fleet", "simulate", "--sizes", "16", "--planned-share", "1.5"])
    assert bad.exit_code != 0 and "planned-share" in bad.output
