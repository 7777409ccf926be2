"""``nodemedic doctor`` against the local stack: it passes on the template as it is, and names the
broken row on each deliberately broken deployment."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import boto3
from nodemedic.reconciler import UNWATCHED_AFTER
from nodemedic.store.roster import RosterHead, RosterStore
from nodemedic_cli.main import app
from nodemedic_cli.target import Target
from nodemedic_sandbox.local import TEMPLATE, LocalMode
from typer.testing import CliRunner

from tests.conftest import require_slurm


def doctor(local: LocalMode) -> tuple[int, dict[str, dict[str, str]]]:
    """Run ``nodemedic doctor --json`` against the local stack (its permissions judged by the local
    IAM evaluator, as iam:SimulatePrincipalPolicy would on AWS)."""
    from nodemedic_cli import doctor as checks

    target = Target(local.stack.name, session=boto3.Session())
    original = checks.SimulatedPermissions
    checks.SimulatedPermissions = lambda iam: checks.LocalPermissions(iam)  # type: ignore[assignment,misc]
    try:
        with local.aws.lambdas_held():
            result = CliRunner().invoke(app, ["doctor", "--json"], obj=target)
    finally:
        checks.SimulatedPermissions = original  # type: ignore[misc]
    rows = json.loads(result.output)
    return result.exit_code, {r["check"]: r for r in rows}


@contextmanager
def deployed(edit: Callable[[str], str] = lambda t: t, **kwargs: object) -> Iterator[LocalMode]:
    """The local stack over real Slurm, from template.yaml with ``edit`` applied to its text."""
    require_slurm()
    with tempfile.TemporaryDirectory(prefix="nodemedic-template-") as tmp:
        root = Path(tmp)
        for name in ("functions", "layers", "statemachines"):
            (root / name).symlink_to(TEMPLATE.parent / name)
        (root / "template.yaml").write_text(edit(TEMPLATE.read_text()))
        with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01, template=root / "template.yaml",
                       **kwargs) as local:  # type: ignore[arg-type]
            yield local


def remediate_one(local: LocalMode) -> dict:
    local.put_event(local.health_event(local.node_names[-1], "XID 79"))
    [execution] = local.wait_for_executions(1, timeout=120)
    return execution


def test_the_doctor_passes_on_the_local_stack() -> None:
    with deployed(schedule_scale=0.05) as local:
        local.start_agents(heartbeat_s=1.0)
        assert remediate_one(local)["status"] == "SUCCEEDED"
        deadline = time.monotonic() + 30
        while True:
            code, rows = doctor(local)
            if rows["heartbeats"]["status"] == "pass" or time.monotonic() > deadline:
                break
            time.sleep(1)
        failed = {k: r for k, r in rows.items() if r["status"] == "fail"}
        assert code == 0 and not failed, failed
        assert rows["nodes mapped"]["status"] == "pass" and rows["scheduler"]["detail"] == "4 Slurm nodes"
        assert rows["unnamed instances"]["status"] == "pass"
        assert rows["metric TimeToRecover {Cluster=local}"]["status"] == "pass"
        assert all(rows[f"permissions {f}"]["status"] == "pass" for f in ("DetectFunction", "RepairFunction",
                                                                          "HealthCheckResultFunction"))
        assert rows["document HealthCheckDocument"]["status"] == "pass"
        assert rows["parameter FaultActionOverrides"]["status"] == rows["safety policy"]["status"] == "pass"


def test_a_metric_published_with_other_dimensions_fails_its_row() -> None:
    """What main published: Powertools added a 'service' dimension, so {Cluster} found nothing."""
    with deployed() as local:
        local.aws.client("cloudwatch").put_metric_data(Namespace="NodeMedic", MetricData=[{
            "MetricName": "TimeToRecover", "Value": 300.0, "Timestamp": datetime.now(UTC),
            "Dimensions": [{"Name": "Cluster", "Value": "local"}, {"Name": "service", "Value": "resume"}]}])
        code, rows = doctor(local)
        row = rows["metric TimeToRecover {Cluster=local}"]
        assert code == 1 and row["status"] == "fail"
        assert "{Cluster, service}" in row["detail"] and "service" in row["fix"]


MAINS_SEND_TASK_SUCCESS = """            - Effect: Allow
              Action: states:SendTaskSuccess
              Resource: !Ref RemediationStateMachine
"""


def test_main_send_task_success_permission_is_denied_and_named() -> None:
    """main scoped states:SendTaskSuccess to the state machine's ARN; the action has no resource type."""
    def mains(text: str) -> str:
        start = text.index("            - Effect: Allow\n              Action: states:SendTaskSuccess")
        end = text.index('Resource: "*"\n', start) + len('Resource: "*"\n')
        return text[:start] + MAINS_SEND_TASK_SUCCESS + text[end:]

    # the check can never be answered: it times out after the shortest timeout the template allows
    with deployed(mains, expect_denials=True, extra_parameters={"HealthCheckTimeoutSeconds": "10"}) as local:
        execution = remediate_one(local)
        assert any("HealthCheckResultFunction" in d.function and d.action == "states:SendTaskSuccess"
                   for d in local.aws.denials), local.aws.denials
        assert execution["status"] != "SUCCEEDED" or local.incidents()[0].status != "closed"
        code, rows = doctor(local)
        row = rows["permissions HealthCheckResultFunction"]
        assert code == 1 and row["status"] == "fail" and "states:SendTaskSuccess on *" in row["detail"]
        assert '"Resource": "*"' in row["fix"]


def _before_the_overrides_pattern(template: str) -> str:
    """The template as it was before CloudFormation checked FaultActionOverrides' shape: a stack
    deployed then may hold any text."""
    checks = ("    AllowedPattern: '^[ \\t\\n\\r]*\\{", "    ConstraintDescription: 'must be a JSON object")
    kept = [line for line in template.splitlines(keepends=True) if not line.startswith(checks)]
    assert len(kept) == len(template.splitlines()) - 2, "the pattern's lines are no longer those"
    return "".join(kept)


def test_a_bad_json_parameter_or_safety_policy_fails_its_row() -> None:
    """CloudFormation takes any text for the JSON parameters but FaultActionOverrides (whose shape
    it checks only on a template of this version or later), and an operator edits the safety
    policy with put-parameter: a bad one failed (or held) every incident, and only then said so."""
    bad = {"FaultActionOverrides": '{"XID 74": "monitr"}', "CheckpointPolicy": '{"default": {"grace_seconds": '}
    with deployed(_before_the_overrides_pattern, extra_parameters=bad) as local:
        code, rows = doctor(local)
        assert code == 1
        overrides, checkpoints = rows["parameter FaultActionOverrides"], rows["parameter CheckpointPolicy"]
        assert overrides["status"] == "fail" and "'monitr' is not one of" in overrides["detail"]
        assert checkpoints["status"] == "fail" and "CHECKPOINT_POLICY" in checkpoints["detail"]
        assert "FaultActionOverrides=" in overrides["fix"] and "docs/checkpoints.md" in checkpoints["fix"]
        assert rows["safety policy"]["status"] == "pass"

        ssm = local.aws.client("ssm")
        name = local.stack.outputs["SafetyPolicyParameterName"]
        policy = json.loads(ssm.get_parameter(Name=name)["Parameter"]["Value"])
        policy["breaker"]["max_percent"] = 0
        ssm.put_parameter(Name=name, Value=json.dumps(policy), Overwrite=True)
        _, rows = doctor(local)
        row = rows["safety policy"]
        assert row["status"] == "fail" and "breaker.max_percent" in row["detail"] and "put-parameter" in row["fix"]


def test_a_node_whose_instance_is_gone_fails_the_mapping_row() -> None:
    """Its group launched another in its place, which backs no node until an incident names it."""
    with deployed() as local:
        gone = local.node_names[1]
        local.aws.client("ec2").terminate_instances(InstanceIds=[local.cluster.instance_of(gone)])
        code, rows = doctor(local)
        assert code == 1 and rows["nodes mapped"]["status"] == "fail" and gone in rows["nodes mapped"]["detail"]
        [launched] = [i["InstanceId"] for i in local.cluster.group_instances()
                      if i["InstanceId"] not in {local.cluster.instance_of(n) for n in local.node_names if n != gone}]
        unnamed = rows["unnamed instances"]
        assert unnamed["status"] == "warn" and launched in unnamed["detail"] and "desired-capacity" in unnamed["fix"]
        assert all(r["status"] != "fail" for k, r in rows.items() if k != "nodes mapped")
    assert shutil.which("scontrol")  # the real Slurm the rows were read from


def test_a_node_whose_agent_was_never_heard_is_named_in_the_agents_row() -> None:
    """An agent that never started (not installed, no instance metadata, no credentials) never
    enters the roster, so the sweeper cannot find its node silent; the doctor compares the nodes
    with the roster. The roster is written as the sweeper writes it, from three agents of four."""
    with deployed() as local:
        unheard = local.node_names[2]
        now = datetime.now(UTC).isoformat()
        RosterStore(local.aws.client("dynamodb"), local.stack.table_name, local.cluster.name).save({
            local.cluster.instance_of(name): {"node": {"instance_id": local.cluster.instance_of(name), "hostname": name,
                                                       "slurm_node": name},
                                              "last_seen": now, "interval_s": 15.0, "reported_at": None}
            for name in local.node_names if name != unheard}, RosterHead())
        _, rows = doctor(local)
        assert rows["agents"]["status"] == "warn" and rows["agents"]["detail"].endswith(f"never: {unheard}")
        assert "AgentPublishPolicy" in rows["agents"]["fix"]
        assert rows["heartbeats"]["status"] == "pass"  # the three it heard are not silent

        # the reconciler (its role judged by the local IAM evaluator) finds it too, and pages it
        # once it has been unwatched for UNWATCHED_AFTER: here its record is dated back that far
        first = local.reconcile()
        assert first["errors"] == [] and first["unwatched_nodes"] == []  # it may still be booting
        instance = local.cluster.instance_of(unheard)
        record = local.ledger.unwatched_nodes(local.cluster.name)
        assert list(record.nodes) == [instance]
        record.nodes[instance].since -= UNWATCHED_AFTER
        local.ledger.save_unwatched_nodes(local.cluster.name, record)
        local.escalations()
        found = [f"{unheard} ({instance}): no heartbeat from its agent"]
        assert local.reconcile()["unwatched_nodes"] == found
        [page] = local.escalations()
        assert "cannot watch 1 node(s) in service" in page["Message"] and f"{unheard} ({instance}" in page["Message"]
        assert local.reconcile()["unwatched_nodes"] == found and local.escalations() == []  # paged once


def test_an_agent_that_names_its_node_unlike_the_scheduler_fails_its_row() -> None:
    """Heard, but every event it sends names a node its instance does not back: Detect refuses
    them all (identity mismatch), so the node is as unwatched as one whose agent never started."""
    with deployed() as local:
        misnamed = local.node_names[1]
        now = datetime.now(UTC).isoformat()
        RosterStore(local.aws.client("dynamodb"), local.stack.table_name, local.cluster.name).save({
            local.cluster.instance_of(name): {
                "node": {"instance_id": local.cluster.instance_of(name), "hostname": name,
                         "slurm_node": "ip-10-0-0-9" if name == misnamed else name},
                "last_seen": now, "interval_s": 15.0, "reported_at": None}
            for name in local.node_names}, RosterHead())
        code, rows = doctor(local)
        assert code == 1 and rows["agents' node names"]["status"] == "fail"
        assert f"{misnamed} (its agent says ip-10-0-0-9)" in rows["agents' node names"]["detail"]
        assert rows["agents"]["status"] == "pass"  # heard, all of them
