"""An AWS for this process: moto, with the few hooks that make a deployed template *run*.

moto 5.2.5 (pinned) stores resources and interprets Step Functions ASL, but on its own it
does not run Lambda code, does not deliver EventBridge events to Step Functions, does not
execute SSM commands (nor emit their status-change events), does not turn EMF log lines into metrics, emits no alarm state
change events and never fires scheduled rules. Each hook below fills one of those gaps; ``tests/component/test_embedded_aws.py``
checks every one of them, so a moto upgrade that moves a hooked internal fails loudly.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import copy
import hashlib
import importlib.util
import io
import itertools
import json
import os
import re
import sys
import threading
import time
import traceback
import unicodedata
import uuid
import warnings
import weakref
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Protocol, TextIO
from unittest import mock

import boto3
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from botocore.exceptions import ClientError
from botocore.retries.standard import ExponentialBackoff
from moto import mock_aws
from moto.autoscaling.exceptions import ValidationError as AutoScalingValidationError
from moto.autoscaling.models import AutoScalingBackend
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.cloudformation.models import Stack as CloudFormationStack
from moto.cloudwatch.models import CloudWatchBackend
from moto.core.botocore_stubber import MockRawResponse
from moto.core.responses import ActionResult
from moto.core.routing import get_service_router
from moto.core.utils import get_service_model, utcnow
from moto.dynamodb import models as dynamodb_models
from moto.dynamodb.exceptions import ItemSizeToUpdateTooLarge, MockValidationException
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.table import Table
from moto.dynamodb.responses import DynamoHandler
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models import ec2_backends
from moto.ec2.models.instances import InstanceBackend
from moto.ec2.utils import filter_dict_attribute_mapping
from moto.eks.models import eks_backends
from moto.events.exceptions import ValidationException as EventsValidationException
from moto.events.models import EventsBackend, Rule, events_backends
from moto.events.utils import EventMessageType
from moto.sns.exceptions import InvalidParameterValue as SnsInvalidParameter
from moto.sns.models import SNSBackend
from moto.sqs.models import Queue as SqsQueue
from moto.sqs.models import SQSBackend
from moto.ssm.exceptions import SSMException
from moto.ssm.models import Command, SimpleSystemManagerBackend
from moto.ssm.responses import SimpleSystemManagerResponse
from moto.stepfunctions.exceptions import ValidationException as StatesValidationException
from moto.stepfunctions.parser import utils as stepfunctions_utils
from moto.stepfunctions.parser.asl.component.common.error_name.error_equals_decl import ErrorEqualsDecl
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import StatesErrorNameType
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
from moto.stepfunctions.parser.asl.component.common.timeouts.timeout import TimeoutSeconds
from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser
from moto.stepfunctions.parser.backend.execution import Execution
from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker
from moto.stepfunctions.parser.models import StepFunctionsParserBackend
from moto.utilities.arns import parse_arn
from nodemedic_agent.documents import parameter_problems, render_document

from nodemedic_sandbox import hyperpod, iam
from nodemedic_sandbox.aws_rules import (
    NEW_ACCOUNT_CONCURRENCY,
    PUT_EVENTS_REQUEST_LIMIT,
    SSM_INVOCATION_LAG_S,
    SSM_STDERR_LIMIT,
    SSM_STDOUT_LIMIT,
    STATES_PAYLOAD_LIMIT,
    put_events_entry_size,
    ssm_agent_timeout,
)

ACCOUNT_ID = "123456789012"
REGION = "us-east-1"

# What the hooks replace; the component tests assert these still exist with these names.
HOOKED = {
    "lambda invoke": (LambdaSimpleBackend, "invoke"),
    "eventbridge delivery": (Rule, "send_to_targets"),
    "ssm command result": (Command, "get_invocation"),
    "ssm command sent": (SimpleSystemManagerBackend, "send_command"),
    "ssm command targets": (Command, "_get_instance_ids_from_targets"),
    "ssm list commands": (SimpleSystemManagerResponse, "list_commands"),
    "alarm state change": (CloudWatchBackend, "set_alarm_state"),
    "exact metric dimensions": (CloudWatchBackend, "get_metric_statistics"),
    "retry sleep": (retrier_decl, "time"),
    "task timeout": (TimeoutSeconds, "_eval_seconds"),
    "ec2 reboot": (InstanceBackend, "reboot_instances"),
    "ec2 start": (InstanceBackend, "start_instances"),
    "autoscaling terminate": (AutoScalingBackend, "terminate_instance"),
    "asl parse per execution": (ExecutionWorker, "_get_evaluation_entrypoint"),
    "states.all matching": (ErrorEqualsDecl, "_eval_body"),
    "eventbridge request size": (EventsBackend, "put_events"),
    "step functions input size": (StepFunctionsParserBackend, "start_execution"),
    "step functions status of a starting execution": (Execution, "status"),
    "step functions interpreter threads": (stepfunctions_utils, "TMP_THREADS"),
    **hyperpod.HOOKED,
    **{f"dynamodb {name}": (DynamoDBBackend, name) for name in ("put_item", "update_item", "delete_item",
                                                                  "transact_write_items")},
    "dynamodb table copy per transaction": (dynamodb_models, "copy"),
    "sns publish": (SNSBackend, "publish"),
    "sqs receive": (SQSBackend, "receive_message"),
    "sqs visible messages": (SqsQueue, "messages"),
}
_DYNAMODB_WRITES = threading.RLock()
ENDING_EXECUTIONS_S = 30.0  # how long stop() waits for a stopped execution's Lambda task in flight
_ORPHANED: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # see EmbeddedAWS.end_executions


SERVICES = ("autoscaling", "cloudformation", "cloudwatch", "dynamodb", "ec2", "eks", "events", "iam", "kms", "lambda",
            "logs", "s3", "sagemaker", "sns", "sqs", "ssm", "stepfunctions")


def _warm_service_models() -> None:
    """Load moto's per-service models once, before any burst: its caches have no lock, so a
    hundred execution threads arriving together would each load (and parse) the same model."""
    for service in SERVICES:
        get_service_model(service)
        get_service_router(service)


STATE_MACHINE_KEY = "ak"  # the access key moto's Step Functions interpreter signs with (boto_client.py)
AGENT_KEY = "nodemedic-agent"  # the access key the local node agents sign with (sandbox/agents.py)
RELAY_KEY = "nodemedic-relay"  # the access key the local controller's relay signs with (local.py)
_PARAMETERS = "nodemedic_api_parameters"


def _remember_parameters(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    """Keep a call's API parameters in its request context: the authorizer, at ``before-call``
    (where the signer says who calls), needs them, not the serialized request."""
    context[_PARAMETERS] = params


_MOTO_PARSE_TEMPLATE = CloudFormationStack.parse_template


def _template_json_first(template: str) -> dict[str, Any]:
    """A template as moto reads it, JSON read as JSON: moto 5.2.5 reads every template with
    PyYAML's pure-Python loader first, and the JSON the local deploy sends took a large part of
    each stack's start-up that way. The same dict either way (YAML is a superset of JSON)."""
    try:
        parsed = json.loads(template)
    except ValueError:
        return _MOTO_PARSE_TEMPLATE(template)
    return parsed if isinstance(parsed, dict) else _MOTO_PARSE_TEMPLATE(template)


_OWN_SESSIONS: dict[str, boto3.Session] = {}


def _own_session(region: str) -> boto3.Session:
    """The embedded AWS's own session (kept per process: its loader caches the service models).
    Its clients are not authorized: they play AWS itself, the harness and the tests."""
    if region not in _OWN_SESSIONS:
        _OWN_SESSIONS[region] = boto3.Session(region_name=region)
    return _OWN_SESSIONS[region]


@dataclass(frozen=True)
class RoleCredentials:
    """What Lambda puts in a function's environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``): temporary credentials of its execution role, in a session named after
    the function; ``caller_arn`` is what STS ``GetCallerIdentity`` answers for them."""

    access_key: str
    secret_key: str
    session_token: str
    caller_arn: str

    @classmethod
    def of(cls, function: str, role_arn: str) -> RoleCredentials:
        digest = hashlib.sha256(f"{role_arn}/{function}".encode()).hexdigest()
        role_name = role_arn.rsplit("/", 1)[1]  # STS names the role without its path
        return cls(f"ASIA{digest[:16].upper()}", digest[16:56], f"local-session-{digest[56:]}",
                   f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/{role_name}/{function}")


class _FunctionClients:
    """``nodemedic.wiring.client`` as Lambda gives it: each function's clients sign with its own
    role's credentials (so a token it presigns from STS names its role, as EKS will read it), kept
    per function as its warm container keeps them. Outside a function: the process's credentials."""

    def __init__(self, embedded: EmbeddedAWS) -> None:
        self._embedded = embedded
        self._clients: dict[tuple[tuple[str, str] | None, str], Any] = {}
        self._lock = threading.Lock()

    def __call__(self, service: str) -> Any:
        from nodemedic.aws_retries import CLIENT_CONFIG

        caller: tuple[str, str] | None = getattr(self._embedded._caller, "function", None)
        with self._lock:
            if (caller, service) not in self._clients:
                keys: dict[str, str] = {}
                if caller is not None:
                    creds = self._embedded.role_credentials(*caller)
                    keys = {"aws_access_key_id": creds.access_key, "aws_secret_access_key": creds.secret_key,
                            "aws_session_token": creds.session_token}
                self._clients[(caller, service)] = boto3.client(  # type: ignore[call-overload]  # any service
                    service, config=CLIENT_CONFIG, **keys)
            return self._clients[(caller, service)]

    def cache_clear(self) -> None:
        with self._lock:
            self._clients.clear()


_PARSED: dict[str, Any] = {}
_PARSED_KEPT = 32
_PARSING = threading.Lock()


def _execution_status(execution: Execution) -> str:
    """An execution's status. moto lists an execution before it starts it (``start_execution``
    appends it, then sets it RUNNING), so a ListExecutions from another thread in between raised
    on its status of None. StartExecution returns only once the execution runs (Step Functions
    API reference): it is RUNNING."""
    return execution.exec_status.value if execution.exec_status is not None else "RUNNING"


def _program(definition: str) -> Any:
    """A definition parsed once (~90 ms for ours, with ANTLR). The parsed program is declarations
    only (each execution's state lives in its Environment), so one parse per definition serves
    its check at CreateStateMachine and every execution; moto parsed it again for each."""
    with _PARSING:
        if definition not in _PARSED:
            _PARSED[definition] = AmazonStateLanguageParser.parse(definition)[0]
            while len(_PARSED) > _PARSED_KEPT:  # the oldest first: each stack's functions have new names
                del _PARSED[next(iter(_PARSED))]
        return _PARSED[definition]


_MOTO_VALIDATE = StepFunctionsParserBackend._validate_definition


def _validated(definition: str) -> None:
    """moto's check of a definition at CreateStateMachine, with the parse the executions reuse;
    a bad definition is refused as moto refuses it."""
    try:
        _program(definition)
    except Exception:
        _MOTO_VALIDATE(definition=definition)  # raises moto's InvalidDefinition
        raise


def _parsed_program(worker: ExecutionWorker) -> Any:
    return _program(worker._evaluation_details.state_machine_details.definition)


# Terminal errors that a Retrier or Catcher on States.ALL does not match (it matches them only by
# name): "States.ALL ... can't catch the States.DataLimitExceeded terminal error type and runtime
# error types" (Step Functions developer guide, "Error names"). A state whose output exceeds the
# 256 KiB payload quota ends the execution, whatever its Catch; moto's States.ALL matched them.
_TERMINAL = frozenset({StatesErrorNameType.StatesStatesDataLimitExceeded, StatesErrorNameType.StatesRuntime})


def _states_all_misses_terminal_errors(decl: ErrorEqualsDecl, env: Any) -> None:
    error_name = env.stack[-1]
    if isinstance(error_name, StatesErrorName) and error_name.typ in _TERMINAL \
            and not any(isinstance(n, StatesErrorName) and n.typ == error_name.typ for n in decl.error_names):
        env.stack.pop()
        env.stack.append(False)
        return
    _ORIGINAL_ERROR_EQUALS(decl, env)


_ORIGINAL_ERROR_EQUALS = ErrorEqualsDecl._eval_body


def _atomic(write: Any) -> Any:
    """moto's DynamoDB writes are read-modify-write without a lock; on AWS each is atomic."""

    def locked(*args: Any, **kwargs: Any) -> Any:
        with _DYNAMODB_WRITES:
            return write(*args, **kwargs)

    return locked


def _key_size_checked(operation: Any) -> Any:
    """moto checks a key's size only where an item is written. DynamoDB refuses a partition key over
    2,048 bytes (a sort key over 1,024) in every request that names one: GetItem, BatchGetItem,
    DeleteItem and UpdateItem answer ValidationException ("Size of hashkey has exceeded the maximum
    size limit of 2048 bytes"; Amazon DynamoDB Developer Guide, "Service, account, and table quotas":
    partition key length; the responses captured from DynamoDB in ExtendDB pull request 194). Here a
    read with such a key found nothing, so code that only ever read one looked fine."""

    def run(self: DynamoDBBackend, table_name: str, key: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        self.get_table(table_name)._validate_key_sizes(key)
        return operation(self, table_name, key, *args, **kwargs)

    return run


_VALUE_PLACEHOLDER = re.compile(r":[A-Za-z0-9_]+")
_EXPRESSIONS = ("ConditionExpression", "KeyConditionExpression", "FilterExpression", "UpdateExpression")


def _values_used(action: Any, *, prefixed: bool) -> Any:
    """moto refuses an ``ExpressionAttributeValues`` entry no expression uses only in UpdateItem.
    DynamoDB refuses it in every request that takes expressions (ValidationException "Value
    provided in ExpressionAttributeValues unused in expressions: keys: {:x}", with "1 validation
    error detected: " before it in PutItem and DeleteItem: the responses of the live service
    recorded in floci-io/floci issue 2893; ExtendDB pull request 10 lists PutItem, DeleteItem,
    UpdateItem, Query, Scan and each item of TransactWriteItems). A value is only ever named by a
    placeholder (an expression has no literals), so a placeholder not in any expression is unused."""

    def run(self: DynamoHandler) -> Any:
        requests = [next(iter(item.values())) for item in self.body.get("TransactItems", [])] or [self.body]
        for request in requests:
            used = {p for key in _EXPRESSIONS for p in _VALUE_PLACEHOLDER.findall(request.get(key) or "")}
            unused = sorted(k for k in request.get("ExpressionAttributeValues") or {} if k not in used)
            if unused:
                raise MockValidationException(("1 validation error detected: " if prefixed else "")
                                              + f"Value provided in ExpressionAttributeValues unused in expressions: "
                                              f"keys: {{{', '.join(unused)}}}")
        return action(self)

    return run


def _sns_publish_checked(publish: Any) -> Any:
    """moto publishes an empty message, and a subject that is empty or holds a line break or another
    control character. SNS refuses each: "Subjects must be UTF-8 text with no line breaks or
    control characters, and less than 100 characters long" (Amazon SNS API Reference, Publish,
    Subject; SNS answers "Invalid parameter: Subject" to an empty one too, and takes 100 characters,
    as moto does: getmoto/moto issue 1503, wellcomecollection/platform issue 1107), and a message
    must not be empty ("Invalid parameter: Empty message"). A page whose subject is built from what
    an event carried is never sent on AWS, and the on-call hears nothing."""

    def run(self: SNSBackend, message: str, arn: str | None, *args: Any, **kwargs: Any) -> Any:
        subject = kwargs.get("subject", args[1] if len(args) > 1 else None)
        if subject is not None and (not subject or any(unicodedata.category(c) == "Cc" for c in subject)):
            raise SnsInvalidParameter("Invalid parameter: Subject")
        if not message:
            raise SnsInvalidParameter("Invalid parameter: Empty message")
        return publish(self, message, arn, *args, **kwargs)

    return run


# "The maximum item size in DynamoDB is 400 KB, which includes both attribute name binary length
# (UTF-8 length) and attribute value lengths" (Amazon DynamoDB Developer Guide, "Service, account,
# and table quotas", https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html)
DYNAMODB_ITEM_BYTES = 400 * 1024


def _item_size_checked(update: Any) -> Any:
    """moto checks an item's size only when an attribute is assigned, so an update can grow an item
    past what AWS refuses (UpdateItem's ValidationException "Item size to update has exceeded the
    maximum allowed size"), and one that moto refuses midway keeps what it changed before (``ADD``
    grows a set in place, then assigns it). Checked here once the update is applied; an update
    refused for any reason leaves the item as it was, as on AWS."""

    def run(self: DynamoDBBackend, table_name: str, key: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        with _DYNAMODB_WRITES:
            table = self.get_table(table_name)
            hash_value, range_value = self.get_keys_value(table, key)
            before = copy.deepcopy(table.get_item(hash_value, range_value))
            try:
                item = update(self, table_name, key, *args, **kwargs)
                if item.size() > DYNAMODB_ITEM_BYTES:
                    raise ItemSizeToUpdateTooLarge()
            except Exception:
                _put_back(table, hash_value, range_value, before)
                raise
            return item

    return run


def _put_back(table: Table, hash_value: Any, range_value: Any, item: Any) -> None:
    """Make ``item`` (None: no item) what the table holds under its key again."""
    home = table.items[hash_value] if range_value else table.items
    slot = range_value if range_value else hash_value
    if item is None:
        home.pop(slot, None)
    else:
        home[slot] = item


class _TablesNotCopied:
    """``copy`` as moto's DynamoDB models see it: a whole Table is not deep-copied (see
    :func:`_item_rollback`); anything else is."""

    @staticmethod
    def deepcopy(value: Any, memo: dict[int, Any] | None = None) -> Any:
        return value if isinstance(value, Table) else copy.deepcopy(value, memo)


def _item_rollback(transact: Any) -> Any:
    """moto backs a transaction up by deep-copying every table it writes, whole: O(items) per
    call, so a storm of 20,000 events spends seconds and gigabytes per TransactWriteItems. Writes
    are serialized here (``_atomic``), so only the items a transaction names can change while it
    runs: those are backed up, and restored when it is cancelled. All or nothing, as on AWS."""

    def run(self: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> None:
        with _DYNAMODB_WRITES:
            saved = []
            for entry in transact_items:
                try:
                    op = next(iter(entry.values()))
                    table = self.get_table(op["TableName"])
                    key = op.get("Key") or {k: op["Item"][k] for k in (table.hash_key_attr, table.range_key_attr) if k}
                    hash_value, range_value = self.get_keys_value(table, key)
                except Exception:  # noqa: BLE001 - a malformed request: moto's own code rejects it, unchanged
                    continue
                saved.append((table, hash_value, range_value, copy.deepcopy(table.get_item(hash_value, range_value))))
            try:
                transact(self, transact_items)
            except Exception:
                for table, hash_value, range_value, item in reversed(saved):
                    _put_back(table, hash_value, range_value, item)
                raise

    return run


@dataclass(frozen=True)
class FunctionSource:
    """Where a deployed function's code lives on this machine."""

    code_dir: Path
    handler: str  # "module.function"


@dataclass
class Invocation:
    function: str
    event: Any
    result: Any = None
    error_type: str | None = None
    error_message: str = ""
    logs: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class Denial:
    """A call a deployed function made that its role does not allow (AWS would refuse it too)."""

    function: str
    action: str
    resource: str
    context: dict[str, list[str]]
    reason: str

    def __str__(self) -> str:
        return (f"{self.function} may not {self.action} on {self.resource} ({self.reason}); its role needs "
                f"{iam.needed_statement(iam.Request(self.action, self.resource, self.context))}"
                + (f" with a condition that holds for {self.context}" if self.context else ""))


@dataclass
class Throttle:
    """AWS throttling injected into the deployed functions' (and the state machine's) calls: the
    next ``times`` attempts of a matching call get the service's throttling error, as a response,
    so the SDK's own retries see it as they would on AWS."""

    service: str  # the client's signing name: dynamodb, ec2, autoscaling, ssm, states, ...
    operation: str | None = None  # e.g. "UpdateItem"; None: every operation
    caller: str | None = None  # a part of the function's name ("Drain"), "state machine"; None: any
    times: int = 1
    containing: str | None = None  # only requests whose body holds this text (a key: "OUTBOX#")
    hits: list[str] = field(default_factory=list)  # "caller service:operation" of each throttled attempt

    def matches(self, caller: str, service: str, operation: str, body: bytes) -> bool:
        return (self.times > len(self.hits) and service == self.service
                and self.operation in (None, operation) and (self.caller is None or self.caller in caller)
                and (self.containing is None or self.containing.encode() in body))


@dataclass
class EntryFailure:
    """EventBridge taking a PutEvents call but failing some of its entries, as it does under load:
    the response's ``FailedEntryCount`` and, per failed entry, an ``ErrorCode`` (``InternalFailure``
    and ``ThrottlingException`` are the retryable ones; EventBridge API reference,
    PutEventsResultEntry). The SDK does not retry an entry: the caller must. moto never fails one.
    The next ``times`` entries with ``source`` fail; the call's other entries go through."""

    source: str
    times: int = 1
    code: str = "InternalFailure"
    failed: list[dict[str, Any]] = field(default_factory=list)  # the entries that failed


    def take(self, entry: dict[str, Any]) -> dict[str, str] | None:
        """The entry's error if this rule fails it (counting it), else None."""
        if entry.get("Source") != self.source or len(self.failed) >= self.times:
            return None
        self.failed.append(entry)
        return {"ErrorCode": self.code, "ErrorMessage": "injected by the local stack"}


def _entries_failing(original: Callable[..., list[dict[str, Any]]],
                     error_of: Callable[[dict[str, Any]], dict[str, str] | None]) -> Callable[..., list[dict[str, Any]]]:
    """PutEvents that fails each entry ``error_of`` gives an error (its ``ErrorCode``/``ErrorMessage``)
    and puts the others, answering in the order of the request as EventBridge does."""
    def put_events(backend: Any, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        errors = [error_of(e) for e in events]
        passed = [e for e, error in zip(events, errors, strict=True) if error is None]
        done = iter(original(backend, passed) if passed else [])
        return [error or next(done) for error in errors]
    return put_events


def _request_within_limit(original: Callable[..., list[dict[str, Any]]]) -> Callable[..., list[dict[str, Any]]]:
    """PutEvents refusing a whole request over EventBridge's size limit (aws_rules); moto checks
    no size."""
    def put_events(backend: Any, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if sum(put_events_entry_size(e) for e in events) > PUT_EVENTS_REQUEST_LIMIT:
            raise EventsValidationException("Total size of the entries in the request is over the limit.")
        return original(backend, events)
    return put_events


def _input_within_quota(original: Callable[..., Any]) -> Callable[..., Any]:
    """StartExecution refusing an input over Step Functions' payload quota (aws_rules); moto
    starts any."""
    def start_execution(backend: Any, state_machine_arn: str, name: Any = None, execution_input: Any = None,
                        *args: Any, **kwargs: Any) -> Any:
        if execution_input is not None and len(str(execution_input).encode()) > STATES_PAYLOAD_LIMIT:
            raise StatesValidationException(
                "1 validation error detected: Value at 'input' failed to satisfy constraint: "
                f"Member must have length less than or equal to {STATES_PAYLOAD_LIMIT}")
        return original(backend, state_machine_arn, name, execution_input, *args, **kwargs)
    return start_execution


SSM_LIST_PAGE = 50  # ListCommands' MaxResults: 1-50


def _list_commands_as_ssm(response: SimpleSystemManagerResponse) -> ActionResult:
    """ListCommands as SSM answers it: its Filters applied (DocumentName, InvokedAfter,
    InvokedBefore, Status) and at most MaxResults commands a page, with a NextToken for the rest
    (SSM API reference, ListCommands and CommandFilter). moto ignores all three: a caller that
    forgot to page, or relied on a filter moto skipped, would pass here and fail on AWS."""
    commands = response.ssm_backend.list_commands(response._get_param("CommandId"), response._get_param("InstanceId"))
    for spec in response._get_param("Filters") or []:
        key, value = spec["key"], spec["value"]
        if key == "DocumentName":
            commands = [c for c in commands if c.document_name == value]
        elif key in ("InvokedAfter", "InvokedBefore"):
            bound = datetime.fromisoformat(value.replace("Z", "+00:00"))
            after = key == "InvokedAfter"
            commands = [c for c in commands if (c.requested_date_time.replace(tzinfo=UTC) >= bound) == after]
        elif key == "Status":
            commands = [c for c in commands if c.status == value]
        else:
            raise SSMException("InvalidFilterKey", f"local mode: ListCommands filter {key} is not emulated")
    size = int(response._get_param("MaxResults") or SSM_LIST_PAGE)
    start = int(response._get_param("NextToken") or 0)
    body: dict[str, Any] = {"Commands": [c.response_object() for c in commands[start:start + size]]}
    if start + size < len(commands):
        body["NextToken"] = str(start + size)
    return ActionResult(body)


# each service's throttling error (its API reference); botocore retries all of them
THROTTLING_CODE = {"ec2": "RequestLimitExceeded", "dynamodb": "ProvisionedThroughputExceededException",
                   "autoscaling": "Throttling", "sns": "Throttling", "sqs": "RequestThrottled"}


def _throttled_response(url: str, protocol: str, code: str) -> AWSResponse:
    return _error_response(url, protocol, code, "Rate exceeded (injected by the local stack)", 400)


def _error_response(url: str, protocol: str, code: str, message: str, status: int) -> AWSResponse:
    if protocol in ("json", "rest-json"):
        body = json.dumps({"__type": code, "message": message})
        headers = {"x-amzn-ErrorType": code, "Content-Type": "application/x-amz-json-1.0"}
    elif protocol == "ec2":
        body = f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors></Response>"
        headers = {"Content-Type": "text/xml"}
    else:  # query
        body = f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error></ErrorResponse>"
        headers = {"Content-Type": "text/xml"}
    return AWSResponse(url, status, HTTPHeaders.from_dict(headers), MockRawResponse(body))


# AWS refuses a request signed too far from its own time: "a request must reach AWS within five
# minutes of the time stamp in the request" (IAM User Guide, "AWS Signature Version 4 for API
# requests"); EC2 allows 15 minutes (EC2 API Reference, "Error codes": RequestExpired). moto never
# looks at the time stamp, so an agent whose clock is off would reach the fake and not AWS.
SIGNING_WINDOW = {"ec2": timedelta(minutes=15)}
SIGNING_WINDOW_DEFAULT = timedelta(minutes=5)
_EXPIRED_CODE = {"json": ("InvalidSignatureException", 400), "rest-json": ("InvalidSignatureException", 403),
                 "ec2": ("RequestExpired", 400), "query": ("SignatureDoesNotMatch", 403)}


def _signing_time_refusal(request: Any, service: str, protocol: str, now: datetime) -> AWSResponse | None:
    """AWS's answer to a request whose SigV4 time stamp (``X-Amz-Date``) is outside the window,
    worded as AWS words it; None when the request is in time (or carries no header stamp)."""
    stamp = request.headers.get("X-Amz-Date")
    if not stamp:
        return None
    stamp = stamp.decode() if isinstance(stamp, bytes) else str(stamp)
    try:
        signed = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    window = SIGNING_WINDOW.get(service, SIGNING_WINDOW_DEFAULT)
    fmt, minutes = "%Y%m%dT%H%M%SZ", int(window.total_seconds() // 60)
    if signed < now - window:
        message = (f"Signature expired: {stamp} is now earlier than {(now - window).strftime(fmt)} "
                   f"({now.strftime(fmt)} - {minutes} min.)")
    elif signed > now + window:
        message = (f"Signature not yet current: {stamp} is still later than {(now + window).strftime(fmt)} "
                   f"({now.strftime(fmt)} + {minutes} min.)")
    else:
        return None
    code, status = _EXPIRED_CODE.get(protocol, _EXPIRED_CODE["query"])
    response = _error_response(request.url, protocol, code, message, status)
    response.headers["Date"] = now.strftime("%a, %d %b %Y %H:%M:%S GMT")  # as every AWS answer has
    return response


def _check_signing_time(request: Any, event_name: str = "", **_: Any) -> AWSResponse | None:
    service = event_name.split(".")[1] if event_name.count(".") >= 2 else ""
    headers = request.headers
    content_type = headers.get("Content-Type") or b""
    content_type = content_type.decode() if isinstance(content_type, bytes) else str(content_type)
    protocol = ("json" if headers.get("X-Amz-Target") else "ec2" if service == "ec2"
                else "query" if content_type.startswith("application/x-www-form-urlencoded") else "rest-json")
    response = _signing_time_refusal(request, service, protocol, datetime.now(UTC))
    if response is not None:
        request.url = "https://refused.nodemedic.invalid/"  # as a throttled call: the backend must not act
    return response


_DENIED_CODE = {"ec2": "UnauthorizedOperation", "sns": "AuthorizationError", "autoscaling": "AccessDenied",
                "sqs": "AccessDenied", "sts": "AccessDenied", "iam": "AccessDenied", "s3": "AccessDenied"}


@dataclass(frozen=True)
class CommandOutcome:
    status: str  # SSM status: Success | Failed | TimedOut | Undeliverable
    exit_code: int
    stdout: str
    stderr: str


@dataclass
class _Run:
    """One command on one instance, running in the background as on a real SSM agent."""

    timeout: int  # seconds the agent lets it run (its executionTimeout, as the agent takes it)
    done: threading.Event = field(default_factory=threading.Event)
    outcome: CommandOutcome | None = None
    started: datetime | None = None
    ended: datetime | None = None


class CommandHost(Protocol):
    """Runs what SSM Run Command sends to an instance (the local mode runs it on this machine)."""

    def run(self, instance_id: str, script: str, timeout_s: int) -> CommandOutcome: ...

    def rebooted(self, instance_ids: list[str]) -> None:
        """EC2 rebooted these instances (moto's reboot changes nothing a command could see)."""

    def registered(self, instance_id: str, launched: float) -> bool:
        """The instance (launched at ``launched``, epoch seconds) has come up at least once since,
        so its SSM agent has registered it."""


class _Capture(io.TextIOBase):
    """A stdout that writes to the current invocation's buffer (loggers bind it at import)."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextlib.contextmanager
    def into(self, buffer: io.StringIO) -> Iterator[None]:
        previous = getattr(self._local, "buffer", None)
        self._local.buffer = buffer
        try:
            yield
        finally:
            self._local.buffer = previous

    def active(self) -> bool:
        """This thread runs a Lambda invocation."""
        return getattr(self._local, "buffer", None) is not None

    def write(self, text: str) -> int:
        buffer: TextIO | None = getattr(self._local, "buffer", None) or sys.__stdout__
        return buffer.write(text) if buffer else len(text)  # no stdout at all (pythonw): nowhere to write

    def flush(self) -> None:
        return None


# One per process: powertools loggers are process-global per service name and keep the stream
# they were created with, so every EmbeddedAWS must hand out the same one.
_CAPTURE = _Capture()
_builtin_print = builtins.print


def _print(*args: Any, **kwargs: Any) -> None:
    """``print`` as a handler calls it (powertools prints its metrics' EMF lines) writes to the
    invocation's log, whatever ``sys.stdout`` another thread has swapped in meanwhile (a CLI
    under test, pytest's capture between phases); any other thread's print is untouched. Swapping
    ``sys.stdout`` per invocation instead lost lines when another swap interleaved with it."""
    if kwargs.get("file") is None and _CAPTURE.active():
        kwargs["file"] = _CAPTURE
    _builtin_print(*args, **kwargs)


builtins.print = _print


class _ScaledTime:
    """Stands in for the ``time`` module inside moto's retrier: Retry intervals × scale."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds * self.scale)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _scaled_delay(original: Callable[..., float], scale: float) -> Callable[..., float]:
    def delay_amount(self: Any, context: Any) -> float:
        return float(original(self, context)) * scale
    return delay_amount


_AWS_SERVICE = threading.local()  # set while the embedded AWS emits an event as an AWS service would


@contextlib.contextmanager
def as_aws_service() -> Iterator[None]:
    """Emit events as AWS itself does (the SSM and CloudWatch emitters, the AWS Health harness):
    only then may a PutEvents entry carry an ``aws.*`` source."""
    previous = getattr(_AWS_SERVICE, "on", False)
    _AWS_SERVICE.on = True
    try:
        yield
    finally:
        _AWS_SERVICE.on = previous


def _aws_source_refused(entry: dict[str, Any]) -> dict[str, str] | None:
    """EventBridge refuses a PutEvents entry whose source starts with ``aws.`` from any caller
    (that entry fails with NotAuthorizedForSourceException; the others go through): only AWS
    services emit those. moto accepts them. (EventBridge API reference, PutEvents; the entry
    error seen on AWS: "NotAuthorizedForSourceException: Not authorized for the source.")"""
    if getattr(_AWS_SERVICE, "on", False) or not str(entry.get("Source", "")).startswith("aws."):
        return None
    return {"ErrorCode": "NotAuthorizedForSourceException", "ErrorMessage": "Not authorized for the source."}


class _NoJsonNumberError(Exception):
    """NaN or Infinity in a Detail (json.loads hands them to ``parse_constant``)."""


def _no_json_number(constant: str) -> Any:
    raise _NoJsonNumberError(constant)


def _detail_not_an_object(entry: dict[str, Any]) -> dict[str, str] | None:
    """EventBridge fails a PutEvents entry whose Detail is JSON but not an object (an array, a
    string, a number, null): "Detail: A valid JSON object" (EventBridge API reference,
    PutEventsRequestEntry), and the entry error recorded from AWS for "[]" and a serialized string
    (localstack/localstack tests/aws/services/events/test_events.snapshot.json,
    test_put_event_malformed_detail) is MalformedDetail. moto puts them (and only warns). So is a
    Detail holding NaN or Infinity, which Python writes and reads but JSON does not have ("Numeric
    values that cannot be represented in the grammar below (such as Infinity and NaN) are not
    permitted", RFC 8259, section 6); moto read them as Python does."""
    detail = entry.get("Detail")
    if not isinstance(detail, str):
        return None
    try:
        parsed = json.loads(detail, parse_constant=_no_json_number)
    except _NoJsonNumberError:
        parsed = None
    except ValueError:
        return None  # moto's own MalformedDetail
    return None if isinstance(parsed, dict) else {"ErrorCode": "MalformedDetail", "ErrorMessage": "Detail is malformed."}


# "With short polling, the ReceiveMessage request queries only a subset of the servers (based on a
# weighted random distribution) to find messages that are available to include in the response.
# Amazon SQS sends the response right away, even if the query found no messages"; long polling
# eliminates "false empty responses (when messages are available but aren't included in a
# response)" (Amazon SQS Developer Guide, "Amazon SQS short and long polling",
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-short-and-long-polling.html).
# moto's short poll reads every message. Here a standard queue's messages lie on SQS_SERVERS
# servers (by message id), and each short poll of a queue reads one of them, in turn: a reader
# that stops at its first empty short poll leaves messages behind, as it may on AWS.
SQS_SERVERS = 3
_SQS_SAMPLE = threading.local()
_ALL_MESSAGES = SqsQueue.messages


def _sampled_messages(queue: SqsQueue) -> list[Any]:
    messages: list[Any] = _ALL_MESSAGES.fget(queue)  # type: ignore[attr-defined]
    server = getattr(_SQS_SAMPLE, "server", None)
    return messages if server is None else [m for m in messages if zlib.crc32(m.id.encode()) % SQS_SERVERS == server]


def _sqs_receive(receive: Callable[..., list[Any]], embedded: EmbeddedAWS) -> Callable[..., list[Any]]:
    """ReceiveMessage as SQS answers it: a short poll reads one server (``_sampled_messages``); a
    long poll reads all and waits until a message comes or its wait ends. The local stack runs one
    function at a time (``_invoke``), so a function's long poll on an empty queue stalls every
    other function for its whole wait, as AWS, which runs them side by side, does not: that wait
    is scaled by ``retry_time_scale``, as the other waits of a run are."""
    turns: dict[str, Iterator[int]] = {}
    lock = threading.Lock()

    def run(self: SQSBackend, queue_name: str, count: int, wait_seconds_timeout: int, *args: Any) -> list[Any]:
        queue = self.get_queue(queue_name)
        if not wait_seconds_timeout and not queue.fifo_queue:
            with lock:
                _SQS_SAMPLE.server = next(turns.setdefault(queue_name, itertools.cycle(range(SQS_SERVERS))))
            try:
                return receive(self, queue_name, count, 0, *args)
            finally:
                _SQS_SAMPLE.server = None
        if not wait_seconds_timeout or getattr(embedded._caller, "function", None) is None:
            return receive(self, queue_name, count, wait_seconds_timeout, *args)
        deadline = time.monotonic() + wait_seconds_timeout * embedded.retry_time_scale
        while not (got := receive(self, queue_name, count, 0, *args)) and (left := deadline - time.monotonic()) > 0:
            queue.wait_for_messages(left)  # type: ignore[arg-type]  # a Condition's wait: seconds, a float
        return got

    return run


class EmbeddedAWS:
    """Start moto in this process with the local mode's hooks; use as a context manager."""

    def __init__(self, region: str = REGION, retry_time_scale: float = 1.0, task_timeout_scale: float = 1.0) -> None:
        """``retry_time_scale`` shortens Retry waits for tests (and a function's SQS long poll on an
        empty queue: see ``_sqs_receive``). ``task_timeout_scale`` lengthens Task
        ``TimeoutSeconds``: this process runs Lambda invocations one at a time, so under a burst a
        task can wait for its turn far longer than it would on AWS."""
        self.region = region
        self.retry_time_scale = retry_time_scale
        self.task_timeout_scale = task_timeout_scale
        self.functions: dict[str, FunctionSource] = {}
        self._function_env_keys: set[str] = set()
        self._clients: dict[str, Any] = {}
        self._clients_lock = threading.Lock()
        self.command_host: CommandHost | None = None
        self._before_invoke: list[tuple[str, Callable[[dict[str, Any]], bool], Callable[[dict[str, Any]], None],
                                        list[dict[str, Any]]]] = []
        self.invocations: list[Invocation] = []
        self.delivery_failures: list[dict[str, Any]] = []
        self._modules: dict[str, ModuleType] = {}
        self._capture = _CAPTURE
        self._lambda_lock = threading.RLock()
        self._stack = contextlib.ExitStack()
        self._schedules: threading.Event | None = None
        # a command's status event is published while the mocks stand: one that ends after stop()
        # publishes nothing (it would otherwise go to the real AWS endpoint)
        self._running = False
        self._lifecycle = threading.Lock()
        self._runs: dict[tuple[str, str], _Run] = {}
        self.hyperpod = hyperpod.HyperPodEmulation(ACCOUNT_ID, region, on_reboot=self._rebooted)
        self.ec2_capacity = True  # False: StartInstances fails with InsufficientInstanceCapacity
        self.invocation_lag_s = SSM_INVOCATION_LAG_S  # GetCommandInvocation's InvocationDoesNotExist window
        self.lambda_concurrency_quota = NEW_ACCOUNT_CONCURRENCY  # the low quota of a new account
        # IAM: each function's calls are authorized against its role (see nodemedic_sandbox.iam)
        self.denials: list[Denial] = []
        self.authorized: list[tuple[str, iam.Request]] = []  # (who, request) for every allowed call
        self.state_machine_roles: list[str] = []  # the deployed state machines' roles (deploy.py)
        self.agent_roles: list[str] = []  # a role with the deployed AgentPublishPolicy attached (deploy.py)
        self.relay_roles: list[str] = []  # the controller's role, with the deployed RelayPolicy attached (deploy.py)
        self.throttles: list[Throttle] = []  # see throttle()
        self.entry_failures: list[EntryFailure] = []  # see fail_entries()
        self._entry_failures_lock = threading.Lock()
        self._caller = threading.local()  # the function whose handler runs on this thread
        # what STS knows: each function's credentials (access key -> (secret, caller ARN)), see role_credentials
        self.credentials: dict[str, tuple[str, str]] = {}
        self.eks_access_entries: dict[str, Callable[[str, list[str]], None]] = {}  # see create_access_entry
        self._role_policies: dict[str, list[dict[str, Any]]] = {}
        self._own: boto3.Session | None = None  # the embedded AWS's own clients: never authorized

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> EmbeddedAWS:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
            "MOTO_ACCOUNT_ID": ACCOUNT_ID,
            # typer (>= 0.29) sets this around building a command's parameters and deletes it
            # afterwards unless it existed: a CLI call in the test thread would then make the key
            # vanish under moto's worker threads iterating os.environ (KeyError). Present and empty
            # it is restored instead of deleted, and pydantic reads "" as unset (no plugin disabled).
            "PYDANTIC_DISABLE_PLUGINS": os.environ.get("PYDANTIC_DISABLE_PLUGINS", ""),
        }
        self._stack.enter_context(mock.patch.dict(os.environ, env))
        self._stack.enter_context(
            mock_aws(config={"stepfunctions": {"execute_state_machine": True},
                             "lambda": {"use_docker": False}})
        )
        self._own = _own_session(self.region)
        self._running = True
        # the functions' clients come from boto3's default session (nodemedic.wiring.client):
        # every call they make passes through the authorizer first. moto makes that session anew
        # at each start; it gets the process's loader of service models, whose cache is what a
        # thousand Step Functions threads creating Lambda clients at once would otherwise each
        # parse again, and what each start parsed again (half a stack's start-up).
        session = boto3._get_default_session()
        session._session.register_component("data_loader", self._own._session.get_component("data_loader"))
        for service in SERVICES:
            session.client(service)  # type: ignore[call-overload]  # every model loaded before any burst
        session.events.register("before-parameter-build", _remember_parameters)
        session.events.register("before-call", self._authorize)
        # a before-send handler answers the request when it returns a response (botocore's
        # endpoint.py); botocore-stubs types every handler as returning None
        answering: list[Callable[..., None]] = [self._maybe_throttle, _check_signing_time]  # type: ignore[list-item]
        for handler in answering:  # registered first: ahead of moto's stubber; AWS looks at the signing time first
            session.events.register_first("before-send", handler)
            self._stack.callback(session.events.unregister, "before-send", handler)
        self._stack.callback(session.events.unregister, "before-parameter-build", _remember_parameters)
        self._stack.callback(session.events.unregister, "before-call", self._authorize)
        from nodemedic import wiring

        wiring.reset()  # clients made before the authorizer was registered are gone
        self._stack.enter_context(mock.patch.object(wiring, "client", _FunctionClients(self)))
        _warm_service_models()
        embedded = self

        def invoke(backend: LambdaSimpleBackend, function_name: str, qualifier: str | None,
                   body: Any, headers: Any, response_headers: dict[str, str]) -> bytes:
            return embedded._invoke(backend, function_name, qualifier, body, headers, response_headers)

        def send_to_targets(rule: Rule, event: EventMessageType, transform_input: bool = True) -> None:
            if rule.scheduled_expression:  # a schedule matches no event (moto's empty pattern matches all)
                return
            embedded._deliver(rule, event, transform_input)

        original_send = SimpleSystemManagerBackend.send_command

        def send_command(backend: SimpleSystemManagerBackend, *args: Any, **kwargs: Any) -> Command:
            for instance_id in kwargs.get("instance_ids") or []:
                embedded._check_managed(instance_id)
            document = embedded._document(kwargs["document_name"])
            if document is not None:  # SSM checks the values against the document before sending
                check_parameters(kwargs["document_name"], document, kwargs.get("parameters") or {})
            command = original_send(backend, *args, **kwargs)
            embedded._start_command(command, document)
            return command

        original_invocation = Command.get_invocation

        def get_invocation(command: Command, instance_id: str, plugin: str | None) -> dict[str, Any]:
            return embedded._run_command(command, instance_id, plugin, original_invocation)

        original_targets = Command._get_instance_ids_from_targets

        def instance_ids_from_targets(command: Command) -> list[str]:
            # moto 5.2.5 adds *every* instance when a command has no Targets (only InstanceIds)
            return original_targets(command) if command.targets else []

        original_set_alarm_state = CloudWatchBackend.set_alarm_state

        def set_alarm_state(backend: CloudWatchBackend, alarm_name: str, reason: str,
                            reason_data: str, state_value: str) -> None:
            old = backend.alarms[alarm_name].state_value if alarm_name in backend.alarms else None
            original_set_alarm_state(backend, alarm_name, reason, reason_data, state_value)
            if old != state_value:
                embedded._emit_alarm_event(backend, alarm_name, old, state_value, reason)

        original_reboot = InstanceBackend.reboot_instances

        def reboot_instances(backend: InstanceBackend, instance_ids: list[str]) -> Any:
            # "Requests to reboot terminated instances are ignored" (EC2 API reference,
            # RebootInstances); moto 5.2.5 sets any instance running, a terminated or stopped one
            # too. A reboot is an operating-system reboot of a running instance (EC2 User Guide,
            # "Reboot your Amazon EC2 instance"); one stopped, stopping or still pending is refused
            # with IncorrectInstanceState (EC2 API reference, "Error codes": the instance is in an
            # incorrect state for the requested action). An id EC2 does not know is refused
            # (InvalidInstanceID.NotFound), as moto does
            known = backend.get_multi_instances_by_id(instance_ids)
            if idle := [i.id for i in known if i.state in ("pending", "stopping", "stopped")]:
                raise EC2ClientError("IncorrectInstanceState",
                                     f"The instance '{idle[0]}' is not in a state from which it can be rebooted.")
            live = [i.id for i in known if i.state not in ("shutting-down", "terminated")]
            rebooted = original_reboot(backend, live) if live else []
            embedded._rebooted([i.id for i in rebooted])
            return rebooted

        original_start = InstanceBackend.start_instances

        def start_instances(backend: InstanceBackend, instance_ids: list[str]) -> Any:
            if not embedded.ec2_capacity:
                raise EC2ClientError("InsufficientInstanceCapacity", "We currently do not have sufficient "
                                     "p5.48xlarge capacity in the Availability Zone you requested.")
            started = original_start(backend, instance_ids)
            for instance, before in started:
                # an instance started from stopped (or hibernated) gets that start as its LaunchTime
                # (EC2 User Guide, "Stop and start Amazon EC2 instances": LaunchTime is the most
                # recent launch; the first is the primary network interface's attach time); moto
                # keeps the first launch
                if before.name == "stopped":
                    instance.launch_time = utcnow()
            embedded._rebooted([instance.id for instance, _ in started])  # a start boots it
            return started

        original_terminate = AutoScalingBackend.terminate_instance

        def terminate_instance(backend: AutoScalingBackend, instance_id: str, should_decrement: bool) -> Any:
            # an instance no group manages (terminated and gone from its group, or detached) is
            # refused with ValidationError "Instance Id not found - No managed instance found for
            # instance ID ..." (what TerminateInstanceInAutoScalingGroup answers on AWS, e.g.
            # github.com/yaybu/touchdown/issues/51, keikoproj/upgrade-manager#25); moto 5.2.5 raises
            # StopIteration out of the request
            group = next((g.name for g in backend.autoscaling_groups.values()
                          for s in g.instance_states if s.instance.id == instance_id), None)
            if group is None:
                raise AutoScalingValidationError(
                    f"Instance Id not found - No managed instance found for instance ID {instance_id}")
            activity = original_terminate(backend, instance_id, should_decrement)
            # a terminated instance keeps its tags while EC2 still lists it (about an hour), the
            # group's aws:autoscaling:groupName too: the group terminated it, it never detached it
            # (EC2 Auto Scaling User Guide, "Tag Auto Scaling groups and instances": the group adds
            # that tag to each instance it launches; only DetachInstances takes an instance out of
            # the group as it runs). moto 5.2.5 terminates by detaching first, which deletes the tag
            backend.ec2_backend.create_tags([instance_id], {"aws:autoscaling:groupName": group})
            return activity

        original_status = InstanceBackend.describe_instance_status

        def describe_instance_status(backend: InstanceBackend, instance_ids: list[str], include_all_instances: bool,
                                     filters: Any) -> Any:
            # moto 5.2.5 ignores the event.code filter (it returns every instance) and has no
            # scheduled events: schedule_instance_event() records them, this filter applies them
            codes = [v for f in filters or [] if f["name"] == "event.code" for v in f["values"]]
            rest = [f for f in filters or [] if f["name"] != "event.code"]
            found = original_status(backend, instance_ids, include_all_instances, rest)
            if not codes:
                return found
            return [i for i in found if any(e["Code"] in codes for e in getattr(i, "events", None) or [])]

        original_statistics = CloudWatchBackend.get_metric_statistics

        def get_metric_statistics(backend: CloudWatchBackend, namespace: str, metric_name: str, start_time: Any,
                                  end_time: Any, period: int, stats: list[str], dimensions: list[dict[str, str]],
                                  unit: str | None = None) -> Any:
            # CloudWatch matches a metric only with exactly the dimensions it was published with
            # (CloudWatch concepts, "Dimensions"); moto matches any superset
            wanted = sorted((d["Name"], d["Value"]) for d in dimensions or [])
            exact = [md for md in backend.get_all_metrics()
                     if sorted((d.name, d.value) for d in md.dimensions) == wanted]
            return original_statistics(SimpleNamespace(get_all_metrics=lambda: exact), namespace,  # type: ignore[arg-type]
                                       metric_name, start_time, end_time, period, stats, [], unit)

        def task_timeout(timeout: TimeoutSeconds, env: Any) -> int:
            return max(1, int(timeout.timeout_seconds * embedded.task_timeout_scale))

        self._original_send_to_targets = Rule.send_to_targets
        for target, attr, new in (
            (LambdaSimpleBackend, "invoke", invoke),
            (Rule, "send_to_targets", send_to_targets),
            (Command, "get_invocation", get_invocation),
            (SimpleSystemManagerBackend, "send_command", send_command),
            (SimpleSystemManagerResponse, "list_commands", _list_commands_as_ssm),
            (Command, "_get_instance_ids_from_targets", instance_ids_from_targets),
            (CloudWatchBackend, "set_alarm_state", set_alarm_state),
            (CloudFormationStack, "parse_template", staticmethod(_template_json_first)),
            (EventsBackend, "put_events", _request_within_limit(_entries_failing(
                EventsBackend.put_events, lambda entry: _aws_source_refused(entry) or _detail_not_an_object(entry)
                or self._injected_entry_error(entry)))),
            (StepFunctionsParserBackend, "start_execution", _input_within_quota(StepFunctionsParserBackend.start_execution)),
            (CloudWatchBackend, "get_metric_statistics", get_metric_statistics),
            (retrier_decl, "time", _ScaledTime(self.retry_time_scale)),
            # the SDK's own backoff (standard mode, what the functions use) is scaled alike
            (ExponentialBackoff, "delay_amount", _scaled_delay(ExponentialBackoff.delay_amount,
                                                               self.retry_time_scale)),
            # a function's worker threads call AWS as the function (and are authorized so)
            (ThreadPoolExecutor, "submit", self._as_submitter(ThreadPoolExecutor.submit)),
            (TimeoutSeconds, "_eval_seconds", task_timeout),
            (InstanceBackend, "reboot_instances", reboot_instances),
            (InstanceBackend, "start_instances", start_instances),
            (AutoScalingBackend, "terminate_instance", terminate_instance),
            (InstanceBackend, "describe_instance_status", describe_instance_status),
            (ExecutionWorker, "_get_evaluation_entrypoint", _parsed_program),
            (StepFunctionsParserBackend, "_validate_definition", staticmethod(_validated)),
            (Execution, "status", property(_execution_status)),
            (ErrorEqualsDecl, "_eval_body", _states_all_misses_terminal_errors),
            *hyperpod.hooks(self.hyperpod),
            (DynamoDBBackend, "put_item", _atomic(DynamoDBBackend.put_item)),
            (DynamoDBBackend, "delete_item", _atomic(_key_size_checked(DynamoDBBackend.delete_item))),
            (DynamoDBBackend, "get_item", _key_size_checked(DynamoDBBackend.get_item)),
            (DynamoDBBackend, "update_item", _item_size_checked(DynamoDBBackend.update_item)),
            (DynamoDBBackend, "transact_write_items", _item_rollback(DynamoDBBackend.transact_write_items)),
            (dynamodb_models, "copy", _TablesNotCopied),
            (DynamoHandler, "put_item", _values_used(DynamoHandler.put_item, prefixed=True)),
            (DynamoHandler, "delete_item", _values_used(DynamoHandler.delete_item, prefixed=True)),
            (DynamoHandler, "query", _values_used(DynamoHandler.query, prefixed=False)),
            (DynamoHandler, "scan", _values_used(DynamoHandler.scan, prefixed=False)),
            (DynamoHandler, "transact_write_items", _values_used(DynamoHandler.transact_write_items, prefixed=False)),
            (SNSBackend, "publish", _sns_publish_checked(SNSBackend.publish)),
            (SQSBackend, "receive_message", _sqs_receive(SQSBackend.receive_message, self)),
            (SqsQueue, "messages", property(_sampled_messages)),
        ):
            # create: the HyperPod batch actions are added; every other hook replaces an attribute
            # that tests/component/test_embedded_aws.py checks still exists
            self._stack.enter_context(mock.patch.object(target, attr, new, create=True))
        # moto 5.2.5 has no Capacity Reservations on instances: place_in_capacity_reservation()
        # records one, DescribeInstances returns it (CapacityReservationId) and filters on it
        self._stack.enter_context(mock.patch.dict(filter_dict_attribute_mapping,
                                                  {"capacity-reservation-id": "capacity_reservation_id"}))

    def place_in_capacity_reservation(self, instance_ids: list[str], reservation_id: str) -> None:
        """These instances run in Capacity Reservation ``reservation_id`` (e.g. a Capacity Block),
        as if launched into it."""
        backend = ec2_backends[ACCOUNT_ID][self.region]
        for instance_id in instance_ids:
            backend.get_instance(instance_id).capacity_reservation_id = reservation_id  # type: ignore[attr-defined]

    def schedule_instance_event(self, instance_id: str, code: str, not_before: datetime, *,
                                description: str = "", event_id: str = "") -> str:
        """EC2 schedules an event for the instance (as ``DescribeInstanceStatus`` shows it: code,
        window, a description that starts with ``[Completed]`` once it is over). Returns its id."""
        event_id = event_id or f"instance-event-{uuid.uuid4().hex[:17]}"
        instance = ec2_backends[ACCOUNT_ID][self.region].get_instance(instance_id)
        instance.events = [*(getattr(instance, "events", None) or []), {  # type: ignore[attr-defined]
            "InstanceEventId": event_id, "Code": code, "Description": description or f"The instance is scheduled "
            f"for {code.replace('-', ' ')}", "NotBefore": not_before.strftime("%Y-%m-%dT%H:%M:%S.000Z")}]
        return event_id

    def scheduled_events_of(self, instance_id: str) -> list[dict[str, str]]:
        """The scheduled events recorded for the instance (:meth:`schedule_instance_event`), as
        ``DescribeInstanceStatus`` shows them; none for an instance that is gone."""
        try:
            instance = ec2_backends[ACCOUNT_ID][self.region].get_instance(instance_id)
        except Exception:  # noqa: BLE001 - moto's InvalidInstanceID: terminated and forgotten
            return []
        return list(getattr(instance, "events", None) or [])

    def fire_schedules(self, target_arn: str) -> int:
        """Fire now every scheduled rule that targets ``target_arn`` (AWS's ``Scheduled Event``, as
        the schedule would deliver it); how many fired."""
        rules = [rule for rule in self._scheduled_rules() if any(t["Arn"] == target_arn for t in rule.targets)]
        for rule in rules:
            self._fire(rule)
        return len(rules)

    def _rebooted(self, instance_ids: list[str]) -> None:
        if self.command_host is not None:
            self.command_host.rebooted(instance_ids)

    def end_executions(self, timeout_s: float = ENDING_EXECUTIONS_S) -> None:
        """Stop every running execution and wait (``timeout_s`` at most) for the interpreter's
        threads, a Lambda task in flight included, to end. moto's executions run on daemon
        threads that outlive the mocks: one left running went on invoking its stack's functions
        inside the next embedded AWS of the process, whose IAM then denied its state machine a
        function it had never heard of. A thread still alive past ``timeout_s`` is orphaned:
        every call it makes to any later embedded AWS is refused (see ``_authorize``)."""
        if not self._running:
            return
        if self._schedules is not None:
            self._schedules.set()  # no scheduled rule starts another
        sfn = self.client("stepfunctions")
        for machines in sfn.get_paginator("list_state_machines").paginate():
            for machine in machines["stateMachines"]:
                pages = sfn.get_paginator("list_executions").paginate(
                    stateMachineArn=machine["stateMachineArn"], statusFilter="RUNNING")
                for page in pages:
                    for execution in page["executions"]:
                        sfn.stop_execution(executionArn=execution["executionArn"], error="EmbeddedAWS.Stopped",
                                           cause="the embedded AWS stopped")
        deadline = time.monotonic() + timeout_s
        # a waitForTaskToken thread only waits for its token (to the task's timeout) and calls nothing
        threads = stepfunctions_utils.TMP_THREADS
        for thread in [t for t in threads if t.is_alive() and not t.name.startswith("WaitForTaskToken_")]:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                _ORPHANED.add(thread)
        threads[:] = [t for t in threads if t.is_alive()]

    def stop(self) -> None:
        self.end_executions()
        with self._lifecycle:
            self._running = False
        if self._schedules is not None:
            self._schedules.set()
        self._stack.close()
        self._modules.clear()
        self._clients.clear()
        from nodemedic import wiring

        wiring.reset()  # no client of this embedded AWS outlives it

    # -- EventBridge schedules (moto stores them but never fires them) ------------------
    def start_schedules(self, scale: float) -> None:
        """Fire ENABLED ``rate(...)`` rules from a thread, each period multiplied by ``scale``
        (1.0 = real time). Each fire delivers AWS's ``Scheduled Event`` to the rule's targets."""
        stop = self._schedules = threading.Event()
        due: dict[str, float] = {}

        def loop() -> None:
            while not stop.wait(0.05):
                now = time.monotonic()
                for rule in self._scheduled_rules():
                    period = schedule_period(str(rule.scheduled_expression)) * scale
                    when = due.setdefault(rule.arn, now + period)
                    if now >= when:
                        due[rule.arn] = now + period
                        self._fire(rule)

        threading.Thread(target=loop, name="embedded-aws-schedules", daemon=True).start()

    def _scheduled_rules(self) -> list[Rule]:
        backend = events_backends[ACCOUNT_ID][self.region]
        return [rule for bus in list(backend.event_buses.values()) for rule in list(bus.rules.values())
                if rule.scheduled_expression and rule.state == "ENABLED"]

    def _fire(self, rule: Rule) -> None:
        event: EventMessageType = {
            "version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event", "source": "aws.events",
                 "account": ACCOUNT_ID, "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "region": self.region, "resources": [rule.arn], "detail": {}}
        try:
            self._deliver(rule, event, True)
        except Exception:  # noqa: BLE001 - a failing target must not stop the clock
            traceback.print_exc()

    @contextlib.contextmanager
    def lambdas_held(self) -> Iterator[None]:
        """No Lambda runs inside this block (invocations wait for its end): the stack holds still
        while a CLI under test reads it."""
        with self._lambda_lock:
            yield

    def client(self, service: str) -> Any:
        """A boto3 client of the embedded AWS (one per service, shared: clients are thread-safe)."""
        with self._clients_lock:
            if service not in self._clients:
                self._clients[service] = self._new_client(service)
            return self._clients[service]

    def _new_client(self, service: str) -> Any:
        assert self._own is not None, "the embedded AWS is not started"
        return self._own.client(service)  # type: ignore[call-overload]  # any service, by name

    # -- IAM: authorize each call of a function (or of the state machine) against its role --
    def _as_submitter(self, submit: Callable[..., Any]) -> Callable[..., Any]:
        """ThreadPoolExecutor.submit that runs the task as the function that submitted it."""
        caller = self._caller

        def wrapped(executor: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            function = getattr(caller, "function", None)
            if function is None:
                return submit(executor, fn, *args, **kwargs)

            def as_function(*a: Any, **k: Any) -> Any:
                caller.function = function
                try:
                    return fn(*a, **k)
                finally:
                    caller.function = None
            return submit(executor, as_function, *args, **kwargs)
        return wrapped

    def _principal(self, request_signer: Any) -> tuple[str, str] | None:
        """Who makes this call: the function whose handler runs on this thread, the state
        machine (moto's interpreter signs its Lambda and SDK-integration calls with the key
        ``ak``), or a node agent (its clients sign with ``AGENT_KEY``); None for the harness and
        the tests."""
        caller: tuple[str, str] | None = getattr(self._caller, "function", None)
        if caller is not None:
            return caller
        credentials = getattr(request_signer, "_credentials", None)
        if credentials is not None and credentials.access_key == STATE_MACHINE_KEY and self.state_machine_roles:
            return ("state machine", self.state_machine_roles[-1])
        if credentials is not None and credentials.access_key == AGENT_KEY and self.agent_roles:
            return ("agent", self.agent_roles[-1])  # a node agent: the instance role users attach the policy to
        if credentials is not None and credentials.access_key == RELAY_KEY and self.relay_roles:
            return ("relay", self.relay_roles[-1])  # nodemedic-agent relay: the controller's role
        return None

    def _authorize(self, model: Any, context: dict[str, Any], request_signer: Any = None, **_: Any) -> None:
        self._caller.call = None
        if threading.current_thread() in _ORPHANED:
            raise ClientError({"Error": {"Code": "ExecutionDoesNotExist",
                                         "Message": "this thread ran an execution of an embedded AWS that has stopped"}},
                              model.name)
        caller = self._principal(request_signer)
        if caller is None:
            return
        function, role_arn = caller
        service = model.service_model.signing_name
        self._caller.call = (function, service, model.name, model.service_model.protocol)  # for _maybe_throttle
        requests = self._authorizer().requests(service, model.name, context.get(_PARAMETERS, {}))
        if role_arn not in self._role_policies:
            self._role_policies[role_arn] = iam.role_policies(self.client("iam"), role_arn)
        for request in requests:
            verdict = iam.evaluate(self._role_policies[role_arn], request)
            if verdict.allowed:
                self.authorized.append((function, request))
                continue
            denial = Denial(function, request.action, request.resource, request.context, verdict.reason)
            self.denials.append(denial)
            raise ClientError({"Error": {"Code": _DENIED_CODE.get(service, "AccessDeniedException"),
                                         "Message": f"User: {role_arn} is not authorized to perform: {request.action} "
                                                    f"on resource: {request.resource} because {verdict.reason}"}},
                              model.name)

    def throttle(self, service: str, operation: str | None = None, *, caller: str | None = None,
                 times: int = 1, containing: str | None = None) -> Throttle:
        """Throttle the next ``times`` attempts of a deployed function's (or, ``caller="state
        machine"``, the state machine's) calls to ``service`` (``operation`` only, if given; only
        requests whose body holds ``containing``, if given)."""
        rule = Throttle(service, operation, caller, times, containing)
        self.throttles.append(rule)
        return rule

    def fail_entries(self, source: str, *, times: int = 1, code: str = "InternalFailure") -> EntryFailure:
        """Fail the next ``times`` PutEvents entries with ``source`` (the call itself succeeds)."""
        rule = EntryFailure(source, times, code)
        self.entry_failures.append(rule)
        return rule

    def _injected_entry_error(self, entry: dict[str, Any]) -> dict[str, str] | None:
        with self._entry_failures_lock:
            return next((error for rule in self.entry_failures if (error := rule.take(entry))), None)

    def before_invoke(self, function: str, action: Callable[[dict[str, Any]], None], *,
                      when: Callable[[dict[str, Any]], bool] = lambda event: True) -> list[dict[str, Any]]:
        """Run ``action(event)`` once, right before the first invocation of a deployed function whose
        name contains ``function`` and whose event satisfies ``when`` (chaos: a controller killed,
        an operator's command, at that stage). Returns the list the event is appended to once fired."""
        fired: list[dict[str, Any]] = []
        self._before_invoke.append((function, when, action, fired))
        return fired

    def _run_before_invoke(self, name: str, event: dict[str, Any]) -> None:
        for function, when, action, fired in list(self._before_invoke):
            if not fired and function in name and when(event):
                fired.append(event)
                action(event)

    def _maybe_throttle(self, request: Any, **_: Any) -> AWSResponse | None:
        call = getattr(self._caller, "call", None)
        if call is None:
            return None
        caller, service, operation, protocol = call
        body = request.body if isinstance(request.body, bytes) else str(request.body or "").encode()
        rule = next((r for r in self.throttles if r.matches(caller, service, operation, body)), None)
        if rule is None:
            return None
        rule.hits.append(f"{caller} {service}:{operation}")
        response = _throttled_response(request.url, protocol, THROTTLING_CODE.get(service, "ThrottlingException"))
        # botocore emits before-send to every handler and takes the first response: moto's stubber
        # would still execute the request (a throttled CreateTags tagged the instance). An address
        # no backend serves makes it pass, so a throttled call changes nothing, as on AWS.
        request.url = "https://throttled.nodemedic.invalid/"
        return response

    def _authorizer(self) -> iam.Authorizer:
        return iam.Authorizer(iam.facts_from(self.client, partition="aws", region=self.region, account=ACCOUNT_ID))

    # -- Lambda: run the real handler --------------------------------------------------
    def _load(self, name: str, source: FunctionSource) -> ModuleType:
        if name not in self._modules:
            module_name, _ = source.handler.rsplit(".", 1)
            path = source.code_dir / f"{module_name.replace('.', '/')}.py"
            spec = importlib.util.spec_from_file_location(f"nodemedic_fn_{name}", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load handler {source.handler} from {source.code_dir}")
            module = importlib.util.module_from_spec(spec)
            with contextlib.redirect_stdout(self._capture):  # loggers bind this stream
                spec.loader.exec_module(module)
            self._modules[name] = module
        return self._modules[name]

    def _invoke(self, backend: LambdaSimpleBackend, function_name: str, qualifier: str | None,
                body: Any, headers: Any, response_headers: dict[str, str]) -> bytes:
        fn = backend.get_function(function_name, qualifier)
        source = self.functions.get(fn.function_name)
        if source is None:
            raise RuntimeError(f"local mode: no source registered for function {fn.function_name}")
        event = json.loads(body or "{}")
        record = Invocation(function=fn.function_name, event=event)
        self._run_before_invoke(fn.function_name, event)
        buffer = io.StringIO()
        request_id = str(uuid.uuid4())
        context = SimpleNamespace(
            function_name=fn.function_name, function_version="$LATEST",
            invoked_function_arn=fn.function_arn, memory_limit_in_mb=fn.memory_size,
            aws_request_id=request_id, log_group_name=f"/aws/lambda/{fn.function_name}",
            log_stream_name=request_id, get_remaining_time_in_millis=lambda: int(fn.timeout) * 1000,
        )
        env = {**{k: str(v) for k, v in (fn.environment_vars or {}).items()},
               "AWS_LAMBDA_FUNCTION_NAME": fn.function_name,
               "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(fn.memory_size)}
        with self._lambda_lock, self._capture.into(buffer), warnings.catch_warnings():
            self._set_function_environment(env)
            started = time.perf_counter()
            # Lambda does not surface Python warnings; powertools warns when a run emits no metric
            warnings.filterwarnings("ignore", message="No application metrics to publish")
            from nodemedic import wiring  # the layer's cached settings and clients

            # every function sees its own settings; its boto3 clients (its role's credentials,
            # _FunctionClients) are kept, as a warm Lambda container keeps them
            wiring.reset(keep_clients=True)
            # the function's init code runs with its role too, as on Lambda
            self._caller.function = (fn.function_name, fn.role)
            try:
                module = self._load(fn.function_name, source)
                handler = getattr(module, source.handler.rsplit(".", 1)[1])
                record.result = handler(event, context)
                payload = json.dumps(record.result).encode()
            except Exception as exc:  # noqa: BLE001 - reported as the Lambda service does
                record.error_type, record.error_message = type(exc).__name__, str(exc)
                error = {"errorType": type(exc).__name__, "errorMessage": str(exc),
                         "requestId": request_id,
                         "stackTrace": traceback.format_tb(exc.__traceback__)[-5:]}
                print(json.dumps({"level": "ERROR", **error}))
                response_headers["x-amz-function-error"] = "Unhandled"
                payload = json.dumps(error).encode()
            finally:
                self._caller.function = None
                wiring.reset(keep_clients=True)
            record.seconds = time.perf_counter() - started
        record.logs = [line for line in buffer.getvalue().splitlines() if line.strip()]
        self.invocations.append(record)
        self._ingest_logs(fn.function_name, request_id, record.logs)
        return payload

    def operator_session(self, user: str) -> Any:
        """A person's credentials, as the operator CLI uses them: an IAM user ``user`` with an
        access key, known to STS (and so to an EKS cluster's authenticator) from now on. A
        ``boto3.Session`` that signs with them; their IAM calls are not evaluated (as the harness's)."""
        import boto3

        iam_client = self.client("iam")
        arn = iam_client.create_user(UserName=user)["User"]["Arn"]
        key = iam_client.create_access_key(UserName=user)["AccessKey"]
        self.credentials[key["AccessKeyId"]] = (key["SecretAccessKey"], arn)
        return boto3.Session(aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"],
                             region_name=self.region)

    def role_credentials(self, function: str, role_arn: str) -> RoleCredentials:
        """The credentials ``function`` runs with (its execution role's), known to STS from now on."""
        creds = RoleCredentials.of(function, role_arn)
        self.credentials[creds.access_key] = (creds.secret_key, creds.caller_arn)
        return creds

    # -- EKS: access entries (moto has none) ---------------------------------------------
    def point_eks_cluster(self, name: str, endpoint: str, ca_pem: bytes) -> None:
        """EKS's part: ``DescribeCluster`` answers the endpoint and CA of the API server that plays
        cluster ``name`` here (moto makes up both)."""
        cluster = eks_backends[ACCOUNT_ID][self.region].clusters[name]
        cluster.endpoint = endpoint
        cluster.certificate_authority = {"data": base64.b64encode(ca_pem).decode()}

    def create_access_entry(self, cluster: str, principal_arn: str, groups: list[str], kind: str) -> None:
        """``eks:CreateAccessEntry``: EKS refuses one for a cluster it does not have; the cluster's
        authenticator (registered in :attr:`eks_access_entries` by whoever plays that cluster's API
        server) maps the principal to ``groups`` from now on.
        https://docs.aws.amazon.com/eks/latest/APIReference/API_CreateAccessEntry.html"""
        if kind != "STANDARD":
            raise ValueError(f"access entry type {kind}: only STANDARD is modelled here")
        self.client("eks").describe_cluster(name=cluster)  # ResourceNotFoundException, as EKS
        register = self.eks_access_entries.get(cluster)
        if register is None:
            raise RuntimeError(f"EKS cluster {cluster} has no API server in this local mode")
        register(principal_arn, groups)

    def seed_function_environment(self) -> None:
        """Create every deployed function's environment variable (empty) once, before anything
        runs. Invocations then only change values: other threads (moto's execution workers, whose
        boto3 clients read the proxy settings by iterating ``os.environ``) never see a key
        disappear, as they would if each invocation patched and restored the environment."""
        keys = {"AWS_LAMBDA_FUNCTION_NAME", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"}
        for page in self.client("lambda").get_paginator("list_functions").paginate():
            for fn in page["Functions"]:
                keys |= set(fn.get("Environment", {}).get("Variables", {}))
        with self._lambda_lock:
            for key in keys - self._function_env_keys:
                os.environ.setdefault(key, "")
            self._function_env_keys |= keys

    def _set_function_environment(self, env: dict[str, str]) -> None:
        """The invoked function's variables; those of other functions read as empty (= unset)."""
        for key in self._function_env_keys - env.keys():
            os.environ[key] = ""
        os.environ.update(env)
        self._function_env_keys |= env.keys()

    def _ingest_logs(self, function_name: str, stream: str, lines: list[str]) -> None:
        """What CloudWatch does with a function's output: store the log, extract EMF metrics."""
        if not lines:
            return
        logs = self.client("logs")
        group = f"/aws/lambda/{function_name}"
        with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
            logs.create_log_group(logGroupName=group)
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
        now = int(time.time() * 1000)
        logs.put_log_events(logGroupName=group, logStreamName=stream,
                            logEvents=[{"timestamp": now, "message": line} for line in lines])
        for line in lines:
            for datum in emf_to_metric_data(line):
                self.client("cloudwatch").put_metric_data(
                    Namespace=datum.pop("Namespace"), MetricData=[datum])

    # -- EventBridge: deliver to Step Functions and Lambda targets ----------------------
    def _deliver(self, rule: Rule, event: EventMessageType, transform_input: bool) -> None:
        if rule.state != "ENABLED" or not rule.event_pattern.matches_event(event):
            return
        delivered = {**event, "time": _iso_time(event.get("time"))}
        others = []
        for target in rule.targets:
            arn = parse_arn(target["Arn"])
            if arn.service not in ("states", "lambda"):
                others.append(target)
                continue
            if any(k in target for k in ("Input", "InputPath", "InputTransformer")):
                raise NotImplementedError(
                    f"local mode: rule {rule.name} target {target['Id']} transforms its input; "
                    "only whole-event delivery to Step Functions/Lambda is emulated")
            try:
                if arn.service == "states":
                    self.client("stepfunctions").start_execution(
                        stateMachineArn=target["Arn"], name=str(uuid.uuid4()),
                        input=json.dumps(delivered, separators=(",", ":"), ensure_ascii=False))
                else:
                    self.client("lambda").invoke(FunctionName=target["Arn"], InvocationType="Event",
                                                 Payload=json.dumps(delivered).encode())
            except Exception as exc:  # noqa: BLE001 - a failed delivery goes to the DLQ, as on AWS
                self._dead_letter(rule, target, delivered, exc)
        if others:
            with mock.patch.object(rule, "targets", others):
                self._original_send_to_targets(rule, event, transform_input)

    def _dead_letter(self, rule: Rule, target: dict[str, Any], event: dict[str, Any],
                     exc: Exception) -> None:
        failure = {"rule": rule.name, "target": target["Id"], "error": repr(exc), "event": event}
        self.delivery_failures.append(failure)
        dlq = target.get("DeadLetterConfig", {}).get("Arn")
        if not dlq:
            return
        sqs = self.client("sqs")
        url = sqs.get_queue_url(QueueName=parse_arn(dlq).resource_id)["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps(event), MessageAttributes={
            "RULE_ARN": {"DataType": "String", "StringValue": rule.arn},
            "TARGET_ARN": {"DataType": "String", "StringValue": target["Arn"]},
            "ERROR_MESSAGE": {"DataType": "String", "StringValue": str(exc)[:256] or repr(exc)},
        })

    # -- SSM: execute the command, as SSM does: in the background, then emit its status event ---
    def _document(self, name: str) -> dict[str, Any] | None:
        """The content of one of the account's own Command documents (None for AWS's)."""
        if name.startswith("AWS-"):
            return None
        try:
            return dict(json.loads(self.client("ssm").get_document(Name=name)["Content"]))
        except ClientError:
            return None

    def _check_managed(self, instance_id: str) -> None:
        """SendCommand refuses at once an instance that SSM cannot reach: ``InvalidInstanceId`` when
        it is no instance of the account, is shutting down or terminated (valid states: running,
        pending, stopped, stopping), or its SSM agent has not registered it yet, as on a new
        instance still booting (SSM API reference, SendCommand, Errors: InvalidInstanceId; AWS's
        message: "Instances [[i-...]] not in a valid state for account ..."). moto 5.2.5 accepts
        any id, so a command sent to a replacement before its agent came up passed here and failed
        on AWS. A registered instance that is rebooting or stopped is accepted: SSM delivers the
        command once its agent is back, within the command's delivery timeout."""
        try:
            instance = ec2_backends[ACCOUNT_ID][self.region].get_instance(instance_id)
        except EC2ClientError:
            instance = None
        launched = instance.launch_time.replace(tzinfo=UTC).timestamp() if instance is not None else 0.0
        if instance is None or instance.state not in ("pending", "running", "stopping", "stopped") or (
                self.command_host is not None and not self.command_host.registered(instance_id, launched)):
            raise SSMException("InvalidInstanceId",
                               f"Instances [[{instance_id}]] not in a valid state for account {ACCOUNT_ID}")

    def _start_command(self, command: Command, document: dict[str, Any] | None) -> None:
        if self.command_host is None:
            return
        if document is None:  # AWS-RunShellScript: its commands are the script
            script = "\n".join(command.parameters.get("commands", []))
        else:
            script = render_document(document, command.parameters)
        timeout = ssm_agent_timeout(command.parameters.get("executionTimeout", ["3600"])[0])
        for instance_id in command.instance_ids:
            run = self._runs[(command.command_id, instance_id)] = _Run(timeout)
            threading.Thread(target=self._execute, args=(command, instance_id, script, run),
                             name=f"ssm-{command.command_id[:8]}", daemon=True).start()

    def _execute(self, command: Command, instance_id: str, script: str, run: _Run) -> None:
        assert self.command_host is not None
        run.started = datetime.now(UTC)
        try:
            run.outcome = self.command_host.run(instance_id, script, run.timeout)
        except Exception as exc:  # noqa: BLE001 - the agent reports a crash as a failed command
            run.outcome = CommandOutcome("Failed", -1, "", f"local command host: {exc!r}")
        run.ended = datetime.now(UTC)
        run.done.set()
        detail = {"command-id": command.command_id, "document-name": command.document_name,
                  "instance-id": instance_id, "requested-date-time": command.requested_date_time.isoformat(),
                  "status": run.outcome.status, "status-details": run.outcome.status}
        try:
            with self._lifecycle, as_aws_service():
                if not self._running:
                    return
                self.client("events").put_events(Entries=[{
                    "Source": "aws.ssm", "DetailType": "EC2 Command Invocation Status-change Notification",
                    "Resources": [f"arn:aws:ec2:{self.region}:{ACCOUNT_ID}:instance/{instance_id}"],
                    "Detail": json.dumps(detail)}])
        except Exception:  # noqa: BLE001 - the embedded AWS may have stopped meanwhile
            traceback.print_exc()

    def _run_command(self, command: Command, instance_id: str, plugin: str | None, original: Any) -> dict[str, Any]:
        run = self._runs.get((command.command_id, instance_id))
        if (utcnow() - command.requested_date_time).total_seconds() < self.invocation_lag_s and not (
                run is not None and run.done.is_set()):
            # as AWS: right after SendCommand the invocation is not there yet (botocore's
            # CommandExecuted waiter retries on this error); one whose end SSM announced is there
            raise SSMException("InvocationDoesNotExist", "An error occurred (InvocationDoesNotExist) when calling the "
                                                      "GetCommandInvocation operation")
        response: dict[str, Any] = original(command, instance_id, plugin)
        if run is None:
            return response
        if not run.done.wait(run.timeout + 30):  # as good as polling until it ends, without the polls
            response.update(Status="InProgress", StatusDetails="InProgress")
            return response
        outcome = run.outcome
        assert outcome is not None and run.started is not None and run.ended is not None
        elapsed = (run.ended - run.started).total_seconds()
        response.update(
            Status=outcome.status, StatusDetails=outcome.status, ResponseCode=outcome.exit_code,
            # as AWS, the first characters of each (aws_rules): a long output loses its end
            StandardOutputContent=outcome.stdout[:SSM_STDOUT_LIMIT],
            StandardErrorContent=outcome.stderr[:SSM_STDERR_LIMIT],
            ExecutionStartDateTime=run.started.isoformat(), ExecutionElapsedTime=f"PT{elapsed:.3f}S",
            ExecutionEndDateTime=run.ended.isoformat(),
        )
        return response

    # -- CloudWatch alarms: emit the state change event ---------------------------------
    def _emit_alarm_event(self, backend: CloudWatchBackend, name: str, old: str | None,
                          new: str, reason: str) -> None:
        alarm = backend.alarms[name]
        now = datetime.now(UTC).isoformat()
        metric = {"id": "m1", "metricStat": {"metric": {
            "namespace": alarm.namespace, "name": alarm.metric_name,
            "dimensions": {d.name: d.value for d in (alarm.dimensions or [])}},
            "period": alarm.period, "stat": alarm.statistic}, "returnData": True}
        detail = {"alarmName": name, "state": {"value": new, "reason": reason, "timestamp": now},
                  "previousState": {"value": old or "INSUFFICIENT_DATA"},
                  "configuration": {"metrics": [metric]}}
        with as_aws_service():
            self.client("events").put_events(Entries=[{
                "Source": "aws.cloudwatch", "DetailType": "CloudWatch Alarm State Change",
                "Resources": [alarm.alarm_arn], "Detail": json.dumps(detail)}])


def check_parameters(name: str, document: dict[str, Any], given: dict[str, list[str]]) -> None:
    """What SSM checks before it sends a command (``InvalidParameters``): no value reaches an
    instance unchecked (:func:`nodemedic_agent.documents.parameter_problems`)."""
    problems = parameter_problems(name, document, given)
    if problems:
        raise SSMException("InvalidParameters", f"{name}: " + "; ".join(problems))


_RATE = re.compile(r"^rate\((\d+) (minute|minutes|hour|hours|day|days)\)$")
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


def schedule_period(expression: str) -> float:
    """Seconds between fires of a ``rate(...)`` expression; cron is not emulated. EventBridge
    refuses a rate whose value is not a positive integer, or whose unit is plural for 1 or singular
    for more ("rate(1 hours)", "rate(5 hour)": EventBridge user guide, "Schedule expressions for
    rules", rate expressions): ValueError, which the local deploy turns into a refused stack."""
    if expression.startswith("cron("):
        raise NotImplementedError(f"local mode fires rate(...) schedules only, not {expression!r}")
    m = _RATE.match(expression)
    if not m or int(m.group(1)) < 1 or (int(m.group(1)) == 1) == m.group(2).endswith("s"):
        raise ValueError(f"Parameter ScheduleExpression is not valid: {expression!r}")
    return int(m.group(1)) * _UNIT_SECONDS[m.group(2).rstrip("s")]


def _iso_time(value: Any) -> str:
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))


def emf_to_metric_data(line: str) -> list[dict[str, Any]]:
    """Turn one Embedded Metric Format log line into ``put_metric_data`` entries."""
    try:
        blob = json.loads(line)
    except ValueError:
        return []
    if not isinstance(blob, dict) or "_aws" not in blob:
        return []
    stamp = datetime.fromtimestamp(blob["_aws"].get("Timestamp", time.time() * 1000) / 1000, UTC)
    data = []
    for directive in blob["_aws"].get("CloudWatchMetrics", []):
        for dim_set in directive.get("Dimensions", [[]]):
            dims = [{"Name": d, "Value": str(blob[d])} for d in dim_set if d in blob]
            for metric in directive.get("Metrics", []):
                values = blob.get(metric["Name"])
                for value in values if isinstance(values, list) else [values]:
                    if value is None:
                        continue
                    data.append({"Namespace": directive["Namespace"], "MetricName": metric["Name"],
                                 "Dimensions": dims, "Value": float(value),
                                 "Unit": metric.get("Unit", "None"), "Timestamp": stamp})
    return data
