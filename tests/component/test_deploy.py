"""The local mode deploys template.yaml itself, with the state machine made executable."""

import json
import time
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
        assert states["Failed"]["Resource"].endswith(stack.resources["ResumeFunction"])
        # one Lambda per stage, the silence sweeper, the reconciler and the planned-events intake, each with
        # its source registered for the local runtime
        assert {Path(src.code_dir).name for src in aws.functions.values()} == {
            "detect", "gate", "shadow", "approval", "drain", "spares", "repair", "deep_health_check",
            "health_check_result", "resume", "silence_sweeper", "reconciler", "planned_events"}
        # the dashboard, and the five alarms (to the escalation topic) that moto's CloudFormation skips
        cw = aws.client("cloudwatch")
        assert cw.list_dashboards()["DashboardEntries"][0]["DashboardName"] == stack.outputs["DashboardName"]
        alarms = cw.describe_alarms()["MetricAlarms"]
        assert sorted(a["AlarmName"].split(" ", 2)[2] for a in alarms) == [
            "MTTR p90 above SLO", "health events dead-lettered", "heartbeats unread", "remediations failed",
            "sweeper or reconciler failing"]
        [unread] = [a for a in alarms if a["AlarmName"].endswith("heartbeats unread")]
        assert unread["Dimensions"] == [{"Name": "QueueName", "Value": stack.outputs["HeartbeatQueueUrl"].rsplit("/", 1)[1]}]
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
        assert patterns[rules[0]["Name"]]["source"] == ["nodemedic.agent", "nodemedic.sweeper", "nodemedic.planned",
                                                    "nodemedic.reconciler"]
        targets = aws.client("events").list_targets_by_rule(Rule=rules[0]["Name"], EventBusName=stack.bus_name)
        assert targets["Targets"][0]["DeadLetterConfig"]["Arn"].startswith("arn:aws:sqs:")


def _deploy_edited(edit, **aws_settings):  # noqa: ANN001, ANN003, ANN202
    """Deploy template.yaml with ``edit`` applied to its text."""
    import tempfile

    text = edit(TEMPLATE.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("functions", "layers", "statemachines"):
            (root / name).symlink_to(TEMPLATE.parent / name)
        (root / "template.yaml").write_text(text)
        with EmbeddedAWS() as aws:
            for key, value in aws_settings.items():
                setattr(aws, key, value)
            return deploy(aws, root / "template.yaml", "s", PARAMS)


def test_an_alarm_topic_on_the_aws_managed_key_is_refused() -> None:
    """main's EscalationTopic used alias/aws/sns: CloudWatch alarms can never publish to it."""
    import pytest
    from nodemedic_sandbox.deploy import DeploymentRefusedError

    with pytest.raises(DeploymentRefusedError, match="AWS managed key alias/aws/sns"):
        _deploy_edited(lambda t: t.replace("KmsMasterKeyId: !Ref EscalationTopicKey", "KmsMasterKeyId: alias/aws/sns"))
    with pytest.raises(DeploymentRefusedError, match="does not let cloudwatch.amazonaws.com"):
        _deploy_edited(lambda t: t.replace("Principal: {Service: [cloudwatch.amazonaws.com, events.amazonaws.com]}",
                                           "Principal: {Service: [events.amazonaws.com]}"))


def test_reserved_concurrency_is_refused_in_a_low_quota_account() -> None:
    """main's sweeper reserved 1: stack creation fails where the account quota is 10 (or 50)."""
    import pytest
    from nodemedic_sandbox.deploy import DeploymentRefusedError

    reserve = lambda t: t.replace("      MemorySize: 128\n", "      MemorySize: 128\n      ReservedConcurrentExecutions: 1\n")  # noqa: E731
    with pytest.raises(DeploymentRefusedError, match=r"below its minimum value of \[10\]"):
        _deploy_edited(reserve)
    with pytest.raises(DeploymentRefusedError, match=r"minimum value of \[50\]"):
        _deploy_edited(reserve, lambda_concurrency_quota=50)
    _deploy_edited(reserve, lambda_concurrency_quota=1000)  # a raised quota leaves room


def test_parameter_values_outside_the_templates_constraints_are_refused_before_anything_is_created() -> None:
    """CloudFormation checks MinValue/MaxValue, AllowedValues, AllowedPattern and unknown names
    before creating a resource; moto checks none of them."""
    import pytest
    from nodemedic_sandbox.deploy import DeploymentRefusedError

    for given, why in (({"PlannedSweepMinutes": "1"}, "not less than 5"),
                       ({"PlannedSweepMinutes": "sixty"}, "must be a number"),
                       ({"RemediationMode": "yolo"}, "one of AllowedValues"),
                       ({"ClusterName": "-bad"}, "must match pattern"),
                       ({"FaultActionOverrides": '{"XID 74": "explode"}'},  # said by its ConstraintDescription
                        "'FaultActionOverrides' must be a JSON object of fault code -> action"),
                       ({"PlannedSweepMinute": "15"}, r"\[PlannedSweepMinute\] do not exist")):
        with EmbeddedAWS() as aws:
            with pytest.raises(DeploymentRefusedError, match=why):
                deploy(aws, TEMPLATE, "s", {**PARAMS, **given})
            assert aws.client("cloudformation").list_stacks()["StackSummaries"] == []


def test_the_planned_events_sweep_runs_at_the_period_the_parameter_sets() -> None:
    with EmbeddedAWS() as aws:
        stack = deploy(aws, TEMPLATE, "s", {**PARAMS, "PlannedSweepMinutes": "15"})
        rules = aws.client("events").list_rules()["Rules"]
        [sweep] = [r for r in rules if "ScheduledEventsSweep" in r["Name"]]
        assert sweep["ScheduleExpression"] == "rate(15 minutes)"
        env = aws.client("lambda").get_function_configuration(FunctionName=stack.resources["PlannedEventsFunction"])
        assert str(env["Environment"]["Variables"]["PLANNED_SWEEP_MINUTES"]) == "15"


def test_hyperpods_node_health_events_reach_the_state_machine_for_this_cluster_only_and_unhealthy() -> None:
    """The rule on the default bus, as deployed, against the sample in AWS's documented shape."""
    from moto.events.models import EventPattern

    sample = json.loads((TEMPLATE.parent / "events/hyperpod/node-health-unhealthy.json").read_text())
    with EmbeddedAWS() as aws:
        stack = deploy(aws, TEMPLATE, "s", {**PARAMS, "HyperPodClusterName": "ml-cluster"})
        events = aws.client("events")
        [rule] = [r for r in events.list_rules()["Rules"] if "HyperPodNodeHealth" in r["Name"]]
        [target] = events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
        assert target["Arn"] == stack.state_machine_arn and target["DeadLetterConfig"]["Arn"].startswith("arn:aws:sqs:")

        def matches(**summary: str) -> bool:
            event = json.loads(json.dumps(sample))
            cluster = summary.pop("ClusterName", None)
            event["detail"]["HealthSummary"].update(summary)
            if cluster:
                event["detail"]["ClusterName"] = cluster
            # the local EventBridge's own matcher (moto implements no TestEventPattern)
            return EventPattern.load(rule["EventPattern"]).matches_event(event)

        assert matches() and matches(RepairAction="Replace")  # Detect decides on HyperPod's own repairs
        assert not matches(HealthStatus="Healthy") and not matches(ClusterName="someone-elses")


def test_policies_too_large_for_a_functions_environment_are_refused_as_lambda_refuses_them() -> None:
    """Lambda takes at most 4 KB of environment variables per function. The Drain function carries
    the drain policy, the checkpoint policy and the fault overrides with some twenty settings:
    policies for forty namespaces and partitions deployed here, and failed on AWS."""
    import pytest
    from nodemedic_sandbox.deploy import DeploymentRefusedError

    drain = {"namespaces": {f"team-{n:02d}-training": {"mode": "wait", "timeout_seconds": 3600} for n in range(40)}}
    checkpoint = {"partitions": {f"p5-team-{n:02d}": {"signal": "USR2", "grace_seconds": 900} for n in range(40)}}
    small = {"KubernetesDrainPolicy": json.dumps({"namespaces": dict(list(drain["namespaces"].items())[:5])})}
    with EmbeddedAWS() as aws:
        deploy(aws, TEMPLATE, "s", {**PARAMS, **small})  # a few namespaces: as before
    with EmbeddedAWS() as aws, pytest.raises(DeploymentRefusedError, match=r"DrainFunction: Lambda was unable to "
                                             r"configure your environment variables .* exceeded the 4KB limit"):
        deploy(aws, TEMPLATE, "s", {**PARAMS, "KubernetesDrainPolicy": json.dumps(drain),
                                    "CheckpointPolicy": json.dumps(checkpoint)})


def test_a_rate_expression_eventbridge_refuses_is_refused() -> None:
    """EventBridge: a rate of 1 takes a singular unit, any other a plural one."""
    import pytest
    from nodemedic_sandbox.deploy import DeploymentRefusedError

    with pytest.raises(DeploymentRefusedError, match=r"ScheduledEventsSweep: Parameter ScheduleExpression is not valid"):
        _deploy_edited(lambda t: t.replace("Schedule: !Sub rate(${PlannedSweepMinutes} minutes)", "Schedule: rate(1 hours)"))


def test_a_document_refuses_a_value_outside_its_pattern_and_nothing_runs() -> None:
    """SSM checks each value against the document's allowedPattern before sending (InvalidParameters):
    an event field can never become shell text on the controller."""
    import pytest
    from botocore.exceptions import ClientError

    ran: list[str] = []

    class Host:
        def run(self, instance_id: str, script: str, timeout_s: int):  # noqa: ANN201
            from nodemedic_sandbox.embedded_aws import CommandOutcome

            ran.append(script)
            return CommandOutcome("Success", 0, "", "")

        def rebooted(self, instance_ids: list[str]) -> None: ...

        def registered(self, instance_id: str, launched: float) -> bool:
            return True

    with EmbeddedAWS() as aws:
        deploy(aws, TEMPLATE, "s", PARAMS)
        aws.command_host = Host()
        ssm = aws.client("ssm")
        [controller] = aws.client("ec2").run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)["Instances"]
        for parameters in ({"node": ["gpu-1"], "reason": ["nodemedic:x XID 79'; reboot; echo '"]},
                           {"node": ["gpu-1 $(reboot)"], "reason": ["ok"]},
                           {"node": ["gpu-1"]},  # reason is required
                           {"node": ["gpu-1"], "reason": ["ok"], "commands": ["reboot"]}):
            with pytest.raises(ClientError, match="InvalidParameters"):
                ssm.send_command(InstanceIds=[controller["InstanceId"]],
                                 DocumentName="nodemedic-c1-slurm-drain", Parameters=parameters)
        assert ran == []
        ssm.send_command(InstanceIds=[controller["InstanceId"]], DocumentName="nodemedic-c1-slurm-drain",
                         Parameters={"node": ["gpu-1"], "reason": ["nodemedic:abc XID 79"]})
        deadline = time.monotonic() + 5
        while not ran and time.monotonic() < deadline:
            time.sleep(0.05)
        [script] = ran
        assert "node='gpu-1'; reason='nodemedic:abc XID 79'" in script and "set -euo pipefail" in script


def test_on_hyperpod_the_deployed_check_is_hyperpods_own_and_its_role_allows_exactly_that() -> None:
    """Provider=hyperpod: the DeepHealthCheck function, as deployed and held to its role by the
    local IAM, asks HyperPod for its deep health check (SSM does not reach HyperPod nodes), is
    retried while HyperPod checks, and answers the task itself once HyperPod has decided."""
    from datetime import UTC, datetime

    from nodemedic.contracts.incident import Incident, IncidentRef
    from nodemedic.store.ledger import Ledger

    with EmbeddedAWS() as aws:
        stack = deploy(aws, TEMPLATE, "s", {**PARAMS, "Provider": "hyperpod", "HyperPodClusterName": "ml-cluster",
                                            "SlurmChannel": "relay"})
        old, new = aws.hyperpod.create_cluster("ml-cluster", ["ip-10-0-0-1", "ip-10-0-0-2"])
        now = datetime.now(UTC)
        incident = Incident(incident_id="inc-1", cluster="c1", instance_id=old, slurm_node="ip-10-0-0-1",
                            fault_code="XID 79", fault_class="gpu_lost", action="replace", source="test",
                            observed_at=now, status="open", detected_at=now, reason="test")
        ledger = Ledger(aws.client("dynamodb"), stack.table_name)
        assert ledger.open_incident(incident) is None
        ref = IncidentRef(**{name: getattr(incident, name) for name in IncidentRef.model_fields})
        ledger.start_stage(ref, "repair", now)
        ledger.record_progress(ref, "repair", {"rungs": [{"rung": "replace", "instance_id": new,
                                                          "started_at": now.isoformat(), "done_at": now.isoformat()}]})
        payload = json.dumps({"incident": ref.model_dump(mode="json"), "instance_id": new, "level": "full",
                              "task_token": "AAAAtoken", "purpose": "recovery"}).encode()

        def invoke() -> dict:
            resp = aws.client("lambda").invoke(FunctionName=stack.resources["DeepHealthCheckFunction"], Payload=payload)
            return {"error": resp.get("FunctionError"), **json.loads(resp["Payload"].read())}

        assert invoke()["errorType"] == "HealthCheckPendingError"
        assert aws.hyperpod.deep_checks == [(new, ["InstanceStress"])]
        assert invoke()["errorType"] == "HealthCheckPendingError"  # HyperPod is checking
        aws.hyperpod.end_deep_check("ml-cluster", new, passed=True)
        assert invoke() == {"error": None, "healthy": True}
        assert aws.denials == [], aws.denials
        assert aws.client("ssm").list_commands()["Commands"] == []  # nothing sent to a node SSM cannot reach
