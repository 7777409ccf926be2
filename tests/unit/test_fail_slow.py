"""Fail-slow from heartbeats: a node persistently slower than its busy peers of the same type is
found; idle nodes, a single slow sample, other instance types and too few peers are not."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from nodemedic.contracts.events import PerfSample
from nodemedic.domain.fail_slow import KEEP, observe, slow_event, slow_nodes

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def roster(ratios: dict[str, list[float]], util: float = 95.0, kind: str = "p5.48xlarge") -> dict[str, dict]:
    out: dict[str, dict] = {}
    for n, (name, series) in enumerate(ratios.items()):
        entry: dict = {"node": {"instance_id": f"i-{n:017x}", "hostname": name, "slurm_node": name}}
        for r in series:
            observe(entry, PerfSample(sm_clock_ratio=r, utilization_pct=util, slowest_gpu=3, instance_type=kind))
        out[f"i-{n:017x}"] = entry
    return out


def test_a_node_20_percent_slower_than_its_peers_for_every_sample_is_slow() -> None:
    r = roster({"gpu-1": [0.99] * 3, "gpu-2": [1.0] * 3, "gpu-3": [0.98] * 3, "gpu-4": [0.80, 0.79, 0.81]})
    [slow] = slow_nodes(r, below=0.10, samples=3)
    assert r[slow.instance_id]["node"]["slurm_node"] == "gpu-4"
    assert (slow.ratio, slow.peer_median, slow.peers, slow.slowest_gpu) == (0.8, 0.99, 3, 3)
    assert slow.percent_below == pytest.approx(19.2)
    event = slow_event(r, slow, "c1", NOW)
    assert (event.fault_code, event.check, event.component.index) == ("FAIL_SLOW", "fail_slow", 3)
    assert event.evidence["percent_below"] == pytest.approx(19.2) and "3 busy p5.48xlarge peers" in \
        str(event.evidence["summary"])


@pytest.mark.parametrize("series", [[0.8, 0.8, 0.99], [0.99, 0.8, 0.8], [0.8, 0.8]])
def test_one_slow_sample_or_too_few_samples_is_not_persistent(series: list[float]) -> None:
    assert slow_nodes(roster({"a": [1.0] * 3, "b": [1.0] * 3, "c": [1.0] * 3, "d": series}),
                      below=0.10, samples=3) == []


def test_idle_nodes_and_too_few_peers_say_nothing() -> None:
    assert slow_nodes(roster({"a": [1.0] * 3, "b": [1.0] * 3, "c": [1.0] * 3, "d": [0.2] * 3}, util=3.0),
                      below=0.10, samples=3) == []  # idle GPUs drop their clocks: no verdict
    assert slow_nodes(roster({"a": [1.0] * 3, "b": [1.0] * 3, "d": [0.5] * 3}), below=0.10, samples=3) == []


def test_peers_are_of_the_same_instance_type() -> None:
    fast = roster({"a": [1.0] * 3, "b": [1.0] * 3, "c": [1.0] * 3}, kind="p5.48xlarge")
    other = roster({"d": [0.7] * 3}, kind="p4d.24xlarge")
    other = {k.replace("i-0", "i-9"): v for k, v in other.items()}
    assert slow_nodes({**fast, **other}, below=0.10, samples=3) == []


def test_the_roster_keeps_only_the_latest_samples() -> None:
    r = roster({"a": [0.5] * (KEEP + 5)})
    assert len(next(iter(r.values()))["perf"]) == KEEP
