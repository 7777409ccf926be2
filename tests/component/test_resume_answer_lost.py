"""A resume whose answer was lost still reports the node back, and only then.

slurmctld going down while ``scontrol update state=resume`` waits for its answer: scontrol asks
again once it is back, and is refused (``Invalid node state specified``) because the first
request lifted the drain. The slurm-resume document from template.yaml runs in bash against a
Slurm-shaped scontrol: refused but read back in service, it says "resumed" (before, the stage
failed and paged on-call about a node that was back); refused and still drained, it fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from nodemedic.errors import ResumeFailedError

from tests.component.test_requeue_retry import SlowControllerSSM, _slurm
from tests.component.test_ssm_output_limit import fake_slurm

FAKE_SCONTROL = r'''
import os, sys
path = os.environ["FAKE_NODE"]
state = open(path).read()
args = sys.argv[1:]
if args[:2] == ["show", "node"] and args[3:] == ["-o"]:
    reason = " Reason=nodemedic:inc-1 XID 79 [root@2026-11-29T05:00:00]" if "DRAIN" in state else ""
    print(f"NodeName={args[2]} Arch=x86_64 State={state} ThreadsPerCore=1{reason}")
elif args[:1] == ["update"] and args[2:] == ["state=resume"]:
    answer = os.environ["FAKE_ANSWER"]
    if answer in ("ok", "lost"):
        open(path, "w").write(state.replace("+DRAIN", ""))
    if answer != "ok":  # lost: lifted, then the retried request was refused; refused: not lifted
        sys.exit("slurm_update error: Invalid node state specified")
else:
    sys.exit(f"fake scontrol: {args}")
'''


@pytest.mark.parametrize("answer", ["ok", "lost"])
def test_a_lift_whose_answer_was_lost_reads_back_and_reports_the_node_resumed(tmp_path: Path, answer: str) -> None:
    node = tmp_path / "node"
    node.write_text("IDLE+DRAIN")
    ssm = SlowControllerSSM({**os.environ, "PATH": "/usr/bin:/bin", "FAKE_NODE": str(node), "FAKE_ANSWER": answer},
                            fake_slurm(tmp_path, FAKE_SCONTROL, "scontrol"))
    assert _slurm(ssm).resume("gpu-1", "nodemedic:inc-1") is True
    assert node.read_text() == "IDLE"


def test_a_refused_lift_of_a_node_still_drained_fails(tmp_path: Path) -> None:
    node = tmp_path / "node"
    node.write_text("IDLE+DRAIN")
    ssm = SlowControllerSSM({**os.environ, "PATH": "/usr/bin:/bin", "FAKE_NODE": str(node), "FAKE_ANSWER": "refused"},
                            fake_slurm(tmp_path, FAKE_SCONTROL, "scontrol"))
    with pytest.raises(ResumeFailedError, match="Invalid node state specified"):
        _slurm(ssm).resume("gpu-1", "nodemedic:inc-1")
    assert node.read_text() == "IDLE+DRAIN"
