"""The chaos tier: each scenario's outcome is collected and listed at the end of the run (and
written to ``$CHAOS_REPORT`` when set: ``make chaos`` writes docs/chaos.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

OUTCOMES: list[dict[str, str]] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not OUTCOMES:
        return
    lines = ["| scenario | incident | node afterwards | job | invariants |", "|---|---|---|---|---|"]
    lines += [f"| {o['scenario']} | {o['incident']} | {o['node']} | {o['job']} | {o['invariants']} |"
              for o in OUTCOMES]
    terminalreporter.write_sep("=", "chaos scenarios")
    for line in lines:
        terminalreporter.write_line(line)
    target = os.environ.get("CHAOS_REPORT")
    if target:
        Path(target).write_text(
            "# Chaos scenarios\n\nWritten by `make chaos` (tests/chaos/test_chaos.py): each fault injected right "
            "before one stage of a real incident, on the local stack with real Slurm; then the reconciler runs "
            "once and every invariant is checked.\n\n" + "\n".join(lines) + "\n")
