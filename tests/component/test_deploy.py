"""The local mode deploys template.yaml itself, with the state machine made executable."""

import json
from pathlib import Path

from nodemedic.safety.policy import parse_policy
from nodemedic_sandbox.deploy import deploy
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"
PARAMS = {"ClusterName": "c1", "AutoScalingGroupName": "g", "SlurmControllerInstanceId": "i-0123456789abcdef0"}


def test_the_template_deploys_with_substitutions_applied_and_policies_in_place() -> None:
    with EmbeddedAWS() as aws:
        stack = deploy(aws, TEMPLATE, "s", PARAMS)
        sfn = aws.client("stepfunctions")
        definition = sfn.describe_state_machine(stateMachineArn=stack.state_machine_arn)["definition"]
        assert "${" not in definition
        states = json.loads(definition)["States"]
        assert states["Detect"]["Resource"].endswith(stack.resources["DetectFunction"])
        assert states["MarkIncidentFailed"]["Parameters"]["TableName"] == stack.table_name
        # one Lambda per stage and the silence sweeper, each with its source registered for the local runtime
        assert {Path(src.code_dir).name for src in aws.functions.values()} == {
            "detect", "gate", "shadow", "approval", "drain", "spares", "repair", "deep_health_check",
            "health_check_result", "resume", "silence_sweeper"}
        # the dashboard, and the three alarms (to the escalation topic) that moto's CloudFormation skips
        cw = aws.client("cloudwatch")
        assert cw.list_dashboards()["DashboardEntries"][0]["DashboardName"] == stack.outputs["DashboardName"]
        alarms = cw.describe_alarms()["MetricAlarms"]
        assert sorted(a["AlarmName"].split(" ", 2)[2] for a in alarms) == [
            "MTTR p90 above SLO", "health events dead-lettered", "remediations failed"]
        assert all(a["AlarmActions"] == [stack.topic_arn] for a in alarms)
        assert not any(a["AlarmName"].startswith("nodemedic-") for a in alarms)  # never starts a remediation
        # the safety policy parameter is seeded from the template parameters and loads cleanly
        name = stack.outputs["SafetyPolicyParameterName"]
        policy = parse_policy(aws.client("ssm").get_parameter(Name=name)["Parameter"]["Value"])
        assert (policy.mode, policy.breaker.max_percent, policy.lemon.incidents) == ("automatic", 10, 3)
        bus = aws.client("events").describe_event_bus(Name=stack.bus_name)
        assert "AllowThisAccountToPublish" in bus["Policy"]
        rules = aws.client("events").list_rules(EventBusName=stack.bus_name)["Rules"]
        patterns = {r["Name"]: json.loads(r["EventPattern"]) for r in rules}
        assert all(p["detail"]["cluster"] == ["c1"] for p in patterns.values())
        rules = [r for r in rules if patterns[r["Name"]]["detail-type"] == ["Node Health Event"]]
        assert patterns[rules[0]["Name"]]["source"] == ["nodemedic.agent", "nodemedic.sweeper"]
        targets = aws.client("events").list_targets_by_rule(Rule=rules[0]["Name"], EventBusName=stack.bus_name)
        assert targets["Targets"][0]["DeadLetterConfig"]["Arn"].startswith("arn:aws:sqs:")
