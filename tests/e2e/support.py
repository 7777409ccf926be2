"""Helpers of the end-to-end tests: start a stack, drive Slurm and the bus, read the outcome."""

import json
import time

from nodemedic.store.control import ControlStore
from nodemedic_sandbox.local import LocalMode

from tests.conftest import require_slurm


def wait_for(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def job_running(local: LocalMode, job: str, timeout: float = 30.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while (info := local.scheduler.job(job))["JobState"] != "RUNNING":
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} not running after {timeout}s: {info['JobState']} "
                                 f"(Reason={info['Reason']}, StartTime={info['StartTime']})")
        time.sleep(0.2)
    return info


def running_job(local: LocalMode, nodes: int = 2) -> tuple[str, list[str]]:
    job = local.scheduler.submit(nodes)
    return job, local.scheduler.hostnames(job_running(local, job)["NodeList"])


OPERATOR = "oncall@example.com"
# every remediation admitted at once (the safety rails have their own tests)
OPEN = {"BreakerMaxPercent": "100", "BreakerMaxNodes": "100", "NodeCooldownMinutes": "0"}


def stack(nodes: int = 4, spares: int = 0, boot_seconds: float = 0.0, **parameters: str) -> LocalMode:
    require_slurm()
    return LocalMode(nodes=nodes, scheduler="slurm", retry_time_scale=0.01, extra_parameters=parameters,
                     spares=spares, boot_seconds=boot_seconds)


def control(local: LocalMode) -> ControlStore:
    return ControlStore(local.aws.client("dynamodb"), local.stack.table_name, local.cluster.name)


def tag(local: LocalMode, nodes: list[str], key: str, value: str) -> None:
    ids = [local.cluster.instance_of(n) for n in nodes]
    local.aws.client("ec2").create_tags(Resources=ids, Tags=[{"Key": key, "Value": value}])


def put_all(local: LocalMode, details: list[dict]) -> None:
    """Up to 10 health events in one PutEvents call, as an agent batches them."""
    local.aws.client("events").put_events(Entries=[
        {"Source": "nodemedic.agent", "DetailType": "Node Health Event", "EventBusName": local.stack.bus_name,
         "Detail": json.dumps(d)} for d in details])


def latest(executions: list[dict]) -> dict:
    return max(executions, key=lambda e: e["startDate"])


def by_status(local: LocalMode) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for i in local.incidents():
        out.setdefault(i.status, []).append(i.slurm_node)
    return {k: sorted(v) for k, v in out.items()}


def drained_nodes(local: LocalMode) -> set[str]:
    return set(local.drains())


