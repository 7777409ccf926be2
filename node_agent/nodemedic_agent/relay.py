"""``nodemedic-agent relay``: runs the stack's Slurm documents on a controller that SSM Run
Command cannot reach (a SageMaker HyperPod cluster's; the stack's ``SlurmChannel`` is ``relay``).

It takes each message from the stack's relay queue (SQS, long polling). A message only names a
request, which it reads from the incident table (``RELAY#<command id>``, written by the function
that sent it), and runs as SSM's agent would: the document one of this cluster's
(``nodemedic-<cluster>-*``), read from SSM (``GetDocument``, which its role allows for those
documents only); each parameter is checked against the document's declaration
(:mod:`nodemedic_agent.documents`), never taken as shell text; the script runs under the request's
timeout; its outcome (status, exit code, the first 24,000 characters of stdout, as SSM returns
them) is written to the request's record. A request is run at most once: its record goes ``Pending`` -> ``InProgress`` in one
conditional write, so a message delivered again (SQS delivers at least once) or a relay that
stopped mid-command (its message comes back after the visibility timeout) runs nothing again. The
one cut off is marked ``Failed`` with the reason; the stage that sent it decides, as it does after
an SSM command whose instance rebooted. A request whose sender has stopped waiting for it (its
timeout has passed, on AWS's clock) is refused: the stage has failed or sent it again. One AWS
did not serve this time (its record's read, or its document's, throttled) is not refused for it:
the document's copy read last runs, or the message comes back in a few seconds and the request is
taken again; a command's outcome is written again while DynamoDB throttles the write.

A request names the controller the stack knows (``SlurmControllerInstanceId``), but what it runs
is a Slurm command, which any of the cluster's controllers can give (``scontrol`` reaches the
active ``slurmctld`` from any of them). So a relay runs it whichever controller it is on: on a
cluster with several controller nodes (HyperPod's multi-head Slurm: a primary and backups) each
runs a relay, and the work goes on when the one the stack names is down or was replaced. Which
relay ran a request is in its record (``ran_on``). Who may be a relay at all is the stack's
``RelayPolicy``, attached to the controllers' role only."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from nodemedic.aws_retries import THROTTLING_CODES
from nodemedic.contracts.relay import RELAY_OUTPUT_LIMIT, RELAY_STDERR_LIMIT, RelayRequest, relay_key

from nodemedic_agent.documents import parameter_problems, render_document, run_script

log = logging.getLogger("nodemedic_agent.relay")
RECEIVE_WAIT_S = 20  # SQS long polling: at most 20 s
WORKERS = 8  # requests run at once
# a request whose sender stopped waiting (its timeout, and this for clocks and delivery) is refused:
# the stage has failed or sent it again, and a drain run now could hit a node returned since
LATE_MARGIN_S = 30
CUT_OFF_MARGIN_S = 60  # InProgress this long past its timeout: the relay running it stopped
COMMAND_ID = re.compile(r"[0-9a-f]{32}")
DOCUMENT_CACHE_S = 300  # a document is read from SSM again after this
RETRY_AFTER_S = 5  # a request AWS did not serve this time (throttled) comes back after this
FINISH_ATTEMPTS = 5  # writes of a command's outcome, the waits doubling from 0.5 s, while DynamoDB throttles them


class OutcomeUnwrittenError(Exception):
    """A command ran, but its outcome could not be written to its record: its message comes back
    after the queue's visibility timeout, and the request is then failed as cut off."""


class Relay:
    def __init__(self, *, cluster: str, instance_id: str, queue_url: str, table: str, sqs: Any, ssm: Any, dynamodb: Any,
                 env: dict[str, str] | None = None, receive_wait_s: int = RECEIVE_WAIT_S, workers: int = WORKERS,
                 retry_after_s: int = RETRY_AFTER_S,
                 now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        self.cluster, self.instance_id, self.queue_url, self.table = cluster, instance_id, queue_url, table
        self._wait_s, self._retry_after_s = receive_wait_s, retry_after_s
        self._sqs, self._ssm, self._db = sqs, ssm, dynamodb
        self._env, self._now = env, now
        self._documents: dict[str, tuple[float, dict[str, Any]]] = {}  # name -> (when read, content)
        self.stop_event = threading.Event()
        self._workers = workers
        self._busy = 0  # requests being run now
        self._lock = threading.Lock()
        self.ran = 0
        self.refused = 0

    def serve(self) -> None:
        """Take and run requests until :attr:`stop_event` is set, ``workers`` at once (as SSM's
        agent runs commands side by side: one slow command does not make the others late); then
        finish those running. An AWS error waits a moment."""
        with ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="nodemedic-relay") as pool:
            while not self.stop_event.is_set():
                try:
                    self.take_once(pool)
                except (BotoCoreError, ClientError) as exc:
                    log.warning("the relay queue did not answer: %s", exc)
                    self.stop_event.wait(5)

    def take_once(self, pool: ThreadPoolExecutor) -> int:
        """Receive as many messages as there are free workers, and run each on one; how many."""
        with self._lock:
            free = min(10, self._workers - self._busy)
        if free <= 0:
            self.stop_event.wait(0.2)
            return 0
        messages = self._sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=free,
                                             WaitTimeSeconds=self._wait_s).get("Messages", [])
        for message in messages:
            with self._lock:
                self._busy += 1
            pool.submit(self._work, message)
        return len(messages)

    def _work(self, message: dict[str, Any]) -> None:
        """Run one message's request, then delete the message. If AWS throttles a call before the
        command ran, the message comes back in ``retry_after_s``; after any other failure of AWS,
        or when the outcome of a command that ran cannot be written, after the queue's visibility
        timeout, and the request is then refused as late or failed as cut off."""
        try:
            self.handle(message["Body"])
            self._sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
        except (BotoCoreError, ClientError) as exc:
            if not _throttled(exc):  # a write may have been done: the request is judged when its message is back
                log.warning("relay: a request's record or its message could not be read or written: %s", exc)
            else:  # nothing was done or run: the request is taken again soon, not when its sender stopped waiting
                log.warning("relay: AWS did not answer this time (%s); the request is taken again in %d s", exc,
                            self._retry_after_s)
                self._retry_soon(message)
        except Exception:  # noqa: BLE001 - one request's failure never stops the relay
            log.exception("relay: a request failed")
        finally:
            with self._lock:
                self._busy -= 1

    def _retry_soon(self, message: dict[str, Any]) -> None:
        """The message comes back after ``retry_after_s`` rather than the queue's visibility
        timeout (by when its sender would have stopped waiting)."""
        try:
            self._sqs.change_message_visibility(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"],
                                                VisibilityTimeout=self._retry_after_s)
        except (BotoCoreError, ClientError) as exc:
            log.warning("relay: the request's message comes back after the queue's visibility timeout: %s", exc)

    def handle(self, body: str) -> None:
        """Run the request a message names, once. The message only names it (``{"command_id"}``):
        what runs is what the pipeline recorded, so a message is no way to run anything else.
        Refused, with the reason in its record: a document that is not this cluster's, parameters
        its declaration refuses, a request its sender stopped waiting for."""
        try:
            command_id = str(json.loads(body)["command_id"])
            if not COMMAND_ID.fullmatch(command_id):  # no key DynamoDB refuses: a message that fails
                raise ValueError(f"{command_id[:64]!r} is no command id")  # every time would come back forever
            item = self._db.get_item(TableName=self.table, Key={"pk": {"S": relay_key(command_id)}},
                                     ConsistentRead=True).get("Item")
            request = RelayRequest.model_validate_json(item["request"]["S"]) if item else None
        except (ValueError, KeyError, TypeError) as exc:  # ValidationError is a ValueError
            self._count("refused")
            log.warning("relay: not a request, ignored: %s", str(exc).splitlines()[0][:300] if str(exc) else repr(exc))
            return
        if request is None or request.command_id != command_id:
            self._count("refused")
            log.warning("relay: %s has no record: ignored", command_id[:64])
            return
        why, document = self._refusal(request)
        if why is not None:
            self._count("refused")
            log.warning("relay: refused %s (%s): %s", request.command_id, request.document, why)
            self._finish(request, "Failed", -1, "", why, start=True)
            return
        if not self._start(request):
            log.info("relay: %s was taken before (a message delivered again): not run again", request.command_id)
            return
        if request.instance_id != self.instance_id:
            log.info("relay: %s is addressed to controller %s; run here, on %s", request.command_id,
                     request.instance_id, self.instance_id)
        script = render_document(document, request.parameters)
        status, code, out, err = self._run(script, request.timeout_s)
        self._count("ran")
        log.info("relay: %s %s: %s (exit %d)", request.command_id, request.document, status, code)
        try:
            self._finish(request, status, code, out, err)
        except (BotoCoreError, ClientError) as exc:
            raise OutcomeUnwrittenError(f"{request.command_id} ran, but its outcome could not be written: {exc}") from exc

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def _refusal(self, request: RelayRequest) -> tuple[str | None, dict[str, Any]]:
        """Why the request is refused (None: it is not), and its document. Only a document of this
        cluster is read from SSM at all."""
        if not request.document.startswith(f"nodemedic-{self.cluster}-"):
            return f"{request.document} is not a document of cluster {self.cluster}", {}
        age = (self._now() - request.sent_at).total_seconds()
        if age > request.timeout_s + LATE_MARGIN_S:
            return f"sent {age:.0f}s ago, and its sender waited {request.timeout_s}s: too late to run", {}
        document = self._document(request.document)
        if document is None:
            return f"{request.document} cannot be read from SSM", {}
        problems = parameter_problems(request.document, document, request.parameters)
        return ("InvalidParameters: " + "; ".join(problems) if problems else None), document

    def _document(self, name: str) -> dict[str, Any] | None:
        """The document's current version, read again after ``DOCUMENT_CACHE_S`` (a stack update
        changes a document's content: the relay must not run the old one for ever); None when SSM
        says there is no such document for this relay, or cannot give it (the request is refused).
        When SSM does not answer this time (throttled, a server error, not reached), the copy read
        last is run; without one, a throttled read is raised: the request is taken again in
        seconds, not refused for it."""
        read_at, known = self._documents.get(name, (0.0, None))
        if known is not None and time.monotonic() - read_at <= DOCUMENT_CACHE_S:
            return known
        try:
            document: dict[str, Any] = json.loads(self._ssm.get_document(Name=name)["Content"])
        except ValueError as exc:
            log.warning("relay: document %s is not JSON: %s", name, exc)
            return None
        except (ClientError, BotoCoreError) as exc:
            if known is not None and _transient(exc):
                log.warning("relay: SSM did not give document %s again (%s): the copy read %.0f s ago is run", name,
                            exc, time.monotonic() - read_at)
                return known
            if _throttled(exc):
                raise  # the request is taken again in seconds
            log.warning("relay: cannot read document %s: %s", name, exc)
            return None
        self._documents[name] = (time.monotonic(), document)
        return document

    def _update(self, request: RelayRequest, **update: Any) -> bool:
        """One conditional write to the request's record; False when its condition did not hold."""
        try:
            self._db.update_item(TableName=self.table, Key={"pk": {"S": relay_key(request.command_id)}},
                                 ExpressionAttributeNames={"#s": "status"}, **update)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise
            return False
        return True

    def _start(self, request: RelayRequest) -> bool:
        """Pending -> InProgress, once; False when it was taken before."""
        if self._update(request, UpdateExpression="SET #s = :run, started_at = :now", ConditionExpression="#s = :pending",
                        ExpressionAttributeValues={":run": {"S": "InProgress"}, ":pending": {"S": "Pending"},
                                                   ":now": {"S": self._now().isoformat()}}):
            return True
        self._fail_cut_off(request)
        return False

    def _fail_cut_off(self, request: RelayRequest) -> None:
        """A request found InProgress longer than its timeout was cut off (the relay stopped while
        it ran, and its message came back): Failed, not run again. One started more recently is
        still running, and is left to finish."""
        cut_before = (self._now() - timedelta(seconds=request.timeout_s + CUT_OFF_MARGIN_S)).isoformat()
        self._update(request, UpdateExpression="SET #s = :failed, exit_code = :code, stderr = :why",
                     ConditionExpression="#s = :run AND (attribute_not_exists(started_at) OR started_at < :cut)",
                     ExpressionAttributeValues={":failed": {"S": "Failed"}, ":code": {"N": "-1"},
                                                ":run": {"S": "InProgress"}, ":cut": {"S": cut_before},
                                                ":why": {"S": "the relay stopped while the command ran; not run again"}})

    def _run(self, script: str, timeout_s: int) -> tuple[str, int, str, str]:
        done = run_script(script, timeout_s, self._env)
        return done.status, done.exit_code, done.stdout, done.stderr

    def _finish(self, request: RelayRequest, status: str, code: int, out: str, err: str, *, start: bool = False) -> None:
        """Write the outcome to the request's record (only one the pipeline made: never a new one),
        ``FINISH_ATTEMPTS`` times while DynamoDB throttles the write: the command ran, and its
        sender waits for what it did."""
        for attempt in range(FINISH_ATTEMPTS):
            try:
                return self._write_outcome(request, status, code, out, err, start=start)
            except (BotoCoreError, ClientError) as exc:
                if not _transient(exc) or attempt == FINISH_ATTEMPTS - 1:
                    raise
                log.warning("relay: %s's outcome not written yet (%s): trying again", request.command_id, exc)
                time.sleep(0.5 * 2 ** attempt)

    def _write_outcome(self, request: RelayRequest, status: str, code: int, out: str, err: str, *, start: bool) -> None:
        was, was_value = (":pending", "Pending") if start else (":run", "InProgress")
        if not self._update(request, ConditionExpression=f"#s = {was}",
                            UpdateExpression="SET #s = :status, exit_code = :code, stdout = :out, stderr = :err, "
                                             "ended_at = :now, ran_on = :me",
                            ExpressionAttributeValues={":status": {"S": status}, ":code": {"N": str(code)},
                                                       ":out": {"S": out[:RELAY_OUTPUT_LIMIT]},
                                                       ":err": {"S": err[:RELAY_STDERR_LIMIT]},
                                                       ":now": {"S": self._now().isoformat()}, was: {"S": was_value},
                                                       ":me": {"S": self.instance_id}}):
            log.warning("relay: %s has no record to write its outcome to (or another wrote it)", request.command_id)


def _throttled(exc: ClientError | BotoCoreError) -> bool:
    """AWS refused the call for its rate: nothing was done. (A server error, any 5xx, or no answer
    at all is "not now" too, but something may have been done.)"""
    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in THROTTLING_CODES


def _transient(exc: ClientError | BotoCoreError) -> bool:
    """AWS did not serve the call this time (throttled, a server error, not reached), as opposed
    to "no"."""
    if isinstance(exc, BotoCoreError) or _throttled(exc):
        return True
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)) >= 500
