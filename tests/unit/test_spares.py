"""Which pool node can take a job, and how the recovery stages read the incident."""

import pytest
from nodemedic.contracts.incident import IncidentRef
from nodemedic.stages.spares import ready


@pytest.mark.parametrize(("state", "usable"), [
    ("IDLE+RESERVED", True),
    ("IDLE", True),
    ("IDLE+DRAIN+RESERVED", False),
    ("IDLE+RESERVED+NOT_RESPONDING", False),
    ("DOWN+RESERVED", False),
    ("ALLOCATED+RESERVED", False),  # someone's reservation job runs on it
    ("MIXED", False),
    ("IDLE*+RESERVED", False),  # the older spelling of not responding
    ("IDLE+CLOUD+RESERVED", True),  # a cloud node that is up
    # Slurm's own states of an idle node that cannot take a job now (scontrol(1), NODE STATE)
    ("IDLE+CLOUD+POWERED_DOWN+RESERVED", False),
    ("IDLE+CLOUD+POWERING_UP+RESERVED", False),
    ("IDLE+POWER_DOWN+RESERVED", False),
    ("IDLE+POWERING_DOWN+RESERVED", False),
    ("IDLE+REBOOT_REQUESTED+RESERVED", False),
    ("IDLE+REBOOT_ISSUED+RESERVED", False),
    ("IDLE+INVALID_REG+RESERVED", False),
    ("IDLE+MAINTENANCE+RESERVED", False),
    ("IDLE+PERFCTRS+RESERVED", False),
])
def test_a_spare_is_ready_only_when_idle_and_answering(state: str, usable: bool) -> None:
    assert ready(state) is usable


def _ref(action: str, ladder: tuple[str, ...] = ()) -> IncidentRef:
    return IncidentRef(incident_id="i", cluster="c", instance_id="i-1", slurm_node="gpu-1", fault_code="MANUAL",
                       fault_class="manual", action=action, source="test",
                       observed_at="2026-11-22T00:00:00Z", ladder=ladder)


def test_an_incident_without_a_ladder_climbs_the_default_for_its_action() -> None:
    """Runbook requests and incidents opened before ladders existed carry none."""
    assert _ref("reboot").rungs == ("reboot", "replace")
    assert _ref("replace").rungs == ("replace",)
    assert _ref("reboot", ("gpu_reset", "reboot", "replace")).rungs == ("gpu_reset", "reboot", "replace")
