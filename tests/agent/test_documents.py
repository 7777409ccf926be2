"""A document's script runs as SSM's agent runs it (the local stack's SSM and the relay both use
:func:`run_script`): written to a file that ``sh -c`` starts, killed with all it started at the
timeout. So the local stack is as strict as an Ubuntu node, where sh is dash."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from nodemedic_agent.documents import run_script

SH_IS_DASH = Path(shutil.which("sh") or "/bin/sh").resolve().name == "dash"


@pytest.mark.skipif(not SH_IS_DASH, reason="sh here is not dash, the shell SSM gives a script on Ubuntu")
def test_a_script_that_names_no_shell_runs_under_sh_and_bash_syntax_fails_there() -> None:
    plain = run_script("set -euo pipefail\necho ran", 30)
    assert plain.status == "Failed" and "pipefail" in plain.stderr and "ran" not in plain.stdout


def test_a_script_whose_first_line_names_bash_runs_under_bash() -> None:
    done = run_script("#!/bin/bash\nset -euo pipefail\nread -r word <<< 'bash'\necho \"$word $BASH_VERSION\"", 30)
    assert done.status == "Success" and done.stdout.startswith("bash ")
    failed = run_script("#!/bin/bash\necho before\nexit 3", 30)
    assert (failed.status, failed.exit_code, failed.stdout) == ("Failed", 3, "before\n")


def test_at_the_timeout_the_script_and_what_it_started_are_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    done = run_script(f"#!/bin/bash\necho started\nsleep 600 & echo $! > {pid_file}\nwait", 2,
                      {**os.environ, "TMPDIR": str(tmp_path)})
    assert done.status == "TimedOut" and done.exit_code == -1 and done.stdout == "started\n"
    child = int(pid_file.read_text())
    gone = subprocess.run(["ps", "-o", "stat=", "-p", str(child)], capture_output=True, text=True, check=False)
    assert gone.stdout.strip() in ("", "Z")  # killed (at most not yet reaped by init)
    assert list(tmp_path.iterdir()) == [pid_file]  # the script's file is gone with it


def test_an_exit_of_194_says_ssm_would_reboot_the_instance() -> None:
    done = run_script("#!/bin/bash\nexit 194", 30)
    assert (done.status, done.exit_code) == ("Failed", 194) and "reboot the instance" in done.stderr
