"""Silence sweeper: started every minute by a schedule; sweeps the heartbeat roster
``SILENCE_SWEEPS_PER_INVOCATION`` times, evenly spaced over that minute (6 = every 10 s)."""

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.settings import settings
from nodemedic.silence_sweeper import SilenceSweeper
from nodemedic.store.roster import RosterConflictError, RosterStore

logger = Logger(service="silence_sweeper")


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    s = settings()
    sweeper = SilenceSweeper(
        sqs=wiring.client("sqs"), events=wiring.client("events"),
        roster=RosterStore(wiring.client("dynamodb"), s.incidents_table, s.cluster_name),
        provider=wiring.provider(), queue_url=s.heartbeat_queue_url, bus=s.event_bus_name,
        cluster=s.cluster_name, threshold_s=s.heartbeat_silence_seconds, slow_below=s.fail_slow_percent / 100,
        slow_samples=s.fail_slow_samples)
    interval = 60.0 / s.silence_sweeps_per_invocation
    start = time.monotonic()
    ends = datetime.now(UTC) + timedelta(milliseconds=context.get_remaining_time_in_millis())  # Lambda stops it then
    summary: dict[str, Any] = {"sweeps": 0, "reported": [], "forgotten": [], "slow": []}
    for n in range(s.silence_sweeps_per_invocation):
        if n:
            time.sleep(max(0.0, start + n * interval - time.monotonic()))
        try:
            result = sweeper.sweep(datetime.now(UTC), ends)
        except RosterConflictError as exc:  # another sweep under way, or saved meanwhile: it has the heartbeats
            logger.warning("sweep skipped", reason=str(exc))
            continue
        summary["sweeps"] += 1
        summary["reported"] += result.reported
        summary["forgotten"] += result.forgotten
        summary["slow"] += result.slow
        if result.slow:
            logger.warning("slow nodes reported (FAIL_SLOW)", instances=result.slow)
        summary["watched"] = result.watched
        if result.reported:
            logger.warning("silent nodes reported", instances=result.reported, threshold_s=s.heartbeat_silence_seconds)
        if result.unpublished:
            summary.setdefault("unpublished", []).extend(result.unpublished)
            logger.error("health events EventBridge did not take; the next sweep sends them again",
                         events=result.unpublished)
        if result.backlog:
            summary["backlog_sweeps"] = summary.get("backlog_sweeps", 0) + 1
            logger.warning("heartbeats left unread in the queue: silence judged as of the last sweep that read them all",
                           judged_as_of=result.judged_as_of.isoformat() if result.judged_as_of else None)
        if result.forgotten or result.invalid:
            logger.info("roster changes", forgotten=result.forgotten, invalid_heartbeats=result.invalid)
        if result.busy:
            summary["busy"] = sorted(set(summary.get("busy", [])) | set(result.busy))
            logger.info("silent nodes their provider is working on (not reported)", instances=result.busy)
    return summary
