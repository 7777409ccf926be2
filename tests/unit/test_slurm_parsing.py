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


def test_a_drain_reason_runs_to_slurms_stamp_even_with_word_equals_text_in_it() -> None:
    fields = parse_scontrol_record("NodeName=gpu-2 State=IDLE+DRAIN ExtSensorsTemp=n/s "
                                   "Reason=rma ticket=42 [bob@2026-11-22T01:18:58] Comment=rack 4 Extra=x=1")
    assert fields["Reason"] == "rma ticket=42 [bob@2026-11-22T01:18:58]"
    assert (fields["Comment"], fields["Extra"], fields["State"]) == ("rack 4", "x=1", "IDLE+DRAIN")
    assert "ticket" not in fields
    # a job's Reason has no stamp: it ends at the next field as every value does
    assert parse_scontrol_record("JobId=5 JobState=PENDING Reason=Priority Dependency=(null)")["Reason"] == "Priority"


def test_the_pipeline_owns_only_drains_with_its_own_incident_tag() -> None:
    ours = NodeStatus("gpu-1", "IDLE+DRAIN", "nodemedic:inc-1 XID 79")
    assert ours.drained_by("nodemedic:inc-1")
    assert not ours.drained_by("nodemedic:inc-10"), "a prefix of another incident id is not ours"
    assert not NodeStatus("gpu-1", "IDLE+DRAIN", "disk swap - bob").drained_by("nodemedic:inc-1")
    assert not NodeStatus("gpu-1", "IDLE", "nodemedic:inc-1 XID 79").drained_by("nodemedic:inc-1")


class RecordingRunner:
    """Stands in for RunCommand: records what would be sent, answers with canned output."""

    def __init__(self, stdout: str = "") -> None:
        self.sent: list[tuple[str, str, dict[str, str]]] = []
        self.stdout = stdout

    def run_checked(self, instance_id: str, document: str, parameters: dict[str, str], timeout_s: int,
                    comment: str = "") -> str:
        self.sent.append((instance_id, document, parameters))
        return self.stdout


def test_the_adapter_sends_parameter_values_to_typed_documents_never_shell() -> None:
    from nodemedic.orchestrators.slurm import SlurmViaSSM
    from nodemedic.providers.run_command import Documents

    runner = RecordingRunner("drained\n")
    slurm = SlurmViaSSM(runner, "i-0ctl", 60, Documents("prod"), spare_reservation="spares")  # type: ignore[arg-type]
    # a fault code is event input: what the drain document's pattern refuses is replaced, not quoted
    slurm.drain("gpu-1", "nodemedic:inc-1 XID 79'; reboot; echo $(id)`x`")
    slurm.take_spare("gpu-9")
    assert runner.sent == [
        ("i-0ctl", "nodemedic-prod-slurm-drain", {"node": "gpu-1", "reason": "nodemedic:inc-1 XID 79__ reboot_ echo _(id)_x_",
                                                   "takeover": "-"}),
        ("i-0ctl", "nodemedic-prod-spare-take", {"node": "gpu-9", "reservation": "spares"}),
    ]


def test_a_drain_that_does_not_say_what_it_did_fails_and_someone_elses_drain_is_kept() -> None:
    import pytest
    from nodemedic.errors import DrainFailedError
    from nodemedic.orchestrators.slurm import SlurmViaSSM
    from nodemedic.providers.run_command import Documents

    kept = SlurmViaSSM(RecordingRunner("kept disk swap - bob [bob@2026-11-22T01:18:58]\n"), "i-0ctl", 60,  # type: ignore[arg-type]
                       Documents("prod"))
    assert kept.drain("gpu-1", "nodemedic:inc-1 XID 79", takeover="nodemedic:") is False
    silent = SlurmViaSSM(RecordingRunner(""), "i-0ctl", 60, Documents("prod"))  # type: ignore[arg-type]
    with pytest.raises(DrainFailedError, match="did not say"):
        silent.drain("gpu-1", "nodemedic:inc-1 XID 79")


def test_a_garbled_number_in_a_job_list_fails_the_command_and_says_what_it_printed() -> None:
    """The job lists were read with float(): junk raised a bare ValueError that named no command,
    and "nan", "inf" or non-ASCII digits were read as times."""
    import pytest
    from nodemedic.errors import CommandFailedError
    from nodemedic.orchestrators.slurm import SlurmViaSSM
    from nodemedic.providers.run_command import Documents

    def slurm(stdout: str) -> SlurmViaSSM:
        return SlurmViaSSM(RecordingRunner(stdout), "i-0ctl", 60, Documents("prod"))  # type: ignore[arg-type]

    good = slurm("now 1764200000\njob 7 gpu 1764190000 1764199000\njob 8 gpu 1764190001 -\n").running_jobs("gpu-1")
    assert [(j.job_id, j.started_at, j.marker, j.now) for j in good] == [
        ("7", 1764190000.0, 1764199000.0, 1764200000.0), ("8", 1764190001.0, None, 1764200000.0)]
    assert slurm("7|RUNNING|1764190000\n8|PENDING|\n").job_states(["7", "8"])["8"].started_at is None
    for stdout, call in [("now nan\n", "running_jobs"), ("now -\n", "running_jobs"),
                         ("now 1764200000\njob 7 gpu inf -\n", "running_jobs"),
                         ("now 1764200000\njob 7 gpu 1764190000 \u0661\u0662\n", "running_jobs"),
                         ("7|RUNNING|Unknown\n", "job_states")]:
        with pytest.raises(CommandFailedError, match="no epoch time|without the controller's clock"):
            getattr(slurm(stdout), call)(*(["gpu-1"] if call == "running_jobs" else [["7"]]))
