"""The published analytic model (AWS's HyperPod cost analysis), reproduced exactly.

- cluster MTBF (h) = 1 / (instances x failure rate per instance-hour)
- failure-free days = GPU-hours / (instances x GPUs per instance) / 24
- days lost = instances x rate x 24 x failure-free days x downtime per failure (h) / 24
  (the published tables multiply by the failure-free duration, not the longer real one)
- improvement of B over A = (total_A - total_B) / total_A; cost saved = days saved x 24 x GPUs x price
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr|d)\s*$", re.I)
_UNIT_HOURS = {"s": 1 / 3600, "sec": 1 / 3600, "m": 1 / 60, "min": 1 / 60, "h": 1.0, "hr": 1.0, "d": 24.0}


def parse_duration_hours(text: str) -> float:
    """``"280m"``, ``"40 min"``, ``"2.5h"``, ``"90s"`` -> hours. A bare number is refused: say the unit."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration; write it with a unit, e.g. 280m, 40min, 2.5h, 90s")
    return float(m.group(1)) * _UNIT_HOURS[m.group(2).lower()]


def parse_rate(text: str) -> float:
    """Failure rate per instance-hour: ``0.0005`` or ``0.05%``."""
    value = float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    if not 0 < value < 1:
        raise ValueError(f"failure rate {text!r} must be a fraction per instance-hour in (0, 1), e.g. 0.0005 or 0.05%")
    return value


def cluster_mtbf_hours(instances: int, rate: float) -> float:
    return 1.0 / (instances * rate)


def failure_free_days(gpu_hours: float, instances: int, gpus_per_instance: int) -> float:
    return gpu_hours / (instances * gpus_per_instance) / 24.0


def days_lost(instances: int, rate: float, free_days: float, downtime_hours: float) -> float:
    return instances * rate * 24.0 * free_days * downtime_hours / 24.0


@dataclass(frozen=True)
class Comparison:
    instances: int
    failure_rate: float
    gpu_hours: float
    gpus_per_instance: int
    downtime_a_hours: float
    downtime_b_hours: float
    price_per_gpu_hour: float | None
    cluster_mtbf_hours: float
    failures: float
    failure_free_days: float
    days_lost_a: float
    days_lost_b: float
    total_days_a: float
    total_days_b: float
    improvement_pct: float
    days_saved: float
    cost_saved: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(instances: int, rate: float, gpu_hours: float, gpus_per_instance: int,
            downtime_a_hours: float, downtime_b_hours: float, price_per_gpu_hour: float | None = None) -> Comparison:
    free = failure_free_days(gpu_hours, instances, gpus_per_instance)
    lost_a = days_lost(instances, rate, free, downtime_a_hours)
    lost_b = days_lost(instances, rate, free, downtime_b_hours)
    total_a, total_b = free + lost_a, free + lost_b
    saved = total_a - total_b
    cost = saved * 24 * instances * gpus_per_instance * price_per_gpu_hour if price_per_gpu_hour is not None else None
    return Comparison(
        instances=instances, failure_rate=rate, gpu_hours=gpu_hours, gpus_per_instance=gpus_per_instance,
        downtime_a_hours=downtime_a_hours, downtime_b_hours=downtime_b_hours, price_per_gpu_hour=price_per_gpu_hour,
        cluster_mtbf_hours=cluster_mtbf_hours(instances, rate), failures=instances * rate * free * 24,
        failure_free_days=free, days_lost_a=lost_a, days_lost_b=lost_b, total_days_a=total_a, total_days_b=total_b,
        improvement_pct=100.0 * saved / total_a, days_saved=saved, cost_saved=cost,
    )


def spares_needed(instances: int, rate: float, repair_hours: float, risk: float = 0.01) -> tuple[int, float]:
    """Hot spares that cover the failures arriving while failed nodes are repaired.

    Failures arrive as a Poisson process at ``instances x rate`` per hour and each keeps one spare
    out of the pool for ``repair_hours`` (replacement boot + full deep health check), so the number
    of spares out at any moment is Poisson with mean ``instances x rate x repair_hours`` (M/G/inf;
    an arriving failure sees that same distribution). With N spares a failure finds the pool empty
    when N or more are out. Returns the smallest N with P(out >= N) <= ``risk``, and that probability.
    """
    if not 0 < risk < 1:
        raise ValueError(f"risk {risk} must be a probability in (0, 1), e.g. 0.01")
    mean = instances * rate * repair_hours
    n, term, below = 0, math.exp(-mean), 0.0  # term = P(out = n); below = P(out < n)
    while 1.0 - below > risk:
        below += term
        n += 1
        term *= mean / n
    return n, max(0.0, 1.0 - below)
