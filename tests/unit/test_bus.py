"""NodeMedic's own health events on its bus: which entries EventBridge took, which it did not and
why, so that the caller resends exactly those (PutEvents fails entries, not only calls)."""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import Stubber
from nodemedic.bus import publish_health_events, put_health_events
from nodemedic.contracts.events import NodeHealthEvent
from nodemedic.errors import PublishFailedError

from tests.conftest import load_event


def events(n: int) -> list[NodeHealthEvent]:
    base = load_event("health/xid-79-gpu-fallen-off-bus.json")["detail"]
    now = datetime.now(UTC).isoformat()
    return [NodeHealthEvent.model_validate({**base, "event_id": f"00000000-0000-4000-8000-{i:012d}",
                                            "observed_at": now, "sent_at": now}) for i in range(n)]


@pytest.fixture
def client():
    c = boto3.client("events", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(c) as stub:
        yield c, stub


def test_entries_eventbridge_failed_are_named_and_the_rest_taken(client) -> None:
    c, stub = client
    taken = {"EventId": "e"}
    stub.add_response("put_events", {"FailedEntryCount": 1, "Entries": [
        taken, {"ErrorCode": "ThrottlingException", "ErrorMessage": "Rate exceeded"}, *[taken] * 8]})
    stub.add_response("put_events", {"FailedEntryCount": 0, "Entries": [taken] * 2})
    errors = put_health_events(c, "bus", "nodemedic.sweeper", events(12))  # two calls: 10 + 2
    assert errors == [None, "ThrottlingException: Rate exceeded", *[None] * 10]
    stub.assert_no_pending_responses()


def test_a_call_that_fails_outright_fails_its_entries_only_and_the_next_call_still_goes(client) -> None:
    c, stub = client
    stub.add_client_error("put_events", "InternalException", "try again", http_status_code=500)
    stub.add_response("put_events", {"FailedEntryCount": 0, "Entries": [{"EventId": "e"}]})
    errors = put_health_events(c, "bus", "nodemedic.sweeper", events(11))
    assert all(e and "InternalException" in e for e in errors[:10]) and errors[10] is None


def test_publish_raises_when_any_event_was_not_taken(client) -> None:
    c, stub = client
    stub.add_response("put_events", {"FailedEntryCount": 1, "Entries": [
        {"EventId": "e"}, {"ErrorCode": "InternalFailure", "ErrorMessage": "oops"}]})
    with pytest.raises(PublishFailedError, match="1 of 2 nodemedic.planned events were not put on the bus: InternalFailure"):
        publish_health_events(c, "bus", "nodemedic.planned", events(2))
