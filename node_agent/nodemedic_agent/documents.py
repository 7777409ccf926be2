"""What SSM's agent does with a Command document before it runs it: check each parameter against
the document's declaration (present or defaulted, ``allowedValues``, ``allowedPattern``: "Creating
SSM documents: parameters" in the Systems Manager user guide), then replace each ``{{ name }}`` in
its ``aws:runShellScript`` lines by the value, and run them as it runs them (:func:`run_script`).
The relay (:mod:`nodemedic_agent.relay`) runs the stack's documents this way; the local stack's
SSM does too."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}")
# a script that exits 194 asks SSM's agent to reboot the instance, then runs again ("Handling
# reboots when running commands", Systems Manager user guide)
REBOOT_EXIT_CODE = 194


def parameter_problems(name: str, document: dict[str, Any], given: dict[str, list[str]]) -> list[str]:
    """Why SSM would refuse these values (``InvalidParameters``); empty when it would not."""
    declared: dict[str, dict[str, Any]] = document.get("parameters", {})
    problems = [f"{k} is not a parameter of {name}" for k in given if k not in declared]
    for key, spec in declared.items():
        values = given.get(key)
        if values is None:
            if "default" not in spec:
                problems.append(f"{key} is required")
            continue
        for value in values:
            if "allowedValues" in spec and value not in spec["allowedValues"]:
                problems.append(f"{key}={value!r} is not one of {spec['allowedValues']}")
            if "allowedPattern" in spec and not re.search(spec["allowedPattern"], value):
                problems.append(f"{key}={value!r} does not match {spec['allowedPattern']}")
    return problems


def render_document(document: dict[str, Any], given: dict[str, list[str]]) -> str:
    """The shell an SSM agent runs for an ``aws:runShellScript`` document: ``{{ name }}``
    replaced by the parameter's value (its default when not given)."""
    values = {k: given.get(k, [str(spec.get("default", ""))]) for k, spec in document.get("parameters", {}).items()}
    lines = [line for step in document["mainSteps"] if step["action"] == "aws:runShellScript"
             for line in step["inputs"]["runCommand"]]
    return _PLACEHOLDER.sub(lambda m: "\n".join(values[m.group(1)]), "\n".join(lines))


@dataclass(frozen=True)
class ScriptRun:
    """How a document's script ended, as SSM reports it."""

    status: str  # Success | Failed | TimedOut
    exit_code: int
    stdout: str
    stderr: str


def run_script(script: str, timeout_s: float, env: Mapping[str, str] | None = None) -> ScriptRun:
    """Run a rendered ``aws:runShellScript`` step as SSM's agent does (amazon-ssm-agent,
    ``plugins/runscript``): its lines written to an executable ``_script.sh`` that ``sh -c <path>``
    starts. So a first line ``#!/bin/bash`` chooses bash, and without one ``/bin/sh`` runs the lines:
    dash on Debian and Ubuntu, which has no ``pipefail`` and no bash syntax. At the timeout the agent
    kills the script and everything it started. An exit of 194 would make the agent reboot the
    instance: reported here as a failure that says so, never emulated."""
    tmp_root = (env if env is not None else os.environ).get("TMPDIR")
    with tempfile.TemporaryDirectory(prefix="nodemedic-script-", dir=tmp_root) as tmp:
        path = Path(tmp) / "_script.sh"
        path.write_text(script + "\n")
        path.chmod(0o700)
        proc = subprocess.Popen(["sh", "-c", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", env=None if env is None else dict(env), start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # the script ended as the time ran out
                pass
            out, err = proc.communicate()
            return ScriptRun("TimedOut", -1, out, f"{err}timed out after {timeout_s:g}s")
    if proc.returncode == REBOOT_EXIT_CODE:  # the agent would reboot the instance and run the script again
        err += f"exit {REBOOT_EXIT_CODE}: SSM's agent would reboot the instance here and run the script again\n"
    return ScriptRun("Success" if proc.returncode == 0 else "Failed", proc.returncode, out, err)
