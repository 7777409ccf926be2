"""The report handles any duration: days-long incidents, negative ones from a node clock that was
off before the origin was corrected, incidents whose node clock said 1970."""

from datetime import UTC, datetime, timedelta

import pytest
from nodemedic.contracts.incident import Incident, StageRecord
from nodemedic_cli import report

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)


def incident(n: int, observed: datetime, detected: datetime, closed: datetime) -> Incident:
    return Incident(incident_id=f"inc-{n}", cluster="c", instance_id="i-0123456789abcdef0", slurm_node="gpu-1",
                    fault_code="XID 79", fault_class="gpu_lost", action="replace", source="nodemedic.agent",
                    observed_at=observed, status="closed", detected_at=detected, reason="r", closed_at=closed,
                    stages={"detect": StageRecord(started_at=detected, completed_at=detected),
                            "resume": StageRecord(started_at=closed - timedelta(seconds=5), completed_at=closed)})


@pytest.mark.parametrize("incidents", [
    pytest.param([incident(1, NOW - timedelta(days=9), NOW - timedelta(days=9), NOW)], id="nine_days_long"),
    pytest.param([incident(2, NOW + timedelta(minutes=10), NOW, NOW + timedelta(seconds=60))], id="negative_mttd"),
    pytest.param([incident(3, datetime(1970, 1, 1, tzinfo=UTC), NOW, NOW + timedelta(seconds=60))], id="rtc_1970"),
])
def test_the_html_report_renders_any_duration(incidents: list[Incident]) -> None:
    built = report.build(incidents, since=NOW - timedelta(days=30))
    assert built.incidents == 1  # found by its detection time, whatever the node's clock said
    page = report.render_html(built, incidents, "t")
    assert "<svg" in page and "inc-" in page


def test_since_filters_on_the_servers_detection_time() -> None:
    old_clock = incident(1, datetime(1970, 1, 1, tzinfo=UTC), NOW, NOW + timedelta(seconds=9))
    long_ago = incident(2, NOW - timedelta(days=40), NOW - timedelta(days=40), NOW - timedelta(days=40))
    assert [i.incident_id for i in report.in_period([old_clock, long_ago], NOW - timedelta(days=7))] == ["inc-1"]


def test_the_training_time_the_incidents_cost_is_added_up_planned_and_unplanned_apart() -> None:
    def drained(n: int, fault_class: str, checkpoint: dict | None, downtime: float) -> Incident:
        i = incident(n, NOW - timedelta(minutes=5), NOW - timedelta(minutes=5), NOW)
        result = {"slurm_node": "gpu-1", "drained_by_pipeline": True, "requeued_jobs": ["7"], "jobs_not_requeued": [],
                  "checkpoint": checkpoint}
        return i.model_copy(update={"fault_class": fault_class, "stages": {
            **i.stages, "drain": StageRecord(started_at=NOW, completed_at=NOW, result=result),
            "jobs": StageRecord(started_at=NOW, completed_at=NOW, result={"job_downtime_s": downtime})}})

    saved = {"policy": "SIGUSR1", "jobs": [{"job_id": "7", "outcome": "checkpointed", "work_saved_s": 1800,
                                            "work_lost_s": 2}]}
    hard = {"policy": "requeued at once: XID 79 (gpu_lost) is a hard fault", "jobs": []}
    built = report.build([drained(1, "planned", saved, 40), drained(2, "planned", saved, 50),
                          drained(3, "gpu_lost", hard, 600), drained(4, "gpu_lost", None, 300)])
    by_kind = {t.kind: t for t in built.training_time}
    planned, unplanned = by_kind["planned"], by_kind["unplanned"]
    assert (planned.incidents, planned.jobs_requeued, planned.jobs_checkpointed) == (2, 2, 2)
    assert (planned.work_saved_s, planned.work_lost_s, planned.job_downtime_s) == (3600, 4, 90)
    assert (unplanned.incidents, unplanned.jobs_checkpointed, unplanned.job_downtime_s) == (2, 0, 900)
    page = report.render_html(built, [], "t")
    assert "Training time" in page and "<td>planned</td><td>2</td>" in page


@pytest.mark.parametrize("recorded", ["600", None, True, [600], {"s": 600}])
def test_a_job_downtime_that_is_no_number_is_left_out_not_a_crash(recorded: object) -> None:
    """The ledger is JSON that an operator or an older version may have written: the report reads
    only numbers from it, in the per-class figures as in the training time."""
    good = incident(1, NOW - timedelta(minutes=5), NOW - timedelta(minutes=5), NOW)
    good = good.model_copy(update={"stages": {**good.stages, "jobs": StageRecord(
        started_at=NOW, completed_at=NOW, result={"job_downtime_s": 120})}})
    odd = good.model_copy(update={"incident_id": "inc-2", "stages": {**good.stages, "jobs": StageRecord(
        started_at=NOW, completed_at=NOW, result={"job_downtime_s": recorded})}})
    built = report.build([good, odd])
    [by_class] = built.by_fault_class
    assert (by_class.incidents, by_class.job_downtime_s.n, by_class.job_downtime_s.p90) == (2, 1, 120)
    assert sum(t.job_downtime_s for t in built.training_time) == 120
