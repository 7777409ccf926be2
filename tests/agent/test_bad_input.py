"""Bad input never crashes the agent: bad config stops it at start naming the field; hardware
errors become check-error events; kernel log lines it cannot parse are skipped and counted."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nodemedic.contracts.events import NodeHealthEvent, NodeIdentity
from nodemedic_agent.checks.base import Finding
from nodemedic_agent.config import ConfigError, load_config
from nodemedic_agent.events import entry, health_event

GOOD = """
cluster = "local"
event_bus = "nodemedic-local"
[hardware]
backend = "simulated"
simulated_dir = "/tmp/none"
"""


def run_agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nodemedic_agent.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("text", "named"), [
    (GOOD + "[intervals]\nheartbeat_seconds = -1\n", "intervals.heartbeat_seconds"),
    (GOOD + "[expected]\ngpus = \"eight\"\n", "expected.gpus"),
    (GOOD.replace('cluster = "local"', 'cluster = "bad name!"'), "cluster"),
    (GOOD.replace('cluster = "local"\n', ""), "cluster: Field required"),
    (GOOD + "[publish]\nspool = \"/x\"\n", "publish.spool"),
    (GOOD + "[fault_overrides]\n\"XID 74\" = \"explode\"\n", "fault_overrides"),
    (GOOD + "[kernel_log]\nsource = \"syslog\"\n", "kernel_log.source"),
    ("cluster = [unclosed", "not valid TOML"),
    # no type is converted: a boolean is no count, a string no interval, an integer no switch
    (GOOD + "[expected]\ngpus = true\n", "expected.gpus"),
    (GOOD + "[expected]\ngpus = 7.5\n", "expected.gpus"),
    (GOOD + "[intervals]\npoll_seconds = \"10\"\n", "intervals.poll_seconds"),
    (GOOD.replace('backend = "simulated"', "dcgm = 1\nbackend = \"simulated\""), "hardware.dcgm"),
    # NaN compares false with every rate, so the rule would never fire; infinity is no interval
    (GOOD + "[thresholds.efa_error_rates]\nrdma_read_wr_err = nan\n", "thresholds.efa_error_rates.rdma_read_wr_err"),
    (GOOD + "[intervals]\nheartbeat_seconds = inf\n", "intervals.heartbeat_seconds"),
    # paths on the node are absolute: systemd starts the agent in /, a test runner anywhere
    (GOOD + "[publish]\nspool_dir = \"spool\"\n", "publish.spool_dir"),
    (GOOD + "[kernel_log]\nsource = \"file\"\npath = \"\"\n", "kernel_log.path"),
    (GOOD + "[storage]\npaths = [\"/\", \"data\"]\n", "storage.paths.1"),
    (GOOD + "[publish]\nendpoint_url = \"vpce-0a1b.events.us-east-1.vpce.amazonaws.com\"\n", "publish.endpoint_url"),
    (GOOD.replace('"nodemedic-local"', '"nodemedic local"'), "event_bus"),
    (GOOD + "[relay]\nqueue_url = \"sqs.us-east-1.amazonaws.com/1/q\"\n", "relay.queue_url"),
])
def test_malformed_config_stops_the_agent_naming_the_field(tmp_path: Path, text: str, named: str):
    config = tmp_path / "agent.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(config)
    proc = run_agent("-c", str(config), "run")
    assert proc.returncode == 2
    assert "configuration error" in proc.stderr and named in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_count_helm_renders_as_a_whole_float_and_a_bus_arn_are_accepted(tmp_path: Path):
    """Helm renders every number of its values as a float: the chart's ConfigMap says ``gpus = 8.0``."""
    config = tmp_path / "agent.toml"
    bus = "arn:aws:events:us-west-2:123456789012:event-bus/nodemedic-prod-a"
    config.write_text(GOOD.replace('"nodemedic-local"', f'"{bus}"') + "[expected]\ngpus = 8.0\nefa_devices = 32\n"
                      "[publish]\nendpoint_url = \"https://vpce-0a1b.events.us-west-2.vpce.amazonaws.com\"\n")
    loaded = load_config(config)
    assert (loaded.expected.gpus, loaded.expected.efa_devices, loaded.event_bus) == (8, 32, bus)


def test_the_relay_without_its_queue_and_table_stops_saying_which_outputs_to_set(tmp_path: Path):
    config = tmp_path / "agent.toml"
    config.write_text(GOOD)
    proc = run_agent("-c", str(config), "relay")
    assert proc.returncode == 2 and "[relay] needs queue_url and table" in proc.stderr
    assert "RelayQueueUrl" in proc.stderr and "Traceback" not in proc.stderr


def test_missing_config_file_is_a_clear_error(tmp_path: Path):
    proc = run_agent("-c", str(tmp_path / "nope.toml"), "validate")
    assert proc.returncode == 2 and "cannot read the configuration" in proc.stderr


def test_nvml_error_becomes_a_check_error_event_and_the_agent_keeps_working(bus, sim, make_agent):
    agent = make_agent()
    sim.inject("nvml-error")
    events = bus.wait_health(1)
    assert [(e["fault_code"], e["evidence"]["check"]) for e in events] == [("CHECK_ERROR", "gpu")]
    assert "simulated driver failure" in events[0]["evidence"]["error"]
    sim.inject("efa-down", efa=0)  # other checks and watchers still run
    assert [e["fault_code"] for e in bus.wait_health(2)] == ["CHECK_ERROR", "EFA_DOWN"]
    assert all(t.is_alive() for t in agent._threads)


def test_unreadable_counter_is_a_check_error(bus, sim, make_agent):
    make_agent()
    (sim.dir / "sys/class/infiniband/rdmap1s0/ports/1/hw_counters/rx_drops").write_text("garbage\n")
    events = bus.wait_health(1)
    assert [(e["fault_code"], e["evidence"]["check"]) for e in events] == [("CHECK_ERROR", "efa")]


def test_unparsable_kernel_log_lines_are_skipped_and_counted(bus, sim, make_agent):
    agent = make_agent()
    with sim.kmsg_path.open("a") as f:  # a log file: a line of text is a message, even if no record
        f.write("\x00\x01 binary junk\nthis is not a kmsg record\n SUBSYSTEM=pci\n\x1b[31m\n")  # 2 junk, 1 text, 1 continuation
    sim.inject("xid", xid=48, gpu=2)
    events = bus.wait_health(1)
    assert [e["fault_code"] for e in events] == ["XID 48"]
    assert agent.kernel_log.stats.skipped == 2


def test_without_a_gpu_driver_the_real_backend_reports_a_check_error(tmp_path: Path):
    config = tmp_path / "agent.toml"
    config.write_text(f"""
cluster = "local"
event_bus = "nodemedic-local"
[node]
instance_id = "i-0123456789abcdef0"
[kernel_log]
source = "off"
[publish]
spool_dir = "{tmp_path / 'spool'}"
""")
    proc = run_agent("-c", str(config), "check", "--once", "--dry-run")
    assert proc.returncode == 1, proc.stderr
    assert "[ERR ] gpu" in proc.stdout and "NVML" in proc.stdout
    assert '"fault_code": "CHECK_ERROR"' in proc.stdout
    assert "Traceback" not in proc.stderr


def test_different_check_errors_are_not_folded_into_one(bus, sim, make_agent):
    make_agent()
    sim.inject("nvml-error")
    (sim.dir / "sys/class/infiniband/rdmap1s0/ports/1/hw_counters/rx_drops").write_text("garbage\n")
    events = bus.wait_health(2)
    assert sorted(e["evidence"]["check"] for e in events) == ["efa", "gpu"]


def test_a_full_disk_under_the_spool_does_not_stop_detection(bus, sim, make_agent, monkeypatch):
    agent = make_agent()

    def disk_full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(agent.spool, "put", disk_full)
    sim.inject("xid", xid=79, gpu=1)
    events = bus.wait_health(1)
    assert [e["fault_code"] for e in events] == ["XID 79"]  # sent directly
    assert agent.lost == 0 and all(t.is_alive() for t in agent._threads)


@pytest.mark.parametrize(("component", "evidence"), [
    ({"kind": "gpu", "index": 300}, {}),
    ({"kind": "gpu", "serial": "x"}, {}),
    (None, {"links": [1, 2], "per_link": {"0": 1}}),
    (None, {f"counter_{n}": n for n in range(400)}),
    (None, {"since": datetime(2026, 11, 28, tzinfo=UTC), "raw": b"\x00"}),
], ids=["index", "field", "nested", "too-many", "no-json-type"])
def test_a_finding_whose_details_the_contract_refuses_is_sent_without_them_saying_so(
        component: dict[str, object] | None, evidence: dict[str, object]) -> None:
    """Whatever a check gets wrong about a fault's component or evidence, the fault goes: an event
    the contract refused was never sent (a long kernel message, a long device name and a large
    count were each found so: tests/agent/test_kernel_log_corpus.py, test_delivery.py)."""
    finding = Finding("efa", "EFA_ERRORS", "degraded", "EFA errors rising", component, evidence)
    event = health_event(finding, "c1", NodeIdentity(instance_id="i-0123456789abcdef0", hostname="gpu-1"), 1)
    assert (event.fault_code, event.severity, event.component) == ("EFA_ERRORS", "warning", None)
    assert event.evidence["summary"] == "EFA errors rising" and str(event.evidence["refused"])


_texts = st.one_of(st.text(max_size=40), st.text(max_size=3000), st.sampled_from(["训" * 1100, "\x01" * 2000, "é" * 700]))
_values = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(), _texts,
                    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))


@settings(max_examples=300, deadline=None)
@given(component=st.one_of(st.none(), st.fixed_dictionaries(
           {"kind": st.sampled_from(["gpu", "nic", "disk", "filesystem", "node", "switch"])},
           optional={"index": _values, "name": _values, "uuid": _values, "serial": _values})),
       evidence=st.dictionaries(st.text(max_size=30), _values, max_size=40), summary=_texts)
def test_whatever_a_check_says_of_a_faults_details_the_fault_is_sent(
        component: dict[str, object] | None, evidence: dict[str, object], summary: str) -> None:
    event = health_event(Finding("nvml", "XID 79", "failed", summary, component, evidence), "c1",
                         NodeIdentity(instance_id="i-0123456789abcdef0", hostname="gpu-1"), 1)
    assert (event.fault_code, event.severity) == ("XID 79", "critical")
    detail = json.loads(entry("bus", event)["Detail"], parse_constant=_refuse)  # JSON, as EventBridge reads it
    assert NodeHealthEvent.model_validate(detail) == event


def _refuse(constant: str) -> object:
    raise AssertionError(f"{constant} in the event: JSON has no such number, and EventBridge refuses the entry")


def test_a_measurement_that_is_no_number_is_sent_as_its_text() -> None:
    """A rate over no time, or a reading a tool could not make, is NaN or infinite: Python wrote it
    into the Detail as NaN, which is no JSON, and EventBridge refused the event."""
    finding = Finding("efa", "EFA_ERRORS", "degraded", "EFA errors rising", None,
                      {"per_s": float("inf"), "ratio": float("nan"), "errors": 12})
    event = health_event(finding, "c1", NodeIdentity(instance_id="i-0123456789abcdef0", hostname="gpu-1"), 1)
    assert {k: event.evidence[k] for k in ("per_s", "ratio", "errors")} == {"per_s": "inf", "ratio": "nan", "errors": 12}
    json.loads(entry("bus", event)["Detail"], parse_constant=_refuse)


def test_a_finding_the_contract_refuses_for_what_it_is_is_an_error_not_an_empty_event() -> None:
    """A fault code the contract refuses is the agent's own error (its fault table): said, not
    sent under another name."""
    with pytest.raises(ValueError, match="fault_code"):
        health_event(Finding("efa", "no such code!", "degraded", "x"), "c1",
                     NodeIdentity(instance_id="i-0123456789abcdef0", hostname="gpu-1"), 1)
