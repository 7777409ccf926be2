"""How the CLI finds its stack and reads --since, without AWS."""

from datetime import UTC, datetime, timedelta

import pytest
from nodemedic.operations import OperatorError
from nodemedic_cli.main import _since
from nodemedic_cli.target import TargetError, stack_from_samconfig


def test_the_stack_name_comes_from_samconfig_as_sam_deploy_guided_writes_it(tmp_path) -> None:
    config = tmp_path / "samconfig.toml"
    config.write_text('version = 0.1\n[default.deploy.parameters]\nstack_name = "nodemedic-prod"\n'
                      'region = "us-west-2"\n')
    assert stack_from_samconfig(config) == "nodemedic-prod"
    assert stack_from_samconfig(tmp_path / "missing.toml") is None
    config.write_text("[default.deploy.parameters\n")
    with pytest.raises(TargetError, match="not valid TOML"):
        stack_from_samconfig(config)


def test_since_takes_a_duration_ago_or_an_iso_time() -> None:
    assert abs((datetime.now(UTC) - timedelta(hours=24)) - _since("24h")) < timedelta(seconds=5)
    assert _since("2026-11-22T08:00") == datetime(2026, 11, 22, 8, 0, tzinfo=UTC)
    assert _since(None) is None
    with pytest.raises(OperatorError, match="--since"):
        _since("yesterday")
