"""What the operator CLI prints is the data as it is: square brackets in a reason, an outcome, an
error or a doctor row are text, not Rich markup. ("[fault table]" and "[gpu_lost]" vanished from
`nodemedic show`, read as style tags; a "[/...]" in an error crashed the CLI with a MarkupError.)
The commands' work is replaced by its result; only the printing is under test."""

from __future__ import annotations

from typing import Any

import pytest
from nodemedic_cli import main as cli
from nodemedic_cli.operator import OperatorError
from nodemedic_cli.target import Target
from typer.testing import CliRunner

TARGET = Target("nodemedic-test")


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli.app, list(args), obj=TARGET)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, " ".join(result.output.split())  # rich wraps long lines


SHOWN: dict[str, Any] = {
    "incident": "inc-1", "node": "gpu-1", "instance_id": "i-0123456789abcdef0", "fault": "XID 79",
    "fault_class": "gpu_lost", "status": "failed", "outcome": "drain failed: slurmctld said [/1]",
    "reason": "XID 79 (gpu_lost) -> replace [fault table]: GPU fell off the bus", "ladder": ["replace"],
    "duplicate_events": 0,
    "timeline": [{"stage": "gate", "seconds": 0.1, "from_fault_s": 1.0, "decision": "proceed [rule: breaker]"}],
    "failure": {"stage": "drain", "error": "scontrol: error: [/bold] Invalid node name"},
}


def test_show_prints_brackets_in_an_incident_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.operator, "show", lambda target, incident: SHOWN)
    code, out = _invoke("show", "inc-1")
    assert code == 0
    for text in ("[gpu_lost]", "[fault table]", "slurmctld said [/1]", "proceed [rule: breaker]",
                 "scontrol: error: [/bold] Invalid node name"):
        assert text in out, (text, out)


def test_an_error_with_brackets_is_said_not_crashed_on(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise OperatorError("no node gpu-[/1] in cluster local [slurm]")

    monkeypatch.setattr(cli.operator, "remediate", refuse)
    code, out = _invoke("remediate", "gpu-[/1]", "--action", "replace", "--reason", "r")
    assert code == 2 and "error: no node gpu-[/1] in cluster local [slurm]" in out, out


def test_a_doctor_row_prints_its_detail_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    from nodemedic_cli import doctor

    class _Row:
        def as_dict(self) -> dict[str, str]:
            return {"check": "safety policy", "status": "fail",
                    "detail": "breaker.max_percent: Input should be greater than 0 [type=greater_than, input_value=0]",
                    "fix": "aws ssm put-parameter --value '[/]'"}

    monkeypatch.setattr(doctor, "run", lambda target: [_Row()])
    code, out = _invoke("doctor")
    assert code == 1 and "[type=greater_than," in out and "--value '[/]'" in out, out  # the table wraps the detail


def test_json_output_is_json_even_when_a_node_reported_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deep-check report may carry NaN or infinity (stored as the node sent it); --json printed
    them as NaN/Infinity, which no strict JSON parser (jq) reads."""
    import json
    import math

    shown = {**SHOWN, "timeline": [{**SHOWN["timeline"][0], "check": {"measurements": [
        {"target": "gpu0", "value": math.nan}, {"target": "gpu1", "value": math.inf}, {"target": "gpu2", "value": 1.5}]}}]}
    monkeypatch.setattr(cli.operator, "show", lambda target, incident: shown)
    result = CliRunner().invoke(cli.app, ["show", "inc-1", "--json"], obj=TARGET)
    assert result.exit_code == 0, result.output

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON output")

    out = json.loads(result.output, parse_constant=refuse)
    assert [m["value"] for m in out["timeline"][0]["check"]["measurements"]] == [None, None, 1.5]


def test_a_rung_the_provider_cannot_do_reads_as_skipped_not_as_a_failed_check() -> None:
    """On HyperPod the GPU reset is skipped (SSM does not reach its nodes): `nodemedic show` says
    so, rather than that a reset was done and its node found unhealthy."""
    from datetime import datetime

    from nodemedic.contracts.incident import StageRecord
    from nodemedic_cli.operator import decision_of

    at = "2026-11-27T02:00:00+00:00"
    rungs = [{"rung": "gpu_reset", "instance_id": "i-1", "started_at": at, "skipped": "not possible here",
              "check": {"healthy": False}},
             {"rung": "reboot", "instance_id": "i-1", "started_at": at, "check": {"healthy": True}}]
    record = StageRecord(started_at=datetime.fromisoformat(at), result={"rungs": rungs})
    assert decision_of("repair", record) == "gpu_reset skipped (not possible here) > reboot on i-1: healthy"

