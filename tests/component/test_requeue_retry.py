"""A drain retried after its requeue command was sent reads that command instead of losing it.

The requeue runs on the Slurm controller through SSM. When the invocation that sent it never
reads its answer (the controller was slow and the wait ran out; SSM's GetCommandInvocation was
throttled), Step Functions retries the stage, and by then the jobs have left the node: a second
requeue finds none. Before, the retry reported "no job requeued", so Spare left the pool alone and
the requeued job waited for a node while a spare sat idle. Here the slurm-requeue document from
template.yaml runs in bash against a Slurm-shaped squeue/scontrol, through the real RunCommand and
the Slurm adapter; SSM is played as AWS documents it (ListCommands filters, executionTimeout kills
the script, GetCommandInvocation says InProgress until the command ends).
"""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from nodemedic.errors import CommandPendingError
from nodemedic.orchestrators.slurm import SlurmViaSSM
from nodemedic.providers.run_command import Documents, RunCommand
from nodemedic_agent.documents import render_document, run_script
from nodemedic_sandbox.aws_rules import SSM_AGENT_PATH, SSM_STDERR_LIMIT, SSM_STDOUT_LIMIT, ssm_agent_timeout
from nodemedic_sandbox.embedded_aws import check_parameters

from tests.component.test_ssm_output_limit import DOCUMENTS, documents, fake_slurm

FAKE_SLURM = r'''
import json, os, sys, time
path = os.environ["FAKE_JOBS"]
jobs = json.load(open(path))
args = sys.argv[1:]
def save():
    json.dump(jobs, open(path + ".tmp", "w")); os.replace(path + ".tmp", path)
if os.path.basename(sys.argv[0]) == "squeue":
    opts = dict(zip(args[1::2], args[2::2])) if args[:1] == ["-h"] else sys.exit(f"fake squeue: {args}")
    if "-w" in opts:
        print("\n".join(j for j, v in jobs.items() if v["state"] == "RUNNING" and opts["-w"] in v["nodes"]))
    elif opts.get("-o") == "%N":
        print(jobs[opts["-j"]]["list"])
    elif opts.get("-o") == "%A %T":
        print("\n".join(f"{j} {jobs[j]['state']}" for j in opts["-j"].split(",") if j in jobs))
elif args[:2] == ["show", "node"] and args[3:] == ["-o"]:  # the requeue reads the node first: drained
    print(f"NodeName={args[2]} Arch=x86_64 NextState=RESUME State={os.environ.get('FAKE_NODE_STATE', 'MIXED+DRAIN')} "
          "Reason=nodemedic:inc-1 XID 79")
elif args[:1] == ["requeue"]:
    if args[1] in os.environ.get("FAKE_HANG", "").split():
        time.sleep(30)  # the controller does not answer; SSM's executionTimeout kills the script
    # a dead node's slurmd never says the job ended: it stays COMPLETING
    jobs[args[1]]["state"] = "COMPLETING" if os.environ.get("FAKE_DEAD_NODE") else "PENDING"
    save()
elif args[:1] == ["update"] and args[1].startswith("jobid=") and args[2:] == ["starttime=now+2"]:
    jobs[args[1].removeprefix("jobid=")]["released"] = True  # held no longer for cred_expire
    save()
else:
    sys.exit(f"fake scontrol: {args}")
'''


class SlowControllerSSM:
    """SSM for one controller, as AWS answers: SendCommand runs the document in bash (killed at
    its executionTimeout, whatever it printed kept); ListCommands filters on DocumentName and
    InvokedAfter; GetCommandInvocation says InProgress for the first ``unanswered`` commands (the
    invocation that sent them gives up waiting) until they are answered."""

    def __init__(self, env: dict[str, str], slurm_bin: Path) -> None:
        self.env = env
        self.documents = documents(ClusterName="c1", SlurmBinDir=str(slurm_bin))
        self.commands: list[dict[str, Any]] = []
        self.invocations: dict[str, dict[str, Any]] = {}
        self.unanswered = 0

    def send_command(self, InstanceIds: list[str], DocumentName: str, Parameters: dict[str, list[str]],  # noqa: N803
                     **_: Any) -> dict[str, Any]:
        document = self.documents[DocumentName]
        check_parameters(DocumentName, document, Parameters)
        command_id = str(uuid.uuid4())
        self.commands.append({"CommandId": command_id, "DocumentName": DocumentName, "Parameters": Parameters,
                              "RequestedDateTime": datetime.now(UTC), "InstanceIds": InstanceIds})
        done = run_script(render_document(document, Parameters), ssm_agent_timeout(Parameters["executionTimeout"][0]),
                          self.env)
        self.invocations[command_id] = {
            "Status": done.status, "ResponseCode": done.exit_code,
            "StandardOutputContent": done.stdout[:SSM_STDOUT_LIMIT], "StandardErrorContent": done.stderr[:SSM_STDERR_LIMIT],
            "silent": self.unanswered > 0}
        self.unanswered -= 1
        return {"Command": {"CommandId": command_id}}

    def get_command_invocation(self, CommandId: str, InstanceId: str) -> dict[str, Any]:  # noqa: N803
        found = self.invocations[CommandId]
        return {"Status": "InProgress"} if found["silent"] else found

    def answer_all(self) -> None:
        for invocation in self.invocations.values():
            invocation["silent"] = False

    def get_paginator(self, operation: str) -> Any:
        assert operation == "list_commands"
        ssm = self

        class _Pages:
            def paginate(self, InstanceId: str, Filters: list[dict[str, str]]) -> list[dict[str, Any]]:  # noqa: N803
                wanted = {f["key"]: f["value"] for f in Filters}
                after = datetime.fromisoformat(wanted["InvokedAfter"].replace("Z", "+00:00"))
                found = [c for c in ssm.commands if InstanceId in c["InstanceIds"]
                         and c["DocumentName"] == wanted["DocumentName"] and c["RequestedDateTime"] >= after]
                return [{"Commands": found[i:i + 2]} for i in range(0, len(found), 2)] or [{"Commands": []}]
        return _Pages()

    def requeues(self) -> int:
        return sum(c["DocumentName"].endswith("-slurm-requeue") for c in self.commands)


@pytest.fixture
def controller(tmp_path: Path) -> tuple[Path, SlowControllerSSM]:
    bin_dir = fake_slurm(tmp_path, FAKE_SLURM, "squeue", "scontrol")
    jobs = tmp_path / "jobs.json"
    env = {**os.environ, "PATH": SSM_AGENT_PATH, "FAKE_JOBS": str(jobs)}
    return jobs, SlowControllerSSM(env, bin_dir)


def _slurm(ssm: SlowControllerSSM, timeout_s: int = 5) -> SlurmViaSSM:
    ticks = itertools.count()  # the wait runs out after timeout_s polls, without sleeping
    runner = RunCommand(ssm, poll_interval=0, sleep=lambda _: None, clock=lambda: float(next(ticks)))
    return SlurmViaSSM(runner, "i-0ctl", timeout_s, Documents("c1"))


def _jobs(path: Path, **jobs: list[str]) -> None:
    path.write_text(json.dumps({job.removeprefix("j"): {"state": "RUNNING", "nodes": nodes,
                                                        "list": ",".join(nodes)} for job, nodes in jobs.items()}))


def _states(path: Path) -> dict[str, str]:
    return {job: v["state"] for job, v in json.loads(path.read_text()).items()}


def test_a_retry_reads_the_requeue_whose_answer_was_lost_and_sends_none_again(controller) -> None:
    jobs, ssm = controller
    _jobs(jobs, j11=["gpu-1", "gpu-2"], j12=["gpu-1"], j13=["gpu-3"])
    started = time.time()
    ssm.unanswered = 1
    with pytest.raises(CommandPendingError):
        _slurm(ssm).evacuate("gpu-1", started)
    assert _states(jobs) == {"11": "PENDING", "12": "PENDING", "13": "RUNNING"}  # done, but unread

    ssm.answer_all()
    out = _slurm(ssm).evacuate("gpu-1", started)  # Step Functions retries the drain
    assert sorted(out.requeued) == ["11", "12"] and out.job_nodes["11"] == ["gpu-1", "gpu-2"]
    assert ssm.requeues() == 1
    # another node's requeue, or one sent before this drain started, is not this drain's
    assert _slurm(ssm).evacuate("gpu-3", started).requeued == ["13"]
    assert _slurm(ssm).evacuate("gpu-1", time.time() + 10).requeued == []


@pytest.mark.parametrize("state", ["MIXED", "IDLE", "ALLOCATED"])
def test_a_node_no_longer_drained_keeps_its_jobs(controller, state: str) -> None:
    """Someone returned the node to service after the drain (``scontrol update state=resume``
    during a checkpoint wait): the document reads the node's State (not NextState) in the same
    command and requeues nothing; the adapter says so."""
    jobs, ssm = controller
    _jobs(jobs, j11=["gpu-1", "gpu-2"])
    ssm.env["FAKE_NODE_STATE"] = state
    out = _slurm(ssm).evacuate("gpu-1", time.time())
    assert out.not_drained == state and out.requeued == [] and _states(jobs) == {"11": "RUNNING"}


def test_a_retry_keeps_what_a_requeue_killed_part_way_did_and_requeues_the_rest(controller) -> None:
    jobs, ssm = controller
    _jobs(jobs, j11=["gpu-1"], j12=["gpu-1", "gpu-4"])
    ssm.env["FAKE_HANG"] = "12"  # the controller hangs on the second job: SSM kills the script
    started = time.time()
    ssm.unanswered = 1
    with pytest.raises(CommandPendingError):
        _slurm(ssm).evacuate("gpu-1", started)
    assert _states(jobs) == {"11": "PENDING", "12": "RUNNING"}

    ssm.env["FAKE_HANG"] = ""
    ssm.answer_all()
    out = _slurm(ssm).evacuate("gpu-1", started)
    assert sorted(out.requeued) == ["11", "12"] and out.job_nodes["12"] == ["gpu-1", "gpu-4"]
    assert out.not_requeued == [] and ssm.requeues() == 2
    assert _states(jobs) == {"11": "PENDING", "12": "PENDING"}


def test_jobs_left_completing_by_a_dead_node_are_requeued_and_released_within_one_wait(controller) -> None:
    """On a dead node every requeued job stays COMPLETING. The release waited up to 15 s for each
    job in turn: six jobs outlasted a 45 s command, SSM killed it, and the drain failed with the
    jobs requeued but still held for cred_expire."""
    jobs, ssm = controller
    _jobs(jobs, **{f"j{n}": ["gpu-1"] for n in range(21, 27)})
    ssm.env["FAKE_DEAD_NODE"] = "1"
    out = _slurm(ssm, timeout_s=45).evacuate("gpu-1")
    assert sorted(out.requeued) == [str(n) for n in range(21, 27)] and out.not_requeued == []
    assert all(job.get("released") for job in json.loads(jobs.read_text()).values())


class SlowCommandSSM:
    """SSM whose commands (a join, a GPU reset) run longer than the stage waits: InProgress until
    ``done``, then succeeded. Parameters are checked against the stack's documents, and
    ListCommands answers as SSM does."""

    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []
        self.done = False

    def send_command(self, InstanceIds: list[str], DocumentName: str, Parameters: dict[str, list[str]],  # noqa: N803
                     **_: Any) -> dict[str, Any]:
        check_parameters(DocumentName, DOCUMENTS[DocumentName], Parameters)
        self.commands.append({"CommandId": f"cmd-{len(self.commands)}", "DocumentName": DocumentName,
                              "Parameters": Parameters, "RequestedDateTime": datetime.now(UTC),
                              "InstanceIds": InstanceIds})
        return {"Command": {"CommandId": self.commands[-1]["CommandId"]}}

    def get_command_invocation(self, CommandId: str, InstanceId: str) -> dict[str, Any]:  # noqa: N803
        if not self.done:
            return {"Status": "InProgress"}
        return {"Status": "Success", "ResponseCode": 0, "StandardOutputContent": "", "StandardErrorContent": ""}

    get_paginator = SlowControllerSSM.get_paginator


def test_a_retried_join_waits_for_the_join_this_replacement_sent_and_sends_no_second() -> None:
    ssm = SlowCommandSSM()
    began = time.time()
    with pytest.raises(CommandPendingError):
        _slurm(ssm).adopt("gpu-1", "i-0new", "nodemedic:inc-1 XID 79", began)
    ssm.done = True
    assert _slurm(ssm).adopt("gpu-1", "i-0new", "nodemedic:inc-1 XID 79", began) == "gpu-1"
    assert len(ssm.commands) == 1
    # an instance that keeps its id across a later replacement (EC2 stop/start) joins again
    assert _slurm(ssm).adopt("gpu-1", "i-0new", "nodemedic:inc-2 XID 79", time.time() + 10) == "gpu-1"
    assert len(ssm.commands) == 2
