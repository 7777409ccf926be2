"""Rules real AWS enforces that moto does not, checked where the local stack deploys and by
``nodemedic doctor`` against a real account. Each cites the AWS documentation it follows."""

from __future__ import annotations

import json
import re
from typing import Any

from nodemedic_sandbox.iam import wildcard_match  # the same wildcard rules as IAM

NEW_ACCOUNT_CONCURRENCY = 10  # a new account's Lambda concurrency quota can be as low as 10
# GetCommandInvocation returns "the first 24,000 characters written by the plugin to stdout" and
# "the first 8,000 characters written by the plugin to stderr" (SSM API reference)
SSM_STDOUT_LIMIT, SSM_STDERR_LIMIT = 24_000, 8_000
# for a moment after SendCommand, GetCommandInvocation answers InvocationDoesNotExist (botocore's
# CommandExecuted waiter retries on it); the local SSM does so for this long
SSM_INVOCATION_LAG_S = 0.1
# SSM's agent runs as a systemd service that sets no PATH, so a document's script gets systemd's
# default (systemd.exec(5), "Environment variables in spawned processes"); no login shell reads
# /etc/profile.d, where ParallelCluster puts /opt/slurm/bin on a user's PATH
SSM_AGENT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def ssm_agent_timeout(value: str) -> int:
    """The seconds SSM's agent lets a step run for its ``timeoutSeconds`` (amazon-ssm-agent,
    ``pluginutil.ValidateExecutionTimeout``): below 5 or above 172,800 seconds, or not a number,
    it runs for the default hour."""
    try:
        seconds = int(float(value))
    except ValueError:
        return 3600
    return seconds if 5 <= seconds <= 172_800 else 3600
# PutEvents refuses a request whose entries total more than 1 MB, each entry sized as EventBridge
# sizes it (EventBridge user guide, "Calculating PutEvents event entry size"; the limit rose from
# 256 KB to 1 MB on 29 January 2026, AWS What's New "Amazon EventBridge increases event payload
# size"): "ValidationException: Total size of the entries in the request is over the limit."
PUT_EVENTS_REQUEST_LIMIT = 1_048_576
# Step Functions holds an execution's input, like any state's data, to 256 KiB as UTF-8 (Step
# Functions developer guide, "Quotas": maximum input or output size; StartExecution API reference:
# input, maximum length 262144). The 1 MB raise did not include it: a 300 KB event that EventBridge
# takes cannot start an execution, and its rule's target delivery fails (to the rule's DLQ)
STATES_PAYLOAD_LIMIT = 262_144


# "Environment variables: 4 KB, for all environment variables associated with the function, in
# aggregate" (Lambda developer guide, "Lambda quotas"); Lambda measures the variables as one JSON
# object and refuses the function: "Lambda was unable to configure your environment variables
# because the environment variables you have provided exceeded the 4KB limit"
LAMBDA_ENVIRONMENT_LIMIT = 4096


def lambda_environment_problem(function: str, variables: dict[str, str]) -> str | None:
    """Why Lambda refuses ``function`` these environment variables (None when it takes them)."""
    sizes = {k: len(str(v).encode()) for k, v in variables.items()}
    size = len(json.dumps({k: str(v) for k, v in variables.items()}, separators=(",", ":")).encode())
    if size <= LAMBDA_ENVIRONMENT_LIMIT:
        return None
    largest = sorted(sizes, key=lambda k: -sizes[k])[:3]
    return (f"{function}: Lambda was unable to configure your environment variables because the environment "
            f"variables you have provided exceeded the 4KB limit ({size:,} bytes; the largest: "
            + ", ".join(f"{k} {sizes[k]:,}" for k in largest) + ")")


def put_events_entry_size(entry: dict[str, Any]) -> int:
    """The size EventBridge counts for a PutEvents entry: Time 14 bytes when given; Source,
    DetailType, Detail and each Resources entry as UTF-8 (the user guide's formula)."""
    size = 14 if entry.get("Time") is not None else 0
    size += sum(len(str(entry.get(key) or "").encode()) for key in ("Source", "DetailType", "Detail"))
    return size + sum(len(str(r).encode()) for r in entry.get("Resources") or [] if r is not None)


def reserved_concurrency_problem(reserved: dict[str, int], account_quota: int) -> str | None:
    """Lambda refuses a reservation that leaves less than the minimum unreserved concurrency
    (Lambda developer guide, "Configuring reserved concurrency": you can reserve up to the
    account's concurrency minus 100; accounts with a lower quota keep all of it unreserved)."""
    total = sum(reserved.values())
    minimum = min(100, account_quota)
    if total and account_quota - total < minimum:
        names = ", ".join(f"{k}={v}" for k, v in sorted(reserved.items()))
        return (f"ReservedConcurrentExecutions ({names}) decreases the account's UnreservedConcurrentExecution "
                f"below its minimum value of [{minimum}] (account concurrency quota {account_quota})")
    return None


def alarm_topic_problem(sns: Any, kms: Any, topic_arn: str) -> str | None:
    """Why a CloudWatch alarm cannot publish to this topic, or None. An encrypted topic needs a
    customer managed key whose policy lets ``cloudwatch.amazonaws.com`` use it: the AWS managed
    ``alias/aws/sns`` key's policy cannot (Amazon SNS developer guide, "Configure AWS KMS
    permissions for AWS services")."""
    key = sns.get_topic_attributes(TopicArn=topic_arn)["Attributes"].get("KmsMasterKeyId")
    if not key:
        return None
    if key.startswith("alias/aws/"):
        return (f"topic {topic_arn} is encrypted with the AWS managed key {key}, which CloudWatch alarms "
                "cannot use: use a customer managed key that grants cloudwatch.amazonaws.com "
                "kms:GenerateDataKey* and kms:Decrypt")
    metadata = kms.describe_key(KeyId=key)["KeyMetadata"]
    raw = kms.get_key_policy(KeyId=metadata["KeyId"], PolicyName="default")["Policy"]
    policy = raw if isinstance(raw, dict) else json.loads(raw)  # moto's CloudFormation keeps the template's dict
    if not _grants_service(policy, "cloudwatch.amazonaws.com", ("kms:GenerateDataKey", "kms:Decrypt")):
        return (f"the key policy of {metadata['Arn']} (topic {topic_arn}) does not let cloudwatch.amazonaws.com "
                "use it (kms:GenerateDataKey* and kms:Decrypt)")
    return None


def _grants_service(policy: dict[str, Any], service: str, actions: tuple[str, ...]) -> bool:
    def allows(action: str) -> bool:
        for statement in _list(policy.get("Statement", [])):
            principals = statement.get("Principal", {})
            services = _list(principals.get("Service", [])) if isinstance(principals, dict) else []
            if (statement.get("Effect") == "Allow" and service in services
                    and any(wildcard_match(a, action, case_sensitive=False) for a in _list(statement.get("Action", [])))):
                return True
        return False

    return all(allows(a) for a in actions)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def parameter_problems(declared: dict[str, dict[str, Any]], given: dict[str, str]) -> list[str]:
    """What CloudFormation refuses in a stack's parameter values before it creates anything: a
    parameter the template does not declare, a Number that is not one, and a value outside the
    declared MinValue/MaxValue, MinLength/MaxLength, AllowedValues or AllowedPattern, said by the
    parameter's ConstraintDescription where it has one (CloudFormation user guide, "Parameters
    syntax": properties). moto checks none of them."""
    problems = []
    for name, value in given.items():
        spec = declared.get(name)
        said = spec.get("ConstraintDescription") if spec else None
        if spec is None:
            problems.append(f"Parameters: [{name}] do not exist in the template")
            continue
        if spec.get("Type") == "Number":
            try:
                number = float(value)
            except ValueError:
                problems.append(f"Parameter '{name}' must be a number")
                continue
            if "MinValue" in spec and number < float(spec["MinValue"]):
                problems.append(f"Parameter '{name}' must be a number not less than {spec['MinValue']}")
            if "MaxValue" in spec and number > float(spec["MaxValue"]):
                problems.append(f"Parameter '{name}' must be a number not greater than {spec['MaxValue']}")
        else:
            if "MinLength" in spec and len(value) < int(spec["MinLength"]):
                problems.append(f"Parameter '{name}' must contain at least {spec['MinLength']} characters")
            if "MaxLength" in spec and len(value) > int(spec["MaxLength"]):
                problems.append(f"Parameter '{name}' must contain at most {spec['MaxLength']} characters")
            if "AllowedPattern" in spec and not re.fullmatch(spec["AllowedPattern"], value):
                problems.append(f"Parameter '{name}' {said or 'must match pattern ' + spec['AllowedPattern']}")
        if "AllowedValues" in spec and value not in [str(v) for v in spec["AllowedValues"]]:
            problems.append(f"Parameter '{name}' {said or 'must be one of AllowedValues'}")
    return problems


def rule_problems(rules: dict[str, dict[str, Any]], declared: dict[str, dict[str, Any]],
                  given: dict[str, str]) -> list[str]:
    """The template's ``Rules`` CloudFormation would refuse these parameter values by: each rule
    whose ``RuleCondition`` holds (or that has none) and one of whose ``Assertions`` does not, by its
    ``AssertDescription`` (CloudFormation user guide, "Rules syntax"; the rule-specific intrinsic
    functions Fn::And, Fn::Or, Fn::Not, Fn::Equals, Fn::Contains and Ref are modelled). moto
    evaluates none: a stack it created, AWS refuses."""
    values = {name: given.get(name, str(spec.get("Default", ""))) for name, spec in declared.items()}

    def value(node: Any) -> Any:
        if isinstance(node, dict) and len(node) == 1:
            [(fn, args)] = node.items()
            if fn == "Ref":
                return values[args]
            if fn == "Fn::Equals":
                return value(args[0]) == value(args[1])
            if fn == "Fn::Not":
                return not value(args[0])
            if fn == "Fn::And":
                return all(value(a) for a in args)
            if fn == "Fn::Or":
                return any(value(a) for a in args)
            if fn == "Fn::Contains":
                return value(args[1]) in [value(a) for a in args[0]]
            raise NotImplementedError(f"the local rules do not model {fn}")
        return str(node) if not isinstance(node, list) else [value(a) for a in node]

    problems = []
    for name, rule in rules.items():
        if "RuleCondition" in rule and not value(rule["RuleCondition"]):
            continue
        problems += [f"{name}: {a.get('AssertDescription', 'assertion failed')}"
                     for a in rule.get("Assertions", []) if not value(a["Assert"])]
    return problems
