"""`make demo` (``nodemedic demo``) runs end to end and shows what it promises."""

from __future__ import annotations

import io

from nodemedic_cli.demo import run_demo
from rich.console import Console

from tests.conftest import require_slurm


def test_the_demo_detects_through_the_agents_and_prints_mttd_mttr(tmp_path) -> None:
    require_slurm()
    out = io.StringIO()
    page = tmp_path / "demo.html"
    assert run_demo(Console(file=out, width=200, force_terminal=False), nodes=6, scheduler="slurm",
                    report_path=page) == 0
    text = out.getvalue()
    assert "real Slurm" in text
    for row in ("XID 79", "ECC_DBE", "XID 13", "GPU_LOST", "HEARTBEAT_MISSING", "XID 48"):
        assert row in text
    assert text.count("recovered") >= 3 and "quarantined, escalated" in text
    # the first fault's job moved to the hot spare; a GPU reset was the first rung for the ECC error
    assert "gpu-7" in text and "gpu_reset ok" in text and "replace failed" in text
    # the safety gate: the hung node was checked first (ambiguous alone), the paused one held
    assert "verify - corroboration" in text and "hold - paused" in text and "held" in text
    assert "SNS escalation" in text and "MTTR" in text
    # each table ends its own line (the live table left its last line open in a log)
    assert all(line.rstrip().endswith("┘") for line in text.splitlines() if "┘" in line)
    assert "<svg" in page.read_text() and str(page) in text.replace("\n", "")
