"""``nodemedic doctor``: after ``sam deploy``, check that the deployment can do its job.

Each check returns rows: what was checked, pass / warn / fail, what was found and, for a
failure, how to fix it. Permissions are checked with the same model of each call that the local
stack's IAM enforces (:mod:`nodemedic_sandbox.iam`): on AWS the decision comes from
``iam:SimulatePrincipalPolicy``, locally from the local evaluator.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from botocore.exceptions import BotoCoreError, ClientError
from nodemedic.domain.silence import is_silent, named_node
from nodemedic.errors import NodeMedicError
from nodemedic.providers.base import Member
from nodemedic.providers.run_command import Documents
from nodemedic.reconciler import UNNAMED_AFTER, execution_arn
from nodemedic.store.ledger import BOOKS_INDEX
from nodemedic.store.roster import RosterStore
from nodemedic_sandbox import iam
from nodemedic_sandbox.aws_rules import alarm_topic_problem

from nodemedic_cli.target import Target

Status = Literal["pass", "warn", "fail"]


@dataclass(frozen=True)
class Row:
    check: str
    status: Status
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


class Permissions(Protocol):
    def decide(self, role_arn: str, request: iam.Request) -> tuple[bool, str]: ...


class SimulatedPermissions:
    """The account's own answer: ``iam:SimulatePrincipalPolicy`` for the function's role."""

    def __init__(self, iam_client: Any) -> None:
        self._iam = iam_client

    def decide(self, role_arn: str, request: iam.Request) -> tuple[bool, str]:
        entries = [{"ContextKeyName": k, "ContextKeyValues": v, "ContextKeyType": "stringList"}
                   for k, v in request.context.items()]
        result = self._iam.simulate_principal_policy(
            PolicySourceArn=role_arn, ActionNames=[request.action], ResourceArns=[request.resource],
            ContextEntries=entries)["EvaluationResults"][0]
        return result["EvalDecision"] == "allowed", result["EvalDecision"]


class LocalPermissions:
    """The local stack's evaluator over the role's policies as deployed."""

    def __init__(self, iam_client: Any) -> None:
        self._iam = iam_client
        self._policies: dict[str, list[dict[str, Any]]] = {}

    def decide(self, role_arn: str, request: iam.Request) -> tuple[bool, str]:
        if role_arn not in self._policies:
            self._policies[role_arn] = iam.role_policies(self._iam, role_arn)
        verdict = iam.evaluate(self._policies[role_arn], request)
        return verdict.allowed, verdict.reason


Call = tuple[str, str, dict[str, Any]]  # service signing name, operation, parameters


def representative_calls(target: Target, member: str) -> dict[str, list[Call]]:
    """One call of each kind each function makes (their parameters are what the code passes),
    keyed by the function's logical id. ``member``: an instance of the cluster."""
    p, out = target.parameters, target.outputs
    table = {"TableName": out["IncidentsTableName"]}
    open_incident = {"TransactItems": [{"Put": {"TableName": table["TableName"], "Item": {}}}] * 2}
    end_incident = {"TransactItems": [{"Update": {"TableName": table["TableName"], "Key": {}}},
                                      {"Delete": {"TableName": table["TableName"], "Key": {}}}]}
    fail_incident = {"TransactItems": [*end_incident["TransactItems"],
                                       {"Put": {"TableName": table["TableName"], "Item": {}}}]}
    execution = execution_arn(out["StateMachineArn"], "doctor")
    db: list[Call] = [("dynamodb", op, table) for op in ("GetItem", "PutItem", "UpdateItem")]
    provider = p.get("Provider") or "autoscaling"
    reads_by_provider: dict[str, list[Call]] = {
        "autoscaling": [("autoscaling", "DescribeAutoScalingGroups", {}), ("ec2", "DescribeInstances", {})],
        "ec2": [("ec2", "DescribeInstances", {})],
        "hyperpod": [("sagemaker", "ListClusterNodes", {"ClusterName": p.get("HyperPodClusterName", "")})],
        "karpenter": [("ec2", "DescribeInstances", {})],  # the NodePool's instances, by Karpenter's tag
    }
    reads = reads_by_provider[provider]
    docs = Documents(target.cluster)
    describe_instances: Call = ("ec2", "DescribeInstances", {})

    def send(document: str, instance: str) -> Call:
        return "ssm", "SendCommand", {"DocumentName": document, "InstanceIds": [instance]}

    describe_cluster: list[Call] = [("eks", "DescribeCluster", {"name": p.get("EksClusterName", "")})]

    def on_controller(*documents: str) -> list[Call]:
        """The scheduler's part: SSM documents on the Slurm controller, or the EKS API server
        (reached with DescribeCluster and a token presigned from STS, which needs no permission)."""
        if target.on_kubernetes:
            return describe_cluster
        if p.get("SlurmChannel") == "relay":  # the relay queue, and each request's record
            return [("sqs", "SendMessage", {"QueueUrl": out["RelayQueueUrl"]}),
                    ("dynamodb", "PutItem", {**table, "Item": {"pk": {"S": "RELAY#0"}}}),
                    ("dynamodb", "UpdateItem", {**table, "Key": {"pk": {"S": "RELAYSENT#0"}}})]
        return [*(send(d, p["SlurmControllerInstanceId"]) for d in documents), ("ssm", "GetCommandInvocation", {})]
    names = describe_cluster if target.on_kubernetes else []  # a node's spec.providerID names its instance
    repair_by_provider: dict[str, list[Call]] = {
        "autoscaling": [("autoscaling", "TerminateInstanceInAutoScalingGroup", {"InstanceId": member}),
                        ("ec2", "CreateTags", {"Resources": [member], "Tags": [{"Key": "nodemedic:slurm-node",
                                                                                 "Value": "gpu-1"}]}),
                        ("ec2", "RebootInstances", {"InstanceIds": [member]})],
        "ec2": [("ec2", "RebootInstances", {"InstanceIds": [member]}), ("ec2", "StopInstances", {"InstanceIds": [member]})],
        "hyperpod": [("sagemaker", op, {"ClusterName": p.get("HyperPodClusterName", "")})
                     for op in ("BatchRebootClusterNodes", "BatchReplaceClusterNodes")],
        # replace deletes the NodeClaim through the API server (its RBAC, not IAM)
        "karpenter": [("ec2", "RebootInstances", {"InstanceIds": [member]}), *describe_cluster],
    }
    repair = repair_by_provider[provider]
    return {
        "DetectFunction": [*db, ("dynamodb", "TransactWriteItems", open_incident), *reads, *names],
        "GateFunction": [*db, ("dynamodb", "TransactWriteItems", end_incident), *reads, *names,
                         ("ssm", "GetParameter", {"Name": out["SafetyPolicyParameterName"]})],
        "ShadowFunction": [("dynamodb", "GetItem", table), ("dynamodb", "UpdateItem", table),
                           *on_controller(docs.slurm_query)],
        # the policy and the instance's tags: a pause or an exclusion set since the gate stops the drain
        "DrainFunction": [*db, ("dynamodb", "BatchGetItem", {"RequestItems": {table["TableName"]: {}}}),
                          *on_controller(docs.slurm_query, docs.slurm_drain, docs.slurm_requeue, docs.slurm_signal),
                          *([] if target.on_kubernetes else [("ssm", "ListCommands", {})]), *reads,
                          ("ssm", "GetParameter", {"Name": out["SafetyPolicyParameterName"]})],
        "SparesFunction": [*db, *reads, *names, *on_controller(docs.slurm_query, docs.spare_take),
                           ("ssm", "GetParameter", {"Name": out["SafetyPolicyParameterName"]})],  # an excluded spare
        "ResumeFunction": [*db, ("dynamodb", "DeleteItem", table), ("dynamodb", "TransactWriteItems", fail_incident),
                           *on_controller(docs.slurm_query, docs.slurm_resume, docs.spare_add, docs.slurm_drain)],
        "ReconcilerFunction": [*db, ("dynamodb", "Scan", table), ("dynamodb", "DeleteItem", table),
                               ("dynamodb", "Query", {**table, "IndexName": BOOKS_INDEX}),
                               ("dynamodb", "BatchGetItem", {"RequestItems": {table["TableName"]: {}}}),
                               ("dynamodb", "TransactWriteItems", fail_incident),
                               ("states", "DescribeExecution", {"executionArn": execution}),
                               ("sns", "Publish", {"TopicArn": out["EscalationTopicArn"]}),
                               ("events", "PutEvents", {"Entries": [{"EventBusName": out["EventBusName"],
                                                                     "Source": "nodemedic.reconciler",
                                                                     "DetailType": "Node Health Event"}]}),
                               *reads,  # the cluster's instances: which agents are not heard
                               *on_controller(docs.slurm_query, docs.slurm_drain)],
        # adopt, by scheduler: Slurm sends the join (a retry reads the one it sent: ListCommands)
        # the requeue: a DEGRADED node's jobs, when a hard fault comes to it while they run on
        # the policy: an exclusion set while the incident was under way stops its next step
        "RepairFunction": [*db, *reads, *repair, *on_controller(docs.slurm_query, docs.slurm_requeue),
                           ("ssm", "GetParameter", {"Name": out["SafetyPolicyParameterName"]}),
                           *([] if provider == "hyperpod" else [send(docs.gpu_reset, member)]),  # skipped there
                           *([] if target.on_kubernetes else [send(docs.node_join, member), ("ssm", "ListCommands", {})])],
        # on HyperPod, whose nodes SSM does not reach, HyperPod's own check, the task answered here
        "DeepHealthCheckFunction": [*db, *([("sagemaker", op, {"ClusterName": p.get("HyperPodClusterName", "")})
                                            for op in ("StartClusterHealthCheck", "DescribeClusterNode")]
                                           + [("states", "SendTaskSuccess", {})] if provider == "hyperpod"
                                           else [send(docs.health_check, member)]),
                                    # a check after a rung is not sent while hands are off the node
                                    *reads, *(describe_cluster if target.on_kubernetes else []),
                                    ("ssm", "GetParameter", {"Name": out["SafetyPolicyParameterName"]})],
        "HealthCheckResultFunction": [*db, ("dynamodb", "DeleteItem", table), ("ssm", "GetCommandInvocation", {}),
                                      ("states", "SendTaskSuccess", {})],
        "ApprovalFunction": [("dynamodb", "UpdateItem", table),
                             ("sns", "Publish", {"TopicArn": out["EscalationTopicArn"]})],
        # the jobs on a node whose notice waits: on Kubernetes this is names' DescribeCluster
        "PlannedEventsFunction": [*reads, *on_controller(docs.slurm_query),
                                  *([] if describe_instances in reads else [describe_instances]),  # a block's instances
                                  ("events", "PutEvents", {"Entries": [{"EventBusName": out["EventBusName"],
                                                                        "Source": "nodemedic.planned",
                                                                        "DetailType": "Node Health Event"}]}),
                                  ("sns", "Publish", {"TopicArn": out["EscalationTopicArn"]}),
                                  ("dynamodb", "PutItem", {**table, "Item": {"pk": {"S": "ANNOUNCED#doctor"}}}),
                                  ("dynamodb", "PutItem", {**table, "Item": {"pk": {"S": "NOTICE#doctor"}}}),
                                  ("dynamodb", "DeleteItem", {**table, "Key": {"pk": {"S": "ANNOUNCED#doctor"}}}),
                                  ("dynamodb", "GetItem", {**table, "Key": {"pk": {"S": "DEFERRED#doctor"}}}),
                                  ("dynamodb", "UpdateItem", {**table, "Key": {"pk": {"S": "DEFERRED#doctor"}}}),
                                  ("ec2", "DescribeInstanceStatus", {}),  # the sweep of scheduled events
                                  # planned work paced under the breaker: the policy, the control
                                  # state and its incidents, the work released lately, Detect's memory
                                  ("ssm", "GetParameter", {"Name": out["SafetyPolicyParameterName"]}),
                                  ("dynamodb", "GetItem", {**table, "Key": {"pk": {"S": "CONTROL#doctor"}}}),
                                  ("dynamodb", "BatchGetItem", {"RequestItems": {table["TableName"]: {
                                      "Keys": [{"pk": {"S": "INCIDENT#doctor"}}]}}}),
                                  ("dynamodb", "GetItem", {**table, "Key": {"pk": {"S": "EVENT#doctor"}}}),
                                  ("dynamodb", "PutItem", {**table, "Item": {"pk": {"S": "PACED#doctor"}}})],
        "SilenceSweeperFunction": [("sqs", "ReceiveMessage", {"QueueUrl": out["HeartbeatQueueUrl"]}),
                                   ("sqs", "DeleteMessageBatch", {"QueueUrl": out["HeartbeatQueueUrl"]}),
                                   ("dynamodb", "GetItem", table), ("dynamodb", "PutItem", table),
                                   ("dynamodb", "UpdateItem", table),  # the lease of the sweep under way
                                   ("dynamodb", "BatchGetItem", {"RequestItems": {table["TableName"]: {}}}),
                                   ("events", "PutEvents", {"Entries": [{"EventBusName": out["EventBusName"],
                                                                         "Source": "nodemedic.sweeper",
                                                                         "DetailType": "Node Health Event"}]}),
                                   *reads, *names],
    }


# -- the checks --------------------------------------------------------------------------------
def check_stack(target: Target) -> Iterator[Row]:
    status = target.status
    ok = status.endswith("_COMPLETE") and "ROLLBACK" not in status
    yield Row("stack", "pass" if ok else "fail", f"{target.stack}: {status}",
              "" if ok else "see the stack's events in CloudFormation and deploy again")


def check_rules(target: Target) -> Iterator[Row]:
    events = target.client("events")
    for logical_id, physical in target.resources_of("AWS::Events::Rule").items():
        name, bus = _rule_name_and_bus(physical)
        # CloudFormation names a rule on a custom bus "bus|rule"; an emulator may give the name alone
        buses = [bus] if bus else ["default", target.output("EventBusName")]
        rule = None
        for bus in buses:
            try:
                rule = events.describe_rule(Name=name, EventBusName=bus)
                break
            except events.exceptions.ResourceNotFoundException:
                continue
        if rule is None:
            yield Row(f"rule {logical_id}", "fail", f"rule {name} does not exist", "deploy the template again")
            continue
        targets = events.list_targets_by_rule(Rule=name, EventBusName=bus)["Targets"]
        if rule["State"] != "ENABLED" or not targets:
            yield Row(f"rule {logical_id}", "fail", f"{rule['State']}, {len(targets)} target(s)",
                      f"enable rule {name} and give it its target (deploy the template again)")
        else:
            yield Row(f"rule {logical_id}", "pass", f"ENABLED -> {', '.join(t['Arn'].split(':')[-1] for t in targets)}")


def _rule_name_and_bus(physical: str) -> tuple[str, str]:
    bus, sep, name = physical.partition("|")
    return (name, bus) if sep else (physical, "")


def check_permissions(target: Target, permissions: Permissions, member: str) -> Iterator[Row]:
    authorizer = iam.Authorizer(iam.facts_from(target.client, partition=target.partition, region=target.region,
                                               account=target.account))
    lambda_ = target.client("lambda")
    for logical_id, calls in representative_calls(target, member).items():
        role = lambda_.get_function_configuration(FunctionName=target.resource_id(logical_id))["Role"]
        denied = []
        for service, operation, params in calls:
            for request in authorizer.requests(service, operation, params):
                allowed, why = permissions.decide(role, request)
                if not allowed:
                    denied.append(request)
        if denied:
            yield Row(f"permissions {logical_id}", "fail",
                      "; ".join(f"{r.action} on {r.resource}" for r in denied),
                      f"allow in {logical_id}'s Policies in template.yaml: "
                      + " ".join(iam.needed_statement(r) for r in denied))
        else:
            yield Row(f"permissions {logical_id}", "pass", f"{len(calls)} kinds of call allowed")


def check_documents(target: Target) -> Iterator[Row]:
    ssm = target.client("ssm")
    for logical_id, name in target.resources_of("AWS::SSM::Document").items():
        try:
            ssm.describe_document(Name=name)
            yield Row(f"document {logical_id}", "pass", name)
        except ClientError as exc:
            yield Row(f"document {logical_id}", "fail", str(exc), "deploy the template again")


# The metrics the alarms and the dashboard read, with the exact dimension sets they query
def wanted_metrics(target: Target) -> list[tuple[str, str, dict[str, str | None]]]:
    """(namespace, metric, {dimension: value, or None for any value}) of every NodeMedic metric
    an alarm or a dashboard widget queries."""
    cw = target.client("cloudwatch")
    wanted: list[tuple[str, str, dict[str, str | None]]] = []
    for alarm in cw.describe_alarms(AlarmNamePrefix="NodeMedic ")["MetricAlarms"]:
        if alarm.get("Namespace") == "NodeMedic":
            wanted.append(("NodeMedic", alarm["MetricName"], {d["Name"]: d["Value"] for d in alarm["Dimensions"]}))
    name = target.outputs.get("DashboardName")
    if name:
        body = json.loads(cw.get_dashboard(DashboardName=name)["DashboardBody"])
        for widget in body.get("widgets", []):
            for metric in widget.get("properties", {}).get("metrics", []):
                wanted.extend(_widget_metric(metric))
    unique = {(ns, m, tuple(sorted(d.items(), key=lambda kv: kv[0]))): (ns, m, d) for ns, m, d in wanted}
    return list(unique.values())


_SEARCH = re.compile(r"\{(?P<schema>[^}]*)\}\s+MetricName=\\?\"(?P<name>\w+)\\?\"(?P<rest>[^']*)")


def _widget_metric(metric: list[Any]) -> list[tuple[str, str, dict[str, str | None]]]:
    if metric and isinstance(metric[0], dict) and "expression" in metric[0]:
        m = _SEARCH.search(metric[0]["expression"])
        if not m:
            return []
        namespace, *keys = [k.strip() for k in m.group("schema").split(",")]
        fixed = dict(re.findall(r'(\w+)=\\?"([^"\\]*)\\?"', m.group("rest")))
        return [(namespace, m.group("name"), {k: fixed.get(k) for k in keys})]
    parts = [x for x in metric if not isinstance(x, dict)]
    if len(parts) >= 2 and parts[0] == "NodeMedic":
        return [(parts[0], parts[1], dict(zip(parts[2::2], parts[3::2], strict=False)))]
    return []


def check_metrics(target: Target) -> Iterator[Row]:
    cw = target.client("cloudwatch")
    for namespace, name, dims in wanted_metrics(target):
        published = [{d["Name"]: d["Value"] for d in m.get("Dimensions", [])}
                     for page in cw.get_paginator("list_metrics").paginate(Namespace=namespace, MetricName=name)
                     for m in page["Metrics"]]
        exact = [p for p in published if set(p) == set(dims)
                 and all(v is None or p[k] == v for k, v in dims.items())]
        shown = ", ".join(f"{k}={v or '*'}" for k, v in dims.items())
        label = f"metric {name} {{{shown}}}"
        if exact:
            yield Row(label, "pass", f"{len(exact)} series with exactly these dimensions")
        elif published:
            sets = sorted({"{" + ", ".join(sorted(p)) + "}" for p in published})
            yield Row(label, "fail", f"published only with dimensions {', '.join(sets)}: CloudWatch matches a "
                      "query only with the exact dimension set, so the alarm/dashboard never sees it",
                      "emit it with exactly the queried dimensions (no POWERTOOLS_SERVICE_NAME 'service' dimension)")
        else:
            yield Row(label, "warn", "no data yet (no incident has recorded it since the deploy)")


def check_alarm_actions(target: Target) -> Iterator[Row]:
    cw = target.client("cloudwatch")
    for alarm in cw.describe_alarms(AlarmNamePrefix="NodeMedic ")["MetricAlarms"]:
        problems = [p for a in alarm.get("AlarmActions", []) if ":sns:" in a
                    and (p := alarm_topic_problem(target.client("sns"), target.client("kms"), a))]
        yield Row(f"alarm {alarm['AlarmName']}", "fail" if problems else "pass",
                  "; ".join(problems) or f"notifies {', '.join(alarm.get('AlarmActions', []))}",
                  "encrypt the topic with a customer managed key that CloudWatch may use" if problems else "")


def _nodes(target: Target) -> tuple[dict[str, Member | None], list[Member], Exception | None]:
    """Each scheduler node and the cluster member backing it (read once for every check: one listing
    of the members, not a lookup per node), the running members that back no node, or why the
    controller could not be read."""
    try:
        nodes = target.orchestrator.nodes()
    except (NodeMedicError, ClientError, BotoCoreError) as exc:
        return {}, [], exc
    by_node: dict[str, Member] = {}
    members = target.provider.members()
    for member in members:
        if member.slurm_node:
            by_node.setdefault(member.slurm_node, member)
    unnamed = [m for m in members if m.slurm_node is None and m.state == "running"]
    return {n.name: by_node.get(n.name) for n in nodes}, unnamed, None


def check_unnamed(unnamed: list[Member], now: datetime) -> Iterator[Row]:
    """Slurm: the instances of the cluster that back no node. A group's new instance is named by
    the incident that claims it within minutes; one that stays unnamed runs no jobs while it
    costs (the reconciler pages it ``UNNAMED_AFTER`` after its launch)."""
    if not unnamed:
        yield Row("unnamed instances", "pass", "every running instance of the cluster backs a Slurm node")
        return
    said = [f"{m.instance_id} (launched {m.launched_at:%Y-%m-%d %H:%M} UTC)" if m.launched_at else m.instance_id
            for m in sorted(unnamed, key=lambda m: m.instance_id)]
    old = [m for m in unnamed if m.launched_at is None or now - m.launched_at >= UNNAMED_AFTER]
    minutes = int(UNNAMED_AFTER.total_seconds() // 60)
    yield Row("unnamed instances", "warn", f"{len(unnamed)} running instance(s) back no Slurm node: {', '.join(said)}"
              + (f"; {len(old)} of them for {minutes} minutes or more" if old else ""),
              "one an incident is taking as a node's replacement is named within minutes; one that stays unnamed runs "
              "no jobs while it costs: terminate it lowering the group's desired capacity (aws autoscaling "
              "terminate-instance-in-auto-scaling-group --should-decrement-desired-capacity), or tag it "
              "nodemedic:slurm-node=<node> and join it as that node")


def check_nodes(mapped: dict[str, Member | None], error: Exception | None, kubernetes: bool) -> Iterator[Row]:
    scheduler = "Kubernetes" if kubernetes else "Slurm"
    if error is not None:
        yield Row("scheduler", "fail", f"cannot read the {scheduler} nodes: {error}",
                  "check EksClusterName, the cluster's endpoint access and your principal's access entry"
                  if kubernetes else "check the controller's SSM agent and SlurmControllerInstanceId")
        return
    yield Row("scheduler", "pass", f"{len(mapped)} {scheduler} nodes")
    unmapped = [name for name, member in mapped.items() if member is None]
    if unmapped:
        yield Row("nodes mapped", "fail", f"no running instance of the cluster backs {', '.join(unmapped)}",
                  "check the nodes' spec.providerID and the provider's group/cluster name" if kubernetes else
                  "tag each node's instance with nodemedic:slurm-node (or fix the provider's group/cluster name)")
    else:
        yield Row("nodes mapped", "pass", f"every {scheduler} node maps to a running instance of the cluster")


def check_heartbeats(target: Target, now: datetime, mapped: dict[str, Member | None]) -> Iterator[Row]:
    roster, _ = RosterStore(target.client("dynamodb"), target.output("IncidentsTableName"), target.cluster).load()
    if not roster:
        yield Row("heartbeats", "warn", "no agent heartbeat received yet",
                  "install the agent on the GPU nodes (node_agent/lifecycle/install-agent.sh)")
        return
    threshold = float(target.parameters.get("HeartbeatSilenceSeconds") or 45)
    silent = sorted(i for i, seen in roster.items() if is_silent(seen, now, threshold))
    yield Row("heartbeats", "fail" if silent else "pass",
              f"{len(roster) - len(silent)} of {len(roster)} agents heard within {threshold:.0f} s"
              + (f"; silent: {', '.join(silent)}" if silent else ""),
              "check the agent on the silent nodes (systemctl status nodemedic-agent)" if silent else "")
    # a node whose agent never started (not installed, no credentials, no instance metadata) never
    # enters the roster, so the sweeper cannot find it silent: this comparison sees it at once, the
    # reconciler after 15 minutes (and pages it). A warning here:
    # an instance that joined a minute ago (a replacement still booting) has not been heard yet either
    members = {name: m for name, m in mapped.items() if m is not None}
    unheard = sorted(name for name, m in members.items() if m.instance_id not in roster)
    yield Row("agents", "warn" if unheard else "pass",
              f"{len(members) - len(unheard)} of {len(members)} nodes' agents heard"
              + (f"; never: {', '.join(unheard)}" if unheard else ""),
              "unless the node is still booting, the agent is not running there: install it (install-agent.sh, "
              "or the DaemonSet), and check it reaches instance metadata and has the stack's AgentPublishPolicy"
              if unheard else "")
    # an agent that names its node unlike the scheduler is heard, but Detect refuses its every event
    misnamed = sorted(f"{name} (its agent says {said})" for name, m in members.items()
                      if m.instance_id in roster and (said := named_node(roster[m.instance_id])) and said != name)
    if misnamed:
        yield Row("agents' node names", "fail", f"named unlike the scheduler: {', '.join(misnamed)}; Detect refuses "
                  "every event they send (identity mismatch)",
                  "set node.slurm_node in the agent's config (install-agent.sh --slurm-node), or NODEMEDIC_NODE_NAME")


def check_spares(target: Target) -> Iterator[Row]:
    size = int(target.parameters.get("HotSpares") or 0)
    if size == 0:
        yield Row("spare pool", "pass", "no hot spares configured (HotSpares=0)")
        return
    from nodemedic.stages.spares import ready

    pool = target.orchestrator.spares()
    ready_now = [s.name for s in pool if ready(s.state)]
    yield Row("spare pool", "pass" if len(ready_now) >= size else "warn",
              f"{len(ready_now)} ready of {size} ({', '.join(f'{s.name} {s.state}' for s in pool) or 'empty'})")


def check_agent_artifact(target: Target) -> Iterator[Row]:
    """The agent's wheelhouse published where install-agent.sh fetches it (a node with no package
    index cannot install the agent otherwise). A warning, not a failure: nodes may install from a
    mirror or an image of their own."""
    from nodemedic_cli.agent_artifact import published

    if "AgentArtifactsBucketName" not in target.outputs:
        yield Row("agent wheelhouse", "warn", "the stack has no agent bucket (deployed from an older template)",
                  "deploy the template again")
        return
    found = published(target)
    bucket = target.output("AgentArtifactsBucketName")
    if not found and target.on_kubernetes:  # the DaemonSet's image carries the agent (docs/kubernetes.md)
        yield Row("agent wheelhouse", "pass", f"none in s3://{bucket}/agent/; on Kubernetes the agent's image "
                  "carries it")
        return
    if not found:
        yield Row("agent wheelhouse", "warn", f"none published in s3://{bucket}/agent/: a node with no package "
                  "index cannot install the agent", "make agent-wheelhouse && nodemedic agent publish")
        return
    newest = found[0]
    yield Row("agent wheelhouse", "pass", f"s3://{bucket}/{newest['Key']} ({newest['Size'] / 1e6:.1f} MB, "
              f"published {newest['LastModified']:%Y-%m-%d %H:%M}Z)")


def check_configuration(target: Target) -> Iterator[Row]:
    """The stack's JSON parameters and the safety policy, read as the functions read them: a bad
    one fails every incident at its stage (or holds it, for the policy) until it is fixed, and
    CloudFormation takes any text."""
    from nodemedic.domain.checkpoint import parse_checkpoint_policy
    from nodemedic.domain.classification import parse_overrides
    from nodemedic.orchestrators.kubernetes import parse_drain_policy

    parsers: list[tuple[str, Callable[[str], object], str]] = [
        ("FaultActionOverrides", parse_overrides, 'a JSON object of fault code -> action, e.g. {"XID 74": "monitor"}'),
        ("CheckpointPolicy", parse_checkpoint_policy, "docs/checkpoints.md"),
    ]
    if target.on_kubernetes:
        parsers.append(("KubernetesDrainPolicy", parse_drain_policy, "docs/kubernetes.md"))
    for key, parse, shape in parsers:
        try:
            parse(target.parameters.get(key, ""))
        except (ValueError, NodeMedicError) as exc:
            yield Row(f"parameter {key}", "fail", str(exc)[:500],
                      f"sam deploy --parameter-overrides {key}='...' with a valid value ({shape})")
        else:
            yield Row(f"parameter {key}", "pass", "valid")
    name = target.output("SafetyPolicyParameterName")
    try:
        target.policy()
    except NodeMedicError as exc:
        yield Row("safety policy", "fail", f"{str(exc)[:500]}; every incident is held until it is fixed",
                  f"aws ssm put-parameter --overwrite --name {name} --value '<valid JSON>' (docs/safety.md)")
    else:
        yield Row("safety policy", "pass", f"{name}: valid")


def run(target: Target, permissions: Permissions | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> list[Row]:
    """Every check, in order; a check that cannot run is itself a failed row."""
    perms = permissions or SimulatedPermissions(target.client("iam"))
    rows = list(check_stack(target))
    mapped, unnamed, nodes_error = _nodes(target)
    member = next((m.instance_id for m in mapped.values() if m), "")
    checks: list[tuple[str, Callable[[], Iterator[Row]]]] = [
        ("configuration", lambda: check_configuration(target)),
        ("rules", lambda: check_rules(target)),
        ("permissions", lambda: check_permissions(target, perms, member or "i-00000000000000000")),
        ("documents", lambda: check_documents(target)),
        ("alarms", lambda: check_alarm_actions(target)),
        ("metrics", lambda: check_metrics(target)),
        ("nodes", lambda: check_nodes(mapped, nodes_error, target.on_kubernetes)),
        *([] if target.on_kubernetes or nodes_error else [("unnamed instances", lambda: check_unnamed(unnamed, now()))]),
        ("heartbeats", lambda: check_heartbeats(target, now(), mapped)),
        ("spares", lambda: check_spares(target)),
        ("agent wheelhouse", lambda: check_agent_artifact(target)),
    ]
    for name, check in checks:
        try:
            rows.extend(check())
        except (ClientError, BotoCoreError, NodeMedicError, KeyError) as exc:
            rows.append(Row(name, "fail", f"the check could not run: {exc!r}"))
    return rows
