"""The three policies the simulator compares, and where each number comes from."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from nodemedic_cli.fleet.simulate import Policy, Stage

BENCHMARKS = Path(__file__).resolve().parents[3] / "docs" / "benchmarks.json"
MIN = 1 / 60
SEC = 1 / 3600

AGENT_LATENCY = "agent: kernel-log XID line -> PutEvents returned"
PIPELINE_TO_DRAIN = "pipeline: event on the bus -> drain command issued"
PIPELINE_TO_CLOSED = "pipeline: event on the bus -> incident closed, excluding simulated waits"


def manual() -> Policy:
    """Published manual handling: root cause 10 min, replace 240 min, resume 30 min (fixed: no
    distribution was published, so p90 = median)."""
    return Policy("manual", detect=Stage(10 * MIN), replace=Stage(240 * MIN), resume=Stage(30 * MIN),
                  source="published manual handling: root cause 10 min, replace 240 min, resume 30 min")


def hyperpod() -> Policy:
    """Published HyperPod P90s (detect 80-90 s, replace 903-981 s, resume 1212-1440 s) taken as
    p90s; the medians are assumed to be 80 % of them (no medians were published)."""
    def p90(low_s: float, high_s: float) -> Stage:
        top = (low_s + high_s) / 2 * SEC
        return Stage(0.8 * top, top)
    return Policy("HyperPod-like", detect=p90(80, 90), replace=p90(903, 981), resume=p90(1212, 1440),
                  source="published P90: detect 80-90 s, replace 903-981 s, resume 1212-1440 s; median assumed 0.8 x p90")


@dataclass(frozen=True)
class NodeMedicInputs:
    """What NodeMedic's numbers are made of: measured ones from docs/benchmarks.json, and
    configured ones that only a real cluster can measure."""

    spares: int = 2
    replacement_boot_min: float = 15.0  # the published replace time, a new instance booting and joining
    full_check_min: float = 30.0  # the burn-in after every rung: DCGM level 3, GPU burn, NCCL
    job_restart_min: float = 10.0  # requeue -> training again: container start, checkpoint load, NCCL init


def _bench(name: str) -> tuple[float, float] | None:
    """(p50, p90) of a measured benchmark in hours, if ``make bench`` has recorded it."""
    if not BENCHMARKS.exists():
        return None
    for r in json.loads(BENCHMARKS.read_text()):
        if r["name"] == name:
            scale = {"ms": SEC / 1000, "s": SEC, "min": MIN, "h": 1.0}[r["unit"]]
            return r["p50"] * scale, r["p90"] * scale
    return None


def nodemedic(inputs: NodeMedicInputs | None = None) -> Policy:
    i = inputs or NodeMedicInputs()
    notes = []
    agent = _bench(AGENT_LATENCY)
    to_drain = _bench(PIPELINE_TO_DRAIN)
    overhead = _bench(PIPELINE_TO_CLOSED)
    if agent and to_drain:
        detect = Stage(agent[0] + to_drain[0], agent[1] + to_drain[1])
        notes.append("detect = agent + pipeline to drain (measured)")
    else:
        detect = Stage(5 * SEC, 10 * SEC)
        notes.append("detect = 5 s (assumed: run make bench to measure)")
    orchestration = Stage(*overhead) if overhead else Stage(10 * SEC, 20 * SEC)
    notes.append("pipeline overhead " + ("measured" if overhead else "assumed 10 s"))
    o50, o90 = orchestration.median_h, orchestration.p90_h or orchestration.median_h
    boot = i.replacement_boot_min * MIN
    return Policy(
        "NodeMedic", detect=detect,
        replace=Stage(boot + i.full_check_min * MIN + o50, 1.1 * boot + i.full_check_min * MIN + o90),
        resume=Stage(i.job_restart_min * MIN, 1.5 * i.job_restart_min * MIN),
        spares=i.spares, swap=orchestration, plans_ahead=True,
        refill=Stage(boot + i.full_check_min * MIN, 1.1 * boot + 1.5 * i.full_check_min * MIN),
        source="; ".join(notes) + f"; configured: {i.spares} spares, replacement boot {i.replacement_boot_min:g} min, "
               f"full check (burn-in) {i.full_check_min:g} min, "
               f"job restart {i.job_restart_min:g} min; announced node losses: checkpointed and moved before "
               "the deadline (no work lost, no detection)",
    )
