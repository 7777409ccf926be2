"""Benchmark results land in docs/benchmarks.json with the fields the project promises."""

from __future__ import annotations

import json

from bench import results


def test_a_result_has_the_promised_fields_and_replaces_its_previous_run(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "JSON", tmp_path / "benchmarks.json")
    monkeypatch.setattr(results, "MD", tmp_path / "benchmarks.md")
    (tmp_path / "benchmarks.md").write_text(f"# Benchmarks\n\nprose stays\n\n{results.BEGIN}\nold\n{results.END}\n")
    results.record([results.summarize("x", "ms", [1.0, 2.0, 3.0, 4.0, 100.0], "cmd")])
    results.record([results.summarize("x", "ms", list(map(float, range(1, 11))), "cmd", target="p90 <= 9")])
    [entry] = json.loads((tmp_path / "benchmarks.json").read_text())
    assert {"name", "unit", "n", "p50", "p90", "max", "command", "machine"} <= set(entry)
    assert (entry["n"], entry["p50"], entry["p90"], entry["max"]) == (10, 5.5, 9.0, 10.0)
    md = (tmp_path / "benchmarks.md").read_text()
    assert "prose stays" in md and "| x | ms | 10 | 5.5 | 9.0 | 10.0 | p90 <= 9 |" in md and "old" not in md


def test_transitions_count_states_entered_plus_retries_as_step_functions_bills():
    from datetime import UTC, datetime, timedelta

    from bench.pipeline import history_counts

    t0 = datetime(2026, 11, 22, tzinfo=UTC)
    kinds = ["ExecutionStarted", "TaskStateEntered", "LambdaFunctionScheduled", "LambdaFunctionFailed",
             "LambdaFunctionScheduled", "LambdaFunctionSucceeded", "TaskStateExited", "ChoiceStateEntered",
             "ChoiceStateExited", "SucceedStateEntered", "ExecutionSucceeded"]
    events = [{"id": i + 1, "type": k, "timestamp": t0 + timedelta(seconds=i)} for i, k in enumerate(kinds)]

    class Sfn:
        def get_execution_history(self, **_):
            return {"events": events}

    counts = history_counts(Sfn(), "arn")
    assert counts == {"transitions": 4, "invocations": 2, "retry_wait_s": 1.0}  # 3 states entered + 1 retry
