"""DCGM's JSON as dcgmi prints it, read by its structure.

The reports under data/dcgm have the shapes of DCGM 3.3 (``DCGM GPU Diagnostic``, ``gpu_id``) and
DCGM 4 (``DCGM Diagnostic``, ``entity_group``/``entity_id``, ``test_summary``), and of ``dcgmi
health -c -j`` (a message cut in parts): read from dcgmi's source (github.com/NVIDIA/DCGM,
dcgmi/Diag.cpp, dcgmi/Health.cpp, dcgmi/DcgmiOutput.cpp); the values are written for the tests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from nodemedic_agent.checks.deep import dcgm_diag
from nodemedic_agent.checks.polled import PolledChecks
from nodemedic_agent.hardware.dcgm import parse_diag, parse_health

from tests.agent.conftest import agent_config, tool

DATA = Path(__file__).parent / "data" / "dcgm"


def report(name: str) -> str:
    return (DATA / name).read_text()


def test_a_healthy_report_has_no_failure_and_no_warning():
    health = parse_health(report("health-healthy.json"))
    assert health.failures == [] and health.warnings == []


def test_a_warning_is_not_a_failure_and_its_message_is_whole():
    health = parse_health(report("health-warning-pcie.json"))
    assert health.failures == []
    assert list(map(str, health.warnings)) == ["GPU 3 PCIe system: Detected more than 8 PCIe replays per minute for GPU 3 : 26 "
                               "Reconnect PCIe card. Run system side PCIE diagnostics utilities. Verify cables "
                               "and connections."]


def test_failures_and_warnings_are_told_apart_per_gpu_and_system():
    health = parse_health(report("health-failure-two-gpus.json"))
    assert list(map(str, health.failures)) == ["GPU 5 Memory system: Detected 2 volatile double-bit ECC error(s) in GPU 5. "
                               "Drain the GPU and reset it or reboot the node."]
    assert [str(w).split(":")[0] for w in health.warnings] == ["GPU 0 InfoROM system", "GPU 5 SM system"]
    assert health.gpu(health.failures) == 5 and health.gpu(health.warnings) is None  # two GPUs warn


def test_an_nvswitch_failure_is_a_failure():
    health = parse_health(report("health-failure-nvswitch.json"))
    assert health.gpu(health.failures) is None
    assert list(map(str, health.failures)) == [
        "NvSwitch 2 NvSwitch F: Detected an NvSwitch fatal error on NvSwitch 2"]


@pytest.mark.parametrize("text", [
    report("health-internal-error.json"),  # DCGM could not judge
    "Error: Health watches not enabled. Please enable watches. \n",  # what dcgmi prints without watches
    '{"body": {}}', '{"header": ["Health Monitor Report"]}', "[]",
    '{"body": {"Overall Health": {"value": "Healthy"}, "GPU": {"children": {"0": {"value": "Fine"}}}}}',
])
def test_what_cannot_be_read_as_a_health_report_is_an_error_never_healthy(text):
    with pytest.raises(ValueError):
        parse_health(text)


def test_a_verdict_without_the_entity_that_gave_it_still_counts():
    text = json.dumps({"body": {"Overall Health": {"value": "Failure"}}, "header": ["Health Monitor Report"]})
    assert list(map(str, parse_health(text).failures)) == ["Overall Health: Failure"]


def test_diag_reports_of_dcgm_3_and_4_that_pass():
    for name, results in (("diag-4-pass.json", 9), ("diag-3-pass.json", 10)):
        diag = parse_diag(report(name))
        assert diag.failed == [] and diag.results == results, name
    assert parse_diag(report("diag-4-pass.json")).warned == []


WARNED = json.dumps({"DCGM Diagnostic": {"test_categories": [{"category": "Integration", "tests": [{
    "name": "pcie", "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Warn",
                                 "warnings": [{"error_category": 5, "error_id": 82, "error_severity": 1,
                                               "warning": "GPU 1 is running at PCI link width 8X"}]}],
    "test_summary": {"status": "Pass"}}]}]}})


def test_a_result_that_only_warned_passes_and_is_said():
    """dcgmi's JSON prints a warning as Fail; a version that prints Warn is read as one."""
    assert parse_diag(WARNED).warned == ["pcie on GPU 1: GPU 1 is running at PCI link width 8X"]
    assert parse_diag(WARNED).failed == []


@pytest.mark.parametrize(("name", "failed"), [
    ("diag-4-fail-gpu.json", ["memory on GPU 1: A memory mismatch was detected on GPU 1, but no error was reported "
                              "by CUDA or NVML.", "memory"]),
    ("diag-4-fail-cpu-only.json", ["cpu_eud on CPU 0: CPU EUD test failed on CPU 0", "cpu_eud"]),
    ("diag-3-fail-persistence.json", ["Persistence Mode on GPU 0: Persistence mode for GPU 0 is currently disabled. "
                                      "The DCGM diagnostic requires peristence mode to be enabled."]),
    ("diag-4-iterations-fail.json", ["memory on GPU 0: A memory mismatch was detected on GPU 0", "memory"]),
])
def test_diag_failures_name_the_test_the_entity_and_dcgms_message(name, failed):
    assert parse_diag(report(name)).failed == failed


def test_a_result_whose_messages_are_one_string_is_still_read():
    text = report("diag-4-fail-gpu.json").replace(
        '[ { "error_category" : 3, "error_id" : 45, "error_severity" : 2,\n'
        '                                                               "warning" : "A memory mismatch was detected on GPU 1, '
        'but no error was reported by CUDA or NVML." } ]', '"A memory mismatch on GPU 1"')
    assert parse_diag(text).failed == ["memory on GPU 1: A memory mismatch on GPU 1", "memory"]


def test_a_diag_that_could_not_run_is_a_failure():
    diag = parse_diag(report("diag-4-runtime-error.json"))
    assert diag.failed[0].startswith("runtime error: ") and "NVVS exited with signal 9" in diag.failed[0]


@pytest.mark.parametrize("text", [
    "Error: unable to connect", "{}", '{"DCGM Diagnostic": {"test_categories": []}}',
    '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "memory", '
    '"results": [{"entity_id": 0, "status": "Bad"}]}]}]}}',
    '{"DCGM Diagnostic": {"test_categories": {"tests": []}}}',
])
def test_a_diag_report_that_cannot_be_read_is_an_error_never_a_pass(text):
    with pytest.raises(ValueError):
        parse_diag(text)


def fake_dcgmi(tmp_path: Path, monkeypatch, stdout: str, code: int = 0) -> None:
    (tmp_path / "out.json").write_text(stdout)
    tool(tmp_path, "dcgmi", f"cat {tmp_path / 'out.json'}\nexit {code}\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_the_deep_check_fails_a_node_whose_diag_failed_even_when_dcgmi_exits_0(tmp_path, monkeypatch):
    """dcgmi diag sets its exit status from GPU errors only: a CPU test's failure exits 0."""
    fake_dcgmi(tmp_path, monkeypatch, report("diag-4-fail-cpu-only.json"), code=0)
    measured = dcgm_diag(level=3)
    assert measured.ok is False and "cpu_eud on CPU 0" in measured.detail


@pytest.mark.parametrize(("text", "said"), [(report("diag-4-pass.json"), "pass (9 results)"),
                                            (WARNED, "warnings: pcie on GPU 1")])
def test_the_deep_check_passes_a_node_whose_diag_passed(tmp_path, monkeypatch, text, said):
    fake_dcgmi(tmp_path, monkeypatch, text)
    measured = dcgm_diag(level=3)
    assert measured.ok is True and said in measured.detail


@pytest.mark.parametrize(("name", "code"), [("diag-4-fail-gpu.json", 226), ("diag-4-runtime-error.json", 255)])
def test_the_deep_check_fails_a_node_whose_diag_failed_or_could_not_run(tmp_path, monkeypatch, name, code):
    fake_dcgmi(tmp_path, monkeypatch, report(name), code=code)
    assert dcgm_diag(level=3).ok is False


@pytest.mark.parametrize(("name", "codes", "gpus"), [
    ("health-healthy.json", [], []),
    ("health-warning-pcie.json", ["DCGM_HEALTH_WARNING"], [3]),
    ("health-failure-two-gpus.json", ["DCGM_HEALTH", "DCGM_HEALTH_WARNING"], [5, None]),  # warnings: two GPUs
])
def test_the_agent_acts_on_a_failure_and_only_records_a_warning(sim, tmp_path, monkeypatch, name, codes, gpus):
    from nodemedic_agent.hardware.nvml import NvmlHardware

    fake_dcgmi(tmp_path, monkeypatch, report(name))
    checks = PolledChecks(NvmlHardware(str(tmp_path / "sys")), agent_config(sim, tmp_path / "spool"))
    found = checks.dcgm().findings
    assert [f.fault_code for f in found] == codes
    assert [(f.component or {}).get("index") for f in found] == gpus
    assert [f.status for f in found] == ["failed" if c == "DCGM_HEALTH" else "degraded" for c in codes]


def test_the_agent_reports_a_dcgmi_it_cannot_read_as_a_check_error(sim, tmp_path, monkeypatch):
    from nodemedic_agent.hardware.nvml import NvmlHardware

    fake_dcgmi(tmp_path, monkeypatch, report("health-internal-error.json"))
    checks = PolledChecks(NvmlHardware(str(tmp_path / "sys")), agent_config(sim, tmp_path / "spool"))
    [result] = [r for r in checks.run_all() if r.name == "dcgm"]
    assert [f.fault_code for f in result.findings] == ["CHECK_ERROR"] and "Internal error" in result.findings[0].summary


def test_the_agent_sets_dcgms_health_watches_once_where_none_is_set(sim, tmp_path, monkeypatch):
    """DCGM watches nothing until told; dcgmi then prints an error on stdout and exits non-zero."""
    from nodemedic_agent.hardware.nvml import NvmlHardware

    watches, calls = tmp_path / "watches", tmp_path / "calls"
    (tmp_path / "out.json").write_text(report("health-warning-pcie.json"))
    tool(tmp_path, "dcgmi", f'echo "$*" >> {calls}\n'
         f'if [ "$2" = "-s" ]; then touch {watches}; echo "Health monitor systems set successfully."; exit 0; fi\n'
         f'if [ ! -f {watches} ]; then echo "Error: Health watches not enabled. Please enable watches. "; '
         f'exit 255; fi\ncat {tmp_path / "out.json"}\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    checks = PolledChecks(NvmlHardware(str(tmp_path / "sys")), agent_config(sim, tmp_path / "spool"))
    assert [f.fault_code for f in checks.dcgm().findings] == ["DCGM_HEALTH_WARNING"]
    assert [f.fault_code for f in checks.dcgm().findings] == ["DCGM_HEALTH_WARNING"]
    assert calls.read_text().splitlines() == ["health -c -j", "health -s a", "health -c -j", "health -c -j"]
    watches.unlink()  # someone cleared them: said, not set again behind the operator's back
    [result] = [r for r in checks.run_all() if r.name == "dcgm"]
    assert [f.fault_code for f in result.findings] == ["CHECK_ERROR"] and "watches not enabled" in result.detail


HOST_ENGINE_DOWN = ("Error: unable to establish a connection to the specified host: localhost\n"
                    "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n")


def test_a_dcgm_that_is_not_running_never_fails_a_node(sim, tmp_path, monkeypatch):
    """nv-hostengine stopped (or not started yet after a boot) says nothing about the GPUs: the
    deep check's gate must not fail, and the ladder must not climb to a replacement, for it."""
    from nodemedic_agent.hardware.nvml import NvmlHardware
    from nodemedic_agent.report import machine

    fake_dcgmi(tmp_path, monkeypatch, HOST_ENGINE_DOWN, code=255)
    result = PolledChecks(NvmlHardware(str(tmp_path / "sys")), agent_config(sim, tmp_path / "spool")).dcgm()
    assert [(f.fault_code, f.status) for f in result.findings] == [("DCGM_UNAVAILABLE", "degraded")]
    assert machine([result], "quick", "i-0123456789abcdef0")["healthy"] is True
    measured = dcgm_diag(level=3)
    assert measured.ok is None and measured.detail.startswith("not run: DCGM's host engine is not reachable")
