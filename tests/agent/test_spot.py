"""The agent reads EC2's Spot interruption notice from instance metadata (``spot/instance-action``,
404 until EC2 warns) on a Spot Instance, and sends it once as a Node Health Event with the fault
code and evidence the pipeline's EventBridge intake gives the same warning. It reads EC2's
rebalance recommendation there too (``events/recommendations/rebalance``) and sends each once."""

from __future__ import annotations

import json
import time
import urllib.error
from datetime import UTC, datetime, timedelta
from email.message import Message

import pytest
from nodemedic.contracts.spot_interruption import RebalanceNotice
from nodemedic_agent.spot import LATE, notice_finding, read_notice, read_rebalance


class Metadata:
    """Instance metadata as IMDS answers it: the life cycle, and the notice once EC2 wrote it."""

    def __init__(self, life_cycle: str = "spot") -> None:
        self.life_cycle = life_cycle
        self.notice: str | None = None
        self.rebalance: str | None = None
        self.paths: list[str] = []

    def __call__(self, path: str) -> str:
        self.paths.append(path)
        if path == "instance-life-cycle":
            return self.life_cycle
        if path == "spot/instance-action" and self.notice is not None:
            return self.notice
        if path == "events/recommendations/rebalance" and self.rebalance is not None:
            return self.rebalance
        raise urllib.error.HTTPError(f"http://169.254.169.254/latest/meta-data/{path}", 404, "Not Found", Message(), None)


def _notice(action: str, at: datetime) -> str:
    return json.dumps({"action": action, "time": at.strftime("%Y-%m-%dT%H:%M:%SZ")})


def test_no_notice_is_none_and_a_notice_is_read_as_ec2_writes_it() -> None:
    metadata = Metadata()
    assert read_notice(metadata) is None
    metadata.notice = '{"action": "stop", "time": "2026-11-26T08:22:00Z"}'  # the user guide's example, dated
    notice = read_notice(metadata)
    assert notice is not None and (notice.action, notice.time) == ("stop", datetime(2026, 11, 26, 8, 22, tzinfo=UTC))


@pytest.mark.parametrize("text", ['{"action": "reboot", "time": "2026-11-26T08:22:00Z"}',
                                  '{"action": "stop", "time": "soon"}', '{"action": "stop"}',
                                  '{"action": "stop", "time": "2026-11-26T08:22:00"}', "<html>", "[]"])
def test_a_notice_that_is_not_ec2s_is_an_error_not_an_interruption(text: str) -> None:
    metadata = Metadata()
    metadata.notice = text
    with pytest.raises(ValueError, match="not EC2's notice"):
        read_notice(metadata)


def test_a_notice_from_before_the_instances_last_start_makes_no_finding() -> None:
    """EC2 started a stopped Spot Instance again: a notice still there is about the run that ended."""
    metadata = Metadata()
    at = datetime.now(UTC)
    metadata.notice = _notice("stop", at)
    notice = read_notice(metadata)
    assert notice is not None
    assert notice_finding(notice, at - timedelta(minutes=2)) is not None  # the warning itself
    assert notice_finding(notice, at + LATE + timedelta(seconds=1)) is None


def test_on_a_spot_instance_the_notice_is_sent_once_with_the_pipelines_evidence(bus, make_agent) -> None:  # noqa: ANN001
    metadata = Metadata()
    agent = make_agent(metadata=metadata, intervals={"spot_seconds": 0.05})
    time.sleep(0.3)
    assert bus.health_events() == [] and metadata.paths.count("spot/instance-action") >= 2
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=2)
    metadata.notice = _notice("hibernate", at)
    [event] = bus.wait_health(1, settle=0.5)  # read every 0.05 s: still one event
    assert (event["check"], event["fault_code"]) == ("spot_interruption", "PLANNED_SPOT_INTERRUPTION")
    assert event["evidence"]["instance_action"] == "hibernate"
    assert datetime.fromisoformat(event["evidence"]["deadline"]) == at
    assert agent.published == 1


def test_an_on_demand_instance_never_reads_the_notice(bus, make_agent) -> None:  # noqa: ANN001
    metadata = Metadata(life_cycle="on-demand")
    make_agent(metadata=metadata, intervals={"spot_seconds": 0.05, "scheduled_events_seconds": 0})
    time.sleep(0.3)
    assert metadata.paths == ["instance-life-cycle"] and bus.health_events() == []  # nor a rebalance


def test_a_rebalance_recommendation_is_read_as_ec2_writes_it_and_anything_else_is_an_error() -> None:
    metadata = Metadata()
    assert read_rebalance(metadata) is None
    metadata.rebalance = '{"noticeTime": "2026-11-26T08:22:00Z"}'  # the user guide's example, dated
    assert read_rebalance(metadata) == datetime(2026, 11, 26, 8, 22, tzinfo=UTC)
    for text in ('{"noticeTime": "2026-11-26T08:22:00"}', '{"noticeTime": "soon"}', "{}", "<html>", "[]"):
        metadata.rebalance = text
        with pytest.raises(ValueError, match="not EC2's recommendation"):
            read_rebalance(metadata)


def test_on_a_spot_instance_each_rebalance_recommendation_is_sent_once(bus, make_agent) -> None:  # noqa: ANN001
    def notices() -> list[dict]:
        return [e["detail"] for e in bus.drain() if e["detail-type"] == "EC2 Instance Rebalance Recommendation"]

    metadata = Metadata()
    agent = make_agent(metadata=metadata, intervals={"spot_seconds": 0.05, "scheduled_events_seconds": 0})
    time.sleep(0.3)
    assert notices() == [] and metadata.paths.count("events/recommendations/rebalance") >= 2
    metadata.rebalance = '{"noticeTime": "2026-11-26T08:22:00Z"}'
    time.sleep(0.6)  # read every 0.05 s: still one notice
    [sent] = notices()
    notice = RebalanceNotice.model_validate(sent)
    assert (notice.cluster, notice.node.instance_id) == (agent.config.cluster, agent.node.instance_id)
    assert notice.notice_time == datetime(2026, 11, 26, 8, 22, tzinfo=UTC)
    metadata.rebalance = '{"noticeTime": "2026-11-26T09:40:00Z"}'  # a new one, later
    time.sleep(0.6)
    assert [RebalanceNotice.model_validate(n).notice_time.hour for n in notices()] == [8, 9]
    assert agent.rebalance_notices == 2 and bus.health_events() == []
