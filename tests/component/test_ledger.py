"""The ledger against DynamoDB in the embedded AWS."""

import threading
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import boto3
import pytest
from botocore.exceptions import ClientError
from nodemedic.contracts.incident import Incident
from nodemedic.store.ledger import Ledger
from nodemedic_sandbox.deploy import create_table_as_declared
from nodemedic_sandbox.embedded_aws import EmbeddedAWS


@pytest.fixture
def ledger():
    with EmbeddedAWS() as aws:
        db = aws.client("dynamodb")
        yield Ledger(db, create_table_as_declared(db, "incidents"))


def incident(incident_id: str, instance: str = "i-0123456789abcdef0") -> Incident:
    now = datetime.now(UTC)
    return Incident(incident_id=incident_id, cluster="c", instance_id=instance, slurm_node="gpu-1",
                    fault_code="XID 79", fault_class="gpu_lost", action="replace", source="test",
                    observed_at=now, status="open", detected_at=now, reason="test")


def test_racing_events_for_one_node_open_exactly_one_incident(ledger: Ledger) -> None:
    results: list[str | None] = []

    def detect(event: str) -> None:  # as Detect does: a loser is folded into the winner, counted
        results.append(existing := ledger.open_incident(incident(event)))
        if existing:
            ledger.count_duplicate(existing, event)

    threads = [threading.Thread(target=detect, args=(f"inc-{i}",)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r is None]
    assert len(winners) == 1
    [opened] = ledger.list_incidents()
    assert set(results) - {None} == {opened.incident_id}
    assert opened.duplicate_events == 19


def test_a_closed_incident_frees_the_node_and_a_failed_one_does_not(ledger: Ledger) -> None:
    first = incident("inc-1")
    assert ledger.open_incident(first) is None
    ledger.close(first, datetime.now(UTC))
    assert ledger.open_incident(incident("inc-2")) is None  # the node is free again
    # inc-2 is never closed (as after a failure): later events join it
    assert ledger.open_incident(incident("inc-3")) == "inc-2"


def test_a_replacement_instance_or_a_spare_is_claimed_by_one_incident(ledger: Ledger) -> None:
    assert ledger.claim("replacement", "i-0aaaaaaaaaaaaaaaa", "inc-1")
    assert ledger.claim("replacement", "i-0aaaaaaaaaaaaaaaa", "inc-1"), "claiming again is idempotent"
    assert not ledger.claim("replacement", "i-0aaaaaaaaaaaaaaaa", "inc-2")
    assert ledger.claim("spare", "gpu-9", "inc-1") and not ledger.claim("spare", "gpu-9", "inc-2")
    ledger.release("spare", "gpu-9")  # the node rejoined the pool: the next incident may take it
    assert ledger.claim("spare", "gpu-9", "inc-2")


def test_a_waiting_check_stays_until_answered(ledger: Ledger) -> None:
    ledger.save_check("cmd-1", "inc-1", "token-1", {"instance_id": "i-1", "level": "full"})
    assert ledger.waiting_check("cmd-1") == ("inc-1", "token-1", {"instance_id": "i-1", "level": "full"})
    assert ledger.waiting_check("cmd-1") is not None  # still there until answered: a failed answer is retried
    ledger.forget_check("cmd-1")
    assert ledger.waiting_check("cmd-1") is None  # a later status event for the command answers nothing


def test_a_retried_detect_finds_its_own_incident_opened(ledger: Ledger) -> None:
    """Step Functions retries Detect after a timeout; the earlier attempt may have opened the incident."""
    assert ledger.open_incident(incident("a")) is None
    assert ledger.open_incident(incident("a")) is None  # the same execution: still ours, not a duplicate
    assert ledger.open_incident(incident("b")) == "a"  # another event for the node: deduplicated


def test_a_folded_event_is_counted_once_even_when_detect_is_retried(ledger: Ledger) -> None:
    assert ledger.open_incident(incident("first")) is None
    for execution in ("dup-1", "dup-2", "dup-1"):  # dup-1's Detect ran twice (a timeout retry)
        assert ledger.open_incident(incident(execution)) == "first"
        ledger.count_duplicate("first", execution)
    assert ledger.get("first").duplicate_events == 2


def test_an_incident_that_folds_events_for_days_stays_within_dynamodbs_item_size(ledger: Ledger, monkeypatch) -> None:
    """Every folded event's id was added to the incident's item, past the cap too: an incident
    held for days grew until DynamoDB refused the item (400 KB) and Detect failed on every event
    for the node. The local stack refuses an item over 400 KB as AWS does."""
    monkeypatch.setattr("nodemedic.store.ledger.MAX_FOLDED_IDS", 3)
    assert ledger.open_incident(incident("held")) is None
    long_ids = [f"exec-{n:04d}-" + "x" * 70 for n in range(6)]  # execution names of 80 characters
    for execution in (*long_ids, long_ids[0]):  # the last: a retried Detect, under the cap
        ledger.count_duplicate("held", execution)
    item = ledger._db.get_item(TableName="incidents", Key={"pk": {"S": "INCIDENT#held"}})["Item"]
    assert len(item["folded"]["SS"]) == 3  # kept up to the cap, then no more
    assert ledger.get("held").duplicate_events == 6  # every event counted, the retry once


def test_held_incidents_release_their_node_locks_on_request(ledger: Ledger) -> None:
    held = incident("held-1")
    assert ledger.open_incident(held) is None
    ledger.end(held, "held", datetime.now(UTC), "breaker: open", release_node=False)
    assert ledger.open_incident(incident("later")) == "held-1"  # folded while held
    other = incident("open-1", "i-0bbbbbbbbbbbbbbbb")  # an open incident's lock stays
    assert ledger.open_incident(other) is None
    scans: list[str] = []
    ledger._db.meta.events.register("provide-client-params.dynamodb.Scan", lambda **kw: scans.append("scan"))
    assert [i.incident_id for i in ledger.release_held(held.cluster)] == ["held-1"]
    assert scans == []  # the operator's reset reads the cluster's locks, not every incident kept
    assert ledger.open_incident(incident("after-reset")) is None
    assert ledger.active_incident_id("c", "i-0bbbbbbbbbbbbbbbb") == "open-1"


def test_a_notice_older_than_one_seen_is_refused_and_the_same_version_again_is_not(ledger: Ledger) -> None:
    keep = datetime(2026, 12, 31, tzinfo=UTC)
    upcoming, closed = datetime(2026, 11, 22, 3, tzinfo=UTC), datetime(2026, 11, 22, 3, 0, 0, 1, tzinfo=UTC)
    assert ledger.newest_notice("arn:notice", upcoming, keep)
    assert ledger.newest_notice("arn:notice", upcoming, keep), "a redelivery (or a retried invocation) goes on"
    assert ledger.newest_notice("arn:notice", closed, keep)
    assert not ledger.newest_notice("arn:notice", upcoming, keep), "delivered after the update one microsecond later"
    assert ledger.newest_notice("arn:other", upcoming, keep), "each notice has its own versions"


@pytest.mark.parametrize(("code", "approve"), [("TaskTimedOut", True), ("TaskDoesNotExist", False),
                                               ("InvalidToken", True)])
def test_an_answer_after_the_approval_wait_ended_is_refused_and_recorded_as_late(ledger: Ledger, code: str,
                                                                                 approve: bool) -> None:
    """The wait's timeout (or the execution's end) comes as the operator answers: Step Functions
    refuses the token with one of its documented errors. The operator is told, and the ledger
    does not say approved."""
    from botocore.stub import Stubber
    from nodemedic import operations

    waiting = incident("inc-1")
    ledger.open_incident(waiting)
    ledger.start_stage(waiting, "approval", datetime.now(UTC))
    ledger.record_progress(waiting, "approval", {"task_token": "token-1"})
    # Step Functions' answer at that moment, through botocore's own stubber (checked against the API model)
    sfn = boto3.client("stepfunctions", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(sfn) as stub:
        stub.add_client_error("send_task_success" if approve else "send_task_failure", code,
                              "Task Timed Out: 'Provided task does not exist anymore'")
        with pytest.raises(operations.OperatorError, match=r"^too late: .*gpu-1 stays drained"):
            operations.answer_approval(ledger, sfn, "inc-1", approve=approve, by="oncall", reason="go ahead")
    approval = ledger.get("inc-1").stages["approval"]
    assert approval.completed_at and approval.result["decision"] == "timed out"
    assert approval.result["late_answer"]["decision"] == ("approved" if approve else "denied")


def _waiting_for_approval(ledger: Ledger) -> Any:
    """An incident whose approval stage waits on ``token-1``, and a Step Functions client whose
    answers the test gives through botocore's stubber."""
    waiting = incident("inc-1")
    ledger.open_incident(waiting)
    ledger.start_stage(waiting, "approval", datetime.now(UTC))
    ledger.record_progress(waiting, "approval", {"task_token": "token-1"})
    return boto3.client("stepfunctions", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")


def test_of_two_operators_answering_at_once_the_first_is_told_and_the_second_refused(ledger: Ledger) -> None:
    """Alice approves and Bob denies the same page at the same moment: Bob's answer is recorded and
    sent between Alice's read and her write. Alice's answer overwrote Bob's in the ledger, her
    SendTaskSuccess was refused (the token already answered) and recorded as "timed out": the
    ledger named neither answer, and Alice was told the node stays drained. Now her write finds
    Bob's answer there: she is told his, and nothing of hers is sent or recorded."""
    from botocore.stub import Stubber
    from nodemedic import operations

    sfn = _waiting_for_approval(ledger)
    read = ledger.get

    def bob_answers_meanwhile(incident_id: str) -> Incident:
        found = read(incident_id)
        if not raced:
            raced.append(incident_id)
            operations.answer_approval(ledger, sfn, incident_id, approve=False, by="bob", reason="RMA requested")
        return found

    raced: list[str] = []
    with Stubber(sfn) as stub, mock.patch.object(ledger, "get", bob_answers_meanwhile):
        stub.add_response("send_task_failure", {}, {"taskToken": "token-1", "error": "ApprovalDenied",
                                                    "cause": "denied by bob: RMA requested"})
        with pytest.raises(operations.OperatorError, match=r"answered meanwhile: denied by bob \(RMA requested\)"):
            operations.answer_approval(ledger, sfn, "inc-1", approve=True, by="alice", reason="go ahead")
        stub.assert_no_pending_responses()  # Bob's denial sent; no SendTaskSuccess at all
    approval = ledger.get("inc-1").stages["approval"]
    assert (approval.result["decision"], approval.result["by"], approval.completed_at) == ("denied", "bob", None)


def test_an_answer_step_functions_could_not_take_is_taken_back_and_can_be_given_again(ledger: Ledger) -> None:
    """SendTaskSuccess throttled: the answer stayed recorded, the execution was never told, and the
    operator's second try was refused ("waits for no approval") until the wait timed out and the
    incident ended denied. Now the answer is taken back with the error, and the second try goes."""
    from botocore.stub import Stubber
    from nodemedic import operations

    sfn = _waiting_for_approval(ledger)
    with Stubber(sfn) as stub:
        stub.add_client_error("send_task_success", "ThrottlingException", "Rate exceeded")
        stub.add_response("send_task_success", {})
        with pytest.raises(ClientError, match="Rate exceeded"):
            operations.answer_approval(ledger, sfn, "inc-1", approve=True, by="oncall", reason="go ahead")
        approval = ledger.get("inc-1").stages["approval"]
        assert "decision" not in approval.result and approval.completed_at is None
        operations.answer_approval(ledger, sfn, "inc-1", approve=True, by="oncall", reason="go ahead")
        stub.assert_no_pending_responses()
    approval = ledger.get("inc-1").stages["approval"]
    assert approval.result["decision"] == "approved" and approval.completed_at is not None


@pytest.mark.parametrize("status", ["quarantined", "escalated", "retired"])
def test_an_ended_incidents_lock_is_released_for_an_operators_act_an_open_ones_never(ledger: Ledger,
                                                                                      status: str) -> None:
    ended, running = incident("inc-ended"), incident("inc-open", instance="i-0123456789abcdef1")
    assert ledger.open_incident(ended) is None and ledger.open_incident(running) is None
    ledger.end(ended, status, datetime.now(UTC), status, release_node=False)  # type: ignore[arg-type]
    assert ledger.release_ended("c", "i-0123456789abcdef1") is None
    assert ledger.active_incident_id("c", "i-0123456789abcdef1") == "inc-open"
    assert ledger.release_ended("c", "i-0123456789abcdef0") == "inc-ended"
    assert ledger.active_incident_id("c", "i-0123456789abcdef0") is None
    assert ledger.release_ended("c", "i-0123456789abcdef0") is None  # nothing left to release


def test_releasing_an_ended_incident_after_a_replace_frees_the_replaced_instance_too(ledger: Ledger) -> None:
    """A quarantine after a replace holds two locks: the replaced (terminated) instance's and its
    replacement's. The operator's act names the node, which the replacement backs now; the
    replaced instance's lock goes too, since nothing else would ever release it."""
    from nodemedic.contracts.incident import IncidentRef

    old, new = "i-0123456789abcdef0", "i-0123456789abcdef9"
    ended = incident("inc-replaced", instance=old)
    assert ledger.open_incident(ended) is None
    ref = IncidentRef(**{name: getattr(ended, name) for name in IncidentRef.model_fields})
    now = datetime.now(UTC)
    ledger.start_stage(ref, "repair", now)
    ledger.record_progress(ref, "repair", {"rungs": [{"rung": "replace", "instance_id": new}]})
    assert ledger.lock(ref, new)
    ledger.end(ref, "quarantined", now, "failed its check after every rung", release_node=False)
    assert ledger.release_ended("c", new) == "inc-replaced"
    assert ledger.active_incident_id("c", new) is None and ledger.active_incident_id("c", old) is None


def test_the_incident_an_event_opened_stays_its_taker_whatever_later_deliveries_are_decided(ledger: Ledger) -> None:
    """A planned notice opens incident A; a later delivery of it (a sweep that finds it again) is
    folded into B, another incident of the node, or refused as stale. Detect's memory still names
    A: overwritten with B, a B held for a cooldown made the notice look never acted on, and it was
    offered again (the node rebooted twice for one maintenance)."""
    now = datetime.now(UTC)
    key = "nodemedic.planned/ev-1"
    assert ledger.event_handled_by(key) is None
    ledger.acknowledge_event(key, "deduplicated", "inc-0", now)  # before it opened one: any decision is kept
    assert ledger.event_handled_by(key) == "inc-0"
    ledger.acknowledge_event(key, "remediate", "inc-A", now)
    ledger.acknowledge_event(key, "deduplicated", "inc-B", now)
    ledger.acknowledge_event(key, "rejected", None, now)
    assert ledger.event_handled_by(key) == "inc-A"


def test_faults_folded_at_once_are_all_noted_once_each_and_only_on_an_open_incident(ledger: Ledger) -> None:
    """Each of 12 faults folded into one incident at the same moment (threads): the first 8
    distinct codes are noted, none twice, none lost to another's write; none on a held incident."""
    from datetime import timedelta

    from nodemedic.contracts.incident import FOLDED_KEPT, FoldedFault

    now = datetime.now(UTC)
    assert ledger.open_incident(incident("inc-1")) is None
    faults = [FoldedFault(fault_code=f"XID {c}", fault_class="gpu_lost", action="replace",
                          observed_at=now + timedelta(seconds=c)) for c in range(12)]
    threads = [threading.Thread(target=ledger.note_folded, args=("inc-1", f)) for f in [*faults[:4], *faults]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    noted = ledger.get("inc-1").folded_faults
    assert len(noted) == FOLDED_KEPT and len({f.fault_code for f in noted}) == FOLDED_KEPT
    assert {f.fault_code for f in faults[:4]} <= {f.fault_code for f in noted}  # noted twice over, kept once
    assert [f.observed_at for f in noted] == sorted(f.observed_at for f in noted)
    ledger.end(incident("inc-1"), "held", now, "breaker", release_node=False)
    assert ledger.open_incident(incident("inc-2", instance="i-0123456789abcdef1")) is None
    ledger.end(incident("inc-2"), "held", now, "breaker", release_node=False)
    assert not ledger.note_folded("inc-2", faults[0]) and ledger.get("inc-2").folded_faults == []


def test_every_incident_is_listed_once_across_the_parallel_scans_with_the_count_heard_as_it_reads(
        ledger: Ledger) -> None:
    for n in range(150):
        assert ledger.open_incident(incident(f"inc-{n}", instance=f"i-{n:017x}")) is None
    heard: list[int] = []
    listed = ledger.list_incidents(heard.append)
    assert sorted(i.incident_id for i in listed) == sorted(f"inc-{n}" for n in range(150))
    assert heard == sorted(heard) and heard[-1] == 150
