"""Health signals end to end, from a simulated node through its real agent to the pipeline on real
Slurm: Xids whose action is in the message (Xid 154, NVLink5) and EFA faults that real EFA can
actually show (a link that loses carrier while the port says ACTIVE, an error-counter storm)."""

from __future__ import annotations

import time

import pytest
from nodemedic.contracts.incident import ENDED_STATUSES, Incident
from nodemedic_sandbox.local import LocalMode

from tests.conftest import require_slurm
from tests.e2e.support import wait_for

SWEEP_S = 0.5


def settled_incidents(fleet: LocalMode, nodes: set[str], timeout: float = 90) -> dict[str, Incident]:
    """Wait until ``nodes`` each have an ended incident and every execution has ended (events that are
    only recorded start executions too, so counting executions alone would race)."""
    wait_for(lambda: nodes <= {i.slurm_node for i in fleet.incidents() if i.status in ENDED_STATUSES},
             f"ended incidents on {sorted(nodes)}", timeout)
    executions = fleet.wait_for_executions(len(fleet.executions()), timeout=30)
    assert all(e["status"] == "SUCCEEDED" for e in executions), [e.get("cause") for e in executions]
    return {i.slurm_node: i for i in fleet.incidents()}


@pytest.fixture
def fleet():
    require_slurm()
    with LocalMode(nodes=4, scheduler="slurm", retry_time_scale=0.01, schedule_scale=SWEEP_S / 60,
                   extra_parameters={"BreakerMaxPercent": "50"}) as local:  # two of four nodes at once
        local.start_agents(heartbeat_s=0.5, poll_s=0.5)
        time.sleep(2 * SWEEP_S + 0.5)
        yield local


def test_xid154_and_nvlink5_messages_get_the_action_they_state(fleet: LocalMode) -> None:
    # what is only recorded: the driver says no action is needed; a non-fatal NVLink5 error
    fleet.agents.inject("gpu-3", "xid", xid=154, gpu=1,
                        text="GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")
    fleet.agents.inject("gpu-3", "xid", xid=144, gpu=2, text="SAW_MVB Nonfatal XC0 i0 Link -1 "
                        "(0x00000021 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)")
    # what is acted on: the driver says reboot; the catalog decodes a fatal NVLink5 error to RESET_GPU
    fleet.agents.inject("gpu-1", "xid", xid=154, gpu=3,
                        text="pid=4511, name=python, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")
    fleet.agents.inject("gpu-2", "xid", xid=149, gpu=0, text="NETIR_LINK_EVT Fatal XC0 i0 Link 08 "
                        "(0x004505c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    time.sleep(2)  # every injected line has been read by its agent
    by_node = settled_incidents(fleet, {"gpu-1", "gpu-2"})
    assert set(by_node) == {"gpu-1", "gpu-2"}  # nothing opened for gpu-3
    reboot, nvlink = by_node["gpu-1"], by_node["gpu-2"]
    assert (reboot.fault_code, reboot.status) == ("XID154_NODE_REBOOT", "closed")
    assert [r["rung"] for r in reboot.stages["repair"].result["rungs"]] == ["reboot"]  # a GPU reset will not do
    assert (nvlink.fault_code, nvlink.status) == ("NVLINK5_RESET_GPU", "closed")
    assert [r["rung"] for r in nvlink.stages["repair"].result["rungs"]] == ["gpu_reset"]
    # the recorded ones were counted, by class
    wait_for(lambda: all(sum(fleet.metric_values("FaultsMonitored", "Sum", Cluster="local", FaultClass=c)) >= 1
                         for c in ("gpu_recovery", "nvlink")), "FaultsMonitored for gpu_recovery and nvlink", 20)


def test_an_efa_link_drop_and_an_efa_error_storm_each_open_their_incident(fleet: LocalMode) -> None:
    fleet.agents.inject("gpu-1", "efa-down", efa=2)
    fleet.agents.inject("gpu-2", "efa-storm", efa=1)
    fleet.agents.inject("gpu-3", "efa-errors", efa=0)  # one jump, not sustained: recorded only
    time.sleep(5)  # well past the storm's debounce (3 polls of 0.5 s)
    by_node = settled_incidents(fleet, {"gpu-1", "gpu-2"})
    assert {n: i.fault_code for n, i in by_node.items()} == {"gpu-1": "EFA_DOWN", "gpu-2": "EFA_ERROR_RATE"}
    assert all(i.fault_class == "efa" and i.status in ("closed", "held") for i in by_node.values())
