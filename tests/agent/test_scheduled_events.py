"""The agent reads EC2's scheduled events for its instance from instance metadata
(``events/maintenance/scheduled``, and ``history`` for the completed or canceled ones, each 404
while empty) in the shape EC2 documents, and sends them to the pipeline when they change."""

from __future__ import annotations

import json
import time
import urllib.error
from datetime import UTC, datetime
from email.message import Message
from typing import Any

import pytest
from nodemedic_agent.scheduled_events import metadata_time, read_scheduled

# the EC2 User Guide's example ("View scheduled events"), as instance metadata writes it
REBOOT = {"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code": "system-reboot", "Description": "scheduled reboot",
          "EventId": "instance-event-0d59937288b749b32", "NotAfter": "21 Jan 2019 09:17:23 GMT", "State": "active"}
RETIREMENT = {"NotBefore": "6 Dec 2026 00:00:00 GMT", "Code": "instance-retirement",
              "Description": "The instance is running on degraded hardware",
              "EventId": "instance-event-0a1b2c3d4e5f6a7b8", "State": "active"}


class Metadata:
    """Instance metadata as IMDS answers it: each path's text, or 404."""

    def __init__(self) -> None:
        self.answers: dict[str, str] = {}
        self.reads = 0

    def __call__(self, path: str) -> str:
        if path == "events/maintenance/scheduled":
            self.reads += 1
        if path in self.answers:
            return self.answers[path]
        raise urllib.error.HTTPError(f"http://169.254.169.254/latest/meta-data/{path}", 404, "Not Found", Message(), None)

    def events(self, scheduled: list[dict[str, Any]], history: list[dict[str, Any]] | None = None) -> None:
        self.answers = {"events/maintenance/scheduled": json.dumps(scheduled)}
        if history:
            self.answers["events/maintenance/history"] = json.dumps(history)


def test_metadata_dates_are_read_whatever_the_locale_and_nothing_else_is() -> None:
    assert metadata_time("21 Jan 2019 09:00:43 GMT") == datetime(2019, 1, 21, 9, 0, 43, tzinfo=UTC)
    assert metadata_time("6 Dec 2026 00:00:00 GMT") == datetime(2026, 12, 6, tzinfo=UTC)
    for text in ("2019-01-21T09:00:43Z", "21 Jan 2019 09:00:43 UTC", "21 Janv 2019 09:00:43 GMT", ""):
        with pytest.raises(ValueError):
            metadata_time(text)


def test_active_events_then_the_ended_ones_newest_first_none_when_both_paths_are_empty() -> None:
    metadata = Metadata()
    assert read_scheduled(metadata) == []
    canceled = {**REBOOT, "State": "canceled", "Description": "[Canceled] scheduled reboot",
                "NotBefore": "21 Nov 2026 09:00:43 GMT", "NotAfter": "21 Nov 2026 09:17:23 GMT"}
    older = {**REBOOT, "EventId": "instance-event-0000000000000000a", "NotBefore": "1 Jan 2018 00:00:00 GMT",
             "State": "completed"}  # before 2020: not a plausible time; from the history it is left out
    metadata.events([RETIREMENT], history=[older, canceled])
    events = read_scheduled(metadata)
    assert [(e.code, e.state) for e in events] == [("instance-retirement", "active"), ("system-reboot", "canceled")]
    assert events[0].not_before == datetime(2026, 12, 6, tzinfo=UTC) and events[0].not_after is None
    earlier = {**REBOOT, "EventId": "instance-event-0000000000000000b", "NotBefore": "2 Feb 2026 00:00:00 GMT",
             "NotAfter": "2 Feb 2026 01:00:00 GMT", "State": "completed"}
    metadata.events([RETIREMENT], history=[earlier, canceled])
    assert [e.event_id for e in read_scheduled(metadata)][1:] == [canceled["EventId"], earlier["EventId"]]


def test_a_description_longer_than_a_notice_carries_is_cut_not_a_reason_to_drop_the_event() -> None:
    """EC2's description is free text NodeMedic only shows: one over 1,024 characters made the
    whole answer "not EC2's", and the retirement it came with was never sent."""
    metadata = Metadata()
    metadata.events([{**RETIREMENT, "Description": "degraded hardware " * 100}])
    [event] = read_scheduled(metadata)
    assert (event.code, len(event.description)) == ("instance-retirement", 1024)


@pytest.mark.parametrize("text", ["<html>", "{}", json.dumps([{**REBOOT, "NotBefore": "soon"}]),
                                  json.dumps([{**REBOOT, "EventId": "../x"}]), json.dumps([{"Code": "system-reboot"}])])
def test_an_answer_that_is_not_ec2s_is_an_error_not_an_event(text: str) -> None:
    metadata = Metadata()
    metadata.answers = {"events/maintenance/scheduled": text}
    with pytest.raises(ValueError, match="events/maintenance/scheduled is not EC2's answer"):
        read_scheduled(metadata)


def test_the_agent_sends_its_scheduled_events_once_and_again_when_they_change(bus, make_agent) -> None:  # noqa: ANN001
    metadata = Metadata()
    agent = make_agent(metadata=metadata, intervals={"scheduled_events_seconds": 0.05})

    def notices() -> list[dict[str, Any]]:
        return [e["detail"] for e in bus.drain() if e["detail-type"] == "EC2 Scheduled Events"]

    time.sleep(0.3)
    assert notices() == [] and metadata.reads >= 2  # nothing scheduled: nothing sent
    metadata.events([RETIREMENT])
    deadline = time.monotonic() + 10
    while not notices() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # read every 0.05 s meanwhile: still one notice
    [notice] = notices()
    assert notice["node"]["slurm_node"] == "gpu-1" and notice["cluster"] == agent.config.cluster
    assert [(e["code"], e["event_id"], e["not_before"], e["state"]) for e in notice["events"]] == [
        ("instance-retirement", "instance-event-0a1b2c3d4e5f6a7b8", "2026-12-06T00:00:00Z", "active")]

    metadata.events([], history=[{**RETIREMENT, "State": "canceled"}])  # AWS canceled it
    while len(notices()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [e["state"] for e in notices()[1]["events"]] == ["canceled"]
    assert agent.scheduled_notices == 2


def test_not_on_ec2_or_a_wrong_answer_sends_nothing_and_the_agent_runs_on(bus, make_agent) -> None:  # noqa: ANN001
    metadata = Metadata()
    metadata.answers = {"events/maintenance/scheduled": "<html>"}
    agent = make_agent(metadata=metadata, intervals={"scheduled_events_seconds": 0.05})
    time.sleep(0.4)
    assert metadata.reads >= 2 and agent.scheduled_notices == 0
    assert [e for e in bus.drain() if e["detail-type"] == "EC2 Scheduled Events"] == []


def test_an_active_event_is_sent_again_while_it_lasts_an_ended_one_is_not(bus, make_agent) -> None:  # noqa: ANN001
    """The agent cannot see whether the planned-events function took its notice (a delivery that
    failed waits in a dead-letter queue): while an event is active it sends it again every
    ``scheduled_events_resend_seconds`` (the same event ids: the pipeline deduplicates)."""
    metadata = Metadata()
    metadata.events([RETIREMENT])
    agent = make_agent(metadata=metadata, intervals={"scheduled_events_seconds": 0.05,
                                                     "scheduled_events_resend_seconds": 0.4})

    def notices() -> list[dict[str, Any]]:
        return [e["detail"] for e in bus.drain() if e["detail-type"] == "EC2 Scheduled Events"]

    deadline = time.monotonic() + 10
    while len(notices()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    sent = notices()
    assert len(sent) >= 3 and all(n["events"] == sent[0]["events"] for n in sent)
    metadata.events([], history=[{**RETIREMENT, "State": "completed"}])
    while notices()[-1]["events"][0]["state"] != "completed" and time.monotonic() < deadline:
        time.sleep(0.05)
    ended = len(notices())
    time.sleep(1.0)  # more than two resend periods: an ended event is not sent again
    assert len(notices()) == ended == agent.scheduled_notices
    assert [e["state"] for e in notices()[-1]["events"]] == ["completed"]
