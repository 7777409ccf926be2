from nodemedic.orchestrators.base import NodeStatus
from nodemedic.orchestrators.slurm import parse_scontrol_record

LINE = (
    "NodeName=gpu-1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 Gres=gpu:8 NodeAddr=127.0.0.1 "
    "OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 State=IDLE+DRAIN "
    "AllocTRES= CapWatts=n/a Reason=nodemedic:inc-1 XID 79 [root@2026-11-22T01:18:58]"
)


def test_scontrol_record_values_may_contain_spaces() -> None:
    fields = parse_scontrol_record(LINE)
    assert fields["NodeName"] == "gpu-1"
    assert fields["OS"] == "Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0"
    assert fields["State"] == "IDLE+DRAIN"
    assert fields["AllocTRES"] == ""
    assert fields["Reason"] == "nodemedic:inc-1 XID 79 [root@2026-11-22T01:18:58]"


def test_the_pipeline_owns_only_drains_with_its_own_incident_tag() -> None:
    ours = NodeStatus("gpu-1", "IDLE+DRAIN", "nodemedic:inc-1 XID 79")
    assert ours.drained_by("nodemedic:inc-1")
    assert not ours.drained_by("nodemedic:inc-10"), "a prefix of another incident id is not ours"
    assert not NodeStatus("gpu-1", "IDLE+DRAIN", "disk swap - bob").drained_by("nodemedic:inc-1")
    assert not NodeStatus("gpu-1", "IDLE", "nodemedic:inc-1 XID 79").drained_by("nodemedic:inc-1")
