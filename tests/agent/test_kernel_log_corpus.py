"""The kernel log parser on a corpus of real-format lines: with and without kmsg, dmesg, syslog
and journald prefixes, pid/name fields, old and new PCI forms, Xid 154 and NVLink5 messages."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nodemedic.contracts.events import NodeIdentity
from nodemedic_agent.checks import kernel_log
from nodemedic_agent.checks.kernel_log import KMSG_RECORD, LogStats, bus_key, kmsg_message, message_finding
from nodemedic_agent.events import health_event

CORPUS = Path(__file__).parent / "data" / "kernel_log_corpus.txt"
GPUS = {"3b:00": 3, "b7:00": 7, "10:1c": 1, "03:00": 0, "53:00": 5, "64:00": 6, "9d:00": 2, "18:00": 4,
        "ca:00": 6, "01:00": 1, "00:1e": 0, "00:06": 0}


def corpus() -> list[tuple[str, str, str]]:
    rows = []
    for line in CORPUS.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        code, bus, text = (part.strip() for part in line.split(" | ", 2))
        rows.append((code, bus, text))
    return rows


@pytest.mark.parametrize(("code", "bus", "line"), corpus(), ids=[f"{i}:{c}" for i, (c, _, _) in enumerate(corpus())])
def test_each_corpus_line_is_the_fault_it_reports(code: str, bus: str, line: str) -> None:
    message = line
    if KMSG_RECORD.match(line):
        parsed = kmsg_message(line, LogStats())
        assert parsed is not None
        message = parsed[0]
    finding = message_finding(message, datetime.now(UTC), lambda pci: GPUS.get(bus_key(pci)))
    if code == "-":
        assert finding is None
        return
    assert finding is not None and finding.fault_code == code
    health_event(finding, "local", NodeIdentity(instance_id="i-0123456789abcdef0", hostname="gpu-1"), 1)  # a valid event
    if bus != "-":
        assert finding.component == {"kind": "gpu", "index": GPUS[bus]}


def test_an_nvlink5_finding_carries_its_decode_and_its_action() -> None:
    fatal = message_finding("NVRM: Xid (PCI:0008:01:00): 144, SAW_MVB Fatal XC0 i0 Link -1 "
                            "(0x00000021 0x00000002 0x0 0x0 0x0 0x0)", datetime.now(UTC), lambda _: 1)
    quiet = message_finding("NVRM: Xid (PCI:0008:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link -1 "
                            "(0x00000021 0x00000001 0x0 0x0 0x0 0x0)", datetime.now(UTC), lambda _: 1)
    assert fatal is not None and quiet is not None
    assert (fatal.status, fatal.evidence["nvlink5_bucket"], fatal.evidence["error_status"]) == \
        ("failed", "RESET_GPU", "0x00000002")
    assert (quiet.status, quiet.evidence["nvlink5_bucket"]) == ("degraded", "IGNORE")


def test_a_mig_xid_names_the_gpu_and_the_instances_the_driver_attributes_it_to() -> None:
    """MIG mode: the Xid is the whole GPU's (its ladder acts on the GPU); the instances are evidence."""
    finding = message_finding("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 43, pid=2749, name=python3, Ch 00000010",
                              datetime.now(UTC), lambda pci: GPUS.get(bus_key(pci)))
    assert finding is not None and finding.component == {"kind": "gpu", "index": 3}
    assert (finding.evidence["mig_gpu_instance"], finding.evidence["mig_compute_instance"]) == (1, 2)


@pytest.mark.parametrize("line", [
    "nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): \u0662\u0664\u0660\u0660\u0667, Fatal, Link 30",  # Arabic-Indic digits
    "NVRM: Xid (PCI:0000:3b:00): \u0664\u0668, pid=1, name=x, Ch 00000008",
    "nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 199809, Fatal, Link 30",  # more digits than an SXid has
])
def test_a_number_the_kernel_does_not_write_is_no_fault(line: str) -> None:
    """Python's \\d matched any Unicode digit and int() read it: a syslog line any process can write
    with Arabic-Indic digits was Xid 48, and an SXid of such digits or of six became a fault code the
    event contract refuses, which stopped the kernel log watcher at every line like it."""
    assert message_finding(line, datetime.now(UTC), lambda _: 3) is None


# every pattern the parser matches, as hypothesis draws text for it, and any text
_PATTERNS = [p for p in vars(kernel_log).values() if isinstance(p, re.Pattern)]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.one_of(*(st.from_regex(p) for p in _PATTERNS), st.text(max_size=200)), st.sampled_from([None, 0, 7]))
def test_any_line_is_no_fault_or_one_the_event_contract_takes(line: str, gpu: int | None) -> None:
    finding = message_finding(line, datetime.now(UTC), lambda _: gpu)
    if finding is not None:
        health_event(finding, "c1", NodeIdentity(instance_id="i-0123456789abcdef0", hostname="gpu-1", slurm_node="gpu-1"),
                     1, datetime.now(UTC))


@pytest.mark.parametrize("tail", ["训" * 1100, "é" * 1100, "\x01" * 1100], ids=["cjk", "latin", "control"])
@pytest.mark.parametrize("line", [
    "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python, GPU has fallen off the bus. ",
    "NVRM: Xid (PCI:0000:53:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required) ",
    "LustreError: 1234:0:(import.c:100) fs-MDT0000: This client was evicted by fs-MDT0000; "], ids=["xid79", "xid154", "lustre"])
def test_a_fault_line_with_a_long_tail_of_wide_characters_is_sent_cut_not_lost(line: str, tail: str) -> None:
    """Each character that is not ASCII, or is a control character, takes 6 bytes in the event's
    JSON: 1,024 of them in the message made evidence over the contract's 4 KiB. The event was never
    built, and the Xid was lost. Now the message is cut to fit and the fault goes."""
    finding = message_finding(line + tail, datetime.now(UTC), lambda _: 5)
    assert finding is not None
    event = health_event(finding, "c1", NodeIdentity(instance_id="i-0123456789abcdef0", hostname="gpu-1"), 1)
    assert event.fault_code == finding.fault_code
    assert str(event.evidence["kmsg"]).startswith(line[:60]) and str(event.evidence["kmsg"]).endswith("...")
    assert {k: v for k, v in event.evidence.items() if not isinstance(v, str)} == \
        {k: v for k, v in finding.evidence.items() if not isinstance(v, str)}  # the decoded facts all kept


def test_a_fault_line_naming_a_device_longer_than_a_component_name_is_sent_with_the_name_cut() -> None:
    """A component's name is shown, never matched: a 300-character device name in an XFS shutdown
    made a component the contract refused, and the fault was never sent."""
    device = "nvme" + "1" * 296
    finding = message_finding(f"XFS ({device}): Filesystem has been shut down due to log error (0x2).", datetime.now(UTC),
                              lambda _: None)
    assert finding is not None
    event = health_event(finding, "c1", NodeIdentity(instance_id="i-0123456789abcdef0", hostname="gpu-1"), 1)
    assert event.component is not None and event.component.name == device[:256]
