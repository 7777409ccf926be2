"""Monte Carlo, discrete-event simulation of a training run on a failing fleet.

What the analytic model leaves out, each of which can be switched off (``Effects``):
failures during a repair (the job resumes only when every failed node is back), hot-spare
pool exhaustion and background refill, replacements that fail their deep health check,
the work lost since the last checkpoint, and stage durations drawn from distributions
(log-normal with the given median and p90) instead of fixed values.

With every effect off and no spares, the mean converges to the analytic model: failures arrive
only while the job trains, at ``instances x rate`` per hour, each costing a fixed downtime.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field, replace

Z90 = 1.2815515655446004  # standard normal quantile at 0.9


@dataclass(frozen=True)
class Stage:
    """A duration in hours: median, and p90 (equal = fixed)."""

    median_h: float
    p90_h: float | None = None

    def sample(self, rng: random.Random, spread: bool) -> float:
        p90 = self.p90_h if self.p90_h is not None else self.median_h
        if not spread or p90 <= self.median_h or self.median_h <= 0:
            return self.median_h
        sigma = math.log(p90 / self.median_h) / Z90
        return rng.lognormvariate(math.log(self.median_h), sigma)


@dataclass(frozen=True)
class Policy:
    """How one failure is handled. With spares, the failed node is swapped for a pre-validated
    spare (``swap``) and replaced in the background (``refill``); otherwise ``replace`` is on the
    critical path. ``resume`` restarts the job once every failed node is back."""

    name: str
    detect: Stage
    replace: Stage
    resume: Stage
    spares: int = 0
    swap: Stage = Stage(0.0)
    refill: Stage = Stage(0.0)
    source: str = ""

    def downtime_hours(self) -> float:
        """Median downtime of one isolated failure (what the analytic model calls downtime)."""
        path = self.swap if self.spares else self.replace
        return self.detect.median_h + path.median_h + self.resume.median_h


@dataclass(frozen=True)
class Effects:
    failures_during_repair: bool = True
    spare_exhaustion: bool = True  # False: the pool never runs dry
    failed_replacement_rate: float = 0.05  # a replacement fails its deep check and is replaced again
    checkpoint_interval_h: float = 1.0  # 0: no work lost on a failure
    distributions: bool = True

    @classmethod
    def none(cls) -> Effects:
        return cls(False, False, 0.0, 0.0, False)


@dataclass
class RunResult:
    total_hours: float
    failures: int
    downtime_hours: float
    lost_work_hours: float
    pool_empty_failures: int


@dataclass
class Summary:
    policy: str
    instances: int
    runs: int
    failure_free_days: float
    mean_total_days: float
    p10_total_days: float
    p90_total_days: float
    mean_days_lost: float
    overhead_pct: float
    mean_failures: float
    mean_lost_work_days: float
    mean_pool_empty_failures: float
    downtime_per_failure_min: float
    extra: dict[str, float] = field(default_factory=dict)


class _Run:
    def __init__(self, policy: Policy, instances: int, rate: float, effects: Effects, rng: random.Random) -> None:
        self.p = policy
        self.rate = instances * rate
        self.fx = effects
        self.rng = rng
        self.pool = policy.spares
        self.refills: list[float] = []  # wall times at which a refilled spare is ready
        self.pool_empty = 0

    def _stage(self, stage: Stage) -> float:
        return stage.sample(self.rng, self.fx.distributions)

    def _replacement(self, stage: Stage) -> float:
        """A replacement, redone while it fails its deep health check."""
        took = self._stage(stage)
        while self.fx.failed_replacement_rate and self.rng.random() < self.fx.failed_replacement_rate:
            took += self._stage(stage)
        return took

    def _repair(self, at: float) -> float:
        """Hours from the failure at ``at`` until this node is back in service."""
        detect = self._stage(self.p.detect)
        if self.p.spares:
            ready = [r for r in self.refills if r <= at]
            self.refills = [r for r in self.refills if r > at]
            self.pool += len(ready)
            if self.pool > 0 or not self.fx.spare_exhaustion:
                if self.fx.spare_exhaustion:
                    self.pool -= 1
                    self.refills.append(at + detect + self._replacement(self.p.refill))
                return detect + self._stage(self.p.swap)
            self.pool_empty += 1
        return detect + self._replacement(self.p.replace)

    def outage(self, at: float) -> tuple[float, int]:
        """(hours the job is down, failures handled) for a failure at wall time ``at``."""
        repaired = at + self._repair(at)
        resumed = repaired + self._stage(self.p.resume)
        failures = 1
        if self.fx.failures_during_repair:
            t = at
            while True:
                t += self.rng.expovariate(self.rate)
                if t >= resumed:
                    break
                failures += 1
                repaired = max(repaired, t + self._repair(t))
                resumed = max(resumed, repaired + self._stage(self.p.resume))
        return resumed - at, failures

    def run(self, work_hours: float) -> RunResult:
        t = done = down = lost = 0.0
        since_checkpoint = 0.0
        failures = 0
        interval = self.fx.checkpoint_interval_h
        while True:
            gap = self.rng.expovariate(self.rate)
            if done + gap >= work_hours:
                t += work_hours - done
                return RunResult(t, failures, down, lost, self.pool_empty)
            t += gap
            done += gap
            if interval:
                since_checkpoint = (since_checkpoint + gap) % interval
                done -= since_checkpoint  # redo the work since the last checkpoint
                lost += since_checkpoint
                since_checkpoint = 0.0
            outage, n = self.outage(t)
            t += outage
            down += outage
            failures += n


def simulate(policy: Policy, instances: int, rate: float, gpu_hours: float, gpus_per_instance: int,
             runs: int = 200, effects: Effects | None = None, seed: int = 1) -> Summary:
    fx = effects or Effects()
    work = gpu_hours / (instances * gpus_per_instance)
    rng = random.Random(f"{seed}-{policy.name}-{instances}")
    results = [_Run(policy, instances, rate, fx, rng).run(work) for _ in range(runs)]
    totals = sorted(r.total_hours / 24 for r in results)
    free_days = work / 24
    mean_total = statistics.fmean(totals)
    failures = statistics.fmean(r.failures for r in results)
    return Summary(
        policy=policy.name, instances=instances, runs=runs, failure_free_days=free_days, mean_total_days=mean_total,
        p10_total_days=totals[max(0, math.ceil(0.1 * runs) - 1)], p90_total_days=totals[max(0, math.ceil(0.9 * runs) - 1)],
        mean_days_lost=mean_total - free_days, overhead_pct=100 * (mean_total - free_days) / free_days,
        mean_failures=failures, mean_lost_work_days=statistics.fmean(r.lost_work_hours for r in results) / 24,
        mean_pool_empty_failures=statistics.fmean(r.pool_empty_failures for r in results),
        downtime_per_failure_min=60 * statistics.fmean(r.downtime_hours for r in results) / max(failures, 1e-9),
    )


def without_spares(policy: Policy) -> Policy:
    return replace(policy, spares=0)
