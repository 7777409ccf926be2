"""The local IAM evaluator against the evaluation rules and examples of the IAM User Guide
("Policy evaluation logic", "Condition operators", "Multivalued context keys"), and main's
template bugs that it must catch."""

import pytest
from nodemedic_sandbox.iam import Authorizer, Facts, Request, evaluate


def policy(*statements: dict) -> list[dict]:
    return [{"Version": "2012-10-17", "Statement": list(statements)}]


ALLOW_ALL_EC2 = {"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}
INSTANCE = "arn:aws:ec2:us-east-1:123456789012:instance/i-0abc"


@pytest.mark.parametrize(("policies", "request_", "allowed"), [
    pytest.param(policy(ALLOW_ALL_EC2), Request("ec2:RebootInstances", INSTANCE), True, id="allow_wildcard_action"),
    pytest.param(policy(ALLOW_ALL_EC2, {"Effect": "Deny", "Action": "ec2:RebootInstances", "Resource": "*"}),
                 Request("ec2:RebootInstances", INSTANCE), False, id="explicit_deny_overrides_allow"),
    pytest.param(policy({"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}),
                 Request("ec2:RebootInstances", INSTANCE), False, id="implicit_deny"),
    pytest.param(policy({"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}),
                 Request("ec2:RebootInstances", INSTANCE), True, id="notaction_allows_others"),
    pytest.param(policy({"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}),
                 Request("iam:CreateUser", "*"), False, id="notaction_excludes"),
    pytest.param(policy({"Effect": "Allow", "Action": "EC2:rebootinstances", "Resource": "*"}),
                 Request("ec2:RebootInstances", INSTANCE), True, id="action_names_ignore_case"),
    pytest.param(policy({"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::bucket/*"}),
                 Request("s3:GetObject", "arn:aws:s3:::bucket/a/b.txt"), True, id="resource_wildcard_spans_slashes"),
    pytest.param(policy({"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::Bucket/*"}),
                 Request("s3:GetObject", "arn:aws:s3:::bucket/a"), False, id="resources_are_case_sensitive"),
    pytest.param(policy({"Effect": "Allow", "NotResource": "arn:aws:s3:::secret/*", "Action": "s3:*"}),
                 Request("s3:GetObject", "arn:aws:s3:::secret/x"), False, id="notresource"),
])
def test_evaluation_logic(policies: list[dict], request_: Request, allowed: bool) -> None:
    assert evaluate(policies, request_).allowed is allowed


def tagged(*, condition: dict, context: dict) -> bool:
    return evaluate(policy({"Effect": "Allow", "Action": "ec2:StopInstances", "Resource": "*",
                            "Condition": condition}), Request("ec2:StopInstances", INSTANCE, context)).allowed


@pytest.mark.parametrize(("condition", "context", "allowed"), [
    pytest.param({"StringEquals": {"aws:ResourceTag/env": ["dev", "test"]}}, {"aws:resourcetag/env": ["test"]},
                 True, id="values_of_one_key_are_ored"),
    pytest.param({"StringEquals": {"aws:ResourceTag/env": "dev", "aws:ResourceTag/team": "ml"}},
                 {"aws:resourcetag/env": ["dev"]}, False, id="keys_are_anded"),
    pytest.param({"StringEquals": {"aws:ResourceTag/env": "dev"}, "StringLike": {"aws:ResourceTag/team": "ml-*"}},
                 {"aws:resourcetag/env": ["dev"], "aws:resourcetag/team": ["ml-infra"]}, True,
                 id="operators_are_anded"),
    pytest.param({"StringEquals": {"aws:ResourceTag/env": "dev"}}, {}, False, id="missing_key_positive_is_false"),
    pytest.param({"StringNotEquals": {"aws:ResourceTag/env": "prod"}}, {}, True, id="missing_key_negated_is_true"),
    pytest.param({"StringNotEquals": {"aws:ResourceTag/env": ["prod", "staging"]}},
                 {"aws:resourcetag/env": ["staging"]}, False, id="negated_matches_none_of_the_values"),
    pytest.param({"StringEqualsIfExists": {"aws:ResourceTag/env": "dev"}}, {}, True, id="ifexists_missing_key"),
    pytest.param({"StringEqualsIfExists": {"aws:ResourceTag/env": "dev"}}, {"aws:resourcetag/env": ["prod"]},
                 False, id="ifexists_present_key"),
    pytest.param({"ForAllValues:StringEquals": {"aws:TagKeys": ["a", "b"]}}, {"aws:tagkeys": ["a"]}, True,
                 id="forallvalues_subset"),
    pytest.param({"ForAllValues:StringEquals": {"aws:TagKeys": ["a", "b"]}}, {"aws:tagkeys": ["a", "c"]}, False,
                 id="forallvalues_extra_key"),
    pytest.param({"ForAllValues:StringEquals": {"aws:TagKeys": ["a"]}}, {}, True, id="forallvalues_missing_key"),
    pytest.param({"ForAnyValue:StringEquals": {"aws:TagKeys": ["a"]}}, {"aws:tagkeys": ["c", "a"]}, True,
                 id="foranyvalue_one_matches"),
    pytest.param({"ForAnyValue:StringEquals": {"aws:TagKeys": ["a"]}}, {}, False, id="foranyvalue_missing_key"),
    pytest.param({"Null": {"aws:ResourceTag/owner": "true"}}, {}, True, id="null_true_key_absent"),
    pytest.param({"Null": {"aws:ResourceTag/owner": "false"}}, {}, False, id="null_false_key_absent"),
    pytest.param({"StringEquals": {"AWS:ResourceTag/env": "dev"}}, {"aws:resourcetag/env": ["dev"]}, True,
                 id="key_names_ignore_case"),
    pytest.param({"StringEquals": {"aws:ResourceTag/env": "dev"}}, {"aws:resourcetag/env": ["Dev"]}, False,
                 id="string_values_are_case_sensitive"),
    pytest.param({"NumericLessThan": {"s3:max-keys": "10"}}, {"s3:max-keys": ["5"]}, True, id="numeric"),
    pytest.param({"Bool": {"aws:SecureTransport": "true"}}, {"aws:securetransport": ["true"]}, True, id="bool"),
])
def test_condition_operators(condition: dict, context: dict, allowed: bool) -> None:
    assert tagged(condition=condition, context=context) is allowed


GROUP_ARN = ("arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:"
             "0f5e6a9c-1111-2222-3333-444455556666:autoScalingGroupName/gpu-nodes")


def authorizer() -> Authorizer:
    return Authorizer(Facts(
        partition="aws", region="us-east-1", account="123456789012",
        instance_tags=lambda _: {"aws:autoscaling:groupName": "gpu-nodes", "nodemedic:cluster": "c1"},
        group_of_instance=lambda _: (GROUP_ARN, {"team": "ml"}),  # a group never carries its own name tag
        topic_key=lambda _: "arn:aws:kms:us-east-1:123456789012:key/k1",
        hyperpod_cluster_arn=lambda name: f"arn:aws:sagemaker:us-east-1:123456789012:cluster/{name}"))


def allowed(statements: list[dict], service: str, operation: str, params: dict) -> bool:
    return all(evaluate(policy(*statements), r).allowed for r in authorizer().requests(service, operation, params))


def test_main_terminate_statement_is_denied_and_the_group_arn_allowed() -> None:
    terminate = {"InstanceId": "i-0abc", "ShouldDecrementDesiredCapacity": False}
    mains = {"Effect": "Allow", "Action": "autoscaling:TerminateInstanceInAutoScalingGroup", "Resource": "*",
             "Condition": {"StringEquals": {"autoscaling:ResourceTag/aws:autoscaling:groupName": "gpu-nodes"}}}
    assert not allowed([mains], "autoscaling", "TerminateInstanceInAutoScalingGroup", terminate)
    scoped = {"Effect": "Allow", "Action": "autoscaling:TerminateInstanceInAutoScalingGroup",
              "Resource": "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:*:autoScalingGroupName/gpu-nodes"}
    assert allowed([scoped], "autoscaling", "TerminateInstanceInAutoScalingGroup", terminate)
    other = {**scoped, "Resource": scoped["Resource"].replace("gpu-nodes", "web")}
    assert not allowed([other], "autoscaling", "TerminateInstanceInAutoScalingGroup", terminate)


def test_send_task_success_has_no_resource_type() -> None:
    scoped = {"Effect": "Allow", "Action": "states:SendTaskSuccess",
              "Resource": "arn:aws:states:us-east-1:123456789012:stateMachine:pipeline"}
    answer = {"taskToken": "t", "output": "{}"}
    assert not allowed([scoped], "states", "SendTaskSuccess", answer), "main's statement"
    assert allowed([{**scoped, "Resource": "*"}], "states", "SendTaskSuccess", answer)


def test_publishing_to_an_encrypted_topic_needs_the_key() -> None:
    publish = {"TopicArn": "arn:aws:sns:us-east-1:123456789012:t", "Message": "m"}
    sns = {"Effect": "Allow", "Action": "sns:Publish", "Resource": publish["TopicArn"]}
    assert not allowed([sns], "sns", "Publish", publish)
    kms = {"Effect": "Allow", "Action": ["kms:GenerateDataKey*", "kms:Decrypt"],
           "Resource": "arn:aws:kms:us-east-1:123456789012:key/k1"}
    assert allowed([sns, kms], "sns", "Publish", publish)


def test_a_transaction_needs_each_items_action_and_a_batch_delete_needs_delete() -> None:
    table = "arn:aws:dynamodb:us-east-1:123456789012:table/t"
    transaction = {"TransactItems": [{"Put": {"TableName": "t", "Item": {}}},
                                     {"Delete": {"TableName": "t", "Key": {}}}]}
    put_only = {"Effect": "Allow", "Action": "dynamodb:PutItem", "Resource": table}
    assert not allowed([put_only], "dynamodb", "TransactWriteItems", transaction)
    assert allowed([{**put_only, "Action": ["dynamodb:PutItem", "dynamodb:DeleteItem"]}], "dynamodb",
                   "TransactWriteItems", transaction)
    batch = {"QueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/q", "Entries": []}
    assert allowed([{"Effect": "Allow", "Action": "sqs:DeleteMessage",
                     "Resource": "arn:aws:sqs:us-east-1:123456789012:q"}], "sqs", "DeleteMessageBatch", batch)


def test_leading_keys_limit_a_role_to_items_whose_partition_key_it_owns() -> None:
    own = {"Effect": "Allow", "Action": "dynamodb:PutItem", "Resource": "arn:aws:dynamodb:us-east-1:123456789012:table/t",
           "Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["ANNOUNCED#*"]}}}
    put = lambda pk: {"TableName": "t", "Item": {"pk": {"S": pk}, "at": {"S": "now"}}}  # noqa: E731
    assert allowed([own], "dynamodb", "PutItem", put("ANNOUNCED#capacity-block/cr-1"))
    assert not allowed([own], "dynamodb", "PutItem", put("INCIDENT#inc-1")), "another item of the table"
    assert not allowed([own], "dynamodb", "TransactWriteItems", {"TransactItems": [{"Put": put("NODE#c1#i-1")}]})


def test_send_command_is_authorized_on_the_document_and_each_tagged_instance() -> None:
    send = {"DocumentName": "nodemedic-drain", "InstanceIds": ["i-0abc"], "Parameters": {}}
    document = {"Effect": "Allow", "Action": "ssm:SendCommand",
                "Resource": "arn:aws:ssm:us-east-1:123456789012:document/nodemedic-drain"}
    instances = {"Effect": "Allow", "Action": "ssm:SendCommand", "Resource": "arn:aws:ec2:us-east-1:123456789012:instance/*",
                 "Condition": {"StringEquals": {"ssm:resourceTag/nodemedic:cluster": "c1"}}}
    assert allowed([document, instances], "ssm", "SendCommand", send)
    assert not allowed([instances], "ssm", "SendCommand", send), "any document"
    assert not allowed([document], "ssm", "SendCommand", send), "any instance"
    other_cluster = {**instances, "Condition": {"StringEquals": {"ssm:resourceTag/nodemedic:cluster": "c2"}}}
    assert not allowed([document, other_cluster], "ssm", "SendCommand", send)


def test_a_call_without_a_model_is_refused_not_let_through() -> None:
    with pytest.raises(NotImplementedError, match="no model"):
        authorizer().requests("ec2", "DeleteVolume", {"VolumeId": "v"})
