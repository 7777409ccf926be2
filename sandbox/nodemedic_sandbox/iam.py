"""IAM for the local stack: every AWS call a deployed function makes is authorized against the
policies of that function's role, as written in ``template.yaml``.

AWS evaluates each request's action, resource ARN(s) and request context (condition keys) against
the principal's identity-based policies; moto evaluates nothing by default, and its opt-in
enforcement ignores resources and conditions. This module is the strict part:

- :func:`evaluate` implements the documented evaluation logic for identity-based policies in one
  account (IAM User Guide, "Policy evaluation logic": an explicit Deny wins, else an Allow, else
  the implicit deny) with Action/NotAction, Resource/NotResource, and the condition operators of
  "IAM JSON policy elements: Condition operators" (String*, Arn*, Numeric*, Bool, Null, the
  ``IfExists`` suffix and the ``ForAnyValue:``/``ForAllValues:`` set operators, with the
  documented rule for a key missing from the request). ``tests/unit/test_iam_evaluation.py``
  checks it against the guide's examples.
- :class:`Authorizer` turns one boto3 call into the IAM requests AWS would evaluate for it, from
  the Service Authorization Reference: the action (``sqs:DeleteMessage`` for DeleteMessageBatch,
  one action per item of a DynamoDB transaction), the resource ARN each action names (``*`` for
  actions without a resource type, such as ``states:SendTaskSuccess``) and the condition keys it
  carries (``aws:ResourceTag/*`` of the EC2 instance, ``autoscaling:ResourceTag/*`` of the
  *group*, ``ssm:resourceTag/*``, ``aws:RequestTag/*``, ``aws:TagKeys``, ``events:source``,
  ``dynamodb:LeadingKeys`` of a single-item write or read...).
  A call it has no model for is refused loudly: add its model, do not let it through.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from botocore.exceptions import ClientError

Context = dict[str, list[str]]  # condition key (lower case) -> values


@dataclass(frozen=True)
class Request:
    """One IAM authorization AWS makes for a call: an action on a resource, with its context."""

    action: str
    resource: str
    context: Context = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str  # the statement that allowed or denied, or why nothing allowed


# -- evaluation ------------------------------------------------------------------------------
def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def wildcard_match(pattern: str, value: str, *, case_sensitive: bool) -> bool:
    """IAM wildcards: ``*`` any run of characters (``/`` and ``:`` included), ``?`` one."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case_sensitive else re.IGNORECASE) is not None


def _matches_action(statement: dict[str, Any], action: str) -> bool:
    if "NotAction" in statement:
        return not any(wildcard_match(a, action, case_sensitive=False) for a in _as_list(statement["NotAction"]))
    return any(wildcard_match(a, action, case_sensitive=False) for a in _as_list(statement.get("Action", [])))


def _matches_resource(statement: dict[str, Any], resource: str) -> bool:
    if "NotResource" in statement:
        return not any(wildcard_match(r, resource, case_sensitive=True) for r in _as_list(statement["NotResource"]))
    return any(wildcard_match(r, resource, case_sensitive=True) for r in _as_list(statement.get("Resource", [])))


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


_SINGLE: dict[str, Callable[[str, str], bool]] = {
    "StringEquals": lambda want, got: want == got,
    "StringEqualsIgnoreCase": lambda want, got: want.lower() == got.lower(),
    "StringLike": lambda want, got: wildcard_match(want, got, case_sensitive=True),
    "ArnEquals": lambda want, got: wildcard_match(want, got, case_sensitive=True),
    "ArnLike": lambda want, got: wildcard_match(want, got, case_sensitive=True),
    "Bool": lambda want, got: want.lower() == got.lower(),
    "NumericEquals": lambda want, got: _number(got) is not None and _number(got) == _number(want),
    "NumericLessThan": lambda want, got: _cmp(got, want, lambda a, b: a < b),
    "NumericLessThanEquals": lambda want, got: _cmp(got, want, lambda a, b: a <= b),
    "NumericGreaterThan": lambda want, got: _cmp(got, want, lambda a, b: a > b),
    "NumericGreaterThanEquals": lambda want, got: _cmp(got, want, lambda a, b: a >= b),
}
_NEGATED = {"StringNotEquals": "StringEquals", "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
            "StringNotLike": "StringLike", "ArnNotEquals": "ArnEquals", "ArnNotLike": "ArnLike",
            "NumericNotEquals": "NumericEquals"}


def _cmp(got: str, want: str, op: Callable[[float, float], bool]) -> bool:
    a, b = _number(got), _number(want)
    return a is not None and b is not None and op(a, b)


def _condition_holds(operator: str, key: str, wanted: list[str], context: Context) -> bool:
    """One key of one operator. Values in ``wanted`` are ORed; AWS's rule for a missing key: a
    positive operator is false, a negated one true, ``...IfExists`` true, ``ForAllValues`` true."""
    set_op, _, op = operator.rpartition(":")
    if_exists = op.endswith("IfExists")
    op = op.removesuffix("IfExists")
    present = key.lower() in context
    got = context.get(key.lower(), [])
    wanted = [str(w).lower() if isinstance(w, bool) else str(w) for w in wanted]
    if op == "Null":  # "true": the key is absent; "false": present
        return any((w.lower() == "true") != present for w in wanted)
    negated = op in _NEGATED
    base = _NEGATED.get(op, op)
    if base not in _SINGLE:
        raise NotImplementedError(f"condition operator {operator} is not modelled by the local IAM")
    test = _SINGLE[base]

    def one(value: str) -> bool:
        matched = any(test(w, value) for w in wanted)
        return not matched if negated else matched

    if not present:
        return if_exists or negated or set_op == "ForAllValues"
    if set_op == "ForAllValues":
        return all(one(v) for v in got)
    return any(one(v) for v in got)  # ForAnyValue, and a single-valued key


def _conditions_hold(statement: dict[str, Any], context: Context) -> bool:
    return all(
        _condition_holds(operator, key, _as_list(values), context)
        for operator, block in statement.get("Condition", {}).items()
        for key, values in block.items()
    )


def evaluate(policies: Iterable[dict[str, Any]], request: Request) -> Verdict:
    """AWS's decision for ``request`` under these identity-based policies (one account, no
    boundaries, SCPs or session policies)."""
    allowed_by = None
    for policy in policies:
        for statement in _as_list(policy.get("Statement", [])):
            if not (_matches_action(statement, request.action) and _matches_resource(statement, request.resource)
                    and _conditions_hold(statement, request.context)):
                continue
            if statement.get("Effect") == "Deny":
                return Verdict(False, f"explicitly denied by {json.dumps(statement)}")
            allowed_by = allowed_by or statement
    if allowed_by is not None:
        return Verdict(True, f"allowed by {json.dumps(allowed_by)}")
    return Verdict(False, "no identity-based policy allows it (implicit deny)")


# -- what one boto3 call asks IAM ------------------------------------------------------------
@dataclass(frozen=True)
class Facts:
    """What the authorizer needs to know about the account's resources (looked up by the caller
    with its own, unauthorized clients)."""

    partition: str
    region: str
    account: str
    instance_tags: Callable[[str], dict[str, str]]
    group_of_instance: Callable[[str], tuple[str, dict[str, str]] | None]  # (group ARN, group tags)
    topic_key: Callable[[str], str | None]  # the KMS key ARN a topic is encrypted with (customer managed)
    hyperpod_cluster_arn: Callable[[str], str]
    table_hash_key: Callable[[str], str] = lambda _table: "pk"  # a table's partition key attribute


def _leading_keys(hash_key_of: Callable[[str], str], body: dict[str, Any]) -> Context:
    """``dynamodb:LeadingKeys``: the partition key value of the item a single-item action names
    (DynamoDB Developer Guide, "Using IAM policy conditions for fine-grained access control")."""
    item = body.get("Key") or body.get("Item") or {}
    value = item.get(hash_key_of(body["TableName"])) if item else None
    if not value:
        return {}
    [(_type, raw)] = value.items()
    return {"dynamodb:leadingkeys": [str(raw)]}


def facts_from(client: Callable[[str], Any], *, partition: str, region: str, account: str) -> Facts:
    """:class:`Facts` read with ``client(service)`` (boto3 clients that are not themselves authorized:
    the embedded AWS's own, or the operator's for ``nodemedic doctor``)."""

    def instance_tags(instance_id: str) -> dict[str, str]:
        try:
            reservations = client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
        except ClientError:  # an unknown instance has no tags (AWS then refuses the call itself)
            return {}
        return {t["Key"]: t["Value"] for r in reservations for i in r["Instances"] for t in i.get("Tags", [])}

    def group_of_instance(instance_id: str) -> tuple[str, dict[str, str]] | None:
        asg = client("autoscaling")
        found = asg.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
        if not found:
            return None
        group = asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[found[0]["AutoScalingGroupName"]])["AutoScalingGroups"][0]
        return str(group["AutoScalingGroupARN"]), {t["Key"]: t["Value"] for t in group.get("Tags", [])}

    def topic_key(topic_arn: str) -> str | None:
        key = client("sns").get_topic_attributes(TopicArn=topic_arn)["Attributes"].get("KmsMasterKeyId")
        if not key or key.startswith("alias/aws/"):
            return None  # no encryption, or an AWS managed key (its policy lets SNS use it for the account)
        return str(client("kms").describe_key(KeyId=key)["KeyMetadata"]["Arn"])

    def hyperpod_cluster_arn(name: str) -> str:
        if name.startswith("arn:"):
            return name
        return str(client("sagemaker").describe_cluster(ClusterName=name)["ClusterArn"])

    @functools.cache  # a table's key schema never changes
    def table_hash_key(name: str) -> str:
        schema = client("dynamodb").describe_table(TableName=name)["Table"]["KeySchema"]
        return str(next(k["AttributeName"] for k in schema if k["KeyType"] == "HASH"))

    return Facts(partition, region, account, instance_tags, group_of_instance, topic_key, hyperpod_cluster_arn,
                 table_hash_key)


# Actions whose IAM name differs from the operation's (Service Authorization Reference)
_ACTION_OF = {("sqs", "DeleteMessageBatch"): "DeleteMessage", ("sqs", "SendMessageBatch"): "SendMessage",
              ("sqs", "ChangeMessageVisibilityBatch"): "ChangeMessageVisibility"}
_PREFIX_OF = {"monitoring": "cloudwatch"}  # signing name -> IAM service prefix
_NO_RESOURCE = {  # actions that support no resource type: AWS evaluates them against "*"
    "states": {"SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat"},
    "ssm": {"GetCommandInvocation", "ListCommandInvocations", "ListCommands", "DescribeInstanceInformation"},
    "ec2": {"DescribeInstances", "DescribeInstanceStatus", "DescribeTags"},
    "autoscaling": {"DescribeAutoScalingGroups", "DescribeScalingActivities", "DescribeAutoScalingInstances"},
    "cloudwatch": {"PutMetricData", "GetMetricData", "GetMetricStatistics", "ListMetrics"},
    "sts": {"GetCallerIdentity"},
}


def _tags_context(prefixes: Iterable[str], tags: dict[str, str]) -> Context:
    return {f"{prefix}/{k}".lower(): [v] for prefix in prefixes for k, v in tags.items()}


class Authorizer:
    """The IAM requests AWS evaluates for one call (service prefix, operation name, parameters)."""

    def __init__(self, facts: Facts) -> None:
        self.f = facts

    def arn(self, service: str, resource: str, *, account: bool = True) -> str:
        return f"arn:{self.f.partition}:{service}:{self.f.region}:{self.f.account if account else ''}:{resource}"

    def requests(self, prefix: str, operation: str, params: dict[str, Any]) -> list[Request]:
        prefix = _PREFIX_OF.get(prefix, prefix)
        action = f"{prefix}:{_ACTION_OF.get((prefix, operation), operation)}"
        if operation in _NO_RESOURCE.get(prefix, set()):
            context = {"cloudwatch:namespace": [params["Namespace"]]} if operation == "PutMetricData" else {}
            return [Request(action, "*", context)]
        builder = getattr(self, f"_{prefix}", None)
        if builder is None:
            raise NotImplementedError(f"the local IAM has no model of {action}: add it to nodemedic_sandbox/iam.py")
        return list(builder(action, operation, params))

    # one method per service prefix ----------------------------------------------------------
    def _dynamodb(self, action: str, operation: str, params: dict[str, Any]) -> Iterable[Request]:
        def table(name: str) -> str:
            return self.arn("dynamodb", f"table/{name}")

        if operation == "TransactWriteItems":  # authorized per item, as the individual action
            kinds = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
                     "ConditionCheck": "ConditionCheckItem"}
            for item in params["TransactItems"]:
                [(kind, body)] = item.items()
                yield Request(f"dynamodb:{kinds[kind]}", table(body["TableName"]),
                              _leading_keys(self.f.table_hash_key, body))
        elif operation in ("BatchGetItem", "BatchWriteItem"):  # no LeadingKeys: no policy here conditions these
            for name in params["RequestItems"]:
                yield Request(action, table(name))
        elif operation in ("Query", "Scan") and params.get("IndexName"):
            # a read of an index is authorized on the index's ARN, not the table's (DynamoDB
            # developer guide, "Using IAM policy conditions for fine-grained access control" and
            # the service authorization reference: resource type "index")
            yield Request(action, f"{table(params['TableName'])}/index/{params['IndexName']}")
        elif "TableName" in params:
            single = operation in ("GetItem", "PutItem", "UpdateItem", "DeleteItem")
            yield Request(action, table(params["TableName"]),
                          _leading_keys(self.f.table_hash_key, params) if single else {})
        else:
            raise NotImplementedError(f"the local IAM has no model of {action}")

    def _ssm(self, action: str, operation: str, params: dict[str, Any]) -> Iterable[Request]:
        if operation == "SendCommand":
            name = params["DocumentName"]
            owned_by_aws = name.startswith(("AWS-", "AWSSupport-", "AWSEC2-", "Amazon"))
            yield Request(action, self.arn("ssm", f"document/{name}", account=not owned_by_aws))
            for instance in params.get("InstanceIds", []):
                tags = self.f.instance_tags(instance)
                yield Request(action, self.arn("ec2", f"instance/{instance}"),
                              _tags_context(("ssm:resourceTag", "aws:ResourceTag"), tags))
            if params.get("Targets"):
                raise NotImplementedError("the local IAM does not model SendCommand with Targets")
        elif operation == "GetDocument":  # the relay reads the document it runs
            yield Request(action, self.arn("ssm", f"document/{params['Name']}"))
        elif operation in ("GetParameter", "GetParameters", "PutParameter"):
            for name in params.get("Names", [params.get("Name")]):
                yield Request(action, self.arn("ssm", f"parameter/{str(name).lstrip('/')}"))
        else:
            raise NotImplementedError(f"the local IAM has no model of {action}")

    def _ec2(self, action: str, operation: str, params: dict[str, Any]) -> Iterable[Request]:
        if operation in ("RebootInstances", "StopInstances", "StartInstances", "TerminateInstances"):
            for instance in params["InstanceIds"]:
                tags = self.f.instance_tags(instance)
                yield Request(action, self.arn("ec2", f"instance/{instance}"),
                              _tags_context(("aws:ResourceTag", "ec2:ResourceTag"), tags))
        elif operation == "CreateTags":
            new = {t["Key"]: t.get("Value", "") for t in params["Tags"]}
            request_tags = {**_tags_context(("aws:RequestTag",), new), "aws:tagkeys": list(new)}
            for instance in params["Resources"]:
                tags = self.f.instance_tags(instance)
                yield Request(action, self.arn("ec2", f"instance/{instance}"),
                              {**_tags_context(("aws:ResourceTag", "ec2:ResourceTag"), tags), **request_tags})
        else:
            raise NotImplementedError(f"the local IAM has no model of {action}")

    def _autoscaling(self, action: str, operation: str, params: dict[str, Any]) -> Iterable[Request]:
        if operation == "TerminateInstanceInAutoScalingGroup":
            found = self.f.group_of_instance(params["InstanceId"])
            # the instance in no group: AWS answers ValidationError after authorizing on "*"
            group_arn, tags = found if found else ("*", {})
            yield Request(action, group_arn, _tags_context(("autoscaling:ResourceTag", "aws:ResourceTag"), tags))
        else:
            raise NotImplementedError(f"the local IAM has no model of {action}")

    def _eks(self, action: str, operation: str, params: dict[str, Any]) -> Iterable[Request]:
        if operation != "DescribeCluster":
            raise NotImplementedError(f"the local IAM has no model of {action}")
        yield Request(action, self.arn("eks", f"cluster/{params['name']}"))

    def _sagemaker(self, action: str, operation: str, params: dict[str, Any]) -> Iterable[Request]:
        yield Request(action, self.f.hyperpod_cluster_arn(params["ClusterName"]))

    def _lambda(self, action: str, operation: str, params: dict[str, Any]) -> Iterable[Request]:
        if operation != "Invoke":
            raise NotImplementedError(f"the local IAM has no model of {action}")
        name = params["FunctionName"]  # a name, a partial or a full ARN (qualifier included)
        arn = name if name.startswith("arn:") else self.arn("lambda", f"function:{name}")
        yield Request("lambda:InvokeFunction", arn)

    def _states(self, action: str, operation: str, params: dict[str, Any]) -> Iterable[Request]:
        if "stateMachineArn" in params:
            yield Request(action, params["stateMachineArn"])
        elif "executionArn" in params:
            yield Request(action, params["executionArn"])
        else:
            raise NotImplementedError(f"the local IAM has no model of {action}")

    def _sns(self, action: str, operation: str, params: dict[str, Any]) -> Iterable[Request]:
        topic = params["TopicArn"]
        yield Request(action, topic)
        key = self.f.topic_key(topic) if operation == "Publish" else None
        if key:  # SNS developer guide, "Encryption at rest": the publisher needs the key too
            yield Request("kms:GenerateDataKey", key)
            yield Request("kms:Decrypt", key)

    def _sqs(self, action: str, operation: str, params: dict[str, Any]) -> Iterable[Request]:
        name = urlparse(params["QueueUrl"]).path.rstrip("/").rsplit("/", 1)[-1]
        yield Request(action, self.arn("sqs", name))

    def _s3(self, action: str, operation: str, params: dict[str, Any]) -> Iterable[Request]:
        """An S3 ARN names no Region or account (``arn:aws:s3:::bucket/key``). HeadObject is
        authorized as s3:GetObject, a listing as s3:ListBucket on the bucket (Amazon S3 API
        Reference, each operation's "Permissions")."""
        bucket = f"arn:{self.f.partition}:s3:::{params['Bucket']}"
        if operation in ("GetObject", "HeadObject", "PutObject", "DeleteObject"):
            verb = "GetObject" if operation == "HeadObject" else operation
            yield Request(f"s3:{verb}", f"{bucket}/{params['Key']}")
        elif operation in ("ListObjectsV2", "ListObjects"):
            yield Request("s3:ListBucket", bucket, {"s3:prefix": [params.get("Prefix", "")]})
        else:
            raise NotImplementedError(f"the local IAM has no model of {action}")

    def _events(self, action: str, operation: str, params: dict[str, Any]) -> Iterable[Request]:
        if operation != "PutEvents":
            raise NotImplementedError(f"the local IAM has no model of {action}")
        for entry in params["Entries"]:
            bus = entry.get("EventBusName") or "default"
            arn = bus if bus.startswith("arn:") else self.arn("events", f"event-bus/{bus}")
            yield Request(action, arn, {"events:source": [entry.get("Source", "")],
                                        "events:detailtype": [entry.get("DetailType", "")]})


def needed_statement(request: Request) -> str:
    """The statement that would allow ``request``: what a denial tells the developer to add."""
    statement: dict[str, Any] = {"Effect": "Allow", "Action": request.action, "Resource": request.resource}
    return json.dumps(statement)


def role_policies(iam: Any, role_arn: str) -> list[dict[str, Any]]:
    """The policy documents of a role: its inline policies and the managed ones attached."""
    name = role_arn.rsplit("/", 1)[-1]
    documents = []
    for policy_name in iam.list_role_policies(RoleName=name)["PolicyNames"]:
        documents.append(_document(iam.get_role_policy(RoleName=name, PolicyName=policy_name)["PolicyDocument"]))
    for attached in iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]:
        try:
            policy = iam.get_policy(PolicyArn=attached["PolicyArn"])["Policy"]
            version = iam.get_policy_version(PolicyArn=attached["PolicyArn"], VersionId=policy["DefaultVersionId"])
        except iam.exceptions.NoSuchEntityException:
            continue  # an AWS managed policy moto does not ship (logs, X-Ray: no boto3 call of ours)
        documents.append(_document(version["PolicyVersion"]["Document"]))
    return documents


def _document(value: Any) -> dict[str, Any]:
    """A policy document as IAM returns it: URL-encoded JSON (moto's CloudFormation stores a
    role's inline policy as the Python repr of the template's dict)."""
    if not isinstance(value, str):
        return dict(value)
    text = unquote(value)
    try:
        return dict(json.loads(text))
    except json.JSONDecodeError:
        return dict(ast.literal_eval(text))

