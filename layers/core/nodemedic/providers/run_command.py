"""Run a shell script on an instance with SSM Run Command and wait for its result."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nodemedic.errors import CommandFailedError, CommandPendingError

TERMINAL = {"Success", "Failed", "Cancelled", "TimedOut", "Undeliverable", "Terminated"}


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


class RunCommand:
    """``AWS-RunShellScript`` on one instance, polled until it ends or the deadline passes."""

    def __init__(
        self,
        client: Any,
        poll_interval: float,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ssm = client
        self._poll = poll_interval
        self._sleep = sleep
        self._clock = clock

    def run(self, instance_id: str, script: str, timeout_s: int, comment: str = "") -> CommandResult:
        sent = self._ssm.send_command(
            InstanceIds=[instance_id],
            DocumentName="AWS-RunShellScript",
            Comment=comment[:100],
            TimeoutSeconds=max(30, timeout_s),
            Parameters={"commands": [script], "executionTimeout": [str(timeout_s)]},
        )
        command_id = sent["Command"]["CommandId"]
        deadline = self._clock() + timeout_s
        while True:
            inv = self._invocation(command_id, instance_id)
            if inv is not None and inv["Status"] in TERMINAL:
                return CommandResult(
                    instance_id=instance_id,
                    command_id=command_id,
                    status=inv["Status"],
                    exit_code=int(inv.get("ResponseCode", -1)),
                    stdout=inv.get("StandardOutputContent", ""),
                    stderr=inv.get("StandardErrorContent", ""),
                )
            if self._clock() >= deadline:
                raise CommandPendingError(
                    f"command {command_id} on {instance_id} still running after {timeout_s}s"
                )
            self._sleep(self._poll)

    def run_checked(self, instance_id: str, script: str, timeout_s: int, comment: str = "") -> str:
        """Run and return stdout; raise :class:`CommandFailedError` with the output on failure."""
        result = self.run(instance_id, script, timeout_s, comment)
        if not result.ok:
            raise CommandFailedError(
                f"{comment or 'command'} on {instance_id}: {result.status} "
                f"(exit {result.exit_code}): {(result.stderr or result.stdout).strip()[-500:]}"
            )
        return result.stdout

    def _invocation(self, command_id: str, instance_id: str) -> dict[str, Any] | None:
        try:
            return dict(
                self._ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id)
            )
        except self._ssm.exceptions.InvocationDoesNotExist:
            return None  # SSM has not registered the invocation yet
