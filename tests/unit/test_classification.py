import pytest
from nodemedic.domain.classification import alarm_fault_code, classify, parse_overrides


@pytest.mark.parametrize(
    ("code", "fault_class", "action"),
    [
        pytest.param("XID 79", "gpu_lost", "replace", id="xid79_replace"),
        pytest.param("XID 54", "gpu_hardware", "replace", id="xid54_replace"),
        pytest.param("XID 48", "gpu_memory", "reboot", id="xid48_reboot"),
        pytest.param("XID 119", "gpu_firmware", "reboot", id="xid119_gsp_reboot"),
        pytest.param("XID 13", "application", "monitor", id="xid13_monitor"),
        pytest.param("XID 147", "nvlink", "monitor", id="xid147_nvlink5_monitor"),
        pytest.param("GPU_LOST", "gpu_lost", "replace", id="gpu_lost_replace"),
        pytest.param("DISK_FULL", "storage", "monitor", id="disk_full_monitor"),
        pytest.param("XID 9999", "unknown", "monitor", id="unknown_is_never_acted_on"),
    ],
)
def test_fault_table(code: str, fault_class: str, action: str) -> None:
    c = classify(code)
    assert (c.fault_class, c.action, c.overridden) == (fault_class, action, False)


def test_an_operator_override_wins_and_says_so() -> None:
    c = classify("XID 74", parse_overrides('{"XID 74": "monitor"}'))
    assert (c.action, c.overridden) == ("monitor", True)
    assert "operator override" in c.reason


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param("{not json", "not JSON", id="not_json"),
        pytest.param('["XID 74"]', "JSON object", id="not_object"),
        pytest.param('{"XID 74": "nuke"}', "'nuke' is not one of", id="unknown_action"),
    ],
)
def test_a_bad_override_is_an_error(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_overrides(raw)


def test_alarm_metrics_map_to_fault_codes() -> None:
    assert alarm_fault_code("StatusCheckFailed_System") == "STATUS_CHECK_SYSTEM"
    assert classify(alarm_fault_code("CPUUtilization")).action == "monitor"


@pytest.mark.parametrize(
    ("code", "ladder"),
    [
        ("XID 48", ("gpu_reset", "reboot", "replace")),  # GPU memory: a reset applies the row remap
        ("XID 119", ("gpu_reset", "reboot", "replace")),  # GSP firmware
        ("HEARTBEAT_MISSING", ("reboot", "replace")),
        ("EFA_DOWN", ("reboot", "replace")),
        ("XID 79", ("replace",)),  # fell off the bus: straight to a new instance
        ("XID 13", ()),  # monitor: no ladder
    ],
)
def test_each_fault_has_its_escalation_ladder(code: str, ladder: tuple[str, ...]) -> None:
    assert classify(code).ladder == ladder


def test_an_operators_override_of_the_action_takes_that_actions_ladder() -> None:
    assert classify("XID 79", {"XID 79": "reboot"}).ladder == ("reboot", "replace")
    assert classify("XID 48", {"XID 48": "replace"}).ladder == ("replace",)
