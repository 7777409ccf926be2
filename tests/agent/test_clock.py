"""A node whose clock is wrong still reaches AWS and sends events AWS takes (agent/clock.py).

The embedded AWS refuses a request signed more than 5 minutes from its time, as AWS does; moto
alone never looks at the time stamp."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import botocore.auth
import pytest
from botocore.exceptions import ClientError
from nodemedic_agent.agent import Agent, events_client
from nodemedic_agent.clock import AwsClock, ClockUnknownError
from nodemedic_agent.hardware.simulated import SimulatedHardware, SimulatedNode
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from .conftest import BUS, NODE, Bus, agent_config


@pytest.fixture
def bus() -> Iterator[Bus]:
    with EmbeddedAWS():
        yield Bus()


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize(("skew", "says"), [(timedelta(minutes=10), "Signature not yet current"),
                                            (timedelta(minutes=-10), "Signature expired")])
def test_a_request_signed_ten_minutes_off_is_refused_as_aws_refuses_it(
        bus: Bus, monkeypatch: pytest.MonkeyPatch, skew: timedelta, says: str) -> None:
    real = botocore.auth.get_current_datetime
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: real(*a, **k) + skew)
    with pytest.raises(ClientError) as refused:
        bus.events.put_events(Entries=[{"Source": "nodemedic.agent", "DetailType": "Node Heartbeat",
                                        "Detail": "{}", "EventBusName": BUS}])
    assert refused.value.response["Error"]["Code"] == "InvalidSignatureException"
    assert refused.value.response["Error"]["Message"].startswith(says)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", real)
    assert bus.heartbeats() == []  # nothing was put on the bus
    bus.events.put_events(Entries=[{"Source": "nodemedic.agent", "DetailType": "Node Heartbeat",
                                    "Detail": "{}", "EventBusName": BUS}])  # four minutes off would pass


def _agent(sim_root: Path, node_clock: AwsClock) -> Agent:
    sim = SimulatedNode(sim_root / "node").create(gpus=8, efa=2, shared_mounts=("/fsx",))
    config = agent_config(sim, sim_root / "spool")
    agent = Agent(config, SimulatedHardware(sim.dir), NODE, events_client(config), aws_clock=node_clock)
    agent.sim = sim  # type: ignore[attr-defined]
    return agent


def _until(condition, timeout: float = 15.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)


def test_an_agent_whose_clock_is_ten_minutes_fast_reaches_aws_and_keeps_its_stamps(bus: Bus, tmp_path: Path) -> None:
    """Its first call is refused; the refusal's Date gives AWS's time; it signs with that from
    then on. Its events keep the node's stamps: Detect measures the skew and corrects durations."""
    agent = _agent(tmp_path, AwsClock(local=lambda: datetime.now(UTC) + timedelta(minutes=10))).start()
    try:
        agent.sim.inject("xid", xid=79, gpu=3)  # type: ignore[attr-defined]
        _until(lambda: bool(bus.health_events()))
        [event] = bus.health_events()
        assert event["fault_code"] == "XID 79"
        assert timedelta(minutes=9) < _utc(event["sent_at"]) - datetime.now(UTC) < timedelta(minutes=11)
        assert timedelta(minutes=-11) < agent.aws_clock.offset < timedelta(minutes=-9)
        assert agent.send_heartbeat()
    finally:
        agent.stop(graceful=False)


def test_an_agent_whose_clock_reads_1970_dates_its_events_by_aws(bus: Bus, tmp_path: Path) -> None:
    """An RTC reset to 1970, NTP not synchronised yet: before, every event and heartbeat failed
    the contract in the agent itself (a time before 2020) and nothing was sent; the node looked
    silent. Now they carry AWS's time, learned from the first answer."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    started = time.monotonic()
    agent = _agent(tmp_path, AwsClock(local=lambda: epoch + timedelta(seconds=time.monotonic() - started))).start()
    try:
        agent.sim.inject("ecc-dbe", gpu=1)  # type: ignore[attr-defined]
        _until(lambda: bool(bus.health_events()))
        [event] = bus.health_events()
        for stamp in ("observed_at", "sent_at"):
            assert abs(_utc(event[stamp]) - datetime.now(UTC)) < timedelta(seconds=30), event
        assert agent.send_heartbeat()
        assert abs(_utc(bus.heartbeats()[-1]["sent_at"]) - datetime.now(UTC)) < timedelta(seconds=30)
    finally:
        agent.stop(graceful=False)


def test_a_clock_that_cannot_date_anything_says_so_until_aws_answers() -> None:
    clock = AwsClock(local=lambda: datetime(1970, 1, 1, tzinfo=UTC))
    with pytest.raises(ClockUnknownError, match="1970"):
        clock.stamp()
    clock.observe("Thu, 26 Nov 2026 02:31:51 GMT")
    assert clock.stamp() == datetime(2026, 11, 26, 2, 31, 51, tzinfo=UTC)
    clock.observe("not a date")  # ignored
    assert clock.known and clock.stamp().year == 2026
    assert clock.stamped(datetime(1970, 1, 1, 0, 5, tzinfo=UTC)) == datetime(2026, 11, 26, 2, 36, 51, tzinfo=UTC)


def test_a_time_the_clock_gave_before_ntp_set_it_is_sent_as_now() -> None:
    """The burn-in hold runs at boot, maybe before NTP: its time (1970) would make the contract
    refuse the NODE_JOINED event the agent sends once the clock is right."""
    now = datetime(2026, 11, 26, 3, 0, tzinfo=UTC)
    clock = AwsClock(local=lambda: now)
    assert clock.stamped(datetime(1970, 1, 1, tzinfo=UTC)) == now
    assert clock.stamped(now - timedelta(seconds=5)) == now - timedelta(seconds=5)


def test_the_agent_signs_exactly_as_botocore_does_at_the_same_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The signer copies botocore's SigV4 but for the time: with the clocks agreeing, the
    signature is botocore's own (a botocore that changed its internals fails here, not on AWS)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    moment = datetime(2026, 11, 26, 2, 31, 51, tzinfo=UTC)
    clock = AwsClock(local=lambda: moment)
    cls = botocore.auth.AUTH_TYPE_MAPS[clock._choose_signer(signature_version="v4") or ""]
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: moment.replace(tzinfo=None))
    signed = []
    for signer in (SigV4Auth, cls):
        request = AWSRequest("POST", "https://events.us-east-1.amazonaws.com/", data=b'{"Entries":[]}',
                             headers={"X-Amz-Target": "AWSEvents.PutEvents"})
        signer(Credentials("AKID", "secret", "token"), "events", "us-east-1").add_auth(request)
        signed.append((request.headers["Authorization"], request.headers["X-Amz-Date"]))
    assert signed[0] == signed[1] and signed[0][1] == "20261126T023151Z"


def test_a_one_off_fault_seen_before_any_aws_answer_is_sent_once_aws_answers(
        server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock at 1970 and no answer from AWS yet (the network not up at boot): an XID the driver
    logged then could not be dated, the kernel-log line was consumed, and the fault was lost. It is
    kept now, and sent, dated by AWS's time, once an answer gives it; a polled fault found at every
    poll meanwhile does not push it out of what is kept."""
    monkeypatch.setattr("nodemedic_agent.agent.UNDATED_KEPT", 4)  # 20 polls below would overflow it
    bus = Bus(endpoint_url=server.url)
    server.down()
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    started = time.monotonic()
    sim = SimulatedNode(tmp_path / "node").create(gpus=8, efa=2, shared_mounts=("/fsx",))
    config = agent_config(sim, tmp_path / "spool", intervals={"heartbeat_seconds": 0.5},
                          publish={"endpoint_url": server.url})
    clock = AwsClock(local=lambda: epoch + timedelta(seconds=time.monotonic() - started))
    agent = Agent(config, SimulatedHardware(sim.dir), NODE, events_client(config), aws_clock=clock).start()
    try:
        time.sleep(0.3)
        sim.inject("xid", xid=13, gpu=2)  # a one-off: no poll finds it again
        time.sleep(0.3)  # the kernel log follower reads it (every 0.05 s)
        sim.inject("thermal", gpu=6)  # found again at every poll
        time.sleep(1.0)
        seen = datetime.now(UTC)
        assert agent.published == 0 and not clock.known
        server.up()
        _until(lambda: len(bus.health_events()) >= 2)
        events = bus.wait_health(2)  # and nothing else: no check error for the heartbeats not sent
        assert sorted(e["fault_code"] for e in events) == ["THERMAL_VIOLATION", "XID 13"]
        [xid] = [e for e in events if e["fault_code"] == "XID 13"]
        assert abs(_utc(xid["observed_at"]) - seen) < timedelta(seconds=30), xid
        assert xid["component"]["index"] == 2
    finally:
        agent.stop(graceful=False)
