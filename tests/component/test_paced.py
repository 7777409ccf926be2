"""The planned work released lately, against DynamoDB in the embedded AWS: two invocations that
read the same releases cannot both take the room (the second write is refused and decides again),
and what is older than the breaker's window no longer counts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nodemedic.store.paced import PacedReleases, PacingConflictError, Release
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

NOW = datetime(2026, 11, 27, 12, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture
def store() -> Iterator[PacedReleases]:
    with EmbeddedAWS() as aws:
        client: Any = aws.client("dynamodb")
        client.create_table(TableName="incidents", BillingMode="PAY_PER_REQUEST",
                            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
        yield PacedReleases(client, "incidents", "c")


def test_two_invocations_that_read_the_same_room_cannot_both_take_it(store: PacedReleases) -> None:
    first, second = store.read(), store.read()  # nothing released yet: both see the whole room
    first.releases["ev-1"] = Release(node="gpu-1", at=NOW)
    store.save(first)
    second.releases["ev-2"] = Release(node="gpu-2", at=NOW)
    with pytest.raises(PacingConflictError):
        store.save(second)
    again = store.read()  # read again, it sees the first one's release and decides from there
    assert again.recent(NOW, HOUR) == {"gpu-1": NOW}
    again.releases["ev-2"] = Release(node="gpu-2", at=NOW)
    store.save(again)
    stale = first  # the first invocation's copy is two writes behind
    stale.releases["ev-3"] = Release(node="gpu-3", at=NOW)
    with pytest.raises(PacingConflictError):
        store.save(stale)
    assert set(store.read().releases) == {"ev-1", "ev-2"}


def test_releases_older_than_the_window_no_longer_count_and_are_dropped(store: PacedReleases) -> None:
    releases = store.read()
    releases.releases |= {"old": Release(node="gpu-1", at=NOW - 2 * HOUR),
                          "new": Release(node="gpu-1", at=NOW - timedelta(minutes=5)),
                          "other": Release(node="gpu-2", at=NOW - timedelta(minutes=59))}
    store.save(releases)
    kept = store.read()
    assert kept.recent(NOW, HOUR) == {"gpu-1": NOW - timedelta(minutes=5), "gpu-2": NOW - timedelta(minutes=59)}
    kept.prune(NOW, HOUR)
    store.save(kept)
    assert set(store.read().releases) == {"new", "other"}
