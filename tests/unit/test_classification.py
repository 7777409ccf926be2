import pytest
from nodemedic.domain.classification import alarm_fault_code, classify, parse_overrides


@pytest.mark.parametrize(
    ("code", "fault_class", "action"),
    [
        pytest.param("XID 79", "gpu_lost", "replace", id="xid79_replace"),
        pytest.param("XID 54", "gpu_hardware", "replace", id="xid54_check_mechanicals_replace"),
        pytest.param("XID 48", "gpu_memory", "reboot", id="xid48_reboot"),
        pytest.param("XID 119", "gpu_reset", "reboot", id="xid119_gsp_reset"),
        pytest.param("XID 46", "gpu_reset", "reboot", id="xid46_was_missed_before_the_catalog"),
        pytest.param("XID 13", "application", "monitor", id="xid13_monitor"),
        pytest.param("XID 147", "nvlink", "monitor", id="xid147_undecoded_nvlink5_monitor"),
        pytest.param("NVLINK5_RESET_GPU", "nvlink", "reboot", id="nvlink5_decoded_fatal"),
        pytest.param("XID154_NODE_REBOOT", "gpu_recovery", "reboot", id="xid154_node_reboot"),
        pytest.param("XID154_NONE", "gpu_recovery", "monitor", id="xid154_none"),
        pytest.param("GPU_LOST", "gpu_lost", "replace", id="gpu_lost_replace"),
        pytest.param("DISK_FULL", "storage", "monitor", id="disk_full_monitor"),
        pytest.param("FS_SHUTDOWN", "filesystem", "reboot", id="xfs_shutdown_reboot"),
        pytest.param("LUSTRE_EVICTED", "filesystem", "monitor", id="lustre_eviction_recorded"),
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
        pytest.param("[" * 100_000, "nested too deeply", id="nested_past_the_decoder"),
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
        ("XID 79", ("replace",)),  # NodeMedic's deviation from RESTART_BM, see the fault table
        ("XID 151", ("reboot", "replace")),  # RESTART_VM: the VM is the instance
        ("XID154_GPU_RESET", ("gpu_reset", "reboot", "replace")),
        ("XID154_NODE_REBOOT", ("reboot", "replace")),  # the driver says a reset will not do
        ("HEARTBEAT_MISSING", ("reboot", "replace")),
        ("EFA_DOWN", ("reboot", "replace")),
        ("XID 13", ()),  # monitor: no ladder
    ],
)
def test_each_fault_has_its_escalation_ladder(code: str, ladder: tuple[str, ...]) -> None:
    assert classify(code).ladder == ladder


def test_an_operators_override_of_the_action_takes_that_actions_ladder() -> None:
    assert classify("XID 79", {"XID 79": "reboot"}).ladder == ("reboot", "replace")
    assert classify("XID 48", {"XID 48": "replace"}).ladder == ("replace",)


def test_every_code_in_nvidias_catalog_gets_its_buckets_action() -> None:
    """Walks the whole catalog: each code's action and ladder are its resolution bucket's, except
    where the fault table has a rule for it, which must say why it deviates."""
    from nodemedic.domain.classification import fault_table
    from nodemedic.domain.xid import catalog

    table = fault_table()
    rules = {r["code"]: r for r in table["rules"]}
    assert len(catalog()) >= 172 and set(range(1, 173)) <= set(catalog())
    for code, entry in catalog().items():
        c = classify(f"XID {code}")
        bucket = table["xid_buckets"][entry.immediate]
        if f"XID {code}" in rules:
            note = rules[f"XID {code}"]["note"]
            assert "NVIDIA" in note, f"XID {code} deviates from its bucket without saying why"
            continue
        assert (c.action, c.fault_class) == (bucket["action"], bucket["fault_class"]), f"XID {code}"
        assert c.ladder == tuple(bucket.get("ladder", ())), f"XID {code}"
        assert entry.mnemonic in c.note


def test_every_reset_bucket_xid_is_acted_on() -> None:
    from nodemedic.domain.xid import catalog

    reset = [code for code, e in catalog().items() if e.immediate == "RESET_GPU"]
    assert {46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158} <= set(reset)
    for code in reset:
        assert classify(f"XID {code}").ladder[0] == "gpu_reset"
