"""Deploy ``template.yaml`` into the embedded AWS, as ``sam build && sam deploy`` would.

Steps: rewrite local paths the way ``sam package`` does (code zipped into an S3 bucket,
``DefinitionUri`` inlined), transform SAM to CloudFormation offline with aws-sam-translator,
``create_stack`` in moto, then repair what moto's CloudFormation gets wrong for this template:
the state machine is re-created where Step Functions executes, with its
``DefinitionSubstitutions`` applied. Nothing here restates the infrastructure: every resource
comes from the template.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import logging
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moto.cloudformation.models import cloudformation_backends
from moto.cloudformation.parsing import clean_json
from samtranslator.translator.managed_policy_translator import ManagedPolicyLoader
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

from nodemedic_sandbox.aws_rules import (
    alarm_topic_problem,
    lambda_environment_problem,
    parameter_problems,
    reserved_concurrency_problem,
    rule_problems,
)
from nodemedic_sandbox.embedded_aws import ACCOUNT_ID, EmbeddedAWS, FunctionSource, schedule_period

ARTIFACT_BUCKET = "nodemedic-local-artifacts"


class DeploymentRefusedError(RuntimeError):
    """Real AWS would refuse this deployment, or leave part of it unable to work."""


class _NoManagedPolicies(ManagedPolicyLoader):  # type: ignore[misc]  # samtranslator ships no type information
    """The template names no AWS managed policies by name; nothing to look up offline."""

    def __init__(self) -> None:
        pass

    def load(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True)
class Stack:
    name: str
    outputs: dict[str, str]
    resources: dict[str, str]  # logical id -> physical id

    @property
    def state_machine_arn(self) -> str:
        return self.outputs["StateMachineArn"]

    @property
    def bus_name(self) -> str:
        return self.outputs["EventBusName"]

    @property
    def table_name(self) -> str:
        return self.outputs["IncidentsTableName"]

    @property
    def topic_arn(self) -> str:
        return self.outputs["EscalationTopicArn"]


@contextlib.contextmanager
def _quiet_about_policies() -> Iterator[None]:
    """moto warns that it cannot create the bus/queue policies, alarms and EKS access entries;
    :func:`_apply_policies` does."""
    moto_log = logging.getLogger("moto")  # moto.cloudformation.parsing logs "No Moto CloudFormation support" here
    level = moto_log.level
    moto_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Tried to parse AWS::(Events::EventBusPolicy|SQS::QueuePolicy|"
                                                      r"CloudWatch::Alarm|EKS::AccessEntry)")
            yield
    finally:
        moto_log.setLevel(level)


def _zip_dir(path: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for file in sorted(path.rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts:
                zf.write(file, file.relative_to(path))
    return buffer.getvalue()


def package(template: dict[str, Any], root: Path, aws: EmbeddedAWS) -> tuple[dict[str, Any], dict[str, Path]]:
    """What ``sam package`` does to local paths; returns the template and each function's code dir."""
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=ARTIFACT_BUCKET)
    packaged = copy.deepcopy(template)
    code_dirs: dict[str, Path] = {}
    for logical_id, resource in packaged["Resources"].items():
        props = resource.get("Properties", {})
        for key in ("CodeUri", "ContentUri"):
            if isinstance(props.get(key), str):
                local = (root / props[key]).resolve()
                s3_key = f"{logical_id}.zip"
                s3.put_object(Bucket=ARTIFACT_BUCKET, Key=s3_key, Body=_zip_dir(local))
                props[key] = f"s3://{ARTIFACT_BUCKET}/{s3_key}"
                if key == "CodeUri":
                    code_dirs[logical_id] = local
        if isinstance(props.get("DefinitionUri"), str):
            props["Definition"] = json.loads((root / props.pop("DefinitionUri")).read_text())
    return packaged, code_dirs


def deploy(aws: EmbeddedAWS, template_path: Path, stack_name: str, parameters: dict[str, str]) -> Stack:
    root = template_path.parent
    sam = copy.deepcopy(_parsed(template_path.read_text()))  # deploying changes it
    if problems := parameter_problems(sam.get("Parameters", {}), parameters):
        raise DeploymentRefusedError("; ".join(problems))
    if problems := rule_problems(sam.get("Rules", {}), sam.get("Parameters", {}), parameters):
        raise DeploymentRefusedError("; ".join(problems))
    packaged, code_dirs = package(sam, root, aws)
    cfn = transform(packaged, parameters, _NoManagedPolicies())
    reserved = {logical_id: int(r["Properties"]["ReservedConcurrentExecutions"])
                for logical_id, r in cfn["Resources"].items()
                if r["Type"] == "AWS::Lambda::Function" and "ReservedConcurrentExecutions" in r.get("Properties", {})}
    if problem := reserved_concurrency_problem(reserved, aws.lambda_concurrency_quota):
        raise DeploymentRefusedError(problem)
    for logical_id, r in cfn["Resources"].items():
        if r["Type"] == "AWS::Events::Rule" and "ScheduleExpression" in r["Properties"]:
            try:
                schedule_period(_with_parameters(r["Properties"]["ScheduleExpression"], cfn, parameters))
            except ValueError as exc:
                raise DeploymentRefusedError(f"{logical_id}: {exc}") from exc
    cloudformation = aws.client("cloudformation")
    with _quiet_about_policies():
        cloudformation.create_stack(
            StackName=stack_name,
            TemplateBody=json.dumps(cfn),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
            Capabilities=["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"],
        )
        described = cloudformation.describe_stacks(StackName=stack_name)["Stacks"][0]
        summaries = cloudformation.list_stack_resources(StackName=stack_name)["StackResourceSummaries"]
    if described["StackStatus"] != "CREATE_COMPLETE":
        raise RuntimeError(f"stack {stack_name}: {described['StackStatus']}")
    resources = {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in summaries}
    lambda_ = aws.client("lambda")
    for logical_id, r in cfn["Resources"].items():  # CloudFormation would have failed (and rolled back) here
        if r["Type"] == "AWS::Lambda::Function":
            config = lambda_.get_function_configuration(FunctionName=resources[logical_id])
            if problem := lambda_environment_problem(logical_id, config.get("Environment", {}).get("Variables", {})):
                raise DeploymentRefusedError(problem)
    for logical_id, code_dir in code_dirs.items():
        handler = cfn["Resources"][logical_id]["Properties"]["Handler"]
        aws.functions[resources[logical_id]] = FunctionSource(code_dir, handler)
    aws.seed_function_environment()
    _recreate_state_machines(aws, stack_name, cfn, resources)
    _apply_policies(aws, stack_name, cfn)
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    if "AgentPublishPolicyArn" in outputs:
        aws.agent_roles.append(_agent_role(aws, stack_name, outputs["AgentPublishPolicyArn"]))
    if "RelayPolicyArn" in outputs:
        aws.relay_roles.append(_agent_role(aws, stack_name, outputs["RelayPolicyArn"], "slurm-controller"))
    return Stack(stack_name, outputs, resources)


def _with_parameters(value: str | dict[str, str], cfn: dict[str, Any], parameters: dict[str, str]) -> str:
    """A string, or an ``Fn::Sub`` of the template's parameters (given, or their defaults)."""
    if isinstance(value, str):
        return value
    text = value["Fn::Sub"]
    for name, spec in cfn.get("Parameters", {}).items():
        text = text.replace(f"${{{name}}}", str(parameters.get(name, spec.get("Default", ""))))
    return text


def _agent_role(aws: EmbeddedAWS, stack_name: str, policy_arn: str, name: str = "gpu-node") -> str:
    """The nodes' instance role as the README says to make it: the stack's agent policy attached.
    The local node agents' calls are authorized against it (``AGENT_KEY``); the controller's, with
    the relay policy, against the relay's (``RELAY_KEY``)."""
    iam = aws.client("iam")
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                     "Principal": {"Service": "ec2.amazonaws.com"}}]}
    role = iam.create_role(RoleName=f"{stack_name}-{name}", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    iam.attach_role_policy(RoleName=role["RoleName"], PolicyArn=policy_arn)
    return str(role["Arn"])


def _moto_stack(aws: EmbeddedAWS, stack_name: str) -> Any:
    return next(s for s in cloudformation_backends[ACCOUNT_ID][aws.region].stacks.values()
                if s.name == stack_name and s.status == "CREATE_COMPLETE")


def _apply_policies(aws: EmbeddedAWS, stack_name: str, cfn: dict[str, Any]) -> None:
    """moto's CloudFormation skips bus and queue policies, CloudWatch alarms, EKS access entries and
    a role's managed policies; apply them through their APIs. (It skips bucket policies too, and they stay unapplied: moto's S3
    evaluates a bucket policy's statements without their conditions, so the template's TLS-only
    Deny, conditioned on aws:SecureTransport, would refuse every request; the local S3 is reached
    in-process, with no transport to secure.)"""
    stack = _moto_stack(aws, stack_name)
    for logical_id, resource in cfn["Resources"].items():  # keys first: the alarms' checks read their policies
        # moto's CloudFormation stores a key's policy and a document's content as dicts, not JSON
        if resource["Type"] == "AWS::KMS::Key":
            policy = clean_json(resource["Properties"]["KeyPolicy"], stack.resource_map)
            aws.client("kms").put_key_policy(KeyId=stack.resource_map[logical_id].id, PolicyName="default",
                                             Policy=json.dumps(policy))
        elif resource["Type"] == "AWS::SSM::Document":
            name = stack.resource_map[logical_id].name
            props = clean_json(resource["Properties"], stack.resource_map)
            aws.client("ssm").delete_document(Name=name)
            aws.client("ssm").create_document(Name=name, Content=json.dumps(props["Content"]),
                                              DocumentType=props.get("DocumentType", "Command"),
                                              DocumentFormat="JSON")
    for logical_id, resource in cfn["Resources"].items():
        if "Condition" in resource and not stack.resource_map.lazy_condition_map[resource["Condition"]]:
            continue  # CloudFormation creates no resource whose condition is false
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::Events::EventBusPolicy":
            props = clean_json(props, stack.resource_map)
            aws.client("events").put_permission(
                EventBusName=props["EventBusName"],
                Policy=json.dumps({"Version": "2012-10-17",
                                   "Statement": [{"Sid": props["StatementId"], **props["Statement"]}]}))
        elif resource["Type"] == "AWS::CloudWatch::Alarm":
            props = clean_json(props, stack.resource_map)
            for key in ("Period", "EvaluationPeriods", "DatapointsToAlarm"):
                if key in props:
                    props[key] = int(props[key])
            props["Threshold"] = float(props["Threshold"])
            for query in props.get("Metrics", []):
                if "MetricStat" in query:
                    query["MetricStat"]["Period"] = int(query["MetricStat"]["Period"])
            for action in props.get("AlarmActions", []):
                if ":sns:" in action and (problem := alarm_topic_problem(aws.client("sns"), aws.client("kms"), action)):
                    raise DeploymentRefusedError(f"alarm {props['AlarmName']} cannot notify: {problem}")
            aws.client("cloudwatch").put_metric_alarm(**props)
        elif resource["Type"] == "AWS::EKS::AccessEntry":
            props = clean_json(props, stack.resource_map)
            aws.create_access_entry(props["ClusterName"], props["PrincipalArn"], props.get("KubernetesGroups", []),
                                    props.get("Type", "STANDARD"))
        elif resource["Type"] == "AWS::IAM::Role" and props.get("ManagedPolicyArns"):
            # moto's CloudFormation attaches none; the stack's own (a function's Policies naming one
            # of its AWS::IAM::ManagedPolicy) are attached here. AWS's (AWSLambdaBasicExecutionRole:
            # logs, which the local IAM does not model) do not exist in the embedded account
            role = stack.resource_map[logical_id].name
            for arn in clean_json(props["ManagedPolicyArns"], stack.resource_map):
                if ":aws:policy/" not in arn:
                    aws.client("iam").attach_role_policy(RoleName=role, PolicyArn=arn)
        elif resource["Type"] == "AWS::SQS::QueuePolicy":
            props = clean_json(props, stack.resource_map)
            for url in props["Queues"]:
                aws.client("sqs").set_queue_attributes(
                    QueueUrl=url, Attributes={"Policy": json.dumps(props["PolicyDocument"])})


def _recreate_state_machines(aws: EmbeddedAWS, stack_name: str, cfn: dict[str, Any],
                             resources: dict[str, str]) -> None:
    """moto's CloudFormation creates state machines where they cannot execute and ignores
    ``DefinitionSubstitutions``; create each again in the executing backend, same name and ARN."""
    stack = _moto_stack(aws, stack_name)
    sfn = aws.client("stepfunctions")
    for logical_id, resource in cfn["Resources"].items():
        if resource["Type"] != "AWS::StepFunctions::StateMachine":
            continue
        props = resource["Properties"]
        definition = clean_json(props["DefinitionString"], stack.resource_map)
        for key, value in clean_json(props.get("DefinitionSubstitutions", {}), stack.resource_map).items():
            definition = definition.replace("${" + key + "}", str(value))
        if "${" in definition:
            raise RuntimeError(f"{logical_id}: unresolved substitution in the definition")
        arn = resources[logical_id]
        role = clean_json(props["RoleArn"], stack.resource_map)
        sfn.create_state_machine(name=arn.rsplit(":", 1)[1], definition=definition, roleArn=role,
                                 type=props.get("StateMachineType", "STANDARD"))
        aws.state_machine_roles.append(role)  # its Lambda and SDK calls are authorized against it


@functools.lru_cache(maxsize=4)
def _parsed(template_text: str) -> dict[str, Any]:
    """A template parsed once per text (0.1-0.2 s each parse: the tests deploy a stack or make a
    table per test). Shared: a caller that changes it copies it first."""
    return dict(yaml_parse(template_text))


def _declared(template_path: Path, resource: str) -> dict[str, Any]:
    """A resource's properties as the template declares them."""
    return copy.deepcopy(dict(_parsed(template_path.read_text())["Resources"][resource]["Properties"]))


def create_table_as_declared(db: Any, name: str, resource: str = "IncidentsTable", template_path: Path | None = None) -> str:
    """Create a DynamoDB table named ``name`` with the keys and indexes ``resource`` declares in
    the template (the project's ``template.yaml`` by default): for tests of the stores on a table
    of their own, with what the stack has."""
    props = _declared(template_path or Path(__file__).resolve().parents[2] / "template.yaml", resource)
    db.create_table(TableName=name, BillingMode=props["BillingMode"], AttributeDefinitions=props["AttributeDefinitions"],
                    KeySchema=props["KeySchema"],
                    **({"GlobalSecondaryIndexes": props["GlobalSecondaryIndexes"]} if "GlobalSecondaryIndexes" in props
                       else {}))
    return name
