"""One sweep: take the heartbeats queued since the last one, update the roster, and publish a
``HEARTBEAT_MISSING`` health event (source ``nodemedic.sweeper``) for each node gone silent,
so silence starts the same state machine as any other fault."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from nodemedic.contracts.events import HEALTH_DETAIL_TYPE, SWEEPER_SOURCE, NodeHeartbeat
from nodemedic.domain.silence import missing_event, record, silent
from nodemedic.providers.base import Provider
from nodemedic.store.roster import RosterStore

GONE = {"shutting-down", "terminated", "stopping", "stopped"}
MAX_RECEIVES = 200  # 2,000 heartbeats per sweep; the rest wait for the next sweep


@dataclass
class SweepResult:
    heartbeats: int = 0
    invalid: int = 0
    watched: int = 0
    reported: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)


class SilenceSweeper:
    def __init__(self, *, sqs: Any, events: Any, roster: RosterStore, provider: Provider,
                 queue_url: str, bus: str, cluster: str, threshold_s: float) -> None:
        self.sqs = sqs
        self.events = events
        self.roster = roster
        self.provider = provider
        self.queue_url = queue_url
        self.bus = bus
        self.cluster = cluster
        self.threshold_s = threshold_s

    def _receive(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        for _ in range(MAX_RECEIVES):
            batch = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                                             WaitTimeSeconds=0).get("Messages", [])
            messages.extend(batch)
            if len(batch) < 10:
                break
        return messages

    def sweep(self, now: datetime) -> SweepResult:
        result = SweepResult()
        messages = self._receive()
        roster, version = self.roster.load()
        for m in messages:
            try:
                beat = NodeHeartbeat.model_validate(json.loads(m["Body"])["detail"])
            except (ValueError, KeyError, TypeError, ValidationError):
                result.invalid += 1
                continue
            if beat.cluster == self.cluster:
                record(roster, beat)
                result.heartbeats += 1
        for instance in silent(roster, now, self.threshold_s):
            member = self.provider.member(instance)
            if member is None or member.state in GONE:  # replaced, scaled in or stopped: not a fault
                roster.pop(instance)
                result.forgotten.append(instance)
                continue
            event = missing_event(roster, instance, self.cluster, now)
            self.events.put_events(Entries=[{
                "Source": SWEEPER_SOURCE, "DetailType": HEALTH_DETAIL_TYPE, "EventBusName": self.bus,
                "Detail": event.model_dump_json(exclude_none=True)}])
            roster[instance]["reported_at"] = now.isoformat()
            result.reported.append(instance)
        self.roster.save(roster, version)
        for i in range(0, len(messages), 10):  # only once the roster holds them
            chunk = messages[i:i + 10]
            self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=[
                {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(chunk)])
        result.watched = len(roster)
        return result
