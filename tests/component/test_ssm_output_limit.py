"""SSM returns only the first 24,000 characters a command prints (GetCommandInvocation). A
``scontrol show nodes -o`` record is ~700-900 characters, so on AWS a cluster of more than about 30
nodes was listed cut short, its last record cut mid-field. The slurm-query document from
template.yaml runs here in bash against an scontrol that answers like Slurm 22.05 for a cluster of
hundreds of nodes, through the real RunCommand, with AWS's cut applied: every node is read, in
pages; and an answer SSM cut is never read at all. The same harness reads drain reasons as the
documents do: from the node's Reason field, whatever text an operator's reason or Comment holds."""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from nodemedic.errors import CommandFailedError
from nodemedic.orchestrators.slurm import SlurmViaSSM
from nodemedic.providers.run_command import CommandResult, Documents, RunCommand
from nodemedic.stages.health_check import parse_report
from nodemedic_agent.documents import render_document, run_script
from nodemedic_agent.report import REPORT_LIMIT, fitted
from nodemedic_sandbox.aws_rules import SSM_AGENT_PATH, SSM_STDERR_LIMIT, SSM_STDOUT_LIMIT
from nodemedic_sandbox.embedded_aws import check_parameters
from samtranslator.yaml_helper import yaml_parse

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = yaml_parse((ROOT / "template.yaml").read_text())
RESOURCES = TEMPLATE["Resources"]


def documents(**parameters: str) -> dict[str, dict[str, Any]]:
    """The stack's Command documents by name as CloudFormation creates them: ``!Sub`` and ``!Ref``
    of the template's parameters (these, else their defaults) resolved."""
    values = {k: str(spec.get("Default", "")) for k, spec in TEMPLATE["Parameters"].items()} | parameters

    def resolved(value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"Fn::Sub"}:
            return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], value["Fn::Sub"])
        if isinstance(value, dict) and set(value) == {"Ref"}:
            return values[value["Ref"]]
        if isinstance(value, dict):
            return {k: resolved(v) for k, v in value.items()}
        return [resolved(v) for v in value] if isinstance(value, list) else value

    return {resolved(r["Properties"]["Name"]): resolved(r["Properties"]["Content"])
            for r in RESOURCES.values() if r["Type"] == "AWS::SSM::Document"}


DOCUMENTS = documents(ClusterName="c1")

# what Slurm 22.05 prints for a node (tests/component: measured on the local cluster), padded to a
# p5's length with the fields a real GPU node has more of
RECORD = ("NodeName={name} Arch=x86_64 CoresPerSocket=48  CPUAlloc=0 CPUEfctv=192 CPUTot=192 CPULoad=1.04 "
          "AvailableFeatures=p5.48xlarge,efa,nvlink ActiveFeatures=p5.48xlarge,efa,nvlink Gres=gpu:h100:8(S:0-1) "
          "NodeAddr=10.1.{i}.7 NodeHostName=ip-10-1-0-7 Port=6818 Version=22.05.8 OS=Linux 6.1.0-18-cloud-amd64 #1 "
          "SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)  RealMemory=2000000 AllocMem=0 FreeMem=1998000 Sockets=2 "
          "Boards=1 State={state} ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu,train  "
          "BootTime=2026-11-25T05:43:00 SlurmdStartTime=2026-11-25T09:37:54 LastBusyTime=2026-11-25T09:37:54 "
          "CfgTRES=cpu=192,mem=2000000M,billing=192,gres/gpu=8 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 "
          "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s{reason}")

SCONTROL = r'''
import json, os, sys
nodes = json.load(open(os.environ["FAKE_NODES"]))
args = sys.argv[1:]
def record(i, n):
    reason = f" Reason={n['reason']} [root@2026-11-25T09:37:54]" if n["reason"] else ""
    reason += f" Comment={n['comment']}" if n.get("comment") else ""
    print(os.environ["FAKE_RECORD"].format(name=n["name"], i=i % 250, state=n["state"], reason=reason))
if args[:2] == ["show", "nodes"]:
    for i, n in enumerate(nodes): record(i, n)
elif args[:2] == ["show", "node"]:
    [record(i, n) for i, n in enumerate(nodes) if n["name"] == args[2]] or sys.exit("node not found")
elif args[:2] == ["show", "reservation"]:
    print(f"ReservationName={args[2]} Nodes=" + ",".join(n["name"] for n in nodes if n.get("spare")) + " State=ACTIVE")
elif args[:1] == ["update"]:
    open(os.environ["FAKE_NODES"] + ".updates", "a").write(" ".join(args[1:]) + "\n")
elif args[:2] == ["show", "hostnames"]:
    print("\n".join(args[2].split(",")))
else:
    sys.exit(f"fake scontrol: {args}")
'''


class ShellSSM:
    """SSM for one controller: SendCommand runs the document's shell here as SSM's agent does;
    GetCommandInvocation answers as AWS does, with the first characters of each stream only."""

    def __init__(self, env: dict[str, str], slurm_bin: Path) -> None:
        self.env = env
        self.documents = documents(ClusterName="c1", SlurmBinDir=str(slurm_bin))
        self.invocations: dict[str, dict[str, Any]] = {}

    def send_command(self, InstanceIds: list[str], DocumentName: str, Parameters: dict[str, list[str]],  # noqa: N803
                     **_: Any) -> dict[str, Any]:
        document = self.documents[DocumentName]
        check_parameters(DocumentName, document, Parameters)
        done = run_script(render_document(document, Parameters), 60, self.env)
        command_id = str(uuid.uuid4())
        self.invocations[command_id] = {
            "Status": done.status, "ResponseCode": done.exit_code,
            "StandardOutputContent": done.stdout[:SSM_STDOUT_LIMIT],
            "StandardErrorContent": done.stderr[:SSM_STDERR_LIMIT], "printed": len(done.stdout)}
        return {"Command": {"CommandId": command_id}}

    def get_command_invocation(self, CommandId: str, InstanceId: str) -> dict[str, Any]:  # noqa: N803
        return self.invocations[CommandId]


def fake_slurm(tmp_path: Path, source: str, *tools: str) -> Path:
    """A directory of Slurm ``tools`` that run ``source``, where ParallelCluster puts Slurm (the
    stack's ``SlurmBinDir``), not on the PATH SSM's agent gives a script."""
    bin_dir = tmp_path / "opt-slurm" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in tools:
        (bin_dir / tool).write_text(f"#!{sys.executable}\n{source}")
        (bin_dir / tool).chmod(0o755)
    return bin_dir


@pytest.fixture
def cluster(tmp_path: Path) -> tuple[Path, ShellSSM]:
    bin_dir = fake_slurm(tmp_path, SCONTROL, "scontrol")
    nodes_file = tmp_path / "nodes.json"
    env = {**os.environ, "PATH": SSM_AGENT_PATH, "FAKE_NODES": str(nodes_file), "FAKE_RECORD": RECORD}
    return nodes_file, ShellSSM(env, bin_dir)


def _slurm(ssm: ShellSSM) -> SlurmViaSSM:
    return SlurmViaSSM(RunCommand(ssm, poll_interval=0), "i-0ctl", 60, Documents("c1"), spare_reservation="spares")


def test_every_node_of_a_2000_node_cluster_is_read_in_pages_each_within_what_ssm_returns(cluster) -> None:
    nodes_file, ssm = cluster
    nodes = [{"name": f"p5-{i:04d}", "state": "IDLE", "reason": ""} for i in range(2000)]
    nodes[7].update(state="IDLE+DRAIN", reason="nodemedic:inc-1 XID 79")
    nodes[1000].update(state="DOWN+DRAIN+NOT_RESPONDING", reason="Not responding")
    nodes[1999].update(state="ALLOCATED+DRAIN", reason="rma ticket=42 by bob", comment="rack 4")
    nodes_file.write_text(json.dumps(nodes))

    statuses = _slurm(ssm).nodes()

    assert [s.name for s in statuses] == [n["name"] for n in nodes]
    assert (statuses[7].state, statuses[7].reason) == ("IDLE+DRAIN", "nodemedic:inc-1 XID 79")
    # an operator's reason may hold "word=" and be followed by a Comment: it is read whole
    assert (statuses[1999].state, statuses[1999].reason) == ("ALLOCATED+DRAIN", "rma ticket=42 by bob")
    assert _slurm(ssm).node_status("p5-1999").reason == "rma ticket=42 by bob"
    assert statuses[1000].state == "DOWN+DRAIN+NOT_RESPONDING" and statuses[1000].reason == "Not responding"
    pages = list(ssm.invocations.values())
    assert len(pages) >= 2 and all(p["printed"] < SSM_STDOUT_LIMIT for p in pages)
    assert 2000 * len(RECORD) > 10 * SSM_STDOUT_LIMIT  # the whole records would never have fitted


def test_a_spare_pool_of_sixty_nodes_is_read_whole(cluster) -> None:
    nodes_file, ssm = cluster
    nodes = [{"name": f"p5-{i:04d}", "state": "IDLE+RESERVED", "reason": "", "spare": i >= 40} for i in range(100)]
    nodes_file.write_text(json.dumps(nodes))
    assert [s.name for s in _slurm(ssm).spares()] == [f"p5-{i:04d}" for i in range(40, 100)]


def test_an_answer_ssm_cut_is_refused_not_read(cluster) -> None:
    """A node record that alone is longer than what SSM returns: the single-node read fails with
    the reason instead of reading a record cut mid-field."""
    nodes_file, ssm = cluster
    nodes_file.write_text(json.dumps([{"name": "gpu-1", "state": "IDLE+DRAIN", "reason": "x" * 30_000}]))
    with pytest.raises(CommandFailedError, match="first 24,000 characters"):
        _slurm(ssm).node_status("gpu-1")


def _result(stdout: str, status: str = "Success", code: int = 0) -> CommandResult:
    return CommandResult("i-1", "cmd-1", status, code, stdout, "")


def test_a_health_report_is_healthy_only_when_it_says_true_and_arrived_whole() -> None:
    whole = json.dumps({"healthy": True, "checks": [{"name": "gpu", "ok": True}, "junk", 7]})
    assert parse_report(_result(whole)) == (True, [{"name": "gpu", "ok": True}])
    for healthy in ("true", "false", 1, [True], None):
        ok, _ = parse_report(_result(json.dumps({"healthy": healthy, "checks": []})))
        assert ok is False, healthy
    ok, checks = parse_report(_result(("log line\n" * 3000)[:SSM_STDOUT_LIMIT]))
    assert ok is False and "cut off" in checks[0]["detail"]
    # nested deeper than the JSON decoder goes: a RecursionError failed the answer, and the rung
    # waited out its whole timeout instead of hearing "unhealthy" at once
    for deep in ("[" * 11_000 + "]" * 11_000, '{"healthy": true, "checks": [' + "[" * 5_000 + "]" * 5_000 + "]}"):
        ok, checks = parse_report(_result(deep))
        assert ok is False and "no health report" in checks[0]["detail"]


def test_the_agents_report_fits_what_ssm_returns_whatever_a_tool_printed() -> None:
    measurements = [{"target": f"GPU {g}", "metric": "gemm_tflops", "value": 700.0, "threshold": 600}
                    for g in range(2000)]
    report = {"healthy": False, "level": "full", "checks": [
        {"name": "dcgm_diag", "ok": False, "status": "failed", "detail": "E" * 50_000, "findings": ["X"]},
        {"name": "gpu_burn", "ok": True, "status": "healthy", "detail": "ok", "measurements": measurements}]}
    line = fitted(report)
    assert len(line) <= REPORT_LIMIT < SSM_STDOUT_LIMIT
    ok, checks = parse_report(_result(line, "Failed", 1))
    assert ok is False and [c["ok"] for c in checks] == [False, True]
    assert checks[0]["detail"].endswith("...") and checks[1]["measurements_dropped"] == 2000
    small = {"healthy": True, "checks": [{"name": "gpu", "ok": True, "detail": "8 GPUs", "measurements": [{"v": 1}]}]}
    assert json.loads(fitted(small)) == small  # a report that fits is printed as it is


@pytest.mark.parametrize("reason", ["hold Reason=nodemedic:inc-5 XID 79", "rma"])
def test_an_operators_drain_is_not_taken_for_nodemedics_by_reason_text_that_names_an_incident(
        cluster, reason: str) -> None:
    """The resume and drain documents read the node's Reason from its field, not from the last
    "Reason=" in the record: an operator's reason, or a Comment after it, that names an incident
    does not make the drain NodeMedic's."""
    nodes_file, ssm = cluster
    nodes_file.write_text(json.dumps([{"name": "gpu-1", "state": "IDLE+DRAIN", "reason": reason,
                                       "comment": "was Reason=nodemedic:inc-5 XID 79"}]))
    slurm = _slurm(ssm)
    assert slurm.resume("gpu-1", owner="nodemedic:inc-5") is False
    assert slurm.drain("gpu-1", "nodemedic:inc-6 XID 79", takeover="nodemedic:") is False
    assert not Path(f"{nodes_file}.updates").exists(), "the operator's drain was changed"


def test_a_node_running_a_thousand_jobs_has_each_signalled_and_read_in_lists_ssm_takes(tmp_path: Path) -> None:
    """The signal and job-state documents take the jobs as one parameter of at most 4,000
    characters (their allowedPattern): a node with a thousand 8-digit jobs (8,999 characters)
    had its checkpoint request refused by SSM, and the drain failed. Now the jobs go in lists
    that fit, each answer within what SSM returns."""
    bin_dir = tmp_path / "opt-slurm" / "bin"
    bin_dir.mkdir(parents=True)
    for tool, script in (("scancel", "exit 0"), ("squeue", 'echo "RUNNING|2026-11-28T10:00:00"')):
        (bin_dir / tool).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / tool).chmod(0o755)
    ssm = ShellSSM({**os.environ, "PATH": SSM_AGENT_PATH}, bin_dir)
    jobs = [str(10_000_000 + n) for n in range(1000)]

    assert _slurm(ssm).request_checkpoint("gpu-1", jobs, "USR1", "batch") == []
    states = _slurm(ssm).job_states(jobs)

    assert sorted(states) == jobs and {s.state for s in states.values()} == {"RUNNING"}
    assert all(s.started_at for s in states.values())
    assert len(ssm.invocations) == 6 and all(i["printed"] < SSM_STDOUT_LIMIT for i in ssm.invocations.values())
