"""One sweep: take the heartbeats queued since the last one, update the roster, and publish a
``HEARTBEAT_MISSING`` health event (source ``nodemedic.sweeper``) for each node gone silent,
so silence starts the same state machine as any other fault; and a ``FAIL_SLOW`` one for each
node that became persistently slower than its peers (:mod:`nodemedic.domain.fail_slow`). A node
counts as reported only once EventBridge took its event: one it refused is sent again by the next
sweep."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from nodemedic.bus import put_health_events
from nodemedic.contracts.events import SWEEPER_SOURCE, NodeHealthEvent, NodeHeartbeat
from nodemedic.contracts.problems import read_json
from nodemedic.domain.fail_slow import slow_event, slow_nodes
from nodemedic.domain.silence import Roster, missing_event, provider_busy, record, silent
from nodemedic.providers.base import Provider
from nodemedic.store.roster import RosterStore

GONE = {"shutting-down", "terminated", "stopping", "stopped"}
# 10,000 nodes beating every 15 s queue 40,000 heartbeats a minute: one receive loop (10 per call)
# cannot drain that in the 10 s between sweeps. Several loops receive at once, each until the
# queue answers empty or the sweep's receive budget is spent (the rest wait for the next sweep).
RECEIVERS = 8
RECEIVE_BUDGET_S = 6.0


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

    def _receive(self) -> list[dict[str, Any]]:
        deadline = time.monotonic() + RECEIVE_BUDGET_S

        def loop(_: int) -> list[dict[str, Any]]:
            got: list[dict[str, Any]] = []
            while time.monotonic() < deadline:
                batch = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                                                 WaitTimeSeconds=0,
                                                 MessageSystemAttributeNames=["SentTimestamp"]).get("Messages", [])
                if not batch:
                    break
                got.extend(batch)
            return got
        with ThreadPoolExecutor(RECEIVERS) as pool:
            return [m for part in pool.map(loop, range(RECEIVERS)) for m in part]

    def _delete(self, messages: list[dict[str, Any]]) -> None:
        def delete(chunk: list[dict[str, Any]]) -> None:
            self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=[
                {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(chunk)])
        with ThreadPoolExecutor(RECEIVERS) as pool:
            list(pool.map(delete, [messages[i:i + 10] for i in range(0, len(messages), 10)]))

    def sweep(self, now: datetime) -> SweepResult:
        result = SweepResult()
        messages = self._receive()
        roster, version = self.roster.load()
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
        for instance in silent(roster, now, self.threshold_s):
            member = self.provider.member(instance)
            if member is None or member.state in GONE:  # replaced, scaled in or stopped: not a fault
                roster.pop(instance)
                result.forgotten.append(instance)
                continue
            if member.state == "pending" and provider_busy(roster[instance], now):  # its provider is starting,
                result.busy.append(instance)  # updating or checking it: silence is expected, and counts from now on
                continue
            missing.append((instance, missing_event(roster, instance, self.cluster, now)))
        reports = ([(instance, event, "reported_at", result.reported) for instance, event in missing]
                   + [(instance, event, "slow_reported_at", result.slow) for instance, event in self._newly_slow(roster, now)])
        errors = put_health_events(self.events, self.bus, SWEEPER_SOURCE, [event for _, event, _, _ in reports])
        for (instance, event, mark, reported), error in zip(reports, errors, strict=True):
            if error:  # left unmarked: the next sweep sends it again
                result.unpublished.append(f"{instance} {event.fault_code}: {error}")
                continue
            roster[instance][mark] = now.isoformat()
            reported.append(instance)
        self.roster.save(roster, version)
        self._delete(messages)  # only once the roster holds them
        result.watched = len(roster)
        return result

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
    """When the heartbeat reached AWS, by AWS's clocks: SQS's ``SentTimestamp`` (epoch ms, when
    the queue took it from EventBridge), else the event's ``time`` (EventBridge's, to the second,
    when the sender gives none: the agent gives none), else ``now``; never later than ``now``."""
    try:
        return min(datetime.fromtimestamp(int(message["Attributes"]["SentTimestamp"]) / 1000, UTC), now)
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        pass
    try:
        taken = datetime.fromisoformat(str(envelope["time"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return now
    return min(taken, now) if taken.tzinfo else now
