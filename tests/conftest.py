import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nodemedic_sandbox import slurm_cluster
from nodemedic_sandbox.local import LocalMode

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ROOT / "events"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After pytest removed a passing run's tmp_path dirs (tmp_path_retention_policy = "failed"),
    removes their root, /tmp/pytest-of-<user>, when nothing else is left in it: the suite leaves
    no temporary directories behind. Under pytest-xdist only the controller does this."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)
    if basetemp is None or hasattr(session.config, "workerinput"):
        return  # (a failed run keeps its dirs, so the root is not empty and stays)
    root = basetemp.parent
    current = root / "pytest-current"
    if current.is_symlink() and not current.exists():
        current.unlink()
    with contextlib.suppress(OSError):
        root.rmdir()  # only if empty


def require(what: str, why: str | None) -> None:
    """Skip a test whose real component (``why``: the reason it cannot run here) is missing;
    under CI, where every tier must run, fail it instead."""
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI needs {what}: {why}")
    pytest.skip(why)


def require_slurm() -> None:
    require("a real local Slurm", slurm_cluster.unavailable_reason())


@pytest.fixture
def local() -> Iterator[LocalMode]:
    """A freshly deployed local stack over a real 4-node Slurm cluster."""
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01) as stack:
        yield stack


def load_event(relative: str) -> dict:
    return json.loads((EVENTS / relative).read_text())


# The chaos tier's table (tests/chaos): each scenario records its outcome as a property of its
# report; the run lists them at its end, and writes them to $CHAOS_REPORT when set (make chaos:
# docs/chaos.md). Here, not in tests/chaos/conftest.py: under pytest-xdist only the controller
# prints the summary, it sees the workers' reports, and it loads this conftest but not that one.
CHAOS_OUTCOMES: list[dict[str, Any]] = []
SOAK_OUTCOMES: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    properties = dict(report.user_properties)
    if report.when == "call" and properties.get("chaos"):
        CHAOS_OUTCOMES.append(properties["chaos"])
    if report.when == "call" and properties.get("soak"):
        SOAK_OUTCOMES.append(properties["soak"])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not CHAOS_OUTCOMES and not SOAK_OUTCOMES:
        return
    outcomes = sorted(CHAOS_OUTCOMES, key=lambda o: o["rank"])  # workers finish in any order
    lines = ["| scenario | incident | node afterwards | job | invariants |", "|---|---|---|---|---|"]
    lines += [f"| {o['scenario']} | {o['incident']} | {o['node']} | {o['job']} | {o['invariants']} |"
              for o in outcomes]
    soaks = ["| seed | what happened, in order | incidents | reconciler | invariants |", "|---|---|---|---|---|"]
    soaks += [f"| {o['seed']} | {o['actions']} | {o['incidents']} | {o['reconciler']} | {o['invariants']} |"
              for o in sorted(SOAK_OUTCOMES, key=lambda o: o["rank"])]
    for title, table in (("chaos scenarios", lines), ("soaks", soaks)):
        if len(table) == 2:  # none ran
            continue
        terminalreporter.write_sep("=", title)
        for line in table:
            terminalreporter.write_line(line)
    target = os.environ.get("CHAOS_REPORT")
    if target:
        Path(target).write_text(
            "# Chaos scenarios\n\nWritten by `make chaos` (tests/chaos/test_chaos.py): each fault injected right "
            "before one stage of a real incident, on the local stack with real Slurm (and, last, an instance "
            "ended before each stage on Kubernetes, a real kube-apiserver); then the reconciler runs "
            "once and every invariant is checked.\n\n" + "\n".join(lines) + "\n\n"
            "## Soaks\n\n(tests/chaos/test_soak.py) Many faults at once on 5 nodes and a spare, in an order a seed "
            "fixes: faults on any node (a spare, a replacement, a node in an incident), events delivered again, "
            "clocks 10 min slow or 2 min fast, an operator draining, returning and pausing, an operator's runbook step "
            "(nodemedic remediate: drain, resume, reboot, replace or a health check) on any node, slurmctld restarted "
            "or crashed, instances terminated by someone else, AWS throttling, AWS's scheduled retirements and Spot "
            "interruption warnings (EC2 ending the instance 20 s later), each delivered again at times; one Slurm soak in "
            "three reaches slurmctld through the relay, and one in five runs on plain EC2 instances (Provider=ec2), where "
            "nothing launches an instance in place of one that ended; on Kubernetes (a real "
            "kube-apiserver) the operator cordons and uncordons, the API server is restarted or killed, and a "
            "PodDisruptionBudget blocks a job's evictions for a while. Once every execution ended, the "
            "reconciler runs until a run starts nothing and the same invariants are checked.\n\n" + "\n".join(soaks) + "\n")
