"""The agent's burn-in hold against a stand-in ``scontrol`` (the real one: tests/e2e/test_burn_in.py):
it drains a node that is not drained, leaves anyone's drain alone, fails closed when Slurm cannot
be reached, and the agent publishes NODE_JOINED once per hold."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from nodemedic.contracts.events import NodeIdentity
from nodemedic_agent.agent import Agent
from nodemedic_agent.burn_in import HoldError, hold, joined
from nodemedic_agent.cli import main
from nodemedic_agent.config import parse_config
from nodemedic_agent.hardware.simulated import SimulatedHardware, SimulatedNode

SCONTROL = """#!/bin/sh
# show node NODE -o: prints $STATE_FILE; update ...: appends its arguments to $LOG_FILE
echo "$@" >> "{log}"
if [ -f "{fail}" ]; then echo "slurm_load_node error: Unable to contact slurm controller" >&2; exit 1; fi
case "$1" in
  show) cat "{state}" ;;
  update) exit 0 ;;
esac
"""


@pytest.fixture
def slurm(tmp_path: Path) -> dict[str, Path]:
    paths = {n: tmp_path / n for n in ("log", "fail", "state")}
    script = tmp_path / "scontrol"
    script.write_text(SCONTROL.format(**paths))
    script.chmod(0o755)
    paths["scontrol"] = script
    return paths


def node_record(state: str, reason: str = "") -> str:
    tail = f" Reason={reason} [root@2026-11-23T10:00:00]" if reason else ""
    return f"NodeName=gpu-7 Arch=x86_64 CoresPerSocket=1 State={state} ThreadsPerCore=1{tail}\n"


def test_a_node_not_drained_is_drained_for_its_burn_in_and_marked(slurm: dict[str, Path], tmp_path: Path) -> None:
    slurm["state"].write_text(node_record("IDLE"))
    marker = tmp_path / "run" / "burn-in-hold.json"
    result = hold("gpu-7", "i-0abc", prefix="nodemedic", marker=marker, scontrol=str(slurm["scontrol"]), retry_s=0)
    assert result.held and result.reason == "nodemedic:burn-in i-0abc joined"
    assert "update NodeName=gpu-7 State=DRAIN Reason=nodemedic:burn-in i-0abc joined" in slurm["log"].read_text()
    assert json.loads(marker.read_text())["reason"] == result.reason


@pytest.mark.parametrize("state,reason", [("IDLE+DRAIN", "rma ticket 42"),  # an operator's
                                          ("DOWN*+DRAIN", "nodemedic:inc-1 XID 79")])  # an open incident's
def test_a_drained_node_is_left_as_it_is(slurm: dict[str, Path], tmp_path: Path, state: str, reason: str) -> None:
    slurm["state"].write_text(node_record(state, reason))
    marker = tmp_path / "burn-in-hold.json"
    result = hold("gpu-7", "i-0abc", prefix="nodemedic", marker=marker, scontrol=str(slurm["scontrol"]), retry_s=0)
    assert not result.held and result.reason == reason and reason in result.message
    assert "update" not in slurm["log"].read_text() and not marker.exists()


def test_an_unreachable_controller_fails_the_hold_after_retrying(slurm: dict[str, Path], tmp_path: Path) -> None:
    slurm["fail"].write_text("")
    naps: list[float] = []
    with pytest.raises(HoldError, match="Unable to contact slurm controller"):
        hold("gpu-7", "i-0abc", prefix="nodemedic", marker=tmp_path / "m.json", scontrol=str(slurm["scontrol"]),
             retry_s=0.05, sleep=naps.append)
    assert naps and not (tmp_path / "m.json").exists()


def test_a_node_unknown_to_slurm_is_an_error(slurm: dict[str, Path], tmp_path: Path) -> None:
    slurm["state"].write_text("Node gpu-7 not found\n")
    with pytest.raises(HoldError, match="does not know node gpu-7"):
        hold("gpu-7", "i-0abc", prefix="nodemedic", marker=tmp_path / "m.json", scontrol=str(slurm["scontrol"]),
             retry_s=0)


def config(tmp_path: Path, slurm: dict[str, Path]) -> dict[str, object]:
    sim = SimulatedNode(tmp_path / "hw").create(gpus=8, efa=0)
    return {"cluster": "c1", "event_bus": "bus",
            "node": {"instance_id": "i-0123456789abcdef0", "slurm_node": "gpu-7", "hostname": "gpu-7"},
            "kernel_log": {"source": "off"}, "hardware": {"backend": "simulated", "simulated_dir": str(sim.dir)},
            "publish": {"spool_dir": str(tmp_path / "spool")},
            "burn_in": {"marker": str(tmp_path / "run" / "hold.json"), "scontrol": str(slurm["scontrol"]),
                        "retry_seconds": 0}}


def test_the_cli_holds_and_exits_1_when_slurm_cannot_be_reached(slurm: dict[str, Path], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agent.toml"
    data = config(tmp_path, slurm)
    lines = [f"{k} = {json.dumps(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for section, values in data.items():
        if isinstance(values, dict):
            lines += [f"[{section}]", *(f"{k} = {json.dumps(v)}" for k, v in values.items())]
    path.write_text("\n".join(lines) + "\n")
    slurm["state"].write_text(node_record("IDLE"))
    assert main(["--config", str(path), "burn-in-hold"]) == 0
    assert "drained for its burn-in" in capsys.readouterr().out
    slurm["fail"].write_text("")
    assert main(["--config", str(path), "burn-in-hold", "--retry-seconds", "0"]) == 1
    assert "cannot hold gpu-7" in capsys.readouterr().err


def test_the_agent_publishes_node_joined_once_per_hold(slurm: dict[str, Path], tmp_path: Path) -> None:
    cfg = parse_config(config(tmp_path, slurm))
    marker = Path(cfg.burn_in.marker)
    out = io.StringIO()
    agent = Agent(cfg, SimulatedHardware(cfg.hardware.simulated_dir or ""),
                  NodeIdentity(instance_id="i-0123456789abcdef0", hostname="gpu-7", slurm_node="gpu-7"),
                  None, dry_run=True, out=out)
    assert not agent.publish_join()  # no hold this boot: nothing
    slurm["state"].write_text(node_record("IDLE"))
    for _ in range(2):  # two joins within the dedupe window are two events
        hold("gpu-7", "i-0123456789abcdef0", prefix="nodemedic", marker=marker, scontrol=str(slurm["scontrol"]))
        finding = joined(marker)
        assert finding is not None
        assert agent.publish_join()
        marker.unlink()  # (dry run keeps it; the real agent removes it once spooled)
        assert not agent.publish_join()
    events = [json.loads(line)["Detail"] for line in out.getvalue().splitlines()]
    assert [(e["fault_code"], e["check"], e["component"]["kind"]) for e in events] == [
        ("NODE_JOINED", "burn_in", "node")] * 2
    assert events[0]["evidence"]["drain_reason"] == "nodemedic:burn-in i-0123456789abcdef0 joined"
