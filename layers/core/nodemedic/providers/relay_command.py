"""The stack's documents run through the relay (:mod:`nodemedic.contracts.relay`), not SSM Run
Command: for a Slurm controller SSM cannot reach (a SageMaker HyperPod cluster's, ``SlurmChannel``
``relay``). The same calls as :class:`~nodemedic.providers.run_command.RunCommand`: a document is
sent (a message on the relay queue, and its record ``RELAY#<command id>`` in the incident table),
found again by a retried stage (``RELAYSENT#<instance>#<document>#<parameters' digest>``: when each
was sent with exactly these parameters, for a day: one small item per kind of request, however
often the controller is asked), and waited for (the record, read consistently, until
``nodemedic-agent relay`` on the controller has written its outcome)."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from nodemedic.contracts.relay import RELAY_TERMINAL, RelayRequest, relay_key
from nodemedic.providers.run_command import CommandResult, Commands

SENT_MEMORY = timedelta(days=1)  # how long a relayed command and its record of sending are kept


class RelayCommand(Commands):
    def __init__(self, sqs: Any, queue_url: str, dynamodb: Any, table: str, poll_interval: float,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._sqs, self._queue = sqs, queue_url
        self._db, self._table = dynamodb, table
        self._poll, self._sleep, self._clock, self._now = poll_interval, sleep, clock, now

    def send(self, instance_id: str, document: str, parameters: dict[str, str], timeout_s: int,
             comment: str = "") -> str:
        """Record the command, put it on the queue, note it as sent; its id at once. Recorded
        first: a command the relay takes always has a record to write its outcome to."""
        now = self._now()
        request = RelayRequest(command_id=uuid.uuid4().hex, instance_id=instance_id, document=document,
                               parameters={k: [v] for k, v in parameters.items()}, timeout_s=timeout_s, sent_at=now)
        expires = {"N": str(int((now + SENT_MEMORY).timestamp()))}
        self._prune(instance_id, document, parameters)
        self._db.put_item(TableName=self._table, Item={
            "pk": {"S": relay_key(request.command_id)}, "status": {"S": "Pending"},
            "request": {"S": request.model_dump_json()}, "comment": {"S": comment[:100]}, "expires_at": expires},
            ConditionExpression="attribute_not_exists(pk)")
        # the message only names the request: the relay runs what is recorded
        self._sqs.send_message(QueueUrl=self._queue, MessageBody=json.dumps({"command_id": request.command_id}))
        # what a retried stage looks for, once it is on its way (a request never sent is never waited for)
        self._db.update_item(TableName=self._table, Key=self._sent_key(instance_id, document, parameters),
                             UpdateExpression="SET #c = :at, expires_at = :e",
                             ExpressionAttributeNames={"#c": f"c:{request.command_id}"},
                             ExpressionAttributeValues={":at": {"N": str(now.timestamp())}, ":e": expires})
        return request.command_id

    def sent_since(self, instance_id: str, document: str, parameters: dict[str, str], since: float) -> list[str]:
        """The ids of the commands sent to ``instance_id`` with ``document`` and these
        ``parameters`` since ``since`` (epoch seconds), oldest first."""
        item = self._db.get_item(TableName=self._table, Key=self._sent_key(instance_id, document, parameters),
                                 ConsistentRead=True).get("Item", {})
        sent = sorted((float(v["N"]), name.removeprefix("c:")) for name, v in item.items() if name.startswith("c:"))
        return [command_id for at, command_id in sent if at >= since]

    def wait(self, instance_id: str, command_id: str, timeout_s: int) -> CommandResult:
        """Read the command's record until the relay wrote its outcome; :class:`CommandPendingError`
        after ``timeout_s`` (the relay is down, or the command still runs)."""
        status = ""

        def ended() -> CommandResult | None:
            nonlocal status
            item = self._db.get_item(TableName=self._table, Key={"pk": {"S": relay_key(command_id)}},
                                     ConsistentRead=True).get("Item", {})
            status = item.get("status", {}).get("S", "")
            if status not in RELAY_TERMINAL:
                return None
            return CommandResult(instance_id=instance_id, command_id=command_id, status=status,
                                 exit_code=int(item.get("exit_code", {}).get("N", "-1")),
                                 stdout=item.get("stdout", {}).get("S", ""), stderr=item.get("stderr", {}).get("S", ""))

        return self._polled(ended, timeout_s, lambda: f"relayed command {command_id} on {instance_id} is still "
                                                      f"{status or 'not recorded'} after {timeout_s}s (is nodemedic-agent "
                                                      "relay running on the controller?)")

    def _prune(self, instance_id: str, document: str, parameters: dict[str, str]) -> None:
        """Drop from the record of what was sent what is older than ``SENT_MEMORY`` (the item of a
        request made often, a page of the node list, would only grow)."""
        key = self._sent_key(instance_id, document, parameters)
        item = self._db.get_item(TableName=self._table, Key=key, ConsistentRead=True).get("Item", {})
        cutoff = (self._now() - SENT_MEMORY).timestamp()
        old = [name for name, v in item.items() if name.startswith("c:") and float(v["N"]) < cutoff]
        if old:
            self._db.update_item(TableName=self._table, Key=key,
                                 UpdateExpression="REMOVE " + ", ".join(f"#o{n}" for n in range(len(old[:100]))),
                                 ExpressionAttributeNames={f"#o{n}": name for n, name in enumerate(old[:100])})

    @staticmethod
    def _sent_key(instance_id: str, document: str, parameters: dict[str, str]) -> dict[str, dict[str, str]]:
        digest = hashlib.sha256(json.dumps(parameters, sort_keys=True).encode()).hexdigest()[:32]
        return {"pk": {"S": f"RELAYSENT#{instance_id}#{document}#{digest}"}}
