"""Monte Carlo, discrete-event simulation of a training run on a failing fleet.

What the analytic model leaves out, each of which can be switched off (``Effects``):
failures during a repair (the job resumes only when every failed node is back), hot-spare
pool exhaustion and background refill, replacements that fail their deep health check,
the work lost since the last checkpoint, and stage durations drawn from distributions
(log-normal with the given median and p90) instead of fixed values.

Planned events (``Effects.planned_share``): that share of node losses is announced ahead (an
instance retirement, a maintenance, a Capacity Block's end). A policy that acts on them
(``Policy.plans_ahead``: NodeMedic) checkpoints the job and moves it before the deadline, so
the node loss costs no work, no detection and no surprise; one that does not meets it at the
deadline like a crash. With at least one checkpoint interval of lead time the move waits for the
job's next periodic checkpoint; with less, the job pays one extra checkpoint write.

ETTR (effective training time ratio) = the failure-free training time / the wall time the run
took: 1.0 for a fleet that never fails.

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
    plans_ahead: bool = False  # acts on announced node losses before their deadline
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
    planned_share: float = 0.0  # of node losses, announced ahead (retirement, maintenance, block end)
    lead_time_h: float = 336.0  # how far ahead (AWS Health: about two weeks)
    checkpoint_write_h: float = 2 / 60  # an extra checkpoint, when the lead time is shorter than an interval

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
    planned: int = 0  # of the failures, announced ahead
    work_hours: float = 0.0

    @property
    def ettr(self) -> float:
        return self.work_hours / self.total_hours if self.total_hours else 1.0


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
    ettr_pct: float = 100.0  # mean over the runs
    ettr_pct_runs: list[float] = field(default_factory=list)  # each run's
    gpu_hours_lost_per_day: float = 0.0  # (wall - failure-free) x GPUs, per day of wall time
    mean_planned: float = 0.0
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

    def _repair(self, at: float, planned: bool = False) -> float:
        """Hours from the failure at ``at`` until this node is back in service (a loss acted on
        ahead needs no detection)."""
        detect = 0.0 if planned else self._stage(self.p.detect)
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

    def outage(self, at: float, planned: bool = False) -> tuple[float, int]:
        """(hours the job is down, failures handled) for a failure at wall time ``at``."""
        repaired = at + self._repair(at, planned)
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
        failures = planned = 0
        interval = self.fx.checkpoint_interval_h
        while True:
            gap = self.rng.expovariate(self.rate)
            if done + gap >= work_hours:
                t += work_hours - done
                return RunResult(t, failures, down, lost, self.pool_empty, planned, work_hours)
            t += gap
            done += gap
            ahead = self.p.plans_ahead and self.fx.planned_share > 0 and self.rng.random() < self.fx.planned_share
            pause = 0.0
            if ahead:  # checkpointed right before the move: nothing to redo
                planned += 1
                if interval and self.fx.lead_time_h < interval:
                    pause = self.fx.checkpoint_write_h
            elif interval:  # checkpoints every interval since the job (re)started from its last one
                since_checkpoint = gap % interval
                done -= since_checkpoint  # redo the work since the last checkpoint
                lost += since_checkpoint
            outage, n = self.outage(t, planned=ahead)
            t += outage + pause
            down += outage + pause
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
    ettrs = [100 * r.ettr for r in results]
    gpus = instances * gpus_per_instance
    return Summary(
        policy=policy.name, instances=instances, runs=runs, failure_free_days=free_days, mean_total_days=mean_total,
        p10_total_days=totals[max(0, math.ceil(0.1 * runs) - 1)], p90_total_days=totals[max(0, math.ceil(0.9 * runs) - 1)],
        mean_days_lost=mean_total - free_days, overhead_pct=100 * (mean_total - free_days) / free_days,
        mean_failures=failures, mean_lost_work_days=statistics.fmean(r.lost_work_hours for r in results) / 24,
        mean_pool_empty_failures=statistics.fmean(r.pool_empty_failures for r in results),
        downtime_per_failure_min=60 * statistics.fmean(r.downtime_hours for r in results) / max(failures, 1e-9),
        ettr_pct=statistics.fmean(ettrs), ettr_pct_runs=ettrs,
        gpu_hours_lost_per_day=statistics.fmean((r.total_hours - r.work_hours) * gpus / (r.total_hours / 24)
                                                for r in results),
        mean_planned=statistics.fmean(r.planned for r in results),
    )


def without_spares(policy: Policy) -> Policy:
    return replace(policy, spares=0)
