"""The operator CLI against the local mode: every command, its --json output, and its errors."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from nodemedic.operations import OperatorError
from nodemedic_cli import operator as operator_commands
from nodemedic_cli.main import app
from nodemedic_cli.target import Target
from nodemedic_sandbox.local import LocalMode
from typer.testing import CliRunner

from tests.e2e.support import OPEN, OPERATOR, running_job, stack, wait_for


@pytest.fixture(scope="module")
def local() -> Iterator[LocalMode]:
    # the operator's name, for the whole module: CliRunner(env=...) would add and delete it around
    # each command while the state machine's threads iterate os.environ (botocore reads proxies
    # there), and one of them fails with KeyError('NODEMEDIC_OPERATOR')
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NODEMEDIC_OPERATOR", OPERATOR)
        with stack(nodes=4, spares=1, **OPEN) as running:
            yield running


def cli(local: LocalMode, *args: str, code: int = 0, hold: bool = True) -> Any:
    """Run ``nodemedic ARGS --json`` against the local stack; return the parsed JSON. With ``hold``
    the stack holds still while the CLI reads it; a reboot or replace that starts the state machine
    waits for its Detect, so the stack runs (``hold=False``)."""
    target = Target(local.stack.name, session=boto3.Session())
    with local.aws.lambdas_held() if hold else contextlib.nullcontext():
        result = CliRunner().invoke(app, [*args, "--json"], obj=target)
    assert result.exit_code == code, result.output
    try:
        return json.loads(result.output)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON: {result.output!r} {result.exception!r}") from None


def test_remediate_starts_the_state_machine_and_show_explains_each_stage(local: LocalMode) -> None:
    job, nodes = running_job(local)
    sick = nodes[0]
    started = cli(local, "remediate", sick, "--action", "replace", "--reason", "GPU 3 keeps failing NCCL", hold=False)
    assert started["started"] and started["action"] == "replace"
    [execution] = local.wait_for_executions(1, timeout=90)
    assert execution["status"] == "SUCCEEDED", execution.get("cause")

    shown = cli(local, "show", started["incident"])
    assert {k: shown[k] for k in ("node", "status", "fault_class")} == {
        "node": sick, "status": "closed", "fault_class": "manual"}
    assert OPERATOR in shown["reason"] and shown["ladder"] == ["replace"]
    stages = {row["stage"]: row for row in shown["timeline"]}
    assert list(stages) == ["detect", "gate", "drain", "spare", "jobs", "repair", "resume"]
    assert all(row["seconds"] is not None and row["seconds"] >= 0 for row in shown["timeline"])
    assert stages["gate"]["decision"].startswith("proceed")
    assert stages["spare"]["decision"].startswith(f"gpu-5 left the spare pool to take {sick}'s jobs")
    assert job in stages["drain"]["decision"] and job in stages["jobs"]["decision"]
    assert "replace on i-" in stages["repair"]["decision"] and "healthy" in stages["repair"]["decision"]

    listed = cli(local, "incidents")
    assert [r["incident"] for r in listed] == [started["incident"]]
    assert set(listed[0]) >= {"incident", "node", "fault", "status", "stage", "observed_at", "closed_at"}
    assert cli(local, "incidents", "--open") == []
    assert cli(local, "incidents", "--since", "1h")[0]["incident"] == started["incident"]

    pool = cli(local, "spares")
    assert pool["target_size"] == 1 and pool["nodes"] == [{"node": sick, "state": pool["nodes"][0]["state"],
                                                           "ready": True}]


def test_single_steps_for_runbooks_drain_health_check_resume(local: LocalMode) -> None:
    drained = cli(local, "remediate", "gpu-3", "--action", "drain", "--reason", "BIOS update")
    assert "DRAIN" in drained["state"]
    node = local.scheduler.node("gpu-3")
    assert node["Reason"].startswith(f"operator:{OPERATOR} BIOS update")  # not the pipeline's: it never resumes it
    again = cli(local, "remediate", "gpu-3", "--action", "drain", "--reason", "BIOS update", code=2)
    assert "already drained" in again["error"]

    checked = cli(local, "remediate", "gpu-3", "--action", "health-check", "--reason", "after the update",
                  "--level", "full")
    assert checked["healthy"] is True and {c["name"] for c in checked["checks"]} >= {"gpu_count", "nccl_all_reduce"}

    resumed = cli(local, "remediate", "gpu-3", "--action", "resume", "--reason", "update done")
    assert "DRAIN" not in resumed["state"]


@pytest.mark.parametrize(("args", "message"), [
    (["remediate", "gpu-99", "--action", "drain", "--reason", "looks bad"], "not in cluster"),
    (["remediate", "gpu-1", "--action", "replace", "--reason", "x"], "reason"),
    (["remediate", "gpu-1", "--action", "replace", "--reason", "it's broken; rm -rf"], "reason"),
    (["remediate", "gpu-1", "--action", "reinstall", "--reason", "looks bad"], "--action must be one of"),
    (["show", "no-such-incident"], "no incident 'no-such-incident'"),
    (["approve", "no-such-incident", "--reason", "ok go"], "no incident"),
    (["breaker", "reset", "--reason", "storm over"], "closed; nothing to reset"),
    (["incidents", "--since", "yesterday"], "--since"),
])
def test_bad_requests_are_refused_with_the_reason_and_change_nothing(local: LocalMode, args: list[str],
                                                                      message: str) -> None:
    before = len(local.executions()), len(local.scontrol_commands("state=drain"))
    refused = cli(local, *args, code=2)
    assert message in refused["error"]
    assert (len(local.executions()), len(local.scontrol_commands("state=drain"))) == before


def test_a_missing_stack_is_named() -> None:
    # options, not env=: CliRunner would change os.environ under the running stack's threads
    result = CliRunner().invoke(app, ["--stack", "no-such-stack", "--region", "us-east-1",
                                      "--endpoint-url", "http://127.0.0.1:9", "incidents", "--json"])
    assert result.exit_code == 2
    assert "no-such-stack" in json.loads(result.output)["error"]


def test_pause_resume_and_breaker_status(local: LocalMode) -> None:
    paused = cli(local, "pause", "--reason", "switch maintenance")
    assert paused["paused"]["by"] == OPERATOR and paused["paused"]["reason"] == "switch maintenance"
    assert cli(local, "breaker", "status")["paused"] is not None
    assert "already paused" in cli(local, "pause", "--reason", "again", code=2)["error"]
    local.put_event(local.health_event("gpu-2", "XID 79"))  # recorded and held: nothing is touched
    wait_for(lambda: any(i.slurm_node == "gpu-2" and i.status == "held" for i in local.incidents()),
             "the held incident", timeout=60)
    resumed = cli(local, "resume", "--reason", "maintenance done")
    assert resumed["paused"] is None and resumed["breaker"]["state"] == "closed"
    # the operator is told which faults were held, since a one-off XID is not reported again
    [held] = resumed["released_held"]
    assert (held["node"], held["fault"], held["status"]) == ("gpu-2", "XID 79", "held")

    cli(local, "pause", "--reason", "switch maintenance, part two")
    local.put_event(local.health_event("gpu-3", "ECC_DBE"))
    wait_for(lambda: any(i.slurm_node == "gpu-3" and i.status == "held" for i in local.incidents()),
             "the held incident", timeout=60)
    with local.aws.lambdas_held():
        said = CliRunner().invoke(app, ["resume", "--reason", "done again"],
                                  obj=Target(local.stack.name, session=boto3.Session()))
    assert said.exit_code == 0, said.output
    assert "released 1 held incident(s)" in said.output and "gpu-3" in said.output and "ECC_DBE" in said.output


def test_approve_and_deny_answer_a_waiting_incident(local: LocalMode) -> None:
    ssm = local.aws.client("ssm")
    name = local.stack.outputs["SafetyPolicyParameterName"]
    policy = json.loads(ssm.get_parameter(Name=name)["Parameter"]["Value"])
    ssm.put_parameter(Name=name, Value=json.dumps({**policy, "mode": "approval"}), Overwrite=True)
    try:
        waiting = []
        for node in ("gpu-1", "gpu-4"):
            started = cli(local, "remediate", node, "--action", "reboot", "--reason", "flaky NVLink", hold=False)
            wait_for(lambda i=started["incident"]: any(x.incident_id == i and "approval" in x.stages
                                                       for x in local.incidents()), "the approval wait", timeout=60)
            waiting.append(started["incident"])
        # a second request for a node whose incident is open would fold into it and change nothing,
        # while the command said it started: refused, naming the incident and what it waits for
        executions = len(local.executions())
        refused = cli(local, "remediate", "gpu-1", "--action", "replace", "--reason", "still flaky", code=2)
        assert f"gpu-1 is in incident {waiting[0]}, still open" in refused["error"]
        assert f"nodemedic approve {waiting[0]}" in refused["error"] and len(local.executions()) == executions
        # an approval while automation is paused would be stopped before the node is touched, while
        # the command said it went on: refused, the incident still waiting; a denial is answered
        cli(local, "pause", "--reason", "driver rollout suspected")
        refused = cli(local, "approve", waiting[0], "--reason", "go ahead", code=2)["error"]
        assert "automation is paused" in refused and "nodemedic resume" in refused
        assert "approval" in local.incident(waiting[0]).stages and local.incident(waiting[0]).status == "open"
        assert cli(local, "deny", waiting[1], "--reason", "not now")["decision"] == "denied"
        cli(local, "resume", "--reason", "rollout is fine")
        assert cli(local, "approve", waiting[0], "--reason", "go ahead")["decision"] == "approved"
        assert "waits for no approval" in cli(local, "approve", waiting[0], "--reason", "twice", code=2)["error"]
        deadline = time.monotonic() + 90
        while {local.incident(i).status for i in waiting} & {"open"} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [local.incident(i).status for i in waiting] == ["closed", "denied"]
    finally:
        ssm.put_parameter(Name=name, Value=json.dumps(policy), Overwrite=True)


@pytest.mark.parametrize("actions", [("reboot", "replace"), ("reboot", "reboot")])
def test_two_requests_for_one_node_at_once_open_one_incident_and_refuse_the_other(local: LocalMode,
                                                                                  actions: tuple[str, str]) -> None:
    """Two on-calls ask for the same node within a second: both pass the CLI's look (no incident
    holds it yet) and both start an execution. Before, the later Detect folded its request into the
    first's incident while both commands said "started". Now the second is told it was refused
    and why, and one incident holds the node. The same action in the same second is the same
    execution name: named as such, not as AWS's ExecutionAlreadyExists."""
    def idle() -> str | None:  # the module's earlier incidents may still hold nodes (a replacement's burn-in)
        return next((n for n in ("gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5") if local.scheduler.node(n)["State"] == "IDLE"
                     and not any(i.slurm_node == n and i.status == "open" for i in local.incidents())), None)

    node = wait_for(idle, "an idle node no incident holds", timeout=180)
    before = len(local.executions())
    answers: list[Any] = []

    def request(action: str) -> None:
        try:
            answers.append(operator_commands.remediate(Target(local.stack.name, session=boto3.Session()), node,
                                                       action, "NCCL hangs on this node", OPERATOR))
        except OperatorError as exc:
            answers.append(exc)

    with local.aws.lambdas_held():  # both look and start before either Detect runs
        threads = [threading.Thread(target=request, args=(action,)) for action in actions]
        for t in threads:
            t.start()
        wait_for(lambda: len(local.executions()) + len(answers) == before + 2, "both executions", timeout=30)
    for t in threads:
        t.join(timeout=90)
    [opened] = [a for a in answers if isinstance(a, dict)]
    [refused] = [a for a in answers if isinstance(a, OperatorError)]
    assert opened["opened"] and local.incident(opened["incident"]).slurm_node == node
    assert (f"opened no incident, nothing was done: {node} is in incident {opened['incident']}, still open" in str(refused)
            or f"was started this second already, as incident {opened['incident']}" in str(refused)), str(refused)
    assert [i.incident_id for i in local.incidents() if i.slurm_node == node and i.status == "open"] in (
        [opened["incident"]], [])  # the one incident holds the node (or has closed already)
    wait_for(lambda: local.incident(opened["incident"]).status != "open", "the incident's end", timeout=120)
    assert local.incident(opened["incident"]).duplicate_events == 0  # the refused request is not one of its events


def closed_by_hand(local: LocalMode, count: int) -> None:
    """At least ``count`` incidents an operator started have closed on the module's stack: those
    the tests before made, or, where this test runs alone, ones it starts (a reboot of idle nodes)."""
    def closed() -> int:
        return sum(1 for i in local.incidents() if i.fault_class == "manual" and i.status == "closed")

    idle = [n for n in ("gpu-1", "gpu-2", "gpu-3", "gpu-4") if local.scheduler.node(n)["State"] == "IDLE"]
    for node in idle[:max(0, count - closed())]:
        cli(local, "remediate", node, "--action", "reboot", "--reason", "report needs a closed incident", hold=False)
    wait_for(lambda: closed() >= count, f"{count} closed incidents", timeout=120)


def test_report_gives_mttd_mttr_by_fault_class_and_writes_the_html_page(local: LocalMode, tmp_path) -> None:
    closed_by_hand(local, 2)
    page = tmp_path / "report.html"
    result = cli(local, "report", "--html", str(page))
    assert result["incidents"] >= 2 and result["by_status"]["closed"] >= 2
    [manual] = [c for c in result["by_fault_class"] if c["fault_class"] == "manual"]
    assert manual["mttr_s"]["n"] == manual["recovered"] >= 2
    assert manual["mttd_s"]["p50"] <= manual["mttr_s"]["p50"] <= manual["mttr_s"]["p90"]
    assert {"detect", "drain", "repair", "resume"} <= set(result["overall"]["stages_s"])
    text = page.read_text()
    assert text.startswith("<!doctype html>") and "<svg" in text and "http" not in text.split("<body>")[1]
    assert result["html"] == str(page)


def _chromium() -> str:
    import os
    import shutil

    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        if os.environ.get("CI"):
            pytest.fail("CI needs Debian's chromium to render the HTML report (make chromium)")
        pytest.skip("chromium is not installed (make chromium)")
    return found


def test_the_html_report_renders_in_headless_chromium(local: LocalMode, tmp_path) -> None:
    import struct
    import subprocess

    page, shot = tmp_path / "report.html", tmp_path / "report.png"
    cli(local, "report", "--html", str(page))
    browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run([*browser, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert dom.count("<rect") >= 10 and "Stage timeline per incident" in dom  # parsed, SVG bars and all
    subprocess.run([*browser, f"--screenshot={shot}", "--window-size=1200,1000", page.as_uri()],
                   capture_output=True, timeout=60, check=True)
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (1200, 1000)
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one
