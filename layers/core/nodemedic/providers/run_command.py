"""Run one of the stack's SSM Command documents on an instance and wait for its result.

Every operation NodeMedic runs on an instance is a typed document in ``template.yaml``
(:class:`Documents`): its parameters are values checked by the document's ``allowedPattern``,
never shell text, and the functions' roles may send only these documents."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from nodemedic.errors import CommandFailedError, CommandPendingError, InstanceGoneError, InstanceNotManagedError
from nodemedic.providers.base import ended_state

REGISTRATION_POLL_S = 0.2  # how soon an invocation SSM has not registered yet is asked for again
TERMINAL = {"Success", "Failed", "Cancelled", "TimedOut", "Undeliverable", "Terminated"}
# GetCommandInvocation returns "the first 24,000 characters written by the plugin to stdout" (SSM
# API reference): an output that long may have lost its end, so nothing is read from it
SSM_STDOUT_LIMIT = 24_000
# how much earlier than an invocation's own clock says a command it sent may be dated by SSM's
SSM_CLOCK_MARGIN_S = 2.0


class _Document:
    """The name of one of the stack's documents: ``nodemedic-<cluster>-<operation>``, the
    operation being the attribute's name with dashes."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._operation = name.replace("_", "-")

    def __get__(self, documents: Documents, owner: type | None = None) -> str:
        return f"nodemedic-{documents.cluster}-{self._operation}"


@dataclass(frozen=True)
class Documents:
    """The names of the stack's SSM Command documents (template.yaml)."""

    cluster: str
    slurm_query = _Document()
    slurm_drain = _Document()
    slurm_requeue = _Document()
    slurm_signal = _Document()
    slurm_resume = _Document()
    spare_take = _Document()
    spare_add = _Document()
    gpu_reset = _Document()
    node_join = _Document()
    health_check = _Document()


@dataclass(frozen=True)
class CommandResult:
    instance_id: str
    command_id: str
    status: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.status == "Success" and self.exit_code == 0

    @property
    def cut(self) -> bool:
        """SSM returned only the start of what the command printed."""
        return len(self.stdout) >= SSM_STDOUT_LIMIT


class Commands:
    """Send a document to an instance, find what an earlier invocation sent, wait for a result:
    through SSM Run Command (:class:`RunCommand`), or through the relay on a controller SSM cannot
    reach (:class:`~nodemedic.providers.relay_command.RelayCommand`)."""

    def send(self, instance_id: str, document: str, parameters: dict[str, str], timeout_s: int,
             comment: str = "") -> str:
        raise NotImplementedError

    def sent_since(self, instance_id: str, document: str, parameters: dict[str, str], since: float) -> list[str]:
        raise NotImplementedError

    def wait(self, instance_id: str, command_id: str, timeout_s: int) -> CommandResult:
        raise NotImplementedError

    # set by each channel: how long between two reads of a command's state, and how it waits
    _poll: float
    _sleep: Callable[[float], None]
    _clock: Callable[[], float]

    def _polled(self, read: Callable[[], CommandResult | None], timeout_s: int,
                pending: Callable[[], str]) -> CommandResult:
        """``read()`` every ``_poll`` seconds until it gives a result; :class:`CommandPendingError`
        saying ``pending()`` after ``timeout_s``."""
        deadline = self._clock() + timeout_s
        while True:
            result = read()
            if result is not None:
                return result
            if self._clock() >= deadline:
                raise CommandPendingError(pending())
            self._sleep(self._poll)

    def run(self, instance_id: str, document: str, parameters: dict[str, str], timeout_s: int,
            comment: str = "") -> CommandResult:
        return self.wait(instance_id, self.send(instance_id, document, parameters, timeout_s, comment), timeout_s)

    def run_checked(self, instance_id: str, document: str, parameters: dict[str, str], timeout_s: int,
                    comment: str = "") -> str:
        """Run and return stdout; raise :class:`CommandFailedError` with the output on failure."""
        result = self.run(instance_id, document, parameters, timeout_s, comment)
        if result.cut:
            raise CommandFailedError(
                f"{comment or 'command'} on {instance_id}: only the first {SSM_STDOUT_LIMIT:,} "
                f"characters of its output came back; nothing read from a cut answer")
        if not result.ok:
            raise CommandFailedError(
                f"{comment or 'command'} on {instance_id}: {result.status} "
                f"(exit {result.exit_code}): {(result.stderr or result.stdout).strip()[-500:]}"
            )
        return result.stdout


class RunCommand(Commands):
    """A document on one instance, polled until it ends or the deadline passes."""

    def __init__(
        self,
        client: Any,
        poll_interval: float,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        ec2: Any = None,
    ) -> None:
        """``ec2``: where given, a refusal is told from an instance that is gone (its role needs
        ``ec2:DescribeInstances``)."""
        self._ssm = client
        self._ec2 = ec2
        self._poll = poll_interval
        self._sleep = sleep
        self._clock = clock

    def send(self, instance_id: str, document: str, parameters: dict[str, str], timeout_s: int,
             comment: str = "") -> str:
        """Send ``document`` with ``parameters`` and return the command id at once.

        SSM sends only to an instance its agent has registered: a new instance (a replacement, a
        node that just joined) is refused with ``InvalidInstanceId`` until its agent comes up, a
        minute or more after EC2 calls it running. That refusal is
        :class:`~nodemedic.errors.InstanceNotManagedError`, which the state machine retries; a
        registered instance that is rebooting is not refused (SSM delivers once it is back). An
        instance EC2 shows shutting down or terminated is refused for good:
        :class:`~nodemedic.errors.InstanceGoneError`, not retried."""
        try:
            sent = self._ssm.send_command(
                InstanceIds=[instance_id],
                DocumentName=document,
                Comment=comment[:100],
                TimeoutSeconds=max(30, timeout_s),
                Parameters={**{k: [v] for k, v in parameters.items()}, "executionTimeout": [str(timeout_s)]},
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidInstanceId":
                raise
            if (state := self.gone(instance_id)) is not None:
                raise InstanceGoneError(f"{instance_id} is {state}: someone else ended it (an Auto Scaling health "
                                        "check, an operator, EC2), and no command will reach it") from exc
            raise InstanceNotManagedError(
                f"SSM cannot send to {instance_id} yet: its agent has not registered it (still booting?), or it is "
                f"shutting down or terminated ({exc.response['Error'].get('Message', '')})") from exc
        return str(sent["Command"]["CommandId"])

    def gone(self, instance_id: str) -> str | None:
        """EC2's state of an instance that is shutting down or terminated (:func:`ended_state`);
        None otherwise, or without an EC2 client."""
        return None if self._ec2 is None else ended_state(self._ec2, instance_id)

    def sent_since(self, instance_id: str, document: str, parameters: dict[str, str], since: float) -> list[str]:
        """The ids of the commands sent to ``instance_id`` with ``document`` and these
        ``parameters`` since ``since`` (epoch seconds), oldest first: what an earlier invocation of
        a retried stage sent, and may not have read (it timed out; SSM was throttled). SSM filters
        by document and time; the parameters, which it cannot filter on, are matched here."""
        after = datetime.fromtimestamp(since - SSM_CLOCK_MARGIN_S, UTC)
        pages = self._ssm.get_paginator("list_commands").paginate(
            InstanceId=instance_id, Filters=[{"key": "DocumentName", "value": document},
                                             {"key": "InvokedAfter", "value": after.strftime("%Y-%m-%dT%H:%M:%SZ")}])
        found = [command for page in pages for command in page.get("Commands", [])
                 if all((command.get("Parameters") or {}).get(k) == [v] for k, v in parameters.items())]
        return [str(c["CommandId"]) for c in sorted(found, key=lambda c: c["RequestedDateTime"])]

    def wait(self, instance_id: str, command_id: str, timeout_s: int) -> CommandResult:
        """Poll a sent command until it ends; :class:`CommandPendingError` after ``timeout_s``."""
        def ended() -> CommandResult | None:
            inv = self._invocation(command_id, instance_id)
            if inv is None or inv["Status"] not in TERMINAL:
                return None
            return CommandResult(instance_id=instance_id, command_id=command_id, status=inv["Status"],
                                 exit_code=int(inv.get("ResponseCode", -1)), stdout=inv.get("StandardOutputContent", ""),
                                 stderr=inv.get("StandardErrorContent", ""))

        return self._polled(ended, timeout_s, lambda: f"command {command_id} on {instance_id} still running after {timeout_s}s")

    def _invocation(self, command_id: str, instance_id: str) -> dict[str, Any] | None:
        """The command's invocation; None while SSM has not registered it (for a moment after
        SendCommand), read again every ``REGISTRATION_POLL_S`` within one poll interval, so a
        command that is already done is not read a whole poll interval late."""
        waited = 0.0
        while True:
            try:
                return dict(self._ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id))
            except self._ssm.exceptions.InvocationDoesNotExist:
                if waited >= self._poll:
                    return None
                step = min(REGISTRATION_POLL_S, self._poll - waited)
                self._sleep(step)
                waited += step
