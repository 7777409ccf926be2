"""template.yaml as AWS will read it: least privilege that still allows the pipeline, documents
instead of shell, partitions, log retention (what cfn-lint does not check)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from nodemedic_agent.documents import render_document, run_script
from samtranslator.yaml_helper import yaml_parse

from tests.component.test_ssm_output_limit import documents

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = yaml_parse((ROOT / "template.yaml").read_text())
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
FUNCTIONS = {k: v for k, v in RESOURCES.items() if v["Type"] == "AWS::Serverless::Function"}


def statements(function: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for p in function["Properties"].get("Policies", []) if isinstance(p, dict)
            for s in p.get("Statement", [])]


def test_no_shell_document_and_no_literal_partition() -> None:
    text = (ROOT / "template.yaml").read_text()
    assert "AWS-RunShellScript" not in text
    assert "arn:aws:" not in text


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_send_command_names_documents_and_tagged_instances_only(name: str) -> None:
    for statement in statements(FUNCTIONS[name]):
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if "ssm:SendCommand" not in actions:
            continue
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        text = json.dumps(resources)
        assert "*" not in text.replace("instance/*", ""), f"{name}: SendCommand on {text}"
        if "instance/*" in text:  # any instance only with this cluster's tag
            assert statement["Condition"]["StringEquals"]["ssm:resourceTag/nodemedic:cluster"] == {"Ref": "ClusterName"}
        else:
            assert all("document/" in json.dumps(r) for r in resources), f"{name}: {text}"


def test_every_document_parameter_is_constrained() -> None:
    documents = {k: v for k, v in RESOURCES.items() if v["Type"] == "AWS::SSM::Document"}
    assert len(documents) >= 9
    for name, document in documents.items():
        for key, spec in document["Properties"]["Content"]["parameters"].items():
            assert "allowedPattern" in spec or "allowedValues" in spec, f"{name}.{key} takes any text"
            assert spec["type"] == "String", f"{name}.{key}: a StringList would become lines of shell"


def test_every_document_names_the_shell_its_lines_are_written_for() -> None:
    """SSM's agent runs a document's lines with sh unless the first names a shell: on Ubuntu (the
    Deep Learning AMIs, HyperPod) that is dash, where ``set -o pipefail`` stops the script at its
    first line. Each document starts with #!/bin/bash, and bash parses what follows."""
    for name, content in documents(ClusterName="c1").items():
        for step in content["mainSteps"]:
            lines = step["inputs"]["runCommand"]
            assert lines[0] == "#!/bin/bash", f"{name}: its lines would run under sh"
            assert lines[1].startswith("trap '[ $? -ne 194 ]") and lines[1].endswith(" EXIT"), \
                f"{name}: an exit of 194 would reboot the instance"
        parsed = subprocess.run(["bash", "-n"], input=render_document(content, {}), capture_output=True, text=True,
                                check=False)
        assert parsed.returncode == 0, f"{name}: {parsed.stderr}"


def test_every_function_has_a_log_group_with_retention() -> None:
    groups = {v["Properties"]["LogGroupName"]["Fn::Sub"]: v["Properties"] for v in RESOURCES.values()
              if v["Type"] == "AWS::Logs::LogGroup"}
    for name in FUNCTIONS:
        assert groups[f"/aws/lambda/${{{name}}}"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_no_function_reserves_concurrency_and_none_names_a_service_dimension() -> None:
    for name, function in FUNCTIONS.items():
        assert "ReservedConcurrentExecutions" not in function["Properties"], name
        assert "POWERTOOLS_SERVICE_NAME" not in json.dumps(function["Properties"].get("Environment", {})), name
    assert "POWERTOOLS_SERVICE_NAME" not in json.dumps(TEMPLATE["Globals"])


def test_the_escalation_topic_uses_a_key_cloudwatch_may_use() -> None:
    assert RESOURCES["EscalationTopic"]["Properties"]["KmsMasterKeyId"] == {"Ref": "EscalationTopicKey"}


def test_the_layer_brings_a_botocore_that_knows_the_hyperpod_batch_calls() -> None:
    import botocore.session

    requirements = (ROOT / "layers/core/requirements.txt").read_text()
    assert "botocore>=1.41.1" in requirements and "boto3>=1.41.1" in requirements
    operations = botocore.session.get_session().get_service_model("sagemaker").operation_names
    assert {"BatchRebootClusterNodes", "BatchReplaceClusterNodes"} <= set(operations)


def test_every_document_the_code_sends_is_in_the_template() -> None:
    from nodemedic.providers.run_command import Documents

    names = {v["Properties"]["Name"]["Fn::Sub"] for v in RESOURCES.values() if v["Type"] == "AWS::SSM::Document"}
    sent = {getattr(Documents("${ClusterName}"), attr) for attr in vars(Documents) if not attr.startswith("_")
            and isinstance(getattr(Documents("${ClusterName}"), attr), str) and attr != "cluster"}
    assert len(sent) == 10 and sent == names


def _wiring_calls(function: str) -> set[str]:
    code = (ROOT / FUNCTIONS[function]["Properties"]["CodeUri"] / "app.py").read_text()
    calls = {call for call in ("orchestrator", "provider") if f"wiring.{call}()" in code}
    return calls | ({"provider"} if "wiring.hands_off" in code else set())  # names the node's member


READS_ONLY = {"ShadowFunction", "PlannedEventsFunction"}
# a reader that annotates pods too: a rebalance recommendation's checkpoint request (nodemedic/rebalance.py)
ALSO = {"PlannedEventsFunction": ["nodemedic:checkpointer"]}


def test_on_kubernetes_every_function_that_reaches_the_cluster_has_an_access_entry_with_the_least_group() -> None:
    """Orchestrator kubernetes: a function that changes the cluster (its code asks wiring for the
    orchestrator; shadow mode only reads what it would do, planned events only read a node's jobs
    for slack and annotate the pods of a node EC2 recommends rebalancing) is a remediator; one that only names
    members (the provider, named by the nodes' providerID) is a reader; each may describe the EKS
    cluster, and every group is bound in deploy/kubernetes/rbac.yaml (tests/kube/test_access.py
    runs each group's calls against the real API server)."""
    entries = {v["Properties"]["PrincipalArn"]["Fn::GetAtt"][0].removesuffix("Role"): v
               for v in RESOURCES.values() if v["Type"] == "AWS::EKS::AccessEntry"}
    reaching = {name: calls for name in FUNCTIONS if (calls := _wiring_calls(name))}
    assert set(entries) == set(reaching)
    for name, entry in entries.items():
        assert entry["Condition"] == "OnKubernetes"
        changes = "orchestrator" in reaching[name] and name not in READS_ONLY
        expected = ["nodemedic:remediator" if changes else "nodemedic:reader", *ALSO.get(name, [])]
        assert entry["Properties"]["KubernetesGroups"] == expected, name
        assert entry["Properties"]["ClusterName"] == {"Ref": "EksClusterName"}
    describe = RESOURCES["EksDescribeClusterPolicy"]
    assert describe["Condition"] == "OnKubernetes"
    assert {r["Ref"].removesuffix("Role") for r in describe["Properties"]["Roles"]} == set(entries)
    [statement] = describe["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Action"] == "eks:DescribeCluster"
    assert statement["Resource"]["Fn::Sub"].endswith(":cluster/${EksClusterName}")
    rbac = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "rbac.yaml").read_text()))
    bound = {s["name"] for d in rbac if d["kind"] == "ClusterRoleBinding" for s in d["subjects"]}
    assert {"nodemedic:remediator", "nodemedic:reader", "nodemedic:checkpointer"} <= bound
    env = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    assert (env["ORCHESTRATOR"], env["EKS_CLUSTER_NAME"]) == ({"Ref": "Orchestrator"}, {"Ref": "EksClusterName"})


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_instance_actions_are_scoped_to_this_clusters_capacity(name: str) -> None:
    """A reboot, stop or start may touch only an instance of this stack's own capacity: the Auto
    Scaling group, the cluster tag, or the Karpenter NodePool (Karpenter tags its instances
    karpenter.sh/nodepool); never every instance in the account."""
    owners = {"aws:ResourceTag/aws:autoscaling:groupName": "AutoScalingGroupName",
              "aws:ResourceTag/nodemedic:cluster": "ClusterName",
              "aws:ResourceTag/karpenter.sh/nodepool": "KarpenterNodePool"}
    for statement in statements(FUNCTIONS[name]):
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if not {"ec2:RebootInstances", "ec2:StopInstances", "ec2:StartInstances"} & set(actions):
            continue
        [(key, value)] = statement["Condition"]["StringEquals"].items()
        assert value == {"Ref": owners[key]}, f"{name}: {actions} scoped by {key}={value}"


def test_each_function_that_publishes_health_events_may_publish_only_under_its_own_source() -> None:
    """The Detect rule trusts a health event's source (the agents' policy cannot forge the
    sweeper's); so each function publishes on the stack's bus under one source, its own."""
    sources = {}
    for name, function in FUNCTIONS.items():
        for statement in statements(function):
            if "events:PutEvents" in ([statement["Action"]] if isinstance(statement["Action"], str)
                                      else statement["Action"]):
                assert statement["Resource"] == {"Fn::GetAtt": ["EventBus", "Arn"]}, name
                sources[name] = statement["Condition"]["StringEquals"]["events:source"]
    assert sources == {"SilenceSweeperFunction": "nodemedic.sweeper", "PlannedEventsFunction": "nodemedic.planned",
                       "ReconcilerFunction": "nodemedic.reconciler"}
    [rule] = [e["Properties"]["Pattern"] for r in RESOURCES.values() for name, e in r.get("Properties", {})
              .get("Events", {}).items() if name == "AgentHealthEvent"]  # what starts an incident
    assert sorted(rule["source"]) == sorted(["nodemedic.agent", *sources.values()])


def test_every_function_run_by_a_schedule_pages_when_it_keeps_failing() -> None:
    """A scheduled function runs outside any execution: its failures fail no incident and dead-
    letter nothing unless it has a dead-letter queue. Each is watched: by the dead-letter alarm
    (its queue), or by an alarm on its AWS/Lambda Errors; either notifies the escalation topic."""
    alarms = {name: r["Properties"] for name, r in RESOURCES.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    watched: set[str] = set()
    for alarm in alarms.values():
        if alarm.get("AlarmActions") != [{"Ref": "EscalationTopic"}]:
            continue
        for query in alarm.get("Metrics", []):
            metric = query.get("MetricStat", {}).get("Metric", {})
            [dimension] = metric.get("Dimensions", [{}])
            value = dimension.get("Value", {})
            if metric.get("MetricName") == "Errors" and metric.get("Namespace") == "AWS/Lambda":
                watched.add(value.get("Ref", ""))
            elif metric.get("Namespace") == "AWS/SQS":
                queue = value.get("Fn::GetAtt", [""])[0]
                watched |= {name for name, f in FUNCTIONS.items()
                            if f["Properties"].get("DeadLetterQueue", {}).get("TargetArn", {}).get("Fn::GetAtt", [""])[0]
                            == queue}
    scheduled = {name for name, f in FUNCTIONS.items()
                 if any(e["Type"] == "Schedule" for e in f["Properties"].get("Events", {}).values())}
    assert scheduled >= {"SilenceSweeperFunction", "ReconcilerFunction", "PlannedEventsFunction"}
    assert scheduled <= watched, scheduled - watched


def test_the_fault_action_overrides_a_deploy_takes_are_those_detect_reads() -> None:
    """CloudFormation refuses a FaultActionOverrides outside its AllowedPattern before it creates
    anything; Detect parses it for every fault, so a value the pattern lets through must parse,
    and one Detect refuses must not get through (else every event would fail Detect)."""
    import re
    from typing import get_args

    from hypothesis import given, settings
    from hypothesis import strategies as st
    from nodemedic.contracts.incident import Action
    from nodemedic.domain.classification import parse_overrides

    spec = TEMPLATE["Parameters"]["FaultActionOverrides"]
    pattern = spec["AllowedPattern"]
    named = set(re.findall(r'"\(([a-z|_]+)\)"', pattern)[0].split("|"))
    assert named == set(get_args(Action)) - {"burn_in", "retire"}  # the actions an override may name
    assert re.fullmatch(pattern, spec["Default"]) and parse_overrides(spec["Default"]) == {}

    @settings(max_examples=300, deadline=None)
    @given(st.from_regex(pattern, fullmatch=True))
    def passes_and_parses(value: str) -> None:
        assert isinstance(parse_overrides(value), dict)

    passes_and_parses()
    for refused in ('{"XID 74": "explode"}', '{"XID 74": "retire"}', '{"XID 74": "burn_in"}', '["XID 74"]', "{not json",
                    '{"XID 74": "monitor",}', '\x0c{"XID 74": "monitor"}', '{"XID\t74": "monitor"}'):
        assert not re.fullmatch(pattern, refused), refused
        with pytest.raises(ValueError):
            parse_overrides(refused)


@pytest.mark.parametrize(("given", "refused"), [
    ({"Orchestrator": "slurm", "SlurmControllerInstanceId": "i-0123456789abcdef0", "AutoScalingGroupName": "g"}, None),
    ({"Orchestrator": "slurm", "AutoScalingGroupName": "g"}, "needs SlurmControllerInstanceId"),
    ({"Orchestrator": "slurm", "SlurmControllerInstanceId": "i-0123456789abcdef0", "Provider": "hyperpod",
      "HyperPodClusterName": "ml"}, "needs SlurmChannel relay"),
    ({"Orchestrator": "slurm", "SlurmControllerInstanceId": "i-0123456789abcdef0", "Provider": "hyperpod",
      "HyperPodClusterName": "ml", "SlurmChannel": "relay"}, None),
    ({"Orchestrator": "kubernetes", "EksClusterName": "eks", "Provider": "hyperpod", "HyperPodClusterName": "ml"}, None),
])
def test_the_templates_rules_refuse_what_cloudformation_would(given: dict[str, str], refused: str | None) -> None:
    """CloudFormation evaluates a template's Rules before it creates anything; moto evaluates none,
    so the local deploy does (aws_rules.rule_problems). On HyperPod, Slurm's documents must take the
    relay: SSM Run Command does not reach its nodes, and the stack would fail every drain."""
    from nodemedic_sandbox.aws_rules import rule_problems

    problems = rule_problems(TEMPLATE["Rules"], TEMPLATE["Parameters"], given)
    assert (problems == []) if refused is None else any(refused in p for p in problems), problems


@pytest.mark.parametrize(("document", "command"), [("gpu-reset", "GpuResetCommand"), ("node-join", "NodeJoinCommand"),
                                                   ("health-check", "DeepHealthCheckCommand")])
def test_a_command_of_yours_that_exits_194_fails_instead_of_rebooting_the_node(document: str, command: str) -> None:
    """SSM's agent reboots an instance whose script exits 194, and runs it again: a health check
    that happened to exit 194 would reboot a node that runs a job, past every safety rail."""
    name = f"nodemedic-c1-{document}"
    content = documents(ClusterName="c1", **{command: "echo ran; exit 194"})[name]
    given = {"level": ["quick"]} if document == "health-check" else {"slurmNode": ["gpu-1"]} if document == "node-join" else {}
    done = run_script(render_document(content, given), 30)
    assert (done.status, done.exit_code, done.stdout) == ("Failed", 1, "ran\n")
    assert "exit 194 reported as 1" in done.stderr


@pytest.mark.parametrize("parameter", ["CommandTimeoutSeconds", "HealthCheckTimeoutSeconds"])
def test_a_command_timeout_is_one_the_documents_and_ssms_agent_take(parameter: str) -> None:
    """It becomes the documents' executionTimeout: five digits at most (their allowedPattern, or
    every SendCommand is refused), and 5 s to two days (else SSM's agent runs the step for an hour)."""
    spec = TEMPLATE["Parameters"][parameter]
    patterns = {d["Properties"]["Content"]["parameters"]["executionTimeout"]["allowedPattern"]
                for d in RESOURCES.values() if d["Type"] == "AWS::SSM::Document"}
    for seconds in (int(spec["MinValue"]), int(spec["MaxValue"])):
        assert 5 <= seconds <= 172_800, (parameter, seconds)
        assert all(re.fullmatch(p, str(seconds)) for p in patterns), (parameter, seconds, patterns)
