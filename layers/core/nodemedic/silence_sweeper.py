"""One sweep: take the heartbeats queued since the last one, update the roster, and publish a
``HEARTBEAT_MISSING`` health event (source ``nodemedic.sweeper``) for each node gone silent,
so silence starts the same state machine as any other fault; and a ``FAIL_SLOW`` one for each
node that became persistently slower than its peers (:mod:`nodemedic.domain.fail_slow`). A node
counts as reported only once EventBridge took its event: one it refused is sent again by the next
sweep.

Silence is judged only up to the heartbeats read. A sweep that reads the queue dry judges it as of
its own start; one that leaves a backlog (the sweeper was down or throttled, or a burst came) judges
it as of the last sweep that read the queue dry, since a node's latest heartbeat may be among those
still unread. Else every node whose heartbeats waited in the backlog read as silent: a fleet of
false HEARTBEAT_MISSING incidents that trips the breaker and stops every real repair. The queue is
read by long polling: a short poll asks only some of SQS's servers, and may answer empty while
heartbeats wait on the others."""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from nodemedic.bus import put_health_events
from nodemedic.contracts.events import EARLIEST, LATEST, SWEEPER_SOURCE, NodeHealthEvent, NodeHeartbeat
from nodemedic.contracts.problems import read_json
from nodemedic.domain.fail_slow import slow_event, slow_nodes
from nodemedic.domain.silence import Roster, missing_event, provider_busy, record, silent
from nodemedic.providers.base import Member, Provider
from nodemedic.store.roster import RosterHead, RosterStore

GONE = {"shutting-down", "terminated", "stopping", "stopped"}
# 10,000 nodes beating every 15 s queue 40,000 heartbeats a minute: one receive loop (10 per call)
# cannot drain that in the 10 s between sweeps. Several loops receive at once, each until the
# queue answers empty or the sweep's receive budget is spent (the rest wait for the next sweep).
RECEIVERS = 8
RECEIVE_BUDGET_S = 6.0
# "Long polling ... eliminat[es] false empty responses (when messages are available but aren't
# included in a response)"; a short poll "queries only a subset of the servers (based on a weighted
# random distribution)" (Amazon SQS Developer Guide, "Amazon SQS short and long polling",
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-short-and-long-polling.html).
# An empty answer of a long poll is what tells a sweep that it read every heartbeat; 1 s is the least.
RECEIVE_WAIT_S = 1
# A sweep holds the roster's lease until it saves (or gives it back when it fails), and at most
# until its invocation ends: the handler passes that end (Lambda's remaining time), so a sweep that
# runs long still keeps the next one out, and one Lambda stopped keeps it out no longer than it ran.
# A fixed 30 s lapsed under a sweep slowed by throttled calls (the function runs up to 75 s): the
# next sweep then read the heartbeats the first had not saved yet and judged their nodes silent.
# Without an end given (a sweep outside Lambda), this long, more than the function's timeout.
SWEEP_LEASE = timedelta(seconds=90)
# Lambda hosts' clocks agree to within milliseconds; the lease is kept this much past the end
CLOCK_MARGIN = timedelta(seconds=1)
# From this many silent nodes in one sweep on, the provider lists the cluster once (a few calls
# per 100 instances) rather than answer for each (two calls each on Auto Scaling)
LIST_MEMBERS_FROM = 10


@dataclass
class SweepResult:
    heartbeats: int = 0
    invalid: int = 0
    watched: int = 0
    reported: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)  # silent while their provider works on them (not reported)
    slow: list[str] = field(default_factory=list)
    unpublished: list[str] = field(default_factory=list)  # "<instance> <fault>: why EventBridge did not take it"
    # when silence was judged as of: the sweep's start if it read the queue dry, else the last sweep
    # that did (None: no sweep has yet, and no silence was judged)
    judged_as_of: datetime | None = None
    backlog: bool = False  # the receive budget ran out with heartbeats still queued


class SilenceSweeper:
    def __init__(self, *, sqs: Any, events: Any, roster: RosterStore, provider: Provider,
                 queue_url: str, bus: str, cluster: str, threshold_s: float, slow_below: float = 0.10,
                 slow_samples: int = 8) -> None:
        self.sqs = sqs
        self.events = events
        self.roster = roster
        self.provider = provider
        self.queue_url = queue_url
        self.bus = bus
        self.cluster = cluster
        self.threshold_s = threshold_s
        self.slow_below = slow_below
        self.slow_samples = slow_samples

    def _receive(self) -> tuple[list[dict[str, Any]], bool]:
        """The heartbeats queued, and whether the queue was read dry (else the budget ran out)."""
        deadline = time.monotonic() + RECEIVE_BUDGET_S

        def loop(_: int) -> tuple[list[dict[str, Any]], bool]:
            got: list[dict[str, Any]] = []
            while time.monotonic() < deadline:
                batch = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                                                 WaitTimeSeconds=RECEIVE_WAIT_S,
                                                 MessageSystemAttributeNames=["SentTimestamp"]).get("Messages", [])
                if not batch:
                    return got, True
                got.extend(batch)
            return got, False
        with ThreadPoolExecutor(RECEIVERS) as pool:
            parts = list(pool.map(loop, range(RECEIVERS)))
        return [m for got, _ in parts for m in got], any(dry for _, dry in parts)

    def _delete(self, messages: list[dict[str, Any]]) -> None:
        def delete(chunk: list[dict[str, Any]]) -> None:
            self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=[
                {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(chunk)])
        with ThreadPoolExecutor(RECEIVERS) as pool:
            list(pool.map(delete, [messages[i:i + 10] for i in range(0, len(messages), 10)]))

    def sweep(self, now: datetime, ends: datetime | None = None) -> SweepResult:
        """One sweep as of ``now`` (its start), in an invocation that ``ends`` then (the lease is
        held that long at most). Raises RosterConflictError, having changed nothing, while another
        sweep is under way or if one saved the roster meanwhile."""
        lease = self.roster.claim(now, max(ends - now, timedelta(0)) + CLOCK_MARGIN if ends else SWEEP_LEASE)
        try:
            return self._sweep(now)
        except BaseException:
            with contextlib.suppress(ClientError, BotoCoreError):  # else it ends by itself with the invocation
                self.roster.release(lease)
            raise

    def _sweep(self, now: datetime) -> SweepResult:
        result = SweepResult()
        messages, dry = self._receive()
        roster, head = self.roster.load()
        result.backlog = not dry
        result.judged_as_of = now if dry else head.read_until
        for m in messages:
            try:
                envelope = read_json(m["Body"])
                beat = NodeHeartbeat.model_validate(envelope["detail"])
            except (ValueError, KeyError, TypeError, ValidationError):
                result.invalid += 1
                continue
            if beat.cluster == self.cluster:
                record(roster, beat, _arrived_at(m, envelope, now))
                result.heartbeats += 1
        missing: list[tuple[str, NodeHealthEvent]] = []
        judged = silent(roster, result.judged_as_of, self.threshold_s) if result.judged_as_of else []
        members = self._members(judged)
        for instance in judged:
            member = members.get(instance)
            if member is None or member.state in GONE:  # replaced, scaled in or stopped: not a fault
                roster.pop(instance)
                result.forgotten.append(instance)
                continue
            if member.state == "pending" and provider_busy(roster[instance], now):  # its provider is starting,
                result.busy.append(instance)  # updating or checking it: silence is expected, and counts from now on
                continue
            try:
                missing.append((instance, missing_event(roster, instance, self.cluster, now)))
            except ValidationError:  # an entry no health event can be made of: dropped and counted, the sweep goes on
                roster.pop(instance)
                result.invalid += 1
        reports = ([(instance, event, "reported_at", result.reported) for instance, event in missing]
                   + [(instance, event, "slow_reported_at", result.slow) for instance, event in self._newly_slow(roster, now)])
        errors = put_health_events(self.events, self.bus, SWEEPER_SOURCE, [event for _, event, _, _ in reports])
        for (instance, event, mark, reported), error in zip(reports, errors, strict=True):
            if error:  # left unmarked: the next sweep sends it again
                result.unpublished.append(f"{instance} {event.fault_code}: {error}")
                continue
            roster[instance][mark] = now.isoformat()
            reported.append(instance)
        self.roster.save(roster, RosterHead(head.version, result.judged_as_of))
        self._delete(messages)  # only once the roster holds them
        result.watched = len(roster)
        return result

    def _members(self, instances: list[str]) -> dict[str, Member | None]:
        """What the provider says of each silent instance: one call each for a few, else the whole
        cluster in one listing (a rack or a switch lost: hundreds silent at once took two Auto
        Scaling and EC2 calls each, throttled, and the failed sweep reported none of them)."""
        if len(instances) < LIST_MEMBERS_FROM:
            return {instance: self.provider.member(instance) for instance in instances}
        listed = {m.instance_id: m for m in self.provider.members()}
        return {instance: listed.get(instance) for instance in instances}

    def _newly_slow(self, roster: Roster, now: datetime) -> list[tuple[str, NodeHealthEvent]]:
        """The nodes to report slow: each once per slow spell; one that is no longer slow is re-armed."""
        slow = {s.instance_id: s for s in slow_nodes(roster, below=self.slow_below, samples=self.slow_samples)}
        report = []
        for instance, entry in roster.items():
            if instance not in slow:
                entry.pop("slow_reported_at", None)
            elif not entry.get("slow_reported_at"):
                report.append((instance, slow_event(roster, slow[instance], self.cluster, now)))
        return report


def _arrived_at(message: dict[str, Any], envelope: dict[str, Any], now: datetime) -> datetime:
    """When the heartbeat reached AWS, by AWS's clocks, never earlier than it did: the earliest of
    the end of the event's ``time`` second, SQS's ``SentTimestamp`` (epoch ms, when the queue took
    it from EventBridge) and ``now``.
    EventBridge writes ``time`` to the whole second ("2017-12-22T18:43:48Z" in its examples,
    https://docs.aws.amazon.com/eventbridge/latest/ref/overview-event-structure.html; the local
    EventBridge truncates), so the event reached it before the end of that second. Dated by the
    second's start, a heartbeat looked up to a second older than it was, and its node was reported
    silent before the threshold (CI saw 4.45 s against 4.5 s).
    The event's time still wins for an event EventBridge delivered late (it retries a target for up
    to 24 h) or replayed from an archive (a replay keeps each event's time): dated by when the queue
    took it, a dead node's heartbeat replayed an hour later made it alive again, and a goodbye
    replayed stopped the watch of a node that had started again."""
    times = [now]
    try:
        times.append(datetime.fromtimestamp(int(message["Attributes"]["SentTimestamp"]) / 1000, UTC))
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        pass
    try:
        taken = datetime.fromisoformat(str(envelope["time"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return min(times)
    # A sender's PutEvents may give any time. One outside the years a health event may carry is
    # not used: at 1970 the node's HEARTBEAT_MISSING could not be built, and the sweep failed on
    # it, and every sweep after it while the message came back; at year 9999 the second's end is no date.
    if taken.tzinfo and EARLIEST <= taken < LATEST:
        times.append((taken.replace(microsecond=0) + timedelta(seconds=1)).astimezone(UTC))
    return min(times)
