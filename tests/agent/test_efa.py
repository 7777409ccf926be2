"""EFA health that can fail: link state from the interface, error rates debounced over polls."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from nodemedic_agent.checks.polled import PolledChecks
from nodemedic_agent.config import ConfigError, parse_config
from nodemedic_agent.hardware.base import EfaDevice

from tests.agent.conftest import agent_config


class Counters:
    """EFA devices whose counters the test sets between polls (clock advanced by hand)."""

    def __init__(self) -> None:
        self.value = 0
        self.carrier = True
        self.operstate: str | None = None  # None: "up" or "down" as the carrier says

    def efa_devices(self) -> list[EfaDevice]:
        operstate = self.operstate or ("up" if self.carrier else "down")
        return [EfaDevice("rdmap0s0", "ACTIVE", {"rdma_write_wr_err": self.value}, "eth1", operstate, self.carrier)]


@pytest.fixture
def checks(sim, tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("nodemedic_agent.checks.polled.time.monotonic", lambda: clock[0])
    hw = Counters()
    polled = PolledChecks(hw, agent_config(sim, tmp_path / "spool", expected={"efa_devices": 1}))  # type: ignore[arg-type]

    def poll(add: int) -> list[str]:
        clock[0] += 1.0
        hw.value += add
        return [f.fault_code for f in polled.efa().findings]
    return poll, hw


def test_a_rate_above_its_threshold_fires_only_when_sustained(checks) -> None:
    poll, _ = checks
    assert poll(0) == []
    assert [poll(50) for _ in range(2)] == [[], []]  # 50 errors/s, but only two polls
    assert poll(0) == []  # the streak is broken
    assert [poll(50) for _ in range(3)] == [[], [], ["EFA_ERROR_RATE"]]


def test_a_counter_that_goes_back_to_zero_is_not_a_storm(checks) -> None:
    poll, hw = checks
    poll(1000)
    hw.value = 0  # driver reloaded
    assert [poll(0) for _ in range(4)] == [[], [], [], []]


def test_a_jump_is_counted_counter_by_counter(sim, tmp_path) -> None:  # noqa: ANN001
    """EFA_HW_ERRORS took the sum of every counter against the sum before: a driver reload that
    zeroed one counter hid another's jump, and a counter whose file appeared counted its history."""
    counters = {"rx_drops": 50_000, "rdma_write_wr_err": 0}

    class Hw:
        def efa_devices(self) -> list[EfaDevice]:
            return [EfaDevice("rdmap0s0", "ACTIVE", dict(counters), "eth1", "up", True)]

    polled = PolledChecks(Hw(), agent_config(sim, tmp_path / "spool", expected={"efa_devices": 1}))  # type: ignore[arg-type]
    assert polled.efa().findings == []
    counters.update(rx_drops=0, rdma_write_wr_err=500)  # rx_drops zeroed, 500 new write errors
    [finding] = polled.efa().findings
    assert (finding.fault_code, finding.evidence["new_errors"]) == ("EFA_HW_ERRORS", 500)
    counters["retrans_timeout_events"] = 90_000  # a counter read for the first time: no errors yet
    assert polled.efa().findings == []


def test_a_link_without_carrier_is_down_while_the_port_still_says_active(checks) -> None:
    poll, hw = checks
    hw.carrier = False
    assert poll(0) == ["EFA_DOWN"]


def test_the_example_config_is_valid_and_a_bad_counter_name_is_refused() -> None:
    example = tomllib.loads((Path(__file__).parents[2] / "node_agent" / "agent.example.toml").read_text())
    assert parse_config(example).thresholds.efa_debounce_polls == 3
    with pytest.raises(ConfigError, match="unknown EFA counters"):
        parse_config({**example, "thresholds": {"efa_error_rates": {"rdma_write_errs": 1}}})


@pytest.mark.parametrize(("operstate", "carrier", "down"), [
    ("unknown", True, False),  # a driver that never sets the state: usable (operstates.rst)
    ("up", True, False), ("down", False, True), ("lowerlayerdown", True, True), ("dormant", True, True),
    ("unknown", False, True),
])
def test_the_link_is_down_by_the_kernels_operational_states_not_by_any_word_but_up(checks, operstate: str, carrier: bool,
                                                                                  down: bool) -> None:
    """The kernel's IF_OPER_UNKNOWN "must be considered for user data": a driver that does not set
    the operational state reads "unknown" while it carries traffic. It read as EFA_DOWN (a reboot)."""
    poll, hw = checks
    hw.operstate, hw.carrier = operstate, carrier
    assert poll(0) == (["EFA_DOWN"] if down else [])


def test_a_counter_read_while_a_fault_is_injected_is_never_empty(sim) -> None:  # noqa: ANN001
    """Sysfs serves a counter whole; the simulated node writes it whole too. Written in place, a
    poll that read it mid-write got an empty file and sent a CHECK_ERROR (a flaky test under load)."""
    import threading

    counter = sim.dir / "sys" / "class" / "infiniband" / "rdmap0s0" / "ports" / "1" / "hw_counters" / "retrans_timeout_events"
    seen: list[str] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.append(counter.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(2000):
            sim.inject("efa-errors", efa=0)
    finally:
        done.set()
        reader.join()
    assert seen and all(text.strip().isdigit() for text in seen)
