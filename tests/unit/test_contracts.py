import json
from pathlib import Path

import pytest
from nodemedic.contracts.events import NodeHeartbeat
from nodemedic.contracts.schema import SCHEMAS, json_schema
from nodemedic.errors import InvalidEventError
from nodemedic.stages.detect import parse_trigger

EVENTS = Path(__file__).resolve().parents[2] / "events"
SAMPLES = sorted(p for p in EVENTS.rglob("*.json")
                 if p.parent.name not in ("schema", "heartbeats", "aws-health", "aws-ec2", "scheduled-events"))
# events/aws-health/, aws-ec2/ and scheduled-events/ are read by the planned-events function:
# tests/unit/test_planned_events.py


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_sample_event_parses(path: Path) -> None:
    trigger = parse_trigger(json.loads(path.read_text()))
    assert trigger.source in ("nodemedic.agent", "nodemedic.sweeper", "aws.cloudwatch", "aws.sagemaker", "nodemedic.operator")


def test_the_sample_heartbeat_parses_and_is_not_a_trigger() -> None:
    event = json.loads((EVENTS / "heartbeats/heartbeat.json").read_text())
    assert NodeHeartbeat.model_validate(event["detail"]).status == "running"
    with pytest.raises(InvalidEventError):
        parse_trigger(event)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_published_json_schema_matches_the_model(name: str) -> None:
    published = json.loads((EVENTS / "schema" / name).read_text())
    assert published == json_schema(name), "regenerate with: nodemedic schema --write"


def _sample() -> dict:
    return json.loads((EVENTS / "health/xid-79-gpu-fallen-off-bus.json").read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"schema_version": "2"}, "schema_version", id="unknown_version"),
        pytest.param({"fault_code": "xid79; rm -rf /"}, "fault_code", id="bad_fault_code"),
        pytest.param({"evidence": {"log": "x" * 5000}}, "evidence is", id="oversized_evidence"),
        pytest.param({"observed_at": "2026-11-22T04:14:07Z"}, "clock skew", id="observed_after_sent"),
        pytest.param({"observed_at": "2026-11-22T03:14:07"}, "observed_at", id="naive_timestamp"),
        pytest.param({"extra": 1}, "extra", id="unknown_field"),
        # what a fuzzer got through before: no coercion, plausible dates, bounded strings
        pytest.param({"observed_at": "0001-01-01T00:00:00Z", "sent_at": "0001-01-01T00:00:01Z"}, "plausible",
                     id="year_0001"),
        pytest.param({"observed_at": "2099-12-31T00:00:00Z", "sent_at": "2100-01-01T00:00:01Z"}, "plausible",
                     id="year_2100"),
        pytest.param({"observed_at": "1970-01-01T00:00:05Z", "sent_at": "1970-01-01T00:00:07Z"}, "plausible",
                     id="year_1970"),
        pytest.param({"count": "5"}, "count", id="count_as_string"),
        pytest.param({"count": True}, "count", id="count_as_bool"),
        pytest.param({"component": {"kind": "gpu", "index": True}}, "index", id="index_as_bool"),
        pytest.param({"observed_at": 1763781247}, "ISO 8601", id="epoch_number_as_date"),
        pytest.param({"fault_code": "XID" + "X" * 5000}, "fault_code", id="huge_fault_code"),
        pytest.param({"event_id": "x" * 65}, "event_id", id="long_event_id"),
        pytest.param({"event_id": "a b;c"}, "event_id", id="event_id_with_spaces"),
    ],
)
def test_a_bad_health_event_names_what_is_wrong(change: dict, message: str) -> None:
    event = _sample()
    event["detail"].update(change)
    with pytest.raises(InvalidEventError, match=message):
        parse_trigger(event)


def test_a_runbook_request_must_name_a_node() -> None:
    event = json.loads((EVENTS / "runbooks/replace-node.json").read_text())
    del event["detail"]["slurm_node"]
    with pytest.raises(InvalidEventError, match="names slurm_node or instance_id"):
        parse_trigger(event)


def test_a_runbook_reason_cannot_smuggle_shell() -> None:
    event = json.loads((EVENTS / "runbooks/replace-node.json").read_text())
    event["detail"]["reason"] = "ok'; scontrol delete"
    with pytest.raises(InvalidEventError, match="reason"):
        parse_trigger(event)


def test_no_mutation_of_a_valid_event_is_coerced_into_another_valid_one() -> None:
    """Property: a field replaced by a value of another JSON type is either refused or kept as it
    was sent (nothing is silently converted: "5" never becomes 5, true never becomes 1)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    json_values = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=False),
                            st.text(max_size=50), st.lists(st.integers(), max_size=3),
                            st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
    fields = ["schema_version", "event_id", "cluster", "check", "fault_code", "severity", "observed_at", "sent_at",
              "count", "component", "evidence", "node"]

    @settings(max_examples=400, deadline=None)
    @given(st.sampled_from(fields), json_values)
    def check(field: str, value: object) -> None:
        event = _sample()
        event["detail"][field] = value
        try:
            parsed = parse_trigger(event)
        except InvalidEventError:
            return
        got = parsed.detail.model_dump(mode="json")[field]
        assert got == value or (field in ("observed_at", "sent_at") and isinstance(value, str)), (field, value, got)

    check()


def test_recorded_rungs_that_are_not_rungs_are_skipped_not_a_crash():
    """A repair record written by another version (or by hand): the reconciler's lock release reads
    the incident's instances from it and must not fail on an entry that is no rung."""
    from datetime import UTC, datetime

    from nodemedic.contracts.incident import Incident, StageRecord

    now = datetime.now(UTC)
    repair = StageRecord(started_at=now, result={"rungs": ["junk", None, {"rung": "no such rung"},
                                                            {"rung": "replace", "instance_id": "i-0feed"}]})
    incident = Incident(incident_id="inc-1", cluster="c", instance_id="i-0123456789abcdef0", slurm_node="gpu-1",
                        fault_code="XID 79", fault_class="gpu_lost", action="replace", source="nodemedic.agent",
                        observed_at=now, status="open", detected_at=now, reason="r", stages={"repair": repair})
    assert incident.instances == ["i-0123456789abcdef0", "i-0feed"]
    assert [r.rung for r in incident.repair_rungs] == ["replace"]
    assert StageRecord(started_at=now, result={"rungs": "junk"}).repair_rungs == []


def test_an_incidents_claims_are_read_from_its_records():
    """What its end releases: the spare its spare stage took, the replacement each replace rung
    found; a stage that took none, or a record that is no claim, names nothing."""
    from datetime import UTC, datetime

    from nodemedic.contracts.incident import Claim, Incident, StageRecord

    now = datetime.now(UTC)

    def incident(**stages: StageRecord) -> Incident:
        return Incident(incident_id="inc-1", cluster="c", instance_id="i-0123456789abcdef0", slurm_node="gpu-1",
                        fault_code="XID 79", fault_class="gpu_lost", action="replace", source="nodemedic.agent",
                        observed_at=now, status="closed", detected_at=now, reason="r", stages=stages)

    old = "i-0123456789abcdef0"
    rungs = [{"rung": "reboot", "instance_id": old},
             {"rung": "replace", "instance_id": old, "progress": {"new_instance_id": "i-0feed"}},
             {"rung": "replace", "instance_id": old, "progress": "junk"},
             {"rung": "replace", "instance_id": old, "progress": {"requested_at": "x"}}]
    both = incident(spare=StageRecord(started_at=now, result={"spare": "gpu-5"}),
                    repair=StageRecord(started_at=now, result={"rungs": rungs}))
    assert both.claims == [Claim(kind="spare", key="gpu-5", incident_id="inc-1"),
                           Claim(kind="replacement", key="i-0feed", incident_id="inc-1")]
    assert incident(spare=StageRecord(started_at=now, result={"spare": None})).claims == []
    assert incident().claims == []
