import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodemedic_sandbox import slurm_cluster
from nodemedic_sandbox.local import LocalMode

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ROOT / "events"


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
