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
    for bad in ("yesterday", "99999999999h"):  # the second: further back than any date, an OverflowError before
        with pytest.raises(OperatorError, match="--since"):
            _since(bad)


def test_an_aws_refusal_is_one_line_that_names_the_call_not_a_traceback() -> None:
    """An operator whose role lacks a permission (or who is throttled) is told which call AWS
    refused and why, in the --json shape too, exit 2. AWS's answers come through botocore's
    stubber, checked against the API model."""
    import json

    import boto3
    from botocore.stub import Stubber
    from nodemedic.store.ledger import LIST_SEGMENTS
    from nodemedic_cli.main import app
    from nodemedic_cli.target import Target
    from typer.testing import CliRunner

    session = boto3.Session(region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    target = Target("nodemedic", session=session)
    with Stubber(target.client("cloudformation")) as stack, Stubber(target.client("dynamodb")) as table:
        stack.add_response("describe_stacks", {"Stacks": [{
            "StackName": "nodemedic", "StackStatus": "CREATE_COMPLETE", "CreationTime": datetime.now(UTC),
            "Outputs": [{"OutputKey": "IncidentsTableName", "OutputValue": "incidents"}]}]})
        for _ in range(LIST_SEGMENTS):  # each parallel scan of the ledger is refused
            table.add_client_error("scan", "AccessDeniedException", "User: arn:aws:sts::1:assumed-role/oncall "
                                   "is not authorized to perform: dynamodb:Scan")
        result = CliRunner().invoke(app, ["incidents", "--json"], obj=target)
    assert result.exit_code == 2, result.exception
    assert json.loads(result.output) == {"error": "AWS refused Scan: AccessDeniedException: User: arn:aws:sts::1:"
                                                  "assumed-role/oncall is not authorized to perform: dynamodb:Scan"}


@pytest.mark.parametrize("args", [["--provider", "karpenter"], ["--scheduler", "slurm", "--provider", "karpenter"],
                                  ["--scheduler", "k8s", "--provider", "fargate"]])
def test_the_demo_refuses_a_provider_its_scheduler_cannot_have(args: list[str]) -> None:
    from nodemedic_cli.main import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["demo", *args])
    said = " ".join(result.output.replace("│", " ").split())  # the error box wraps the line
    assert result.exit_code == 2 and "choose autoscaling, or karpenter with --scheduler kubernetes" in said
