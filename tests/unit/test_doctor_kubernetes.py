"""``nodemedic doctor`` on a stack deployed with Orchestrator=kubernetes: the functions reach the
cluster through eks:DescribeCluster (and a presigned STS token), never through SSM on a Slurm
controller the stack does not have, and the template's policy allows exactly that."""

from __future__ import annotations

from types import SimpleNamespace

from nodemedic_cli.doctor import check_nodes, representative_calls
from nodemedic_sandbox import iam

from tests.unit.test_template import RESOURCES

STACK = SimpleNamespace(
    parameters={"Orchestrator": "kubernetes", "EksClusterName": "prod-gpu", "Provider": "autoscaling",
                "AutoScalingGroupName": "eks-gpu-ng", "SlurmControllerInstanceId": ""},
    outputs={"IncidentsTableName": "t", "StateMachineArn": "arn:aws:states:us-east-1:123456789012:stateMachine:sm",
             "SafetyPolicyParameterName": "/nodemedic/p", "EscalationTopicArn": "arn:aws:sns:us-east-1:123456789012:e",
             "HeartbeatQueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/hb", "EventBusName": "bus"},
    cluster="prod", on_kubernetes=True)


def _authorizer() -> iam.Authorizer:
    return iam.Authorizer(iam.Facts("aws", "us-east-1", "123456789012", instance_tags=lambda _: {},
                                    group_of_instance=lambda _: None, topic_key=lambda _: None,
                                    hyperpod_cluster_arn=lambda name: name))


def test_every_function_that_reaches_the_cluster_describes_it_and_the_template_allows_it() -> None:
    calls = representative_calls(STACK, "i-0a1b2c3d4e5f60789")  # type: ignore[arg-type]
    describe = ("eks", "DescribeCluster", {"name": "prod-gpu"})
    policy = RESOURCES["EksDescribeClusterPolicy"]["Properties"]
    granted = {r["Ref"].removesuffix("Role") for r in policy["Roles"]}
    [statement] = policy["PolicyDocument"]["Statement"]
    rendered = {**statement, "Resource": statement["Resource"]["Fn::Sub"].replace("${AWS::Partition}", "aws")
                .replace("${AWS::Region}", "us-east-1").replace("${AWS::AccountId}", "123456789012")
                .replace("${EksClusterName}", "prod-gpu")}
    reaching = {name for name, made in calls.items() if describe in made}
    assert reaching == granted
    [request] = _authorizer().requests(*describe)
    assert iam.evaluate([{"Version": "2012-10-17", "Statement": [rendered]}], request).allowed
    assert not iam.evaluate([{"Version": "2012-10-17", "Statement": [rendered]}],
                            _authorizer().requests("eks", "DescribeCluster", {"name": "other"})[0]).allowed
    sends = [params for made in calls.values() for service, op, params in made if op == "SendCommand"]
    assert all(params["InstanceIds"] != [""] for params in sends)  # nothing to a Slurm controller


def test_the_node_rows_speak_of_kubernetes_and_its_fixes() -> None:
    rows = list(check_nodes({"ip-10-0-1-17.ec2.internal": None}, None, kubernetes=True))
    assert rows[0].detail == "1 Kubernetes nodes"
    assert rows[1].status == "fail" and "spec.providerID" in rows[1].fix
    [failed] = check_nodes({}, RuntimeError("401 Unauthorized"), kubernetes=True)
    assert "access entry" in failed.fix


def test_on_karpenter_repair_reboots_only_the_node_pools_instances_and_deletes_nodeclaims_via_the_cluster() -> None:
    stack = SimpleNamespace(**{**vars(STACK), "parameters": {**STACK.parameters, "Provider": "karpenter",
                                                             "KarpenterNodePool": "gpu-pool"}})
    calls = representative_calls(stack, "i-0a1b2c3d4e5f60789")  # type: ignore[arg-type]
    reboot = ("ec2", "RebootInstances", {"InstanceIds": ["i-0a1b2c3d4e5f60789"]})
    assert reboot in calls["RepairFunction"] and ("eks", "DescribeCluster", {"name": "prod-gpu"}) in calls["RepairFunction"]
    [statement] = [s for p in RESOURCES["RepairFunction"]["Properties"]["Policies"] if isinstance(p, dict)
                   for s in p.get("Statement", [])
                   if "aws:ResourceTag/karpenter.sh/nodepool" in s.get("Condition", {}).get("StringEquals", {})]
    rendered = {**statement, "Condition": {"StringEquals": {"aws:ResourceTag/karpenter.sh/nodepool": "gpu-pool"}},
                "Resource": statement["Resource"]["Fn::Sub"].replace("${AWS::Partition}", "aws")
                .replace("${AWS::Region}", "us-east-1").replace("${AWS::AccountId}", "123456789012")}

    def allowed(pool: str) -> bool:
        facts = iam.Facts("aws", "us-east-1", "123456789012", instance_tags=lambda _: {"karpenter.sh/nodepool": pool},
                          group_of_instance=lambda _: None, topic_key=lambda _: None,
                          hyperpod_cluster_arn=lambda name: name)
        return all(iam.evaluate([{"Version": "2012-10-17", "Statement": [rendered]}], r).allowed
                   for r in iam.Authorizer(facts).requests(*reboot))

    assert allowed("gpu-pool") and not allowed("cpu-pool")


def _rendered(function: str) -> list[dict]:
    """The function's policy statements as deployed in us-east-1 of account 123456789012."""
    def sub(value: object) -> object:
        if isinstance(value, dict) and "Fn::Sub" in value:
            return str(value["Fn::Sub"]).replace("${AWS::Partition}", "aws").replace("${AWS::Region}", "us-east-1") \
                .replace("${AWS::AccountId}", "123456789012") \
                .replace("${SafetyPolicyParameter}", STACK.outputs["SafetyPolicyParameterName"]) \
                .replace("${EksClusterName}", STACK.parameters["EksClusterName"])
        return [sub(v) for v in value] if isinstance(value, list) else value
    attached = [r["Properties"]["PolicyDocument"] for r in RESOURCES.values() if r["Type"] == "AWS::IAM::Policy"
                and {"Ref": f"{function}Role"} in r["Properties"]["Roles"]]  # e.g. EksDescribeClusterPolicy
    return [{k: sub(v) for k, v in s.items() if k != "Condition"}
            for p in [*RESOURCES[function]["Properties"]["Policies"], *attached] if isinstance(p, dict)
            for s in p.get("Statement", []) if "Condition" not in s]


def test_on_hyperpod_the_check_is_hyperpods_own_and_the_template_allows_it() -> None:
    """SSM does not reach HyperPod nodes: doctor expects the check function to ask HyperPod (and
    answer the task itself), and the Repair function to send no GPU reset, which it skips."""
    stack = SimpleNamespace(**{**vars(STACK), "parameters": {**STACK.parameters, "Provider": "hyperpod",
                                                             "HyperPodClusterName": "ml-cluster"}})
    calls = representative_calls(stack, "i-0a1b2c3d4e5f60789")  # type: ignore[arg-type]
    check = calls["DeepHealthCheckFunction"]
    assert ("sagemaker", "StartClusterHealthCheck", {"ClusterName": "ml-cluster"}) in check
    assert not [c for c in check + calls["RepairFunction"] if c[1] == "SendCommand"]
    cluster = "arn:aws:sagemaker:us-east-1:123456789012:cluster/abcdef012345"
    facts = iam.Facts("aws", "us-east-1", "123456789012", instance_tags=lambda _: {}, group_of_instance=lambda _: None,
                      topic_key=lambda _: None, hyperpod_cluster_arn=lambda name: cluster)
    policy = [{"Version": "2012-10-17", "Statement": _rendered("DeepHealthCheckFunction")}]
    for service, operation, params in check:
        if service != "dynamodb":
            assert all(iam.evaluate(policy, r).allowed for r in iam.Authorizer(facts).requests(service, operation, params)), \
                operation
