"""A stage invoked twice for one incident (a Step Functions retry after a timeout) acts once."""

import json
import time

from nodemedic_sandbox.local import LocalMode


def invoke(local: LocalMode, logical_id: str, payload: dict) -> dict:
    resp = local.aws.client("lambda").invoke(FunctionName=local.stack.resources[logical_id],
                                             Payload=json.dumps(payload).encode())
    body = json.loads(resp["Payload"].read())
    assert "FunctionError" not in resp, body
    return body


def test_each_stage_twice_acts_once(local: LocalMode) -> None:
    event = {"source": "nodemedic.agent", "detail-type": "Node Health Event",
             "detail": local.health_event("gpu-2", "XID 79")}
    old_instance = local.cluster.instance_of("gpu-2")
    detected = invoke(local, "DetectFunction", {"event": event, "incident_id": "inc-twice"})
    assert detected["decision"] == "remediate"
    stage = {"incident": detected["incident"]}

    drains = [invoke(local, "DrainFunction", stage) for _ in range(2)]
    assert drains[0] == drains[1]
    assert len(local.scontrol_commands("state=drain")) == 1

    spared = [invoke(local, "SparesFunction", stage) for _ in range(2)]
    assert spared[0] == spared[1] and spared[0]["spare"] is None  # no pool in this stack

    repaired = [invoke(local, "RepairFunction", {**stage, "destination": "service"}) for _ in range(2)]
    assert repaired[0] == repaired[1] and repaired[0]["rung"] == "replace"
    group = local.cluster.group_instances()
    assert len(group) == 4 and old_instance not in {i["InstanceId"] for i in group}
    ec2 = local.aws.client("ec2")
    all_instances = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    assert sum(i["State"]["Name"] == "terminated" for i in all_instances) == 1, "one termination"
    joins = [c for c in local.cluster.commands if "SLURM_NODE='gpu-2'" in c.script]
    assert len(joins) == 1 and joins[0].instance_id == repaired[0]["instance_id"]

    # this test delivers SSM's status-change event itself, twice: the stack's own delivery is off
    local.aws.client("events").disable_rule(Name=local.stack.resources["HealthCheckResultFunctionCheckEnded"])
    check = {**stage, "instance_id": repaired[0]["instance_id"], "level": "quick", "task_token": "token-1"}
    sent = [invoke(local, "DeepHealthCheckFunction", check) for _ in range(2)]
    assert sent[0] == sent[1]  # the same command: a retried start sends nothing new
    deadline = time.monotonic() + 60  # SSM's status-change event comes once the command has ended
    while not any("health-check" in c.script for c in local.cluster.commands) and time.monotonic() < deadline:
        time.sleep(0.1)
    ssm_event = {"source": "aws.ssm", "detail-type": "EC2 Command Invocation Status-change Notification",
                 "detail": {"command-id": sent[0]["command_id"], "status": "Success"}}
    # an event not in SSM's shape is ignored, whatever its detail holds; the check still waits
    for odd in ({"detail": "cmd"}, {"detail": {"command-id": 7}}, {}):
        assert invoke(local, "HealthCheckResultFunction", odd) == {"answered": False}
    answers = [invoke(local, "HealthCheckResultFunction", ssm_event) for _ in range(2)]
    assert answers[0] == {"answered": True, "healthy": True} and answers[1] == {"answered": False}
    assert len([c for c in local.cluster.commands if "health-check" in c.script]) == 1

    resumed = [invoke(local, "ResumeFunction", stage) for _ in range(2)]
    assert resumed[0] == resumed[1] and resumed[0]["resumed"] is True
    assert len(local.scontrol_commands("state=resume")) == 1
    assert local.incident("inc-twice").status == "closed"
