"""How every AWS call of the functions is retried on throttling and transient errors.

Two layers, each with a budget: the SDK retries each call (botocore's *standard* mode: truncated
exponential backoff with full jitter, up to ``MAX_ATTEMPTS`` attempts, about a minute in the
worst case); a call still throttled after that raises :class:`AwsThrottledError`, which the
state machine retries for the whole stage (``Retry`` on that name, jittered, a few minutes) before
its ``Catch`` fails the incident the one uniform way. Every stage is idempotent, so a retried one
redoes nothing it recorded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from botocore.config import Config
from botocore.exceptions import ClientError

from nodemedic.errors import AwsThrottledError

MAX_ATTEMPTS = 8
CLIENT_CONFIG = Config(retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS}, connect_timeout=5,
                       read_timeout=30)

# botocore's standard-mode throttling codes (botocore/retries/standard.py): the call was refused
# for its rate, nothing was done
THROTTLING_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "ProvisionedThroughputExceededException", "TransactionInProgressException",
    "RequestLimitExceeded", "BandwidthLimitExceeded", "RequestThrottled", "SlowDown",
    "PriorRequestNotComplete", "EC2ThrottledException",
})
# and the transient ones
RETRYABLE_CODES = THROTTLING_CODES | frozenset({
    "RequestTimeout", "RequestTimeoutException",
    "InternalError", "InternalServerError", "InternalFailure", "ServiceUnavailable", "ServiceUnavailableException",
})

F = TypeVar("F", bound=Callable[..., Any])


def retryable(exc: ClientError) -> bool:
    """Throttled or transient; a DynamoDB transaction cancelled because an item was throttled too."""
    code = exc.response.get("Error", {}).get("Code", "")
    if code == "TransactionCanceledException":
        reasons = exc.response.get("CancellationReasons", [])
        return any(r.get("Code") in ("ThrottlingError", "ProvisionedThroughputExceeded") for r in reasons)
    return code in RETRYABLE_CODES


def throttling_is_retryable(handler: F) -> F:
    """Report a call still throttled after the SDK's retries as :class:`AwsThrottledError`
    (its ``errorType`` is what the state machine's ``Retry`` matches)."""
    @functools.wraps(handler)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return handler(*args, **kwargs)
        except ClientError as exc:
            if retryable(exc):
                operation = getattr(exc, "operation_name", "a call")
                raise AwsThrottledError(f"{operation} still throttled after {MAX_ATTEMPTS} attempts: "
                                        f"{exc.response['Error'].get('Code')}") from exc
            raise
    return wrapped  # type: ignore[return-value]
