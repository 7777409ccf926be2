"""The three capacity providers against the embedded AWS: Auto Scaling, plain EC2, HyperPod."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError
from nodemedic.errors import CapacityError, InstanceGoneError, NodeGoneError, ProviderBusyError, ReplacementFailedError
from nodemedic.providers.autoscaling import AutoScalingProvider
from nodemedic.providers.base import SLURM_NODE_TAG
from nodemedic.providers.ec2 import CLUSTER_TAG, EC2Provider
from nodemedic.providers.hyperpod import BATCH_LIMIT, HyperPodProvider
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

IMAGE = "ami-12345678"


@pytest.fixture
def aws():
    with EmbeddedAWS() as embedded:
        yield embedded


def _claim_all(_: str) -> bool:
    return True


def _group(aws: EmbeddedAWS, size: int = 3) -> list[str]:
    ec2, asg = aws.client("ec2"), aws.client("autoscaling")
    ec2.create_launch_template(LaunchTemplateName="gpu-lt", LaunchTemplateData={"ImageId": IMAGE})
    asg.create_auto_scaling_group(AutoScalingGroupName="g", MinSize=size, MaxSize=size + 1, DesiredCapacity=size,
                                  LaunchTemplate={"LaunchTemplateName": "gpu-lt"}, AvailabilityZones=["us-east-1a"])
    ids = sorted(i["InstanceId"] for i in asg.describe_auto_scaling_groups()["AutoScalingGroups"][0]["Instances"])
    for n, instance in enumerate(ids, 1):
        ec2.create_tags(Resources=[instance], Tags=[{"Key": SLURM_NODE_TAG, "Value": f"gpu-{n}"}])
    return ids


def test_autoscaling_replace_terminates_then_claims_and_tags_the_new_instance(aws: EmbeddedAWS) -> None:
    old = _group(aws)[0]
    provider = AutoScalingProvider(aws.client("autoscaling"), aws.client("ec2"), "g")
    refused: list[str] = []
    step = provider.replace(old, "gpu-1", {}, claim=lambda c: not refused.append(c) and len(refused) > 1)
    assert step.instance_id is None and step.progress["requested_at"]  # the first candidate was taken by another
    step = provider.replace(old, "gpu-1", step.progress, claim=_claim_all)
    assert step.instance_id not in (None, old)
    assert provider.member_by_node("gpu-1").instance_id == step.instance_id
    assert provider.size() == 3
    # every instance of the group in one listing; the terminated one is gone
    assert sorted((m.slurm_node, m.state) for m in provider.members()) == [
        ("gpu-1", "running"), ("gpu-2", "running"), ("gpu-3", "running")]
    # a retried step changes nothing: same replacement, no second termination
    assert provider.replace(old, "gpu-1", step.progress, claim=_claim_all).instance_id == step.instance_id


class _ActivitiesSay:
    """moto never records scaling activities; this client says the group's last launch failed."""

    def __init__(self, client: Any, message: str, whole_seconds: bool = False) -> None:
        self._client, self._message, self._whole_seconds = client, message, whole_seconds

    def describe_scaling_activities(self, **_: Any) -> dict[str, Any]:
        # whole seconds: a launch that began in the second of the request, dated to the second
        start = datetime.now(UTC).replace(microsecond=0) if self._whole_seconds else datetime.now(UTC) + timedelta(seconds=1)
        return {"Activities": [{"StartTime": start, "StatusCode": "Failed",
                                "Description": "Launching a new EC2 instance.  Status Reason: ...",
                                "StatusMessage": self._message}]}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@pytest.mark.parametrize("whole_seconds", [False, True], ids=["later", "in the request's second"])
def test_autoscaling_capacity_failure_of_the_groups_launch_is_a_capacity_error(aws: EmbeddedAWS,
                                                                                 whole_seconds: bool) -> None:
    ids = _group(aws, size=1)
    asg = aws.client("autoscaling")
    asg.update_auto_scaling_group(AutoScalingGroupName="g", MaxSize=1)
    provider = AutoScalingProvider(_ActivitiesSay(asg, "We currently do not have sufficient p5.48xlarge capacity "
                                                       "(InsufficientInstanceCapacity)", whole_seconds),
                                   aws.client("ec2"), "g")
    with pytest.raises(CapacityError, match="InsufficientInstanceCapacity"):
        provider.replace(ids[0], "gpu-1", {}, claim=lambda _: False)


class _Busy:
    """An Auto Scaling client whose group is busy for the next ``times`` terminations (another
    replacement's launch under way): what the API reference lists among the call's errors."""

    def __init__(self, client: Any, code: str, times: int) -> None:
        self._client, self._code, self.times = client, code, times

    def terminate_instance_in_auto_scaling_group(self, **kwargs: Any) -> dict[str, Any]:
        if self.times:
            self.times -= 1
            raise ClientError({"Error": {"Code": self._code, "Message": "The operation can't be performed because "
                                                                        "there are scaling activities in progress."}},
                              "TerminateInstanceInAutoScalingGroup")
        return self._client.terminate_instance_in_auto_scaling_group(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@pytest.mark.parametrize("code", ["ScalingActivityInProgress", "ResourceContention"])
def test_autoscaling_busy_with_another_activity_is_a_wait_not_a_failure(aws: EmbeddedAWS, code: str) -> None:
    """Two nodes replaced at once: the group may still be launching the first one's replacement
    when the second is terminated, and refuse. That failed the second incident and paged; now the
    rung waits and terminates it on the retry."""
    ids = _group(aws)
    busy = _Busy(aws.client("autoscaling"), code, times=1)
    provider = AutoScalingProvider(busy, aws.client("ec2"), "g")
    with pytest.raises(ProviderBusyError, match=f"Auto Scaling group g is busy.*{code}"):
        provider.replace(ids[1], "gpu-2", {}, claim=_claim_all)
    assert provider.member(ids[1]).state == "running"  # nothing was done
    step = provider.replace(ids[1], "gpu-2", {}, claim=_claim_all)
    assert step.progress["requested_at"]
    step = provider.replace(ids[1], "gpu-2", step.progress, claim=_claim_all)
    assert step.instance_id not in (None, ids[1])


class _EndedFirst:
    """An Auto Scaling client under which someone else (EC2 for a Spot interruption, an operator)
    ends the instance after NodeMedic read the group and before its termination arrives."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def terminate_instance_in_auto_scaling_group(self, **kwargs: Any) -> dict[str, Any]:
        self._client.terminate_instance_in_auto_scaling_group(**kwargs)  # theirs
        return self._client.terminate_instance_in_auto_scaling_group(**kwargs)  # NodeMedic's

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_an_instance_ended_by_someone_else_as_nodemedic_terminates_it_is_replaced_not_failed(aws: EmbeddedAWS) -> None:
    ids = _group(aws)
    asg = aws.client("autoscaling")
    with pytest.raises(ClientError, match="ValidationError.*No managed instance found for instance ID"):
        _EndedFirst(asg).terminate_instance_in_auto_scaling_group(InstanceId=ids[2], ShouldDecrementDesiredCapacity=False)
    provider = AutoScalingProvider(_EndedFirst(asg), aws.client("ec2"), "g")
    step = provider.replace(ids[1], "gpu-2", {}, claim=_claim_all)
    assert step.progress["requested_at"]
    step = provider.replace(ids[1], "gpu-2", step.progress, claim=_claim_all)
    assert step.instance_id not in (None, ids[1]) and provider.member_by_node("gpu-2").instance_id == step.instance_id


def test_the_groups_ended_instances_are_listed_with_the_node_each_backed(aws: EmbeddedAWS) -> None:
    """What the reconciler gives a lost node: the group's instances EC2 ended, each with its node
    tag (and the group's own tag, kept on an instance the group terminated, as on AWS); neither
    one it still runs, nor one of another group, nor one that backed no node."""
    ids = _group(aws)
    asg, ec2 = aws.client("autoscaling"), aws.client("ec2")
    provider = AutoScalingProvider(asg, ec2, "g")
    assert provider.ended() == []
    asg.terminate_instance_in_auto_scaling_group(InstanceId=ids[1], ShouldDecrementDesiredCapacity=False)
    [gone] = provider.ended()
    assert (gone.instance_id, gone.slurm_node, gone.state) == (ids[1], "gpu-2", "terminated")
    assert gone.tags["aws:autoscaling:groupName"] == "g"
    unnamed = next(m for m in provider.members() if m.slurm_node is None)  # the one launched in its place
    asg.terminate_instance_in_auto_scaling_group(InstanceId=unnamed.instance_id, ShouldDecrementDesiredCapacity=False)
    assert [m.instance_id for m in provider.ended()] == [ids[1]]
    assert AutoScalingProvider(asg, ec2, "other").ended() == []


def _tagged(aws: EmbeddedAWS, count: int = 2) -> list[str]:
    ec2 = aws.client("ec2")
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId=IMAGE, MinCount=count, MaxCount=count)["Instances"]]
    for n, instance in enumerate(ids, 1):
        ec2.create_tags(Resources=[instance], Tags=[{"Key": CLUSTER_TAG, "Value": "c1"},
                                                    {"Key": SLURM_NODE_TAG, "Value": f"gpu-{n}"}])
    ec2.run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1)  # not the cluster's
    return ids


def test_the_clusters_ended_ec2_instances_are_listed_with_the_node_each_backed(aws: EmbeddedAWS) -> None:
    """What the reconciler pages for a node no instance backs on Provider=ec2: the cluster's
    instances EC2 ended, each with its node tag; neither one it still runs or stopped, nor one of
    another cluster."""
    ids = _tagged(aws, 3)
    ec2 = aws.client("ec2")
    provider = EC2Provider(ec2, "c1")
    assert provider.ended() == []
    ec2.stop_instances(InstanceIds=[ids[2]])  # stopped: it comes back as itself
    ec2.terminate_instances(InstanceIds=[ids[1]])
    [gone] = provider.ended()
    assert (gone.instance_id, gone.slurm_node, gone.state) == (ids[1], "gpu-2", "terminated")
    assert EC2Provider(ec2, "other").ended() == []


def test_ec2_replace_is_a_stop_and_start_of_the_same_instance(aws: EmbeddedAWS) -> None:
    ids = _tagged(aws)
    provider = EC2Provider(aws.client("ec2"), "c1")
    assert provider.size() == 2 and provider.member_by_node("gpu-2").instance_id == ids[1]
    assert {m.instance_id: m.slurm_node for m in provider.members()} == {ids[0]: "gpu-1", ids[1]: "gpu-2"}
    step = provider.replace(ids[0], "gpu-1", {}, claim=_claim_all)
    assert step.instance_id == ids[0]
    assert step.progress == {"stop_requested": True, "start_requested": True}
    assert provider.member(ids[0]).state == "running"


def test_ec2_replace_of_an_instance_someone_ended_retires_and_one_taken_out_of_the_cluster_fails(
        aws: EmbeddedAWS) -> None:
    """Someone else terminated gpu-1's instance under its incident: nothing launches one in its
    place on plain EC2, so the rung says the node is gone (the incident is retired; the reconciler
    pages the node once with what to do) rather than failing it. An instance whose cluster tag was
    taken off is not the provider's to stop and start: that fails, saying so."""
    ids = _tagged(aws)
    ec2 = aws.client("ec2")
    provider = EC2Provider(ec2, "c1")
    ec2.terminate_instances(InstanceIds=[ids[0]])
    with pytest.raises(NodeGoneError, match=rf"EC2 ended {ids[0]} \(terminated\) outside NodeMedic.*"
                                            "nodemedic:cluster=c1 and nodemedic:slurm-node=<node>"):
        provider.replace(ids[0], "gpu-1", {}, claim=_claim_all)
    ec2.delete_tags(Resources=[ids[1]], Tags=[{"Key": CLUSTER_TAG}])
    with pytest.raises(ReplacementFailedError, match="no instance of cluster c1 now"):
        provider.replace(ids[1], "gpu-2", {}, claim=_claim_all)
    assert provider.member(ids[1]) is None and ec2.describe_instances(InstanceIds=[ids[1]])[
        "Reservations"][0]["Instances"][0]["State"]["Name"] == "running"


def test_on_kubernetes_the_ec2_providers_members_are_the_clusters_instances_named_by_no_slurm_tag(
        aws: EmbeddedAWS) -> None:
    """On Slurm an instance with the cluster tag and no Slurm name is the controller, not a member;
    on Kubernetes no instance carries a Slurm name (the node's providerID names its instance)."""
    ec2 = aws.client("ec2")
    ids = sorted(i["InstanceId"] for i in ec2.run_instances(ImageId=IMAGE, MinCount=2, MaxCount=2)["Instances"])
    ec2.create_tags(Resources=ids, Tags=[{"Key": CLUSTER_TAG, "Value": "c1"}])
    ec2.run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1)  # not the cluster's
    assert EC2Provider(ec2, "c1").members() == []
    on_kubernetes = EC2Provider(ec2, "c1", slurm_tagged=False)
    assert sorted(m.instance_id for m in on_kubernetes.members()) == ids and on_kubernetes.member(ids[0]) is not None


def test_ec2_without_capacity_to_start_again_is_a_capacity_error_and_stays_retryable(aws: EmbeddedAWS) -> None:
    ids = _tagged(aws)
    provider = EC2Provider(aws.client("ec2"), "c1")
    aws.ec2_capacity = False
    with pytest.raises(CapacityError, match="InsufficientInstanceCapacity"):
        provider.replace(ids[0], "gpu-1", {}, claim=_claim_all)
    assert provider.member(ids[0]).state == "stopped"
    aws.ec2_capacity = True  # capacity is back: the retried rung continues from the stopped instance
    step = provider.replace(ids[0], "gpu-1", {"stop_requested": True}, claim=_claim_all)
    assert step.instance_id == ids[0] and provider.member(ids[0]).state == "running"


def _hyperpod(aws: EmbeddedAWS, nodes: int) -> list[str]:
    return aws.hyperpod.create_cluster("hp", [f"ip-10-0-0-{n}" for n in range(1, nodes + 1)])


def test_hyperpod_reboots_in_batches_of_at_most_25_nodes(aws: EmbeddedAWS) -> None:
    ids = _hyperpod(aws, 30)
    provider = HyperPodProvider(aws.client("sagemaker"), "hp")
    assert provider.size() == 30
    assert provider.member(ids[4]).slurm_node == "ip-10-0-0-5"
    members = provider.members()  # from ListClusterNodes alone
    assert [(m.instance_id, m.slurm_node, m.state) for m in members] == [
        (i, f"ip-10-0-0-{n}", "running") for n, i in enumerate(ids, 1)]
    provider.reboot(ids)
    assert [(op, len(batch)) for op, batch in aws.hyperpod.calls] == [("reboot", BATCH_LIMIT), ("reboot", 5)]
    assert [i for _, batch in aws.hyperpod.calls for i in batch] == ids
    with pytest.raises(aws.client("sagemaker").exceptions.ClientError, match="between 1 and 25"):
        aws.client("sagemaker").batch_reboot_cluster_nodes(ClusterName="hp", NodeIds=ids[:26])


def test_hyperpod_replace_brings_a_new_node_under_the_same_slurm_name(aws: EmbeddedAWS) -> None:
    ids = _hyperpod(aws, 2)
    provider = HyperPodProvider(aws.client("sagemaker"), "hp")
    step = provider.replace(ids[0], "ip-10-0-0-1", {}, claim=_claim_all)
    assert step.instance_id is None and aws.hyperpod.calls == [("replace", [ids[0]])]
    step = provider.replace(ids[0], "ip-10-0-0-1", step.progress, claim=_claim_all)
    assert step.instance_id not in (None, ids[0])
    assert provider.member_by_node("ip-10-0-0-1").instance_id == step.instance_id
    assert len(aws.hyperpod.calls) == 1  # the second step only looked


def test_hyperpod_replacement_is_the_groups_next_launch_never_a_peer_and_never_one_claimed(aws: EmbeddedAWS) -> None:
    """What finds the replacement is HyperPod's own record (instance group, launch time), not a name:
    peers launched with the replaced node are never taken, and one another incident claimed is skipped."""
    ids = _hyperpod(aws, 3)
    provider = HyperPodProvider(aws.client("sagemaker"), "hp")
    asked: list[str] = []
    step = provider.replace(ids[1], "ip-10-0-0-2", {}, claim=lambda c: bool(asked.append(c)))
    assert step.instance_id is None and step.progress["instance_group"] == "workers"
    step = provider.replace(ids[1], "ip-10-0-0-2", step.progress, claim=lambda c: bool(asked.append(c)))
    new = next(n for n in aws.client("sagemaker").list_cluster_nodes(ClusterName="hp")["ClusterNodeSummaries"]
               if n["InstanceId"] not in ids)["InstanceId"]
    assert step.instance_id is None and asked == [new]  # only the new node was offered, and it was refused
    step = provider.replace(ids[1], "ip-10-0-0-2", step.progress, claim=_claim_all)
    assert step.instance_id == new and aws.hyperpod.calls == [("replace", [ids[1]])]


def test_hyperpod_without_capacity_is_a_capacity_error(aws: EmbeddedAWS) -> None:
    ids = _hyperpod(aws, 2)
    aws.hyperpod.capacity = False
    provider = HyperPodProvider(aws.client("sagemaker"), "hp")
    step = provider.replace(ids[1], "ip-10-0-0-2", {}, claim=_claim_all)
    with pytest.raises(CapacityError, match="InsufficientInstanceCapacity"):
        provider.replace(ids[1], "ip-10-0-0-2", step.progress, claim=_claim_all)


def test_hyperpod_unknown_nodes_fail_the_batch_with_their_ids(aws: EmbeddedAWS) -> None:
    _hyperpod(aws, 1)
    provider = HyperPodProvider(aws.client("sagemaker"), "hp")
    with pytest.raises(Exception, match="i-00000000000000000"):
        provider.reboot(["i-00000000000000000"])


def test_hyperpod_busy_with_a_node_is_a_wait_not_a_failure(aws: EmbeddedAWS) -> None:
    """HyperPod refuses a reboot or replacement of a node it is working on itself (its own repair
    after its health agent's verdict, a patch, a deep health check: ``InstanceIdInUse`` or
    ``InvalidInstanceStatus``). That was a ReplacementFailedError, and the incident failed and paged
    while HyperPod was busy repairing the very node. Now it is a wait (the rung is retried until
    that work ends); a node that is not in the cluster still fails at once."""
    ids = _hyperpod(aws, 3)
    provider = HyperPodProvider(aws.client("sagemaker"), "hp")
    aws.hyperpod.in_use.add(ids[0])
    try:
        with pytest.raises(ProviderBusyError, match=f"HyperPod is working on {ids[0]} itself.*InstanceIdInUse"):
            provider.reboot([ids[0]])
        with pytest.raises(ProviderBusyError, match="InstanceIdInUse"):
            provider.replace(ids[0], "ip-10-0-0-1", {}, claim=_claim_all)
    finally:
        aws.hyperpod.in_use.clear()
    aws.hyperpod.set_status("hp", ids[1], "SystemUpdating")  # HyperPod patching it
    with pytest.raises(ProviderBusyError, match="InvalidInstanceStatus"):
        provider.reboot([ids[1]])
    assert provider.member(ids[0]).instance_id == ids[0]  # nothing was replaced meanwhile
    with pytest.raises(ReplacementFailedError, match="InstanceIdNotFound"):  # busy and gone: not a wait
        provider.reboot([ids[1], "i-00000000000000000"])
    aws.hyperpod.set_status("hp", ids[1], "Running")
    provider.reboot([ids[0], ids[1]])  # the work ended: the retried rung goes through
    assert aws.hyperpod.calls[-1] == ("reboot", [ids[0], ids[1]])


class _FailsEveryNode:
    """A SageMaker client whose batch calls fail each node with ``code``."""

    def __init__(self, code: str) -> None:
        self.code = code

    def batch_reboot_cluster_nodes(self, ClusterName: str, NodeIds: list[str]) -> dict:  # noqa: N803 - boto3's names
        return {"Successful": [], "Failed": [{"NodeId": n, "ErrorCode": self.code, "Message": "m"} for n in NodeIds]}


@pytest.mark.parametrize(("code", "error"), [
    ("InternalServerError", ProviderBusyError),  # HyperPod's own fault for the node: asked again
    ("InstanceIdNotFound", InstanceGoneError),  # HyperPod replaced it itself, or it was removed
    ("SomethingNew", ReplacementFailedError),  # a code the API reference does not list: failed, with it
])
def test_each_error_code_hyperpod_documents_for_a_node_has_its_meaning(code: str, error: type) -> None:
    with pytest.raises(error, match=code):
        HyperPodProvider(_FailsEveryNode(code), "hp").reboot(["i-0123456789abcdef0"])


def test_a_reboot_of_an_instance_someone_stopped_never_starts_it_and_says_why(aws: EmbeddedAWS) -> None:
    """EC2 reboots only a running instance (IncorrectInstanceState otherwise). An instance someone
    stopped under its incident (an operator for maintenance, a Spot stop) is never started by
    NodeMedic: the rung fails and says so. moto started it on a reboot."""
    ids = _tagged(aws)
    ec2 = aws.client("ec2")
    provider = EC2Provider(ec2, "c1")
    ec2.stop_instances(InstanceIds=[ids[0]])
    with pytest.raises(ReplacementFailedError, match=f"{ids[0]} \\(stopped\\): someone else stopped it.*"
                                                     "IncorrectInstanceState"):
        provider.reboot([ids[0]])
    assert provider.member(ids[0]).state == "stopped"


def test_a_reboot_of_an_instance_still_booting_is_that_boot() -> None:
    """A pending instance (started again meanwhile) boots already: what the rung asks, no failure."""
    from botocore.exceptions import ClientError
    from nodemedic.providers.base import reboot_ec2

    class _Pending:
        def reboot_instances(self, InstanceIds: list[str]) -> None:  # noqa: N803 - boto3's names
            raise ClientError({"Error": {"Code": "IncorrectInstanceState", "Message": "pending"}}, "RebootInstances")

        def get_paginator(self, name: str) -> object:
            class _Pages:
                def paginate(self, **_: object) -> list[dict]:
                    return [{"Reservations": [{"Instances": [{"InstanceId": "i-1", "State": {"Name": "pending"}}]}]}]
            return _Pages()

    reboot_ec2(_Pending(), ["i-1"])
