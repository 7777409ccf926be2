"""AWS's time, as this node's AWS calls see it.

A node's clock can be wrong: an RTC reset to 1970 before NTP has synchronised, chrony stopped, a
clock minutes fast. Two things break then, and this module mends both.

- **Signing.** AWS refuses a request signed more than 5 minutes from its own time ("Signature
  expired", IAM User Guide, "AWS Signature Version 4 for API requests": "a request must reach AWS
  within five minutes of the time stamp in the request"). botocore signs with the local clock and,
  unlike the Java, .NET, JavaScript and Rust SDKs, does not correct for skew: every event and
  heartbeat would be refused, and the node would look silent. Every AWS answer, a refusal
  included, carries the server's ``Date``; the agent's clients learn the offset from it and sign
  with the node's clock plus that offset.
- **Stamps.** The event contract refuses a time before 2020 or from 2100 (a garbled or forged
  event). An agent whose clock reads 1970 stamps its events with AWS's time instead (the node's
  clock plus the offset), or, before any answer has taught it the offset, sends nothing it
  cannot date (:class:`ClockUnknownError`). A clock that is merely off keeps its own stamps: Detect
  measures the skew against the bus's time and corrects the durations (nodemedic.domain.freshness).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from botocore.auth import AUTH_TYPE_MAPS, SIGV4_TIMESTAMP, SigV4Auth
from botocore.exceptions import NoCredentialsError
from nodemedic.contracts.events import EARLIEST, LATEST


class ClockUnknownError(RuntimeError):
    """This node's clock cannot date an event and no AWS answer has given AWS's time yet."""


class AwsClock:
    def __init__(self, local: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        self._local = local
        self._lock = threading.Lock()
        self.offset = timedelta(0)  # AWS's clock minus this node's, from the last answer's Date
        self.known = False  # an answer has been seen
        self._signer = f"v4-nodemedic-aws-time-{uuid.uuid4().hex}"  # botocore's name for this clock's signer

    def observe(self, date_header: str) -> None:
        """Learn AWS's time from an answer's ``Date`` header (to the second)."""
        try:
            server = parsedate_to_datetime(date_header)
        except (TypeError, ValueError):
            return
        if server.tzinfo is None:
            return
        offset = server - self._local()
        with self._lock:
            # the header is to the second: a change below 2 s is its rounding and the answer's travel
            if not self.known or abs(offset - self.offset) >= timedelta(seconds=2):
                self.offset = offset
            self.known = True

    def aws_now(self) -> datetime:
        """AWS's time by this node's clock and the last known offset: what requests are signed with."""
        return self._local() + self.offset

    @staticmethod
    def plausible(moment: datetime) -> bool:
        return EARLIEST <= moment < LATEST

    def stamp(self) -> datetime:
        """The time an event or heartbeat sent now carries (see the module's docstring)."""
        local = self._local()
        if self.plausible(local):
            return local
        if not self.known:
            raise ClockUnknownError(f"this node's clock reads {local.isoformat()} and no AWS answer has given "
                                    "AWS's time yet: nothing can be dated")
        return local + self.offset

    def stamped(self, moment: datetime) -> datetime:
        """A time this node's clock gave (when a fault was seen), as an event carries it. One the
        clock gave before NTP set it (a burn-in hold at boot, at 1970) is no date at all: now."""
        local = self._local()
        if self.plausible(local):
            return moment if self.plausible(moment) else local
        return moment + self.offset

    def attach(self, client: Any) -> Any:
        """Make ``client`` learn AWS's time from every answer and sign with it (None: a dry run)."""
        if client is None:
            return None
        client.meta.events.register("after-call", self._after_call)
        client.meta.events.register("choose-signer", self._choose_signer)
        return client

    def _after_call(self, http_response: Any = None, **_: Any) -> None:
        date = http_response.headers.get("Date") if http_response is not None else None
        if date:
            self.observe(date if isinstance(date, str) else date.decode())

    def _choose_signer(self, signature_version: str = "", **_: Any) -> str | None:
        if signature_version != "v4":
            return None
        if self._signer not in AUTH_TYPE_MAPS:
            AUTH_TYPE_MAPS[self._signer] = type("AwsTimeSigV4Auth", (_AwsTimeSigV4Auth,), {"clock": self})
        return self._signer


class _AwsTimeSigV4Auth(SigV4Auth):
    """botocore's SigV4 (botocore.auth.SigV4Auth.add_auth), timed by an :class:`AwsClock`."""

    clock: AwsClock

    def add_auth(self, request: Any) -> None:
        if self.credentials is None:
            raise NoCredentialsError()
        request.context["timestamp"] = self.clock.aws_now().astimezone(timezone.utc).strftime(SIGV4_TIMESTAMP)
        # botocore's own steps of SigV4Auth.add_auth (botocore is pinned); its stubs leave them out
        self._modify_request_before_signing(request)  # type: ignore[attr-defined]
        canonical_request = self.canonical_request(request)
        string_to_sign = self.string_to_sign(request, canonical_request)
        self._inject_signature_to_request(request, self.signature(string_to_sign, request))  # type: ignore[attr-defined]
