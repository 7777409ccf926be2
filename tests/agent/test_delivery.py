"""Dedupe, batching, and delivery through a bus outage and an agent restart."""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
from nodemedic.contracts.events import MAX_COUNT, NodeIdentity
from nodemedic.store.ledger import Ledger
from nodemedic_agent.checks.base import Finding
from nodemedic_agent.dedupe import Deduper
from nodemedic_agent.events import health_event
from nodemedic_agent.publisher import MAX_BATCH_BYTES, batches, entry_size
from nodemedic_agent.spool import Spool

from .conftest import Bus

ATTEMPT = timedelta(seconds=0.25)  # a send under way as the bus comes back


def test_repeated_fault_is_one_event(bus, sim, make_agent):
    agent = make_agent()
    for _ in range(5):
        sim.inject("xid", xid=79, gpu=3)  # each also arrives twice: kernel log + NVML event
    events = bus.wait_health(1, settle=1.0)
    assert [(e["fault_code"], e["count"]) for e in events] == [("XID 79", 1)]
    assert agent.dedupe.suppressed_total == 9


def test_a_health_event_is_sent_again_with_its_event_id_so_a_dropped_delivery_is_not_lost(bus, sim, make_agent):
    agent = make_agent(intervals={"reassert_seconds": 0.3, "reasserts": 2})
    sim.inject("xid", xid=79, gpu=3)
    events = bus.wait_health(3, settle=1.2)  # sent, then again after 0.3 s and 0.6 s more; no more
    assert len(events) == 3 and agent.reasserted == 2
    assert len({e["event_id"] for e in events}) == 1 and len({e["observed_at"] for e in events}) == 1
    sent = [e["sent_at"] for e in events]
    assert sent == sorted(sent) and len(set(sent)) == 3  # sent now: the pipeline sees no clock skew


def _until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def _ledger() -> Ledger:
    """The stack's ledger table, as the agent's acknowledgements read it."""
    db = boto3.client("dynamodb", region_name="us-east-1")
    db.create_table(TableName="ledger", BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    return Ledger(db, "ledger")


def test_with_acknowledgements_an_event_is_sent_again_until_the_pipeline_decided_on_it(bus, sim, make_agent):
    """Detect down for longer than a fixed number of re-sends: the agent goes on (reasserts is a
    bound only without the table), and stops at the first look after Detect recorded a decision."""
    ledger = _ledger()
    agent = make_agent(intervals={"reassert_seconds": 0.1, "reasserts": 1},
                       publish={"acknowledgements_table": "ledger"})
    sim.inject("xid", xid=79, gpu=3)
    events = bus.wait_health(5, settle=0)  # sent, then after 0.1, 0.2, 0.4, 0.8 s more: no decision yet
    assert len({e["event_id"] for e in events}) == 1 and agent.reasserted >= 4 and agent.acknowledged == 0
    ledger.acknowledge_event(f"nodemedic.agent/{events[0]['event_id']}", "remediate", "inc-1", datetime.now(UTC))
    _until(lambda: agent.acknowledged)
    sent = len(bus.wait_health(0, settle=4.0))  # the next look would be 3.2 s after the last
    assert agent.acknowledged == 1 and agent.unacknowledged == 0
    assert len(bus.health_events()) == sent == agent.reasserted + 1


def test_with_acknowledgements_an_event_no_one_decides_on_is_given_up_after_its_window(bus, sim, make_agent):
    _ledger()
    agent = make_agent(intervals={"reassert_seconds": 0.1, "reassert_within_seconds": 1.0},
                       publish={"acknowledgements_table": "ledger"})
    sim.inject("xid", xid=79, gpu=3)
    _until(lambda: agent.unacknowledged)
    events = bus.wait_health(0, settle=2.0)
    assert agent.unacknowledged == 1 and agent.acknowledged == 0
    # sent at 0, then at about 0.1, 0.3 and 0.7 s; the look at about 1.5 s is past the window: no more
    assert 3 <= len(events) == agent.reasserted + 1 <= 4


def test_a_step_of_the_nodes_clock_does_not_end_the_window_to_send_again(bus, sim, make_agent, monkeypatch):
    """After a reboot the node's clock is corrected by an hour (NTP stepping a wrong RTC) just
    after the agent sent its event: the window to send it again runs on, by elapsed time."""
    _ledger()
    agent = make_agent(intervals={"reassert_seconds": 0.1, "reassert_within_seconds": 30.0},
                       publish={"acknowledgements_table": "ledger"})
    sim.inject("xid", xid=79, gpu=3)
    bus.wait_health(1, settle=0)
    stepped = time.time
    monkeypatch.setattr(time, "time", lambda: stepped() + 3600)
    _until(lambda: agent.reasserted >= 2 or agent.unacknowledged)
    assert agent.unacknowledged == 0 and agent.reasserted >= 2


def test_a_saved_event_keeps_its_age_and_one_saved_by_an_earlier_version_is_aged_by_its_wall_time():
    from nodemedic_agent.agent import _age

    assert _age({"age_s": 12.5}) == 12.5 and _age({"age_s": -3}) == 0.0
    assert 59 <= _age({"first_sent": time.time() - 60}) <= 61
    assert _age({"first_sent": time.time() + 3600}) == 0.0  # saved under a clock since stepped back


def test_an_event_still_undecided_is_sent_again_by_the_next_run_of_the_agent(bus, sim, make_agent):
    """The agent restarts (an upgrade, a crash) while the pipeline has not decided on its event:
    the new run sends it again (its dedupe memory keeps the condition from being reported anew),
    and stops once the decision is there."""
    ledger = _ledger()
    settings = {"intervals": {"reassert_seconds": 0.2}, "publish": {"acknowledgements_table": "ledger"}}
    first = make_agent(**settings)
    sim.inject("xid", xid=79, gpu=3)
    [event] = bus.wait_health(1, settle=0)
    first.stop(graceful=False)
    second = make_agent(**settings)
    _until(lambda: second.reasserted >= 2)
    assert {e["event_id"] for e in bus.health_events()} == {event["event_id"]}
    ledger.acknowledge_event(f"nodemedic.agent/{event['event_id']}", "remediate", "inc-1", datetime.now(UTC))
    _until(lambda: second.acknowledged)
    assert second.acknowledged == 1
    third = make_agent(**settings)  # nothing left to send again
    time.sleep(1.0)
    assert third.reasserted == 0 and third.acknowledged == 0


def test_an_acknowledgement_that_cannot_be_read_counts_as_none(bus, sim, make_agent):
    """The table is missing (or the role lacks the permission): the event is sent again, as
    without acknowledgements, and the error is kept for the operator."""
    # the window leaves room for a slow first read on a loaded machine (a 0.5 s one ended before
    # the first look once in a clean-clone run)
    agent = make_agent(intervals={"reassert_seconds": 0.1, "reassert_within_seconds": 2.0},
                       publish={"acknowledgements_table": "no-such-table"})
    sim.inject("xid", xid=79, gpu=3)
    _until(lambda: agent.unacknowledged)
    assert agent.reasserted >= 1 and agent.acks is not None and agent.acks.errors == agent.reasserted + 1
    assert "ResourceNotFoundException" in agent.acks.last_error


def test_repeats_are_counted_into_the_next_event_after_the_window():
    now = [0.0]
    dedupe = Deduper(window_s=300, clock=lambda: now[0])
    assert dedupe.admit("XID 79|3") == 1
    assert [dedupe.admit("XID 79|3") for _ in range(4)] == [None] * 4
    assert dedupe.admit("XID 79|5") == 1  # another GPU is another fault
    now[0] = 301.0
    assert dedupe.admit("XID 79|3") == 5  # this one plus the 4 folded ones


def test_a_storm_folded_into_more_than_an_event_may_count_is_sent_saying_the_most_it_may():
    """A fault repeating a thousand times a second over a long window: the next event used to
    carry a count the contract refuses, so it was never built, and the storm went unsaid."""
    now = [0.0]
    dedupe = Deduper(window_s=86400, clock=lambda: now[0])
    assert dedupe.admit("XID 94|3") == 1
    dedupe._seen["XID 94|3"].suppressed = MAX_COUNT + 5  # what a day of the storm folds; admitting each is slow
    now[0] = 86401.0
    count = dedupe.admit("XID 94|3")
    assert count == MAX_COUNT
    event = health_event(Finding("kernel_log", "XID 94", "degraded", "a storm of contained ECC errors"), "local",
                         NodeIdentity(instance_id="i-0123456789abcdef0", hostname="gpu-1"), count)
    assert event.count == MAX_COUNT


def test_a_clock_stepped_back_does_not_fold_a_fault_until_it_catches_up(tmp_path):
    """NTP corrects a clock that ran years fast (a bad RTC): the fault is published again, not
    folded as a repeat of a send the clock now puts in the future, in memory or after a restart."""
    year = 365 * 86400.0
    now = [2_000_000_000.0 + 10 * year]  # the clock is ten years fast
    state = tmp_path / "dedupe.json"
    dedupe = Deduper(window_s=300, clock=lambda: now[0], state_file=state)
    assert dedupe.admit("XID 79|3") == 1
    now[0] -= 10 * year  # corrected
    assert dedupe.admit("XID 79|3") == 1
    now[0] = 2_000_000_000.0 + 10 * year
    Deduper(window_s=300, clock=lambda: now[0], state_file=state).admit("XID 48|0")
    now[0] -= 10 * year  # corrected before the agent restarts
    assert Deduper(window_s=300, clock=lambda: now[0], state_file=state).admit("XID 48|0") == 1


def test_the_spool_keeps_the_order_of_its_events_when_the_clock_steps_back(tmp_path, monkeypatch):
    """Spooled events go out (and, over the bound, are dropped) oldest first, across a restart,
    even when the node's clock stepped back between two of them."""
    clock = [2_000_000_000 * 10**9]
    monkeypatch.setattr("nodemedic_agent.spool.time.time_ns", lambda: clock[0])
    spool = Spool(tmp_path, max_events=2)

    def event(detail: str) -> dict[str, str]:
        return {"Source": "nodemedic.agent", "DetailType": "Node Health Event", "Detail": detail, "EventBusName": "b"}

    spool.put(event("first"), "a")
    clock[0] -= 3600 * 10**9  # NTP steps the clock back an hour
    spool.put(event("second"), "b")
    restarted = Spool(tmp_path, max_events=2)
    assert [e["Detail"] for _, e in restarted.oldest(10)] == ["first", "second"]
    restarted.put(event("third"), "c")  # over the bound: the oldest goes
    assert [e["Detail"] for _, e in Spool(tmp_path, max_events=2).oldest(10)] == ["second", "third"]


def test_batches_respect_ten_entries_and_256_kb():
    small = [(f"s{i}", {"Source": "nodemedic.agent", "DetailType": "Node Health Event", "Detail": "{}"}) for i in range(23)]
    assert [len(b) for b in batches(small)] == [10, 10, 3]
    big = [(f"b{i}", {"Source": "s", "DetailType": "d", "Detail": json.dumps({"x": "y" * 100_000})}) for i in range(5)]
    sized = batches(big)
    assert [len(b) for b in sized] == [2, 2, 1]
    assert all(sum(entry_size(e) for _, e in b) <= MAX_BATCH_BYTES for b in sized)


def test_a_spool_file_that_is_no_event_is_set_aside_and_never_blocks_the_queue(tmp_path):
    """A file another version wrote, or a disk gave back damaged: a non-entry reached PutEvents,
    whose parameter check refused the whole batch on every try, and no event behind it was sent."""
    good = {"Source": "nodemedic.agent", "DetailType": "Node Health Event", "Detail": "{}", "EventBusName": "b"}
    for n, content in enumerate(["{not json", "null", "[1]", json.dumps({"Detail": "x"}), json.dumps(good)]):
        (tmp_path / f"ev-{n + 1:020d}-k{n}.json").write_text(content)
    spool = Spool(tmp_path)
    assert spool.oldest(10) == [(f"ev-{5:020d}-k4.json", good)]
    reasons = sorted(p.read_text() for p in spool.dead_dir.glob("*.reason"))
    assert reasons == ["not a PutEvents entry"] * 3 + ["unreadable spool file"]
    assert len(spool) == 1


def test_outage_spools_events_and_delivers_each_once_across_a_restart(server, sim, make_agent):
    bus = Bus(endpoint_url=server.url)
    server.down()  # the bus becomes unreachable

    first = make_agent(publish={"endpoint_url": server.url})
    sim.inject("xid", xid=79, gpu=3)
    sim.inject("ecc-dbe", gpu=1)
    deadline = time.monotonic() + 5
    while len(first.spool) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert len(first.spool) == 2 and first.publisher.stats.sent == 0
    assert first.publisher.stats.failed_calls >= 1  # it did try, and backed off
    first.stop(graceful=False)  # the agent dies with the bus still down

    second = make_agent(publish={"endpoint_url": server.url})
    assert len(second.spool) == 2  # the spool survived the restart
    sim.inject("hang")
    time.sleep(0.5)
    back = datetime.now(UTC)
    server.up()  # the bus comes back

    events = bus.wait_health(3, timeout=15, settle=1.0)
    assert sorted(e["fault_code"] for e in events) == ["ECC_DBE", "HUNG_TASK", "XID 79"]
    assert len({e["event_id"] for e in events}) == 3  # none duplicated
    assert len(second.spool) == 0
    # each says when it was sent, not when it was spooled: an event held through the outage must not
    # read, against the bus's time, as a node clock that far behind (and its fault as that much younger).
    # A send stamped as it starts may start a moment before the bus is back and still get through
    # (CI: 1.2 ms before): within ATTEMPT of `back`, while the spooled events were seen a second before
    for event in events:
        assert datetime.fromisoformat(event["sent_at"]) >= back - ATTEMPT
        assert back > datetime.fromisoformat(event["observed_at"])
    assert sum(back - datetime.fromisoformat(e["observed_at"]) > 2 * ATTEMPT for e in events) >= 2


def test_entries_set_aside_are_bounded_newest_kept(tmp_path):
    """Something that writes bad entries for weeks must not fill the node's disk with dead ones."""
    spool = Spool(tmp_path, max_dead=3)
    for n in range(1, 6):
        (tmp_path / f"ev-{n:020d}-k{n}.json").write_text("{not json")
        spool = Spool(tmp_path, max_dead=3)
        assert spool.oldest(10) == []
    kept = sorted(p.name for p in spool.dead_dir.iterdir())
    assert kept == [f"ev-{n:020d}-k{n}.json{suffix}" for n in (3, 4, 5) for suffix in ("", ".reason")]


def test_a_full_spool_drops_its_oldest_event_and_says_so(tmp_path, caplog):
    spool = Spool(tmp_path, max_events=2)
    entry = {"Source": "s", "DetailType": "d", "Detail": "{}", "EventBusName": "b"}
    for key in ("a", "b", "c"):
        spool.put(entry, key)
    assert [name.rsplit("-", 1)[1] for name, _ in spool.oldest(10)] == ["b.json", "c.json"]
    assert spool.dropped == 1 and "spool full (2 events): dropped the oldest" in caplog.text


def test_a_disk_gone_read_only_does_not_stop_the_event_that_may_say_so(bus, sim, make_agent, monkeypatch):
    """The root file system remounted read-only (ext4's errors=remount-ro): the agent's state
    directory on it takes no file. The dedupe memory's save raised, so every event was lost before
    it reached the spool (whose own failure already fell back to a direct send)."""
    agent = make_agent()
    real_open = Path.open

    def read_only(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        if self.parent == agent.publisher.spool.dir and "w" in mode:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", read_only)
    sim.inject("xid", xid=79, gpu=3)
    sim.inject("xid", xid=48, gpu=1)
    events = bus.wait_health(2)
    assert sorted(e["fault_code"] for e in events) == ["XID 48", "XID 79"]
    assert agent.lost == 0 and all(t.is_alive() for t in agent._threads)


def test_a_spool_whose_disk_went_read_only_after_the_event_forgets_what_was_sent(tmp_path, monkeypatch, caplog):
    """Spooled, then the disk went read-only: the sent entry's file cannot be deleted. Raising there
    stopped the sender after each send, and the same events went out again at every attempt."""
    spool = Spool(tmp_path, max_dead=3)
    entry = {"Source": "s", "DetailType": "d", "Detail": "{}", "EventBusName": "b"}
    spool.put(entry, "sent")
    spool.put(entry, "refused")
    [(sent, _), (refused, _)] = spool.oldest(10)

    def read_only(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Path, "unlink", read_only)
    monkeypatch.setattr(os, "replace", read_only)
    spool.remove([sent])
    spool.dead([refused], "ValidationException: bad")
    assert len(spool) == 0 and spool.oldest(10) == []
    assert "could not be deleted (Read-only file system)" in caplog.text and "could not set" in caplog.text


def test_only_a_health_event_is_restamped_as_it_leaves_and_never_back_in_time():
    from datetime import timedelta

    from nodemedic.contracts.events import NodeIdentity
    from nodemedic_agent.checks.base import Finding
    from nodemedic_agent.events import entry, health_event, heartbeat, sent_now

    node = NodeIdentity(instance_id="i-0123456789abcdef0", hostname="gpu-1")
    spooled = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)
    event = health_event(Finding("nvml", "ECC_DBE", "failed", "ECC DBE", None, {}, spooled), "c1", node, 1, spooled)
    item = entry("bus", event)
    later = json.loads(sent_now(item, spooled + timedelta(minutes=30))["Detail"])
    assert (later["sent_at"], later["observed_at"], later["event_id"]) == \
        ("2026-11-26T08:30:00Z", "2026-11-26T08:00:00Z", event.event_id)
    assert json.loads(sent_now(item, spooled - timedelta(hours=1))["Detail"])["sent_at"] == "2026-11-26T08:00:00Z"
    beat = entry("bus", heartbeat("c1", node, 30.0, now=spooled))
    assert sent_now(beat, spooled + timedelta(minutes=30)) == beat
    garbled = {**item, "Detail": "{not json"}
    assert sent_now(garbled, spooled) == garbled
