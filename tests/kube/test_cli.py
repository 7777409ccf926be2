"""The operator CLI against the whole stack on Kubernetes: ``nodemedic`` reaches the real API
server with the operator's own IAM credentials (a token presigned from STS, as for the
functions), and the cluster's access entries and deploy/kubernetes/rbac.yaml decide what it may
do. Four operators: one with no access entry, one whose entry names no group, one in
``nodemedic:reader``, one in ``nodemedic:remediator``. Each is a separate IAM user: the API server caches a token's review for
two minutes (``--authentication-token-webhook-cache-ttl``), so a changed entry is not seen at once."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from nodemedic_cli import doctor as checks
from nodemedic_cli.main import app
from nodemedic_cli.target import Target
from nodemedic_sandbox import kube_apiserver
from nodemedic_sandbox.kube_cluster import KubeScheduler
from nodemedic_sandbox.local import LocalMode
from typer.testing import CliRunner

from tests.conftest import require
from tests.e2e.support import OPEN

OPERATOR = "oncall@example.com"


@pytest.fixture(scope="module")
def local() -> Iterator[LocalMode]:
    require("the real kube-apiserver", kube_apiserver.unavailable_reason())
    with pytest.MonkeyPatch.context() as env:  # for the module: see tests/e2e/test_cli.py
        env.setenv("NODEMEDIC_OPERATOR", OPERATOR)
        with LocalMode(nodes=3, spares=1, scheduler="kubernetes", retry_time_scale=0.01,
                       extra_parameters=OPEN) as stack:
            yield stack


def _kube(local: LocalMode) -> KubeScheduler:
    assert isinstance(local.scheduler, KubeScheduler)
    return local.scheduler


def operator(local: LocalMode, user: str, groups: list[str] | None) -> tuple[Any, str]:
    """An IAM user's session and ARN; with ``groups``, the access entry an admin creates for it
    (``aws eks create-access-entry --kubernetes-groups …``)."""
    session = local.aws.operator_session(user)
    arn = session.client("sts").get_caller_identity()["Arn"]
    if groups is not None:
        local.aws.create_access_entry(_kube(local).eks_cluster, arn, groups, "STANDARD")
    return session, arn


def cli(local: LocalMode, session: Any, *args: str, code: int = 0, hold: bool = True) -> Any:
    """``nodemedic ARGS --json`` as the operator whose session this is; the parsed JSON. With
    ``hold`` no function runs meanwhile; a reboot or replace waits for its Detect (``hold=False``)."""
    original = checks.SimulatedPermissions  # the doctor's permission rows: the local IAM evaluator
    checks.SimulatedPermissions = lambda iam: checks.LocalPermissions(iam)  # type: ignore[assignment,misc]
    try:
        with local.aws.lambdas_held() if hold else contextlib.nullcontext():
            result = CliRunner().invoke(app, [*args, "--json"], obj=Target(local.stack.name, session=session))
    finally:
        checks.SimulatedPermissions = original  # type: ignore[misc]
    assert result.exit_code == code, (result.output, result.exception)
    text = result.output  # after the lines where moto says which CloudFormation types it lacks
    return json.loads(text[min(text.index(c) for c in "[{" if c in text):])


def test_an_operator_without_an_access_entry_is_told_which_to_create_and_nothing_changes(local: LocalMode) -> None:
    session, arn = operator(local, "alice", None)
    refused = cli(local, session, "spares", code=2)["error"]
    assert f"does not know {arn} (401 Unauthorized)" in refused
    assert (f"aws eks create-access-entry --cluster-name {_kube(local).eks_cluster} --principal-arn {arn} "
            "--kubernetes-groups nodemedic:remediator") in refused
    assert "does not know" in cli(local, session, "remediate", "gpu-2", "--action", "drain", "--reason", "BIOS update",
                                  code=2)["error"]
    assert "DRAIN" not in _kube(local).node("gpu-2")["State"] and local.executions() == []
    rows = {r["check"]: r for r in cli(local, session, "doctor", code=1)}
    assert rows["scheduler"]["status"] == "fail" and "create-access-entry" in rows["scheduler"]["detail"]


def test_an_operator_whose_access_entry_has_no_group_is_told_to_update_it(local: LocalMode) -> None:
    session, arn = operator(local, "dave", [])  # authenticated, but no RBAC binding: 403
    refused = cli(local, session, "spares", code=2)["error"]
    assert f"knows {arn}, but no group of its access entry may list nodes (403 Forbidden)" in refused
    assert f"aws eks update-access-entry --cluster-name {_kube(local).eks_cluster} --principal-arn {arn} " in refused


def test_a_reader_sees_the_spare_pool_but_its_drain_is_refused_by_rbac(local: LocalMode) -> None:
    session, arn = operator(local, "bob", ["nodemedic:reader"])
    pool = cli(local, session, "spares")
    assert pool["held_by"] == "taint nodemedic.io/spare" and pool["reservation"] is None
    assert pool["nodes"] == [{"node": "gpu-4", "state": "IDLE+RESERVED", "ready": True}] and pool["ready"] == 1
    refused = cli(local, session, "remediate", "gpu-2", "--action", "drain", "--reason", "BIOS update", code=2)["error"]
    assert refused.startswith("drain gpu-2: 403 Forbidden: ") and f'User "{arn}" cannot patch resource "nodes"' in refused
    assert "DRAIN" not in _kube(local).node("gpu-2")["State"]


def test_a_remediator_drains_resumes_and_starts_an_incident_through_the_real_api_server(local: LocalMode) -> None:
    kube = _kube(local)
    session, arn = operator(local, "carol", ["nodemedic:remediator"])
    drained = cli(local, session, "remediate", "gpu-2", "--action", "drain", "--reason", "BIOS update")
    assert drained["state"].endswith("+DRAIN") and kube.node("gpu-2")["State"].endswith("+DRAIN")
    # the operator's cordon: automation never lifts it (its reason does not carry NodeMedic's prefix)
    assert kube.node("gpu-2")["Reason"] == f"operator:{OPERATOR} BIOS update"
    resumed = cli(local, session, "remediate", "gpu-2", "--action", "resume", "--reason", "BIOS done")
    assert "DRAIN" not in resumed["state"] and "DRAIN" not in kube.node("gpu-2")["State"]

    started = cli(local, session, "remediate", "gpu-1", "--action", "reboot", "--reason", "GPU 3 keeps failing NCCL", hold=False)
    [execution] = local.wait_for_executions(1, timeout=120)
    assert execution["status"] == "SUCCEEDED", execution.get("cause")
    shown = cli(local, session, "show", started["incident"])
    assert (shown["node"], shown["status"], shown["ladder"][0]) == ("gpu-1", "closed", "reboot")
    repair = next(row for row in shown["timeline"] if row["stage"] == "repair")
    assert "reboot on i-" in repair["decision"] and "healthy" in repair["decision"], repair
    assert [r["incident"] for r in cli(local, session, "incidents")] == [started["incident"]]
    rows = {r["check"]: r for r in cli(local, session, "doctor", code=0)}
    assert rows["scheduler"] == {"check": "scheduler", "status": "pass", "detail": "4 Kubernetes nodes", "fix": ""}
    assert rows["nodes mapped"]["status"] == "pass" and rows["spare pool"]["status"] == "pass"
    assert rows["parameter KubernetesDrainPolicy"] == {"check": "parameter KubernetesDrainPolicy", "status": "pass",
                                                        "detail": "valid", "fix": ""}
    # no wheelhouse in the bucket is no warning here: the DaemonSet's image carries the agent
    assert rows["agent wheelhouse"]["status"] == "pass" and "image carries it" in rows["agent wheelhouse"]["detail"]
    # every call the CLI made reached the API server as carol, in the group her entry names
    assert (arn, ("nodemedic:remediator",)) in kube.authenticator.authenticated
