"""The running agent: watchers and checks feed findings through dedupe into the publisher.

Threads: the NVML XID event wait, the kernel log follower, the polled checks, the heartbeat and
the sender. Any error inside a watcher becomes a check-error finding and the watcher carries on
after a pause; the agent never crash-loops on a bad counter. A reading that never returns (a
driver call that hangs) is seen by the heartbeat's thread and reported as CHECK_STALLED.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, TextIO

import boto3
from botocore.config import Config
from nodemedic.contracts.events import NodeHealthEvent, NodeIdentity, PerfSample
from nodemedic.contracts.problems import read_json
from nodemedic.contracts.scheduled_notice import ScheduledEvent, ScheduledEventsNotice
from nodemedic.contracts.spot_interruption import RebalanceNotice

from nodemedic_agent.acknowledgements import Acknowledgements
from nodemedic_agent.burn_in import joined
from nodemedic_agent.checks.base import CheckResult, Finding, check_error
from nodemedic_agent.checks.kernel_log import KernelLogFollower, bus_key, message_finding, xid_finding
from nodemedic_agent.checks.polled import AFTER_BOOT, PolledChecks, reading
from nodemedic_agent.clock import AwsClock, ClockUnknownError
from nodemedic_agent.config import AgentConfig
from nodemedic_agent.dedupe import Deduper
from nodemedic_agent.events import entry, health_event, heartbeat, sent_now
from nodemedic_agent.hardware.base import GpuState, Hardware, HardwareError
from nodemedic_agent.identity import imds
from nodemedic_agent.publisher import Publisher
from nodemedic_agent.scheduled_events import read_scheduled
from nodemedic_agent.spool import Spool
from nodemedic_agent.spot import is_spot, notice_finding, read_notice, read_rebalance

log = logging.getLogger("nodemedic_agent")
SPOT_RETRY_S = 300.0  # instance metadata unreachable: when to ask again whether this is a Spot Instance
MAX_REASSERT_WAIT_S = 900.0  # with acknowledgements: the longest wait between two looks at an undecided event
UNDATED_KEPT = 1000  # distinct findings kept while no time can be put on them (see Agent.emit)


def events_client(config: AgentConfig, *, aws_access_key_id: str | None = None,
                  aws_secret_access_key: str | None = None) -> Any:
    """PutEvents client; botocore's own retries are off, the spool and backoff do that job. The
    credentials are the instance role's unless given (the local mode signs as that role)."""
    from nodemedic_agent.identity import resolve_region

    cfg = Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=5)
    return boto3.client("events", region_name=resolve_region(config), endpoint_url=config.publish.endpoint_url,
                        config=cfg, aws_access_key_id=aws_access_key_id, aws_secret_access_key=aws_secret_access_key)


def acknowledgements(config: AgentConfig, *, aws_access_key_id: str | None = None,
                     aws_secret_access_key: str | None = None) -> Acknowledgements | None:
    """Where the agent reads the pipeline's decisions on its events; None without
    ``publish.acknowledgements_table`` (events are then sent again a fixed number of times)."""
    from nodemedic_agent.identity import resolve_region

    if not config.publish.acknowledgements_table:
        return None
    cfg = Config(retries={"total_max_attempts": 2}, connect_timeout=2, read_timeout=5)
    client = boto3.client("dynamodb", region_name=resolve_region(config),
                          endpoint_url=config.publish.dynamodb_endpoint_url, config=cfg,
                          aws_access_key_id=aws_access_key_id, aws_secret_access_key=aws_secret_access_key)
    return Acknowledgements(client, config.publish.acknowledgements_table)


@dataclass(frozen=True)
class _Pending:
    """A health event to send again unless the pipeline has decided on it by ``due``."""

    due: float  # time.monotonic()
    sends: int  # sent again so far
    first_sent: float  # time.monotonic() of the first send (a restart keeps the age): a step of the
    # node's clock (NTP correcting an RTC after a reboot) neither ends nor stretches the window
    event: NodeHealthEvent


def _age(saved: dict[str, Any]) -> float:
    """How long ago a saved event was first sent: its ``age_s``, or from the wall-clock
    ``first_sent`` an earlier version saved. Time the agent was down does not count."""
    if "age_s" in saved:
        return max(0.0, float(saved["age_s"]))
    return max(0.0, time.time() - float(saved["first_sent"]))


class Agent:
    def __init__(self, config: AgentConfig, hardware: Hardware, node: NodeIdentity, client: Any,
                 dry_run: bool = False, out: TextIO = sys.stdout,
                 clock: Callable[[], float] | None = None, acks: Acknowledgements | None = None,
                 aws_clock: AwsClock | None = None, metadata: Callable[[str], str] = imds) -> None:
        self.config = config
        self.metadata = metadata  # one instance metadata path (IMDSv2): the Spot interruption notice
        self._spot: bool | None = None  # a Spot Instance: not known until metadata answers
        self._rebalance_sent: datetime | None = None  # the noticeTime of the rebalance recommendation last sent
        self.rebalance_notices = 0
        self._scheduled_sent: list[ScheduledEvent] = []  # the scheduled events last sent
        self._scheduled_sent_at = 0.0  # and when (time.monotonic)
        self.scheduled_notices = 0
        self.aws_clock = aws_clock or AwsClock()  # AWS's time, learned from every answer: signing and stamps
        self.client = self.aws_clock.attach(client)
        self.hw = hardware
        self.node = node
        self.dry_run = dry_run
        self.out = out
        self.spool = Spool(config.publish.spool_dir, config.publish.spool_max_events)
        self.dedupe = Deduper(config.intervals.dedupe_window_seconds, clock or time.time,
                              state_file=None if dry_run else self.spool.dir / "dedupe.json")
        self.publisher = Publisher(client, self.spool, config.publish.max_backoff_seconds, sending=self._sending)
        self.checks = PolledChecks(hardware, config)
        source = config.kernel_log.source
        self.kernel_log = KernelLogFollower(source, config.kernel_log.path, threading.Event(),
                                            cursor_file=None if dry_run else self.spool.dir / f"{source}-cursor.json",
                                            replay_seconds=config.kernel_log.replay_seconds)
        self.stop_event = self.kernel_log.stop
        self.published = 0
        self.lost = 0  # events neither spooled nor sent (spool unwritable while the bus was down)
        # findings this node's clock could not date (it reads 1970) before any AWS answer gave AWS's
        # time, by dedupe key, each as first seen: sent once one does. A polled check finds its
        # fault at every poll, so keeping only the first of each keeps a one-off among them
        self._undated: dict[str, Finding] = {}
        self._undated_lock = threading.Lock()
        self.heartbeats = 0
        self.acks = acks
        if acks is not None:
            self.aws_clock.attach(acks.client)
        self.reasserted = 0
        self.acknowledged = 0  # events the pipeline decided on while they waited to be sent again
        self.unacknowledged = 0  # events given up on: no decision within intervals.reassert_within_seconds
        self._reassert_lock = threading.Lock()
        self._reassert_file = None if dry_run else self.spool.dir / "reassert.json"
        self._reasserts = self._load_reasserts()
        self._gpu_by_bus: dict[str, int] = {}
        self._threads: list[threading.Thread] = []
        self._print_lock = threading.Lock()

    # -- findings -> events -------------------------------------------------------------
    @cached_property
    def software(self) -> dict[str, str]:
        """The node's GPU driver and kernel versions, read once: a new driver or kernel takes a
        reboot, and with it a new start of the agent. None read is no reason to lose a fault."""
        try:
            return self.hw.software()
        except (OSError, HardwareError) as exc:
            log.warning("the node's driver and kernel versions are not sent with its events: %s", exc)
            return {}

    def emit(self, finding: Finding) -> bool:
        """Publish ``finding`` unless it repeats within the dedupe window. True if published. One
        that cannot be dated yet is kept, and published with the first that can."""
        try:
            now = self._stamp()  # before the dedupe: a finding that cannot be dated is not counted as sent
        except ClockUnknownError as exc:
            with self._undated_lock:
                if len(self._undated) < UNDATED_KEPT:
                    self._undated.setdefault(finding.key, finding)
            log.warning("%s kept until AWS answers: %s", finding.fault_code, exc)
            return False
        self.emit_undated()
        return self._emit_dated(finding, now)

    def emit_undated(self) -> int:
        """Publish the findings kept while the clock could not date them, now that it can. How many."""
        if not self._undated:
            return 0
        with self._undated_lock:
            kept, self._undated = list(self._undated.values()), {}
        return sum(self._emit_dated(finding, self._stamp()) for finding in kept)

    def _emit_dated(self, finding: Finding, now: datetime) -> bool:
        count = self.dedupe.admit(finding.key)
        if count is None:
            return False
        finding = replace(finding, observed_at=self.aws_clock.stamped(finding.observed_at))
        event = health_event(finding, self.config.cluster, self.node, count, now, self.software)
        self._send(entry(self.config.event_bus, event), event.event_id)
        if not self.dry_run:
            self._schedule_reassert(_Pending(time.monotonic(), 0, time.monotonic(), event))
        self.published += 1
        return True

    def _send(self, item: dict[str, Any], event_id: str) -> None:
        """To the bus (through the spool), or in a dry run on ``out``."""
        if self.dry_run:
            self._print_entry(item)
        else:
            self._publish(item, event_id)

    def _print_entry(self, item: dict[str, Any]) -> None:
        """A dry run's entry, on ``out`` instead of the bus: one JSON line."""
        with self._print_lock:
            print(json.dumps({"Source": item["Source"], "DetailType": item["DetailType"],
                              "Detail": json.loads(item["Detail"])}), file=self.out, flush=True)

    # -- re-asserting: the same event again, so a delivery the pipeline dropped is not lost --
    def _schedule_reassert(self, last: _Pending) -> None:
        """Look at ``last.event`` again ``reassert_seconds * 2**sends`` from now (without an
        acknowledgements table, only ``reasserts`` times; with one, at most 15 minutes)."""
        intervals = self.config.intervals
        if intervals.reassert_seconds <= 0 or (self.acks is None and last.sends >= intervals.reasserts):
            return
        wait = intervals.reassert_seconds * 2 ** last.sends
        if self.acks is not None:  # looked at until decided: at least every 15 minutes
            wait = min(wait, max(intervals.reassert_seconds, MAX_REASSERT_WAIT_S))
        due = time.monotonic() + wait
        with self._reassert_lock:
            self._reasserts.append(_Pending(due, last.sends, last.first_sent, last.event))
            self._save_reasserts()

    def _reassert(self) -> None:
        """Send each event that is due again, unless the pipeline has decided on it (read from the
        acknowledgements table, when there is one) or, with the table, it was first sent more than
        ``reassert_within_seconds`` ago. The pipeline remembers each event it decided on: a second
        send of one changes nothing; one it never saw (Detect throttled, failed, the event
        dropped) opens the incident then."""
        now = time.monotonic()
        with self._reassert_lock:
            due = [r for r in self._reasserts if r.due <= now]
            self._reasserts = [r for r in self._reasserts if r.due > now]
        window = self.config.intervals.reassert_within_seconds
        for pending in due:
            event = pending.event
            decision = self.acks.decision(event.event_id) if self.acks else None
            if decision is not None:
                self.acknowledged += 1
                log.info("event %s (%s): the pipeline decided %s", event.event_id, event.fault_code, decision)
                continue
            if self.acks is not None and now - pending.first_sent > window:
                self.unacknowledged += 1
                log.warning("event %s (%s) sent %d time(s) and the pipeline has not decided on it within %g s: "
                            "not sent again", event.event_id, event.fault_code, pending.sends + 1, window)
                continue
            again = event.model_copy(update={"sent_at": self._stamp()})  # the same event, sent now
            self._publish(entry(self.config.event_bus, again), again.event_id)
            self.reasserted += 1
            self._schedule_reassert(_Pending(now, pending.sends + 1, pending.first_sent, event))
        if due:
            with self._reassert_lock:
                self._save_reasserts()
        self.stop_event.wait(min(1.0, self.config.intervals.reassert_seconds or 1.0))

    def _load_reasserts(self) -> list[_Pending]:
        """The events a previous run of the agent was still to send again: looked at again one
        ``reassert_seconds`` from now (the dedupe memory keeps a still-present condition from being
        reported anew, so without this an event the pipeline never saw would be lost)."""
        if self._reassert_file is None or not self._reassert_file.exists():
            return []
        now = time.monotonic()
        soon = now + self.config.intervals.reassert_seconds
        try:
            saved = read_json(self._reassert_file.read_text())
            return [_Pending(soon, int(p["sends"]), now - _age(p), NodeHealthEvent.model_validate(p["event"]))
                    for p in saved]
        except (OSError, ValueError, TypeError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
            log.error("the events to send again were not read (%s): %s is ignored", exc, self._reassert_file)
            return []

    def _save_reasserts(self) -> None:
        """Write the events still to send again (under ``_reassert_lock``); a failed write is
        logged, never raised: detection goes on."""
        if self._reassert_file is None:
            return
        now = time.monotonic()
        saved = [{"sends": p.sends, "age_s": round(now - p.first_sent, 3),
                  "event": p.event.model_dump(mode="json", exclude_none=True)} for p in self._reasserts]
        tmp = self._reassert_file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(saved))
            os.replace(tmp, self._reassert_file)
        except OSError as exc:
            log.error("the events to send again were not saved (%s): a restart would not send them", exc)

    def _publish(self, item: dict[str, Any], event_id: str) -> None:
        """Spool, then send. A spool that cannot be written (disk full) must not stop detection:
        the event is sent directly instead, and only lost if the bus is unreachable too."""
        try:
            self.publisher.submit(item, event_id)
        except OSError as exc:
            if self.publisher.send_direct([item]):
                log.error("spool unwritable (%s); event %s sent directly", exc, event_id)
            else:
                self.lost += 1
                log.error("spool unwritable (%s) and the bus unreachable (%s): event %s lost",
                          exc, self.publisher.last_error, event_id)

    def gpu_index(self, pci: str) -> int | None:
        return self._gpu_by_bus.get(bus_key(pci))

    def _map_gpus(self, gpus: list[GpuState]) -> None:
        """PCI bus -> GPU index, so kernel-log lines (which name the bus) get the GPU's index."""
        self._gpu_by_bus = {bus_key(g.pci_bus_id): g.index for g in gpus if g.pci_bus_id}

    def publish_join(self) -> bool:
        """Publish ``NODE_JOINED`` for the burn-in hold this boot left (once: the marker goes once the
        event is spooled). True when one was published."""
        marker = Path(self.config.burn_in.marker)
        finding = joined(marker)
        if finding is None:
            return False
        published = self.emit(finding)
        if not self.dry_run:
            marker.unlink(missing_ok=True)
        return published

    def poll_once(self) -> list[CheckResult]:
        self.publish_join()
        results = self.checks.run_all()
        if self.checks.gpus:  # what the GPU check read (kept from its last success); no second NVML pass
            self._map_gpus(self.checks.gpus)
        try:
            booting = self.hw.uptime() < self.config.thresholds.boot_settle_seconds
        except (HardwareError, OSError, ValueError):  # the boot's age unknown: nothing held back
            booting = False
        for result in results:
            for finding in result.findings:
                if booting and finding.fault_code in AFTER_BOOT:
                    continue  # links still training after the boot: read again next poll
                self.emit(finding)
        return results

    # -- loops ----------------------------------------------------------------------------
    def _guarded(self, name: str, check: str | None, body: Callable[[], None]) -> Callable[[], None]:
        """Run ``body`` until stopped; an exception is logged, reported as a check error (when
        ``check`` is given) and the loop starts again after a pause."""
        def loop() -> None:
            while not self.stop_event.is_set():
                try:
                    body()
                except Exception as exc:  # noqa: BLE001 - a watcher must never take the agent down
                    log.exception("%s failed; retrying", name)
                    try:
                        for finding in check_error(check, name, exc).findings if check else []:
                            self.emit(finding)
                    except Exception:  # noqa: BLE001 - reporting the error failed too: keep looping
                        log.exception("could not report the failure of %s", name)
                    self.stop_event.wait(min(30.0, self.config.intervals.poll_seconds))
        return loop

    def _xid_watch(self) -> None:
        with self.checks.watchdog.watching("the NVML Xid event wait", "nvml"):
            xids = self.hw.wait_xid(1.0)
        for xid in xids:
            self.emit(xid_finding(xid.xid, xid.pci_bus_id, xid.gpu_index, xid.observed_at, {"source": "nvml_event"},
                                  "nvml", self.config.fault_overrides))

    def _follow_kernel_log(self) -> None:
        """Each kernel log message to its finding. A message whose handling fails is skipped and
        counted: raised out of the loop, it would be read again from the cursor at the loop's
        restart, and fail again, and hold back every message after it."""
        for message, observed in self.kernel_log.messages():
            try:
                finding = message_finding(message, observed, self.gpu_index, self.config.fault_overrides)
                if finding:
                    self.emit(finding)
            except Exception:  # noqa: BLE001 - one message must not stop the log
                self.kernel_log.stats.failed += 1
                log.exception("kernel log: skipped a message that could not be handled: %.300r", message)

    def _spot_watch(self) -> None:
        """On a Spot Instance, EC2's interruption notice, read every ``intervals.spot_seconds``."""
        if self._spot is None:
            try:
                self._spot = is_spot(self.metadata)
            except OSError as exc:  # not on EC2, or metadata unreachable for now: ask again later
                log.info("instance metadata unreachable (%s): Spot interruption notices not read for now", exc)
                self.stop_event.wait(SPOT_RETRY_S)
                return
            log.info("%s", "a Spot Instance: reading its interruption notice" if self._spot
                     else "not a Spot Instance: no interruption notice to read")
        if not self._spot:
            self.stop_event.wait()
            return
        notice = read_notice(self.metadata)
        if notice is not None:
            try:
                now = self._stamp()
            except ClockUnknownError:  # emit() keeps it until AWS's time is known
                now = notice.time
            finding = notice_finding(notice, now)
            if finding is not None:
                self.emit(finding)
        self._rebalance_watch()
        self.stop_event.wait(self.config.intervals.spot_seconds)

    def _rebalance_watch(self) -> None:
        """EC2's rebalance recommendation, sent once per ``noticeTime`` (an answer that is not
        EC2's is logged, and read again at the next look)."""
        try:
            at = read_rebalance(self.metadata)
        except ValueError as exc:
            log.warning("rebalance recommendation not read: %s", exc)
            return
        if at is None or at == self._rebalance_sent:
            return
        item = entry(self.config.event_bus, RebalanceNotice(schema_version="1", cluster=self.config.cluster,
                                                            node=self.node, notice_time=at))
        log.info("EC2 recommends rebalancing this Spot Instance (noticed at %s)", at.isoformat())
        self._send(item, f"rebalance-{at:%Y%m%dT%H%M%SZ}")
        self._rebalance_sent = at
        self.rebalance_notices += 1

    def _scheduled_watch(self) -> None:
        """EC2's scheduled events for this instance, read every ``intervals.scheduled_events_seconds``
        and sent when they differ from what was last sent (after a start, when there are any: the
        pipeline deduplicates), and again every ``intervals.scheduled_events_resend_seconds`` while
        one is active: the agent cannot see whether the planned-events function took a notice (a
        failed delivery waits in its dead-letter queue until someone redrives it). Not on EC2, or an
        answer that is not EC2's: logged, read again later."""
        try:
            events = read_scheduled(self.metadata)
        except OSError as exc:
            log.info("instance metadata unreachable (%s): scheduled events not read for now", exc)
        except ValueError as exc:
            log.warning("scheduled events not read: %s", exc)
        else:
            resend = self.config.intervals.scheduled_events_resend_seconds
            due = resend and time.monotonic() - self._scheduled_sent_at >= resend
            if events != self._scheduled_sent or (due and any(e.state == "active" for e in events)):
                self.send_scheduled(events)
        self.stop_event.wait(self.config.intervals.scheduled_events_seconds)

    def send_scheduled(self, events: list[ScheduledEvent]) -> None:
        item = entry(self.config.event_bus, ScheduledEventsNotice(schema_version="1", cluster=self.config.cluster,
                                                                 node=self.node, events=events))
        log.info("EC2 scheduled events of this instance: %s", ", ".join(f"{e.code} {e.event_id} ({e.state}, not before "
                                                                         f"{e.not_before.isoformat()})" for e in events))
        self._send(item, "scheduled-events")
        self._scheduled_sent, self._scheduled_sent_at = events, time.monotonic()
        self.scheduled_notices += 1

    def _poll(self) -> None:
        self.poll_once()
        self.stop_event.wait(self.config.intervals.poll_seconds)

    def perf(self) -> PerfSample | None:
        """The node's speed from the last GPU poll: its slowest GPU's SM clock against that GPU's
        maximum, and how busy the GPUs are (the sweeper compares it with the node's peers)."""
        if any(s.what == reading("gpu") for s in self.checks.stalls()):
            return None  # the last reading is from before the GPUs stopped answering: not the node's speed now
        clocked = [(g.sm_clock_ratio, g.index) for g in self.checks.gpus if g.sm_clock_ratio is not None]
        if not clocked:
            return None
        ratio, slowest = min(clocked)
        busy = sum(g.utilization_pct for g in self.checks.gpus) / len(self.checks.gpus)
        return PerfSample(sm_clock_ratio=round(min(ratio, 2.0), 4), utilization_pct=round(min(busy, 100.0), 1),
                          slowest_gpu=slowest, instance_type=self.config.node.instance_type or "")

    def _sending(self, item: dict[str, Any]) -> dict[str, Any]:
        """A spooled entry as it leaves now (:func:`~nodemedic_agent.events.sent_now`)."""
        try:
            return sent_now(item, self._stamp())
        except ClockUnknownError:  # nothing dates this send: the stamp it was spooled with stays
            return item

    def _stamp(self) -> datetime:
        """Now, as an event sent now carries it. A node clock that cannot date anything (1970)
        and no AWS answer seen yet: one call, whatever it answers, gives AWS's time."""
        try:
            return self.aws_clock.stamp()
        except ClockUnknownError:
            try:
                self.client.describe_event_bus(Name=self.config.event_bus)
            except Exception:  # noqa: BLE001 - a refusal carries AWS's time too; none at all: unknown still
                log.warning("could not reach AWS to learn its time", exc_info=True)
            return self.aws_clock.stamp()

    def send_heartbeat(self, status: str = "running") -> bool:
        beat = heartbeat(self.config.cluster, self.node, self.config.intervals.heartbeat_seconds, status,
                         self.perf(), now=self._stamp())
        if self.dry_run:
            return True
        ok = self.publisher.send_direct([entry(self.config.event_bus, beat)])
        self.heartbeats += ok
        return ok

    def report_stalls(self) -> int:
        """CHECK_STALLED for each reading that has run longer than ``thresholds.check_stall_seconds``
        (the heartbeat's thread asks: the stalled loop cannot). Returns how many."""
        stalls = self.checks.stalls()
        for stall in stalls:
            log.error("%s has not returned for %.0fs", stall.what, stall.seconds)
            self.emit(self.checks.stalled(stall))
        return len(stalls)

    def _heartbeat(self) -> None:
        self.report_stalls()
        try:
            self.send_heartbeat()  # stamping it tries to learn AWS's time while that is unknown
        except ClockUnknownError as exc:  # AWS not reached yet: the next beat tries again
            log.warning("no heartbeat sent: %s", exc)
        else:
            self.emit_undated()
        self.publisher.wake()  # a successful heartbeat means the bus is back: retry the spool now
        self.stop_event.wait(self.config.intervals.heartbeat_seconds)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> Agent:
        """Start the loops. The heartbeat and the sender first: the GPUs are read once before the
        watchers start (the kernel log names a GPU by its PCI bus), and a driver that does not
        answer blocks that reading; the heartbeat's thread then reports it (CHECK_STALLED) instead
        of a node that says nothing at all."""
        self._start_loops([
            ("sender", self._guarded("sender", None, lambda: self.publisher.run(self.stop_event))),
            ("heartbeat", self._guarded("heartbeat", "heartbeat", self._heartbeat)),
            ("reassert", self._guarded("reassert", None, self._reassert)),
        ])
        try:
            with self.checks.watchdog.watching("the first GPU reading", "nvml"):
                self._map_gpus(self.hw.gpus())
        except HardwareError:
            pass
        loops: list[tuple[str, Callable[[], None]]] = [
            ("xid", self._guarded("xid watch", "nvml", self._xid_watch)),
            ("poll", self._guarded("polled checks", "nvml", self._poll)),
        ]
        if self.config.intervals.spot_seconds:
            loops.append(("spot", self._guarded("spot notice", None, self._spot_watch)))
        if self.config.intervals.scheduled_events_seconds:
            loops.append(("scheduled", self._guarded("scheduled events", None, self._scheduled_watch)))
        if self.config.kernel_log.source != "off":
            loops.append(("kernel-log", self._guarded("kernel log", "kernel_log", self._follow_kernel_log)))
        self._start_loops(loops)
        return self

    def _start_loops(self, loops: list[tuple[str, Callable[[], None]]]) -> None:
        for name, target in loops:
            thread = threading.Thread(target=target, name=f"nodemedic-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, graceful: bool = True, flush_timeout_s: float = 5.0) -> None:
        """Stop the loops. Graceful: say goodbye (the cloud stops watching this node) and try to
        empty the spool; what is left stays on disk for the next start."""
        self.stop_event.set()
        self.publisher.wake()
        deadline = time.monotonic() + 5
        for thread in list(self._threads):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if graceful and not self.dry_run:
            self.send_heartbeat("stopping")
            self.publisher.flush(flush_timeout_s)
        # a reading still running (a loop's, or the first GPU reading of an agent still starting) is
        # inside a call that never returned: closing NVML under it could block the stop too
        inside = [stall.what for stall in self.checks.watchdog.stalls(0)]
        if inside:
            log.warning("stopping with %s still inside a call that has not returned", ", ".join(inside))
        else:
            self.hw.close()
