"""The CLI's help reads as prose: a docstring's line breaks are where the source wraps, not the
reader's terminal, so they must not show in ``--help``."""

import re

import pytest
from nodemedic_cli.main import app
from typer.testing import CliRunner

COMMANDS = [[], ["demo"], ["doctor"], ["report"], ["fleet"], ["fleet", "simulate"], ["xid"], ["xid", "import"],
            ["breaker"], ["breaker", "reset"], ["planned"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "nodemedic")
def test_help_wraps_to_the_terminal_not_to_the_source(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    text = re.sub(r"[│╭╮╰╯─]", " ", result.output)
    rows = [row.strip() for row in text.splitlines() if row.strip()]
    # at 200 columns no sentence of ours wraps, so a row that stops mid-sentence is a kept line break
    broken = [row for row in rows if re.search(r"[a-z,]$", row) and len(row) < 120 and " " in row
              and not row.startswith(("Usage:", "--", "-"))]
    assert not broken, "\n".join(broken)


def test_the_command_list_gives_each_command_its_summary_in_one_piece() -> None:
    output = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "start a cluster, inject faults, show remediation live" in " ".join(output.split())
    assert re.search(r"demo\s+Run the local end-to-end demo: deploy template.yaml into an embedded AWS, start a cluster, "
                     r"inject faults", output)
