"""The whole stack with Karpenter: template.yaml deployed with ``Orchestrator=kubernetes`` and
``Provider=karpenter`` into the embedded AWS, its functions reaching the real kube-apiserver as on
EKS and held to their roles by the local IAM. The GPU nodes are a static NodePool: the local mode
plays Karpenter (nodemedic_sandbox.karpenter: the NodeClaim CRD on the API server, an instance
per NodeClaim tagged as Karpenter tags it, the instance of a deleted NodeClaim terminated and
another launched), besides the kubelets, the training operator and the scheduler it plays on
every Kubernetes stack (tests/kube/test_local_stack.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from nodemedic.orchestrators.kubernetes import SPARE_TAINT
from nodemedic.providers.karpenter import GROUP, NODECLAIM_TAG, NODECLAIMS, NODEPOOL_TAG, VERSION
from nodemedic.stages.spares import ready
from nodemedic_sandbox import kube_apiserver
from nodemedic_sandbox.kube_cluster import KubeScheduler
from nodemedic_sandbox.local import LocalMode

from tests.conftest import require
from tests.e2e.support import OPEN, wait_for
from tests.kube.test_cli import cli, operator


@pytest.fixture
def local() -> Iterator[LocalMode]:
    require("the real kube-apiserver", kube_apiserver.unavailable_reason())
    with LocalMode(nodes=3, spares=1, scheduler="kubernetes", provider="karpenter", retry_time_scale=0.01,
                   extra_parameters=OPEN) as stack:
        yield stack


def _tags(local: LocalMode, instance: str) -> dict[str, str]:
    found = local.aws.client("ec2").describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]
    return {t["Key"]: t["Value"] for t in found.get("Tags", [])} | {"state": found["State"]["Name"]}


def test_xid79_on_a_karpenter_node_deletes_its_nodeclaim_and_the_pools_next_launch_takes_its_place(
        local: LocalMode) -> None:
    kube = local.scheduler
    assert isinstance(kube, KubeScheduler) and local.cluster.karpenter is not None
    karpenter = local.cluster.karpenter
    job = kube.submit(3, name="llm")  # one worker on each of gpu-1..3; gpu-4 is the spare
    assert wait_for(lambda: kube.job(job)["JobState"] == "RUNNING", "the job to run")
    old = local.cluster.break_node("gpu-1", fixed_by="replace")
    old_claim = karpenter.nodeclaim[old]

    local.put_event(local.health_event("gpu-1", "XID 79"))  # ladder: replace
    [execution] = local.wait_for_executions(1, timeout=180)

    assert execution["status"] == "SUCCEEDED", execution.get("cause")
    incident = local.incident(execution["name"])
    assert incident.status == "closed"
    # its NodeClaim deleted through the API server, its instance terminated by Karpenter, and the
    # pool's next launch checked and put in the spare pool under its own name
    [rung] = incident.stages["repair"].result["rungs"]
    new = rung["progress"]["new_instance_id"]
    assert rung["rung"] == "replace" and rung["check"]["healthy"] and rung["progress"]["nodeclaim"] == old_claim
    assert old_claim not in karpenter.claims() and _tags(local, old)["state"] == "terminated"
    assert _tags(local, new)[NODEPOOL_TAG] == karpenter.pool and _tags(local, new)[NODECLAIM_TAG] in karpenter.claims()
    assert kube.node_of(new) == rung["node"] != "gpu-1" and kube.spares() == [rung["node"]]
    # the job's worker moved to the spare at once
    after = kube.job(job)
    assert after["JobState"] == "RUNNING" and after["NodeList"] == "gpu-2,gpu-3,gpu-4"
    assert SPARE_TAINT not in kube.taints("gpu-4")
    wait_for(lambda: "gpu-1" not in kube.node_names(), "the old node to be deleted")
    # the replacement joins the pool at once, Ready a moment later (its kubelet, READY_AFTER_S):
    # a spare that is not Ready is never taken, so the next fault comes once it is
    wait_for(lambda: ready(kube.node(rung["node"])["State"]), "the replacement in the pool to be Ready")

    # another node of the pool: a GPU reset, then EC2's reboot of the pool's instance (allowed by
    # its NodePool tag); its worker takes the replacement from the pool, and the node is in service again
    rebooted = local.cluster.break_node("gpu-3", fixed_by="reboot")
    local.put_event(local.health_event("gpu-3", "XID 48"))  # ladder: GPU reset, reboot, replace
    second = next(e for e in local.wait_for_executions(2, timeout=180) if e["executionArn"] != execution["executionArn"])

    assert second["status"] == "SUCCEEDED", second.get("cause")
    incident = local.incident(second["name"])
    assert [r["rung"] for r in incident.stages["repair"].result["rungs"]] == ["gpu_reset", "reboot"]
    assert incident.stages["spare"].result["spare"] == rung["node"]
    assert kube.instance_of("gpu-3") == rebooted and "DRAIN" not in kube.node("gpu-3")["State"]
    assert wait_for(lambda: kube.job(job)["JobState"] == "RUNNING", "the job to run again")
    # the pool is its size again, and every NodeClaim it holds backs a node
    claims = k8s.CustomObjectsApi(kube.api).list_cluster_custom_object(GROUP, VERSION, NODECLAIMS)["items"]
    backing = {c["status"]["providerID"].rsplit("/", 1)[1] for c in claims}
    assert len(claims) == 4 and {kube.instance_of(n) for n in kube.node_names()} == backing
    # every call each function made was allowed by its role (leaving the local mode raises otherwise)
    assert local.aws.denials == [] and kube.authenticator.rejected == [] and kube.errors == []
    # the doctor reads the Karpenter deployment as it is: each function's calls allowed by its role
    # (on the pool's instances, by their tags), the nodes mapped to their instances, the pool full
    session, _ = operator(local, "dana", ["nodemedic:remediator"])
    rows = {r["check"]: r for r in cli(local, session, "doctor", code=0)}
    assert [r for r in rows.values() if r["status"] == "fail"] == []  # a metric with no data yet only warns
    assert all(r["status"] == "pass" for name, r in rows.items() if name.startswith(("permissions ", "rule ")))
    assert rows["nodes mapped"]["status"] == "pass"
    assert rows["scheduler"]["detail"] == "4 Kubernetes nodes" and rows["spare pool"]["status"] == "pass"
