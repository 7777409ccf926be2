"""The fault's origin on a clock we trust, and events too old to act on (issue: clock skew,
replays, redeliveries)."""

from datetime import UTC, datetime, timedelta

import pytest
from nodemedic.domain.freshness import fault_origin, staleness

BUS = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)  # when EventBridge received the event


@pytest.mark.parametrize(("observed", "sent", "origin", "corrected"), [
    pytest.param(BUS - timedelta(seconds=3), BUS - timedelta(seconds=1), BUS - timedelta(seconds=3), False,
                 id="good_clock"),
    pytest.param(BUS + timedelta(seconds=100), BUS + timedelta(seconds=102), BUS, False,
                 id="slightly_fast_clock_never_negative"),
    pytest.param(BUS + timedelta(minutes=10) - timedelta(seconds=4), BUS + timedelta(minutes=10),
                 BUS - timedelta(seconds=4), True, id="ten_minutes_fast"),
    pytest.param(datetime(1970, 1, 1, 0, 0, 5, tzinfo=UTC), datetime(1970, 1, 1, 0, 0, 7, tzinfo=UTC),
                 BUS - timedelta(seconds=2), True, id="rtc_of_1970"),
    pytest.param(BUS - timedelta(days=3), BUS - timedelta(days=3) + timedelta(seconds=1),
                 BUS - timedelta(seconds=1), True, id="three_days_slow"),
])
def test_the_origin_is_on_the_servers_clock_when_the_node_clock_is_implausible(observed, sent, origin, corrected):
    got = fault_origin(observed, sent, BUS)
    assert (got.at, got.corrected) == (origin, corrected)
    assert got.at <= BUS  # no duration measured from it is ever negative


def test_server_side_sources_keep_their_time() -> None:
    assert fault_origin(BUS - timedelta(seconds=30), None, BUS).at == BUS - timedelta(seconds=30)
    assert fault_origin(BUS + timedelta(seconds=30), None, BUS).at == BUS


@pytest.mark.parametrize(("received", "repaired", "why"), [
    pytest.param(BUS, None, None, id="fresh"),
    pytest.param(BUS - timedelta(hours=2), None, "entered the bus 7200 s ago", id="replayed"),
    pytest.param(BUS, BUS - timedelta(seconds=1), "predates the node's last completed repair", id="before_repair"),
    pytest.param(BUS + timedelta(hours=1), None, "in the future", id="bus_time_in_the_future"),
])
def test_stale_events_are_refused_with_the_reason(received, repaired, why) -> None:
    origin = received - timedelta(seconds=5)
    got = staleness(received, BUS, timedelta(hours=1), origin, repaired)
    assert (got is None) if why is None else (why in got)
