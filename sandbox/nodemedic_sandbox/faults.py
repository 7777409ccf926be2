"""The local cluster's simulated hardware faults (``faults.json`` in its state directory).

The test process (injecting faults, rebooting instances) and the node commands that SSM runs as
other processes (``join``, ``gpu-reset``) all change this file, so every change is a read-modify-
write under an exclusive lock, and every write replaces the file atomically: a change is never
lost to a concurrent one, and a reader never sees half a file.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _path(state: Path) -> Path:
    return state / "faults.json"


def read(state: Path) -> dict[str, Any]:
    return dict(json.loads(_path(state).read_text()))


def _write(state: Path, faults: dict[str, Any]) -> None:
    tmp = state / f"faults.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(faults))
    os.replace(tmp, _path(state))


@contextmanager
def change(state: Path) -> Iterator[dict[str, Any]]:
    """``with change(state) as faults: faults[...] = ...``: written back when the block ends."""
    with (state / "faults.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        faults = read(state) if _path(state).exists() else {}
        yield faults
        _write(state, faults)


def take_bad_replacement(faults: dict[str, Any], node: str, instance_id: str) -> None:
    """If a bad replacement was asked for ``node`` (``SimCluster.fail_replacement_of``),
    ``instance_id``, its replacement, is it: broken until it is replaced in turn."""
    bad: list[str] = list(faults.get("bad_replacements", []))
    if node in bad:
        bad.remove(node)
        faults["bad_replacements"] = bad
        faults["broken"] = {**faults.get("broken", {}), instance_id: "replace"}
