"""``nodemedic-agent gpu-reset``: the first rung of the repair ladder as it succeeds on a real node
(the stack's ``GpuResetCommand``).

A bare ``nvidia-smi --gpu-reset`` is refused ("In use by another client") while anything holds
the GPU open: NodeMedic's own agent (NVML), DCGM's host engine, persistence mode
(``nvidia-persistenced`` counts as an attachment: NVIDIA/NVSentinel#1690, gpu-operator#118).
So, on the GPUs asked for (all by default):

1. refuse, touching nothing, while a compute process runs on one of them, or while nvidia-smi's
   process list cannot be read: the node is drained before this rung, and a process still there
   is a job this must not kill;
2. arm a systemd timer (``systemd-run``) that puts back what the next step changes, should this
   process be killed (SSM kills a command at its timeout); then stop the services that hold the
   GPUs and are running (``--stop-unit``: the agent and DCGM by default), and turn persistence
   mode off on the GPUs that have it on;
3. ``nvidia-smi --gpu-reset -i <uuids>``, then check that every GPU answers again;
4. always, whatever failed: persistence mode back on where it was, the stopped services started
   again (in reverse order), and the timer disarmed. A reset whose timer is still pending (one
   under way, or one killed less than ``--restore-after`` ago) is refused.

Fabric Manager (NVSwitch systems) is left running: NVIDIA's own reset workflow does not stop it.
Prints each step, then one JSON line (``ok``, ``gpus``, ``failed``); exits 0 only when the reset
and the check after it passed, 2 when a GPU asked for does not exist.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

HOLDERS = ("nodemedic-agent.service", "nvidia-dcgm.service", "dcgm.service")
RESTORE_UNIT = "nodemedic-gpu-reset-restore"  # the systemd timer that puts things back if this is killed
RESTORE_AFTER_S = 600
EXIT_REFUSED, EXIT_BAD_TARGET = 1, 2
NO_PROCESSES = "No running processes found"  # what some nvidia-smi versions print for an empty list

Run = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=300, check=False)


class ResetError(Exception):
    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Gpu:
    index: str
    uuid: str
    persistence: bool


@dataclass
class GpuReset:
    """One reset: what it changed, so that ``restore`` undoes exactly that."""

    run: Run = _run
    say: Callable[[str], None] = print
    stopped: list[str] = field(default_factory=list)
    persistence_off: list[str] = field(default_factory=list)
    armed: bool = False  # the restore timer is set

    def _smi(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(["nvidia-smi", *args])

    def targets(self, wanted: Sequence[str]) -> list[Gpu]:
        out = self._smi("--query-gpu=index,uuid,persistence_mode", "--format=csv,noheader")
        if out.returncode != 0:
            raise ResetError(f"nvidia-smi cannot list the GPUs: {(out.stderr or out.stdout).strip()[:200]}")
        gpus = []
        for line in out.stdout.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3 and parts[0].isdigit():
                gpus.append(Gpu(parts[0], parts[1], parts[2] == "Enabled"))
        if not gpus:
            raise ResetError("nvidia-smi lists no GPU")
        if not wanted:
            return gpus
        chosen = [g for g in gpus if g.index in wanted or g.uuid in wanted]
        unknown = sorted(set(wanted) - {g.index for g in chosen} - {g.uuid for g in chosen})
        if unknown:
            raise ResetError(f"no such GPU: {', '.join(unknown)} (this node has {', '.join(g.index for g in gpus)})",
                             EXIT_BAD_TARGET)
        return chosen

    def busy(self, gpus: list[Gpu]) -> list[str]:
        """The compute processes on ``gpus`` (``pid name on GPU i``). nvidia-smi does not quote its CSV,
        and a process name may hold a comma, so the pid is the first field and the GPU the last. A line
        that names no GPU is not read as "no process": the reset is refused (a job it missed would die)."""
        out = self._smi("--query-compute-apps=pid,process_name,gpu_uuid", "--format=csv,noheader")
        if out.returncode != 0:
            raise ResetError(f"nvidia-smi cannot list the GPUs' processes: {(out.stderr or out.stdout).strip()[:200]}")
        index = {g.uuid: g.index for g in gpus}
        found = []
        for line in out.stdout.splitlines():
            if not line.strip() or line.strip() == NO_PROCESSES:
                continue
            if line.startswith("WARNING:"):  # a notice nvidia-smi prints first, e.g. "infoROM is corrupted at gpu ..."
                self.say(f"nvidia-smi: {line.strip()[:200]}")
                continue
            pid, _, rest = line.partition(",")
            name, _, uuid = rest.rpartition(",")
            if not uuid.strip().startswith("GPU-"):
                raise ResetError(f"cannot read nvidia-smi's list of the GPUs' processes, nothing reset: {line.strip()[:200]!r}")
            if uuid.strip() in index:
                found.append(f"pid {pid.strip()} ({name.strip()}) on GPU {index[uuid.strip()]}")
        return found

    def release(self, gpus: list[Gpu], units: Sequence[str], restore_after_s: int) -> None:
        """Stop the running ``units`` and turn persistence mode off, after arming a systemd timer
        that puts both back in ``restore_after_s`` should this process be killed first (SSM kills
        a command at its executionTimeout): a node must never be left without its agent."""
        if self.run(["systemctl", "is-active", "--quiet", f"{RESTORE_UNIT}.timer"]).returncode == 0:
            raise ResetError(f"a GPU reset is under way or its restore is pending ({RESTORE_UNIT}.timer): "
                             "nothing done")
        running = [u for u in units if self.run(["systemctl", "is-active", "--quiet", u]).returncode == 0]
        pm = [g.uuid for g in gpus if g.persistence]
        undo = [shlex.join(["nvidia-smi", "-pm", "1", "-i", uuid]) for uuid in pm] + \
            [shlex.join(["systemctl", "start", u]) for u in reversed(running)]
        if undo:
            armed = self.run(["systemd-run", f"--unit={RESTORE_UNIT}", f"--on-active={restore_after_s}",
                              "--description=NodeMedic: put back what a killed GPU reset stopped",
                              "/bin/sh", "-c", "; ".join(undo)])
            if armed.returncode != 0:
                raise ResetError(f"cannot arm the restore timer (systemd-run): "
                                 f"{(armed.stderr or armed.stdout).strip()[:200]}; nothing stopped")
            self.armed = True
        for unit in running:
            out = self.run(["systemctl", "stop", unit])
            if out.returncode != 0:
                raise ResetError(f"cannot stop {unit}, which holds the GPUs: {(out.stderr or out.stdout).strip()[:200]}")
            self.stopped.append(unit)
            self.say(f"stopped {unit} (it holds the GPUs open)")
        for gpu in gpus:
            if gpu.persistence:
                out = self._smi("-pm", "0", "-i", gpu.uuid)
                if out.returncode != 0:
                    raise ResetError(f"cannot turn persistence mode off on GPU {gpu.index}: "
                                     f"{(out.stderr or out.stdout).strip()[:200]}")
                self.persistence_off.append(gpu.uuid)
        if self.persistence_off:
            self.say(f"persistence mode off on {len(self.persistence_off)} GPU(s) for the reset")

    def reset(self, gpus: list[Gpu]) -> None:
        uuids = ",".join(g.uuid for g in gpus)
        out = self._smi("--gpu-reset", "-i", uuids)
        said = " ".join((out.stdout + " " + out.stderr).split())
        if out.returncode != 0:
            raise ResetError(f"nvidia-smi --gpu-reset exited {out.returncode}: {said[:240]}")
        self.say(f"reset: {said[:240]}")
        check = self._smi("--query-gpu=uuid", "--format=csv,noheader", "-i", uuids)
        back = {line.strip() for line in check.stdout.splitlines()}
        missing = [g.index for g in gpus if g.uuid not in back]
        if check.returncode != 0 or missing:
            raise ResetError(f"after the reset GPU(s) {', '.join(missing) or uuids} do not answer: "
                             f"{(check.stderr or check.stdout).strip()[:200]}")

    def restore(self) -> list[str]:
        """Undo what ``release`` changed; the problems met (each step is tried)."""
        problems = []
        for uuid in self.persistence_off:
            if self._smi("-pm", "1", "-i", uuid).returncode != 0:
                problems.append(f"persistence mode not restored on {uuid}")
        for unit in reversed(self.stopped):
            if self.run(["systemctl", "start", unit]).returncode != 0:
                problems.append(f"{unit} not started again")
            else:
                self.say(f"started {unit} again")
        if self.armed and not problems:  # put back here: the safety net is not needed
            self.run(["systemctl", "stop", f"{RESTORE_UNIT}.timer"])
        return problems


def gpu_reset(wanted: Sequence[str], units: Sequence[str] = HOLDERS, run: Run = _run,
              say: Callable[[str], None] = print, restore_after_s: int = RESTORE_AFTER_S) -> int:
    """Reset the GPUs ``wanted`` (indices or UUIDs; none: all of them); the exit status."""
    job = GpuReset(run=run, say=say)
    gpus: list[Gpu] = []
    code, failed = 0, ""
    try:
        gpus = job.targets(wanted)
        if running := job.busy(gpus):
            raise ResetError(f"a job still runs on the GPUs, nothing reset: {'; '.join(running)[:200]}")
        job.release(gpus, units, restore_after_s)
        job.reset(gpus)
    except ResetError as exc:
        code, failed = exc.code, str(exc)
    except (OSError, subprocess.SubprocessError) as exc:  # nvidia-smi missing, a command hung
        code, failed = EXIT_REFUSED, f"{type(exc).__name__}: {exc}"[:300]
    finally:
        problems = job.restore()
    if problems:
        code = code or EXIT_REFUSED
        failed = "; ".join([failed, *problems] if failed else problems)
    say(json.dumps({"ok": code == 0, "gpus": [g.index for g in gpus], "failed": failed or None}))
    return code
