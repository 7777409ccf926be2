"""``nodemedic-agent gpu-reset``, the ladder's first rung, against a node that behaves as NVIDIA's
driver does: ``nvidia-smi --gpu-reset`` is refused ("In use by another client") while a process
holds the GPU open - NodeMedic's own agent, DCGM's host engine - or persistence mode is on
(NVIDIA/NVSentinel#1690, NVIDIA/gpu-operator#118). The node's ``nvidia-smi`` and ``systemctl``
are small programs over a state file (no GPU here); every call they get is logged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nodemedic_agent.cli import main

from tests.agent.conftest import tool

NVIDIA_SMI = r'''
import json, sys
state_path, log = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
state = json.load(open(state_path))
open(log, "a").write("nvidia-smi " + " ".join(args) + "\n")
def ids(): return args[args.index("-i") + 1].split(",") if "-i" in args else [g["uuid"] for g in state["gpus"]]
def chosen(): return [g for g in state["gpus"] if g["uuid"] in ids() or g["index"] in ids()]
if args[0].startswith("--query-gpu=index"):
    for g in state["gpus"]:
        print(f"{g['index']}, {g['uuid']}, {'Enabled' if g['pm'] else 'Disabled'}")
elif args[0].startswith("--query-gpu=uuid"):
    lost = [g for g in chosen() if g.get("lost")]
    if lost:
        print(f"Unable to determine the device handle for GPU {lost[0]['index']}: GPU is lost", file=sys.stderr)
        sys.exit(15)
    for g in chosen(): print(g["uuid"])
elif args[0].startswith("--query-compute-apps"):
    for p in state["apps"]: print(", ".join(str(f) for f in (p["pid"], p["name"], p["uuid"]) if f != ""))
elif args[0] == "-pm":
    for g in chosen(): g["pm"] = args[1] == "1"
    print("All done.")
elif args[0] in ("--gpu-reset", "-r"):
    if state.get("reset_hangs"):
        import time; time.sleep(60)
    holders = [u for u, active in state["units"].items() if active and u in state["holders"]]
    busy = [g for g in chosen() if g["pm"] or holders or any(p["uuid"] == g["uuid"] for p in state["apps"])]
    if busy or state.get("reset_fails"):
        print("The following GPUs could not be reset:")
        for g in busy or chosen(): print(f"  GPU {g['uuid']}: In use by another client")
        sys.exit(255)
    for g in chosen():
        g["resets"] = g.get("resets", 0) + 1
        if state.get("lost_after_reset"): g["lost"] = True
        print(f"GPU {g['uuid']} was successfully reset.")
    print("All done.")
json.dump(state, open(state_path, "w"))
'''
SYSTEMCTL = r'''
import json, sys
state_path, log = sys.argv[1], sys.argv[2]
args = [a for a in sys.argv[3:] if a != "--quiet"]
state = json.load(open(state_path))
open(log, "a").write("systemctl " + " ".join(args) + "\n")
verb, unit = args
if unit.endswith(".timer"):  # the transient timer systemd-run made
    timer = state.get("timers", {}).get(unit)
    if verb == "is-active": sys.exit(0 if timer else 3)
    state.get("timers", {}).pop(unit, None)
elif verb == "is-active": sys.exit(0 if state["units"].get(unit) else 3)
else: state["units"][unit] = verb == "start"
json.dump(state, open(state_path, "w"))
'''
SYSTEMD_RUN = r'''
import json, sys
state_path, log = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
state = json.load(open(state_path))
open(log, "a").write("systemd-run " + " ".join(args[:2]) + "\n")
unit = next(a.split("=", 1)[1] for a in args if a.startswith("--unit="))
state.setdefault("timers", {})[unit + ".timer"] = {"after": args[1], "command": args[-1]}
json.dump(state, open(state_path, "w"))
'''


class Node:
    """A GPU node's ``nvidia-smi`` and ``systemctl`` on PATH, over ``state.json``."""

    def __init__(self, root: Path, gpus: int = 4) -> None:
        self.root = root
        self.state_path, self.log = root / "state.json", root / "calls.log"
        self.write({"gpus": [{"index": str(i), "uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000", "pm": True}
                             for i in range(gpus)],
                    "units": {"nodemedic-agent.service": True, "nvidia-dcgm.service": True,
                              "nvidia-fabricmanager.service": True},
                    "holders": ["nodemedic-agent.service", "nvidia-dcgm.service"], "apps": []})
        self.log.write_text("")
        bin_dir = root / "bin"
        bin_dir.mkdir()
        for name, program in (("nvidia-smi", NVIDIA_SMI), ("systemctl", SYSTEMCTL), ("systemd-run", SYSTEMD_RUN)):
            (root / f"{name}.py").write_text(program)
            tool(bin_dir, name, f'exec {sys.executable} {root / name}.py {self.state_path} {self.log} "$@"\n')
        self.path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"

    def state(self) -> dict:
        return json.loads(self.state_path.read_text())

    def write(self, state: dict) -> None:
        self.state_path.write_text(json.dumps(state))

    def update(self, **changes) -> None:
        self.write({**self.state(), **changes})

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture
def node(tmp_path, monkeypatch) -> Node:
    n = Node(tmp_path)
    monkeypatch.setenv("PATH", n.path)
    return n


def reset(capsys, *args: str) -> tuple[int, dict, str]:
    code = main(["gpu-reset", *args])
    out = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(out[-1]), "\n".join(out[:-1])


def test_the_old_default_is_refused_on_a_node_where_the_agent_runs(node):
    """What the stack's GpuResetCommand was: the agent's own NVML handle, DCGM and persistence
    mode hold the GPUs, so the first rung failed on every real node."""
    out = subprocess.run(["nvidia-smi", "--gpu-reset"], capture_output=True, text=True, env={"PATH": node.path})
    assert out.returncode == 255 and "In use by another client" in out.stdout
    assert all(g.get("resets", 0) == 0 for g in node.state()["gpus"])


def test_the_gpus_are_released_reset_checked_and_everything_is_put_back(node, capsys):
    code, summary, said = reset(capsys)
    assert code == 0 and summary == {"ok": True, "gpus": ["0", "1", "2", "3"], "failed": None}
    state = node.state()
    assert [g["resets"] for g in state["gpus"]] == [1, 1, 1, 1]
    assert all(g["pm"] for g in state["gpus"])  # persistence mode back on
    assert state["units"] == {"nodemedic-agent.service": True, "nvidia-dcgm.service": True,
                              "nvidia-fabricmanager.service": True}
    assert "systemctl stop nvidia-fabricmanager.service" not in node.calls()  # NVIDIA's workflow keeps it
    assert "stopped nodemedic-agent.service" in said and "started nodemedic-agent.service again" in said
    calls = node.calls()
    assert calls.index("systemctl start nvidia-dcgm.service") < calls.index("systemctl start nodemedic-agent.service")


def test_a_job_still_on_a_gpu_is_never_killed_and_nothing_is_touched(node, capsys):
    node.update(apps=[{"pid": 4242, "name": "python3", "uuid": node.state()["gpus"][2]["uuid"]}])
    code, summary, _ = reset(capsys)
    assert code == 1 and not summary["ok"] and "pid 4242 (python3) on GPU 2" in summary["failed"]
    assert not [c for c in node.calls() if "--gpu-reset" in c or c.startswith("systemctl stop") or " -pm " in c]


def test_a_job_whose_process_name_holds_a_comma_is_still_seen(node, capsys):
    """nvidia-smi prints its CSV unquoted: a name with a comma must not hide the job from the check."""
    node.update(apps=[{"pid": 4243, "name": "/opt/train,v2/bin/python3", "uuid": node.state()["gpus"][1]["uuid"]}])
    code, summary, _ = reset(capsys)
    assert code == 1 and "pid 4243 (/opt/train,v2/bin/python3) on GPU 1" in summary["failed"]
    assert not [c for c in node.calls() if "--gpu-reset" in c or c.startswith("systemctl stop") or " -pm " in c]


@pytest.mark.parametrize("line", ["4244, python3", "[Insufficient Permissions]"])
def test_a_process_list_that_cannot_be_read_refuses_the_reset(node, capsys, line):
    node.update(apps=[{"pid": line, "name": "", "uuid": ""}])
    code, summary, _ = reset(capsys)
    assert code == 1 and "cannot read nvidia-smi's list" in summary["failed"]
    assert not [c for c in node.calls() if "--gpu-reset" in c or c.startswith("systemctl stop") or " -pm " in c]


def test_a_warning_nvidia_smi_prints_first_is_passed_on_not_read_as_a_process(node, capsys):
    """A sick GPU's nvidia-smi starts its output with a notice; the reset goes on, saying it."""
    node.update(apps=[{"pid": "WARNING: infoROM is corrupted at gpu 0000:04:00.0", "name": "", "uuid": ""}])
    code, summary, said = reset(capsys)
    assert code == 0 and summary["ok"]
    assert "nvidia-smi: WARNING: infoROM is corrupted at gpu 0000:04:00.0" in said


def test_an_empty_process_list_said_in_words_is_no_process(node, capsys):
    node.update(apps=[{"pid": "No running processes found", "name": "", "uuid": ""}])
    code, summary, _ = reset(capsys)
    assert code == 0 and summary["ok"]


def test_only_the_gpus_asked_for_are_reset_and_an_unknown_one_touches_nothing(node, capsys):
    third = node.state()["gpus"][3]["uuid"]
    code, summary, _ = reset(capsys, "--gpus", f"1,{third}")
    assert code == 0 and summary["gpus"] == ["1", "3"]
    assert [g.get("resets", 0) for g in node.state()["gpus"]] == [0, 1, 0, 1]
    assert [g["pm"] for g in node.state()["gpus"]] == [True] * 4
    before = len(node.calls())
    code, summary, _ = reset(capsys, "--gpus", "1,9")
    assert code == 2 and "no such GPU: 9" in summary["failed"]
    assert all(c.startswith("nvidia-smi --query-gpu=index") for c in node.calls()[before:])


@pytest.mark.parametrize(("fault", "said"), [({"reset_fails": True}, "--gpu-reset exited 255"),
                                             ({"lost_after_reset": True}, "do not answer")])
def test_a_failed_reset_still_puts_everything_back_and_says_why(node, capsys, fault, said):
    node.update(**fault)
    code, summary, _ = reset(capsys)
    assert code == 1 and not summary["ok"] and said in summary["failed"]
    state = node.state()
    assert all(g["pm"] for g in state["gpus"]) and all(state["units"].values())


def test_a_service_that_was_not_running_is_neither_stopped_nor_started(node, capsys):
    node.update(units={"nodemedic-agent.service": True, "nvidia-dcgm.service": False})
    code, _, _ = reset(capsys)
    assert code == 0
    assert not [c for c in node.calls() if c.endswith(("stop nvidia-dcgm.service", "start nvidia-dcgm.service"))]
    assert node.state()["units"]["nvidia-dcgm.service"] is False


def test_no_nvidia_smi_is_a_clear_failure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    code, summary, _ = reset(capsys)
    assert code == 1 and "FileNotFoundError" in summary["failed"]


def test_a_reset_killed_midway_leaves_a_timer_that_puts_the_agent_and_persistence_back(node, tmp_path):
    """SSM kills a command at its executionTimeout: no finally runs. The node must not be left
    without its agent (it said goodbye when stopped, so nothing would notice it is silent)."""
    node.update(reset_hangs=True)
    agent = [sys.executable, "-m", "nodemedic_agent.cli", "gpu-reset"]
    proc = subprocess.Popen(agent, stdout=subprocess.DEVNULL, env={**os.environ, "PATH": node.path},
                            start_new_session=True)
    deadline = time.monotonic() + 30
    while not any("--gpu-reset" in c for c in node.calls()) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the reset and the nvidia-smi it waits for: as SSM kills them
    assert proc.wait(10) == -signal.SIGKILL
    state = node.state()
    assert not state["units"]["nodemedic-agent.service"] and not any(g["pm"] for g in state["gpus"])
    timer = state["timers"]["nodemedic-gpu-reset-restore.timer"]
    assert timer["after"] == "--on-active=600"
    calls = node.calls()  # armed before anything was stopped
    assert calls.index(next(c for c in calls if c.startswith("systemd-run"))) < calls.index(
        "systemctl stop nodemedic-agent.service")
    # a retry while the restore is pending touches nothing
    node.update(reset_hangs=False)
    again = subprocess.run(agent, capture_output=True, text=True, env={**os.environ, "PATH": node.path})
    assert again.returncode == 1 and "restore is pending" in json.loads(again.stdout.splitlines()[-1])["failed"]
    # the timer fires: what the killed reset changed is back
    subprocess.run(["/bin/sh", "-c", timer["command"]], check=True, env={"PATH": node.path})
    state = node.state()
    assert all(state["units"].values()) and all(g["pm"] for g in state["gpus"])


def test_a_reset_that_ends_disarms_its_timer(node, capsys):
    code, _, _ = reset(capsys)
    assert code == 0 and not node.state().get("timers")
    assert "systemctl stop nodemedic-gpu-reset-restore.timer" in node.calls()


def test_without_systemd_run_nothing_is_stopped(node, capsys):
    tool(Path(node.path.split(os.pathsep)[0]), "systemd-run", "echo 'Failed to start transient timer unit' >&2\nexit 1\n")
    code, summary, _ = reset(capsys)
    assert code == 1 and "cannot arm the restore timer" in summary["failed"]
    assert not [c for c in node.calls() if c.startswith("systemctl stop") or " -pm 0" in c or "--gpu-reset" in c]


@pytest.mark.parametrize("value", ["-5", "0", "soon", "100000"])
def test_a_restore_delay_that_makes_no_sense_is_refused_before_anything_runs(node, capsys, value):
    with pytest.raises(SystemExit) as stop:
        main(["gpu-reset", "--restore-after", value])
    assert stop.value.code == 2 and "--restore-after" in capsys.readouterr().err
    assert node.calls() == []
