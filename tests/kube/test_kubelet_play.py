"""The parts of a cluster the local mode plays write to the real API server as a controller does:
on what they read, so that a change NodeMedic made in between is never written over."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s
from nodemedic.orchestrators.kubernetes import BURN_IN_TAINT, SPARE_TAINT
from nodemedic_sandbox import kube_apiserver

from tests.kube.conftest import Cluster


def test_the_node_found_ready_keeps_a_taint_nodemedic_set_while_it_was_being_read(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replacement becomes Ready while Resume returns it to the spare pool: the played node
    lifecycle controller read the taints, NodeMedic swapped the burn-in hold for the spare taint,
    and the controller wrote back what it had read. The node ended held for a burn-in nobody ran,
    not in the pool (a flake of the Kubernetes stack test, 1 run in 5 or so under load)."""
    node = cluster.node("gpu-9", ready=False, taints=[
        {"key": kube_apiserver.NOT_READY_TAINT, "effect": "NoSchedule"},
        {"key": BURN_IN_TAINT, "value": "pending", "effect": "NoSchedule"}])
    read_node = k8s.CoreV1Api.read_node
    swapped: list[str] = []

    def read_then_nodemedic_writes(self: k8s.CoreV1Api, name: str, **kwargs: Any) -> Any:  # noqa: ANN401
        raw = read_node(self, name, **kwargs)
        if not swapped:  # NodeMedic's add_spare lands between the controller's read and its write
            swapped.append(name)
            taints = [t for t in cluster.read_node(name).spec.taints if t.key != BURN_IN_TAINT]
            cluster.core.patch_node(name, [{"op": "add", "path": "/spec/taints", "value": [
                *(cluster.api.sanitize_for_serialization(t) for t in taints),
                {"key": SPARE_TAINT, "value": "true", "effect": "NoSchedule"}]}])
        return raw

    monkeypatch.setattr(k8s.CoreV1Api, "read_node", read_then_nodemedic_writes)
    kube_apiserver.set_ready(cluster.api, node, True, "test")
    monkeypatch.undo()
    assert swapped == [node]
    assert cluster.taints(node) == {SPARE_TAINT: "true:NoSchedule"}
    assert cluster.condition(node, "Ready").status == "True"
