"""The local mode in one object: embedded AWS + local scheduler + simulated cluster + the
deployed ``template.yaml``. Tests, benchmarks and the demo all start it the same way."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from nodemedic.contracts.incident import Incident
from nodemedic.store.ledger import Ledger
from nodemedic_agent.relay import Relay

from nodemedic_sandbox import scheduler as scheduler_mod
from nodemedic_sandbox.agents import NodeAgents
from nodemedic_sandbox.cluster import SimCluster
from nodemedic_sandbox.deploy import Stack, deploy
from nodemedic_sandbox.embedded_aws import RELAY_KEY, SQS_SERVERS, EmbeddedAWS, as_aws_service

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
TERMINAL = {"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"}


class LocalMode:
    """``with LocalMode(nodes=4) as local: ...`` deploys everything; leaving stops it all."""

    def __init__(self, nodes: int = 4, scheduler: str = "auto", retry_time_scale: float = 1.0,
                 stack_name: str = "nodemedic-local", extra_parameters: dict[str, str] | None = None,
                 schedule_scale: float | None = None, task_timeout_scale: float = 1.0, spares: int = 0,
                 boot_seconds: float = 0.0, expect_denials: bool = False, template: Path = TEMPLATE,
                 provider: str = "autoscaling") -> None:
        """``scheduler``: ``auto``, ``slurm``, ``simulated`` or ``kubernetes`` (see
        :func:`nodemedic_sandbox.scheduler.create`). ``provider``: where the instances come from,
        ``autoscaling`` (an Auto Scaling group) or, on Kubernetes, ``karpenter`` (a static NodePool
        whose Karpenter the local mode plays). ``schedule_scale``: fire the template's
        scheduled rules (the silence sweeper) with their periods multiplied by it; ``None`` leaves
        them unfired. ``spares``: how many more nodes
        start in the hot-spare reservation. ``boot_seconds``: how long a new or rebooted
        instance takes to answer (the published ~900 s, scaled down for a run). Every call a deployed
        function makes is authorized against its role; leaving raises ``PermissionError`` listing any
        call that was denied, unless ``expect_denials`` (a test of a broken deployment)."""
        self.expect_denials = expect_denials
        self.template = template
        self.node_names = [f"gpu-{i}" for i in range(1, nodes + spares + 1)]
        self.spare_names = self.node_names[nodes:]
        self.boot_seconds = boot_seconds
        self.provider = provider
        self.prefer = scheduler
        self.stack_name = stack_name
        self.extra_parameters = extra_parameters or {}
        self.aws = EmbeddedAWS(retry_time_scale=retry_time_scale, task_timeout_scale=task_timeout_scale)
        self.scheduler_note = ""
        self.schedule_scale = schedule_scale
        self.agents: NodeAgents | None = None
        self.relay: Relay | None = None  # the one on the controller the stack names
        self._relays: list[tuple[Relay, threading.Thread]] = []

    def __enter__(self) -> LocalMode:
        self.aws.start()
        try:
            self.scheduler, self.scheduler_note = scheduler_mod.create(self.node_names, prefer=self.prefer)
            self.scheduler.start()
            self.cluster = SimCluster(self.aws, self.scheduler, spares=self.spare_names,
                                      boot_seconds=self.boot_seconds, provider=self.provider)
            self.cluster.create()
            self.aws.command_host = self.cluster
            params = {**self.cluster.template_parameters(), **self.extra_parameters}
            self.stack: Stack = deploy(self.aws, self.template, self.stack_name, params)
            self.ledger = Ledger(self.aws.client("dynamodb"), self.stack.table_name)
            self._escalation_queue = self._subscribe_queue(self.stack.topic_arn)
            if params.get("SlurmChannel") == "relay":
                self.relay = self.start_relay(self.cluster.controller_id)
            if self.schedule_scale is not None:
                self.aws.start_schedules(self.schedule_scale)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.agents is not None:
            self.agents.stop()
        self.aws.end_executions()  # while the relays and the scheduler its Lambda tasks in flight call still run
        for relay, thread in self._relays:
            relay.stop_event.set()
            thread.join(timeout=30)
        if hasattr(self, "scheduler"):
            self.scheduler.stop()
            shutil.rmtree(self.scheduler.root, ignore_errors=True)  # the cluster's temp dir: nothing is left
        self.aws.stop()
        if self.aws.denials and not self.expect_denials and not any(exc):
            raise PermissionError("IAM denied calls that template.yaml's roles must allow (AWS would too):\n"
                                  + "\n".join(f"- {d}" for d in self.aws.denials))

    def start_relay(self, instance_id: str) -> Relay:
        """``nodemedic-agent relay`` on a controller node ``instance_id`` (SlurmChannel relay; a
        second one: a backup controller of a multi-head cluster): the agent's own code, signing as
        the controllers' role (the stack's RelayPolicy attached), running the documents against
        this cluster's Slurm as the local SSM would. Stopped when the stack is."""
        def as_controller(service: str) -> Any:
            return boto3.client(service, region_name=self.aws.region, aws_access_key_id=RELAY_KEY,  # type: ignore[call-overload]
                                aws_secret_access_key="local")

        relay = Relay(cluster=self.cluster.name, instance_id=instance_id, queue_url=self.stack.outputs["RelayQueueUrl"],
                      table=self.stack.table_name, sqs=as_controller("sqs"), ssm=as_controller("ssm"),
                      dynamodb=as_controller("dynamodb"), env=self.cluster.command_env(self.cluster.controller_id),
                      receive_wait_s=1)
        thread = threading.Thread(target=relay.serve, name=f"nodemedic-relay-{instance_id}", daemon=True)
        thread.start()
        self._relays.append((relay, thread))
        return relay

    def stop_relay(self, relay: Relay) -> None:
        """Stop ``relay`` (its controller down) once the requests it runs are done."""
        relay.stop_event.set()
        for started, thread in self._relays:
            if started is relay:
                thread.join(timeout=30)

    def start_agents(self, heartbeat_s: float = 15.0, poll_s: float = 2.0, reassert_s: float = 60.0,
                     scheduled_s: float = 300.0) -> NodeAgents:
        """A real node agent on every node (simulated hardware), publishing to the stack's bus and
        reading the pipeline's decisions on its events from the stack's ledger."""
        self.agents = NodeAgents(self.cluster, self.stack.bus_name, self.node_names, heartbeat_s, poll_s,
                                 table=self.stack.table_name, reassert_s=reassert_s, scheduled_s=scheduled_s).start()
        return self.agents

    # -- inputs -----------------------------------------------------------------------------
    def health_event(self, node: str, fault_code: str = "XID 79", *, observed_at: datetime | None = None,
                     gpu: int = 0, **overrides: Any) -> dict[str, Any]:
        """A valid Node Health Event v1 ``detail`` for ``node`` (as the agent would send it)."""
        now = datetime.now(UTC)
        detail: dict[str, Any] = {
            "schema_version": "1", "event_id": str(uuid.uuid4()), "cluster": self.cluster.name,
            "node": {"instance_id": self.cluster.instance_of(node), "hostname": f"{node}.local",
                     # the agent's DaemonSet reports its Kubernetes node name (spec.nodeName)
                     "k8s_node" if self.cluster.kubernetes else "slurm_node": node},
            "check": "kernel_log", "component": {"kind": "gpu", "index": gpu},
            "fault_code": fault_code, "severity": "critical",
            "observed_at": (observed_at or now).isoformat(), "sent_at": now.isoformat(),
            "evidence": {"kmsg": f"NVRM: Xid (PCI:0000:{gpu:02x}:00): {fault_code.split()[-1]}"},
        }
        detail.update(overrides)
        return detail

    def put_event(self, detail: dict[str, Any], source: str = "nodemedic.agent",
                  detail_type: str = "Node Health Event") -> dict[str, Any]:
        sent: dict[str, Any] = self.aws.client("events").put_events(Entries=[{
            "Source": source, "DetailType": detail_type, "EventBusName": self.stack.bus_name,
            "Detail": json.dumps(detail)}])
        return sent

    def emit_as_aws(self, event: dict[str, Any], at: datetime | None = None) -> dict[str, Any]:
        """An AWS service's part: deliver an ``aws.*`` event (its documented shape, e.g. a sample
        from events/aws-health/ or events/aws-ec2/) to the account's default bus, as AWS Health or
        EC2 does, stamped ``at`` (now unless given: the sample's own ``time`` is not used). (Real
        EventBridge refuses PutEvents with an ``aws.*`` source from a caller, and so does the
        embedded one; only this harness, playing AWS, sends one.)"""
        entry = {"Source": event["source"], "DetailType": event["detail-type"], "Resources": event.get("resources", []),
                 "Detail": json.dumps(event["detail"]), **({"Time": at} if at else {})}
        with as_aws_service():
            sent: dict[str, Any] = self.aws.client("events").put_events(Entries=[entry])
        return sent

    def _subscribe_queue(self, topic_arn: str) -> str:
        sqs = self.aws.client("sqs")
        url = sqs.create_queue(QueueName=f"{self.stack_name}-escalations")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.aws.client("sns").subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=arn)
        return str(url)

    def escalations(self) -> list[dict[str, Any]]:
        """SNS notifications published to the escalation topic so far (drained from the queue). A
        short poll of the local SQS reads one of its servers in turn (embedded_aws.SQS_SERVERS), so
        the queue, read by this one reader, is empty once each server answered empty in a row (a
        long poll would tell it too, after waiting its second)."""
        sqs = self.aws.client("sqs")
        messages: list[dict[str, Any]] = []
        empty = 0
        while empty < SQS_SERVERS:
            batch = sqs.receive_message(QueueUrl=self._escalation_queue, MaxNumberOfMessages=10).get("Messages", [])
            empty = 0 if batch else empty + 1
            for m in batch:
                messages.append(json.loads(m["Body"]))
                sqs.delete_message(QueueUrl=self._escalation_queue, ReceiptHandle=m["ReceiptHandle"])
        return messages

    # -- observing ---------------------------------------------------------------------------
    def executions(self) -> list[dict[str, Any]]:
        pages = self.aws.client("stepfunctions").get_paginator("list_executions")
        return [e for page in pages.paginate(stateMachineArn=self.stack.state_machine_arn) for e in page["executions"]]

    def wait_for_executions(self, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Wait until ``count`` executions exist and all have ended; return their descriptions."""
        sfn = self.aws.client("stepfunctions")
        deadline = time.monotonic() + timeout
        while True:
            listed = time.monotonic()
            execs = self.executions()
            if len(execs) >= count and all(e["status"] in TERMINAL for e in execs):
                return [sfn.describe_execution(executionArn=e["executionArn"]) for e in execs]
            if time.monotonic() > deadline:
                states = [(e["name"], e["status"]) for e in execs]
                raise TimeoutError(f"executions not done after {timeout}s: {states}")
            # listing a thousand executions takes a while: poll no more than half the time
            time.sleep(max(0.1, time.monotonic() - listed))

    @staticmethod
    def detect_decision(execution: dict[str, Any]) -> str | None:
        """What Detect decided in a finished execution (None if it never decided)."""
        decision = json.loads(execution.get("output") or "{}").get("detect", {}).get("decision")
        return None if decision is None else str(decision)

    def incident(self, incident_id: str) -> Incident:
        return self.ledger.get(incident_id)

    def incidents(self) -> list[Incident]:
        return self.ledger.list_incidents()

    def metric_values(self, name: str, statistic: str = "Maximum", **dimensions: str) -> list[float]:
        """Per-minute ``statistic`` of a NodeMedic metric with exactly these dimensions (last hour)."""
        cw = self.aws.client("cloudwatch")
        dims = [{"Name": k, "Value": v} for k, v in dimensions.items()]
        now = datetime.now(UTC)
        stats = cw.get_metric_statistics(
            Namespace="NodeMedic", MetricName=name, Dimensions=dims,
            StartTime=datetime.fromtimestamp(now.timestamp() - 3600, UTC),
            EndTime=datetime.fromtimestamp(now.timestamp() + 60, UTC),
            Period=60, Statistics=[statistic])
        return [p[statistic] for p in stats["Datapoints"]]

    def reconcile(self) -> dict[str, Any]:
        """Run the reconciler now (its schedule fires every 5 minutes); returns its report."""
        resp = self.aws.client("lambda").invoke(FunctionName=self.stack.resources["ReconcilerFunction"],
                                                Payload=b"{}")
        body: dict[str, Any] = json.loads(resp["Payload"].read())
        if "FunctionError" in resp:
            raise RuntimeError(f"the reconciler failed: {body}")
        return body

    def fire_schedule(self, function: str) -> None:
        """Fire the scheduled rule(s) of the template's ``function`` (logical id) now, as EventBridge
        would on its schedule."""
        arn = self.aws.client("lambda").get_function(FunctionName=self.stack.resources[function])
        if not self.aws.fire_schedules(arn["Configuration"]["FunctionArn"]):
            raise ValueError(f"{function} has no scheduled rule")

    def drains(self) -> list[str]:
        """The node of each drain the pipeline sent to the controller (its slurm-drain commands)."""
        return [m.group(1) for script in self.scontrol_commands("state=drain")
                if (m := re.search(r"node='([^']*)'", script))]

    def scontrol_commands(self, verb: str) -> list[str]:
        """Scripts run on the controller that contain ``verb`` (e.g. ``state=drain``)."""
        return [c.script for c in self.cluster.commands
                if c.instance_id == self.cluster.controller_id and verb in c.script]
