"""SlurmChannel relay: the pipeline's Slurm documents reach a controller SSM Run Command cannot
reach (a SageMaker HyperPod cluster's: SSM reaches its nodes only through Session Manager) through
the stack's relay queue and ``nodemedic-agent relay`` on the controller. The local stack runs the
agent's own relay, signing as the controller's role with the stack's RelayPolicy attached, against
real Slurm; every call both sides make is authorized against the template's policies."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from nodemedic.contracts.relay import RelayRequest, relay_key
from nodemedic.providers.relay_command import RelayCommand
from nodemedic.providers.run_command import Documents
from nodemedic_sandbox.local import LocalMode

from tests.e2e.support import OPEN, job_running, running_job, stack, wait_for

RELAY = {**OPEN, "SlurmChannel": "relay"}


def _relayed(local: LocalMode) -> RelayCommand:
    return RelayCommand(local.aws.client("sqs"), local.stack.outputs["RelayQueueUrl"], local.aws.client("dynamodb"),
                        local.stack.table_name, poll_interval=0.2)


def test_a_fault_on_a_running_job_is_remediated_through_the_relay_with_no_ssm_command_to_the_controller() -> None:
    with stack(nodes=4, **RELAY) as local:
        job, nodes = running_job(local)
        sick = nodes[0]
        local.put_event(local.health_event(sick, "XID 79"))
        [execution] = local.wait_for_executions(1)
        assert execution["status"] == "SUCCEEDED", execution.get("cause")
        incident = local.incident(execution["name"])
        assert incident.status == "closed"
        assert int(job_running(local, job)["Restarts"]) == 1  # drained and requeued through the relay
        wait_for(lambda: "DRAIN" not in local.scheduler.node(sick)["State"], "the node back in service")
        assert local.relay is not None and local.relay.ran >= 4 and local.relay.refused == 0
        # nothing reached the controller through SSM: the replacement's join and check still do (SSM reaches it)
        assert local.scontrol_commands("scontrol") == []
        assert local.aws.client("ssm").list_commands(InstanceId=local.cluster.controller_id)["Commands"] == []


def test_the_relay_runs_each_request_once_and_refuses_what_the_pipeline_did_not_record() -> None:
    with stack(nodes=2, **RELAY) as local:
        relayed, docs = _relayed(local), Documents(local.cluster.name)
        controller = local.cluster.controller_id
        out = relayed.run_checked(controller, docs.slurm_query, {"operation": "node", "node": "gpu-1"}, 60)
        assert "NodeName=gpu-1" in out
        # SQS delivers at least once: the same request delivered again runs nothing again
        [command_id] = relayed.sent_since(controller, docs.slurm_query, {"operation": "node", "node": "gpu-1"}, 0)
        ran = local.relay.ran  # type: ignore[union-attr]
        local.aws.client("sqs").send_message(QueueUrl=local.stack.outputs["RelayQueueUrl"],
                                             MessageBody=json.dumps({"command_id": command_id}))
        # a message naming no recorded request, and a record the relay must refuse (another
        # cluster's document; a parameter its document's allowedPattern refuses)
        sqs, db = local.aws.client("sqs"), local.aws.client("dynamodb")
        sqs.send_message(QueueUrl=local.stack.outputs["RelayQueueUrl"], MessageBody=json.dumps({"command_id": "f" * 32}))
        # and one no key could hold (DynamoDB would refuse it every time it came back)
        sqs.send_message(QueueUrl=local.stack.outputs["RelayQueueUrl"], MessageBody=json.dumps({"command_id": "x" * 3000}))
        refused = {}
        query = {"operation": ["node"], "node": ["gpu-1"]}
        for why, document, parameters, instance in [
                ("not a document of cluster", "nodemedic-other-slurm-query", query, controller),
                ("InvalidParameters", docs.slurm_drain, {"node": ["gpu-1; reboot"], "reason": ["x"]}, controller)]:
            request = RelayRequest(command_id=uuid.uuid4().hex, instance_id=instance, document=document,
                                   parameters=parameters, timeout_s=30, sent_at=datetime.now(UTC))
            db.put_item(TableName=local.stack.table_name, Item={"pk": {"S": relay_key(request.command_id)},
                                                                "status": {"S": "Pending"},
                                                                "request": {"S": request.model_dump_json()}})
            sqs.send_message(QueueUrl=local.stack.outputs["RelayQueueUrl"],
                             MessageBody=json.dumps({"command_id": request.command_id}))
            refused[request.command_id] = why
        # a request the relay was running when it stopped (its message came back): not run again, failed
        cut = RelayRequest(command_id=uuid.uuid4().hex, instance_id=controller, document=docs.slurm_drain,
                           parameters={"node": ["gpu-1"], "reason": ["nodemedic:cut"]}, timeout_s=30,
                           sent_at=datetime.now(UTC))
        db.put_item(TableName=local.stack.table_name, Item={"pk": {"S": relay_key(cut.command_id)},
                                                            "status": {"S": "InProgress"},
                                                            "request": {"S": cut.model_dump_json()}})
        sqs.send_message(QueueUrl=local.stack.outputs["RelayQueueUrl"], MessageBody=json.dumps({"command_id": cut.command_id}))
        refused[cut.command_id] = "the relay stopped while the command ran"
        for command_id, why in refused.items():
            result = relayed.wait(controller, command_id, 30)
            assert (result.status, why in result.stderr) == ("Failed", True), (why, result)
        wait_for(lambda: local.relay.refused == 4, "the relay to refuse the four")  # type: ignore[union-attr]
        assert local.aws.client("sqs").get_queue_attributes(  # every message taken off the queue
            QueueUrl=local.stack.outputs["RelayQueueUrl"], AttributeNames=["ApproximateNumberOfMessagesNotVisible",
                                                                          "ApproximateNumberOfMessages"])["Attributes"] \
            == {"ApproximateNumberOfMessagesNotVisible": "0", "ApproximateNumberOfMessages": "0"}
        assert local.relay.ran == ran  # type: ignore[union-attr]
        assert "DRAIN" not in local.scheduler.node("gpu-1")["State"]


def test_a_request_whose_sender_stopped_waiting_is_refused_not_run_late() -> None:
    """The relay was down, or its queue's message came back late: a drain the stage gave up on
    (it failed, or sent another) would drain a node that may be back in service by now."""
    with stack(nodes=2, **RELAY) as local:
        docs, db = Documents(local.cluster.name), local.aws.client("dynamodb")
        request = RelayRequest(command_id=uuid.uuid4().hex, instance_id=local.cluster.controller_id,
                               document=docs.slurm_drain, parameters={"node": ["gpu-1"], "reason": ["nodemedic:late"]},
                               timeout_s=30, sent_at=datetime.now(UTC) - timedelta(seconds=90))
        db.put_item(TableName=local.stack.table_name, Item={"pk": {"S": relay_key(request.command_id)},
                                                            "status": {"S": "Pending"},
                                                            "request": {"S": request.model_dump_json()}})
        local.aws.client("sqs").send_message(QueueUrl=local.stack.outputs["RelayQueueUrl"],
                                             MessageBody=json.dumps({"command_id": request.command_id}))
        result = _relayed(local).wait(local.cluster.controller_id, request.command_id, 30)
        assert result.status == "Failed" and "too late" in result.stderr
        assert "DRAIN" not in local.scheduler.node("gpu-1")["State"]


def test_a_relay_ssm_throttles_runs_the_request_a_moment_later_and_does_not_fail_it() -> None:
    """SSM throttles the relay's GetDocument beyond its SDK's retries, before it read the document
    once: the request waits (its message comes back, which the controller's role may ask for) and
    then runs; the drain is done, not failed."""
    with stack(nodes=2, **RELAY) as local:
        docs, controller = Documents(local.cluster.name), local.cluster.controller_id
        throttle = local.aws.throttle("ssm", "GetDocument", caller="relay", times=6)
        out = _relayed(local).run_checked(controller, docs.slurm_drain,
                                          {"node": "gpu-1", "reason": "nodemedic:throttled", "takeover": "-"}, 60)
        assert out.strip().splitlines()[-1] == "drained" and len(throttle.hits) == 6
        assert "DRAIN" in local.scheduler.node("gpu-1")["State"]
        assert local.relay is not None and local.relay.refused == 0 and not local.aws.denials


def test_the_doctor_passes_on_a_relay_stack_and_names_a_relay_that_does_not_answer() -> None:
    from tests.e2e.test_doctor import doctor

    with stack(nodes=2, CommandTimeoutSeconds="10", **RELAY) as local:
        code, rows = doctor(local)
        failed = {k: r for k, r in rows.items() if r["status"] == "fail" and k != "heartbeats"}
        assert not failed, failed  # each function may use the relay; the controller answers through it
        assert rows["scheduler"]["detail"] == "2 Slurm nodes"
        assert local.relay is not None
        local.stop_relay(local.relay)  # the relay on the controller stopped
        code, rows = doctor(local)
        assert code == 1 and rows["scheduler"]["status"] == "fail"
        assert "nodemedic-agent relay" in rows["scheduler"]["detail"]


def test_a_relay_on_a_backup_controller_runs_the_work_when_the_named_one_is_down() -> None:
    """A HyperPod Slurm cluster may have several controller nodes (multi-head: a primary and
    backups), each with its relay. Requests name the controller the stack knows; a relay refused
    every request named for another instance, and failed it: with that controller down (or
    replaced, under a new id), every drain, requeue and resume failed while a backup stood by.
    Now any controller's relay runs it (scontrol reaches the active slurmctld from any), once."""
    with stack(nodes=2, **RELAY) as local:
        assert local.relay is not None
        backup = local.start_relay("i-0b0b0b0b0b0b0b0b0")
        local.stop_relay(local.relay)  # the controller the stack names is down
        relayed, docs = _relayed(local), Documents(local.cluster.name)
        controller = local.cluster.controller_id
        out = relayed.run_checked(controller, docs.slurm_query, {"operation": "node", "node": "gpu-1"}, 60)
        assert "NodeName=gpu-1" in out and backup.ran == 1
        [command_id] = relayed.sent_since(controller, docs.slurm_query, {"operation": "node", "node": "gpu-1"}, 0)
        record = local.aws.client("dynamodb").get_item(TableName=local.stack.table_name,
                                                       Key={"pk": {"S": relay_key(command_id)}})["Item"]
        assert record["ran_on"]["S"] == "i-0b0b0b0b0b0b0b0b0"  # which controller ran it
