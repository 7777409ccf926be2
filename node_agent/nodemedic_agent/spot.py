"""EC2's notice that it interrupts this Spot Instance, and its recommendation to rebalance it,
read from instance metadata.

EC2 writes ``spot/instance-action`` (``{"action": "terminate"|"stop"|"hibernate", "time":
"2017-09-18T08:22:00Z"}``) two minutes before it acts; until then the path answers 404. AWS
recommends reading it every 5 seconds.
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html

The pipeline hears of the same interruption from EventBridge (``EC2 Spot Instance Interruption
Warning``, NodeMedic's planned-events intake); this is the node's own reading of it, sent as a
Node Health Event with the same fault code and evidence, so that a delivery lost or late on one
side leaves the other. Detect folds the second into the incident the first opened.

EC2 writes ``events/recommendations/rebalance`` (``{"noticeTime": "2020-11-05T08:22:00Z"}``) when
the instance's risk of interruption rises; until then the path answers 404 (EC2 User Guide, "EC2
instance rebalance recommendations"). The agent sends each one it reads once to NodeMedic's bus
(the planned-events function asks the node's jobs to checkpoint, as for EventBridge's ``EC2
Instance Rebalance Recommendation``).
"""

from __future__ import annotations

import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from nodemedic.contracts.problems import read_json

from nodemedic_agent.checks.base import Finding

INSTANCE_ACTION = "spot/instance-action"
REBALANCE = "events/recommendations/rebalance"
LIFE_CYCLE = "instance-life-cycle"  # "spot" or "on-demand"
ACTIONS = frozenset({"terminate", "stop", "hibernate"})
FAULT_CODE = "PLANNED_SPOT_INTERRUPTION"
# a notice whose time passed longer ago than this is from before the instance's last start (EC2
# started a stopped or hibernated Spot Instance again): this run is not interrupted
LATE = timedelta(minutes=2)


@dataclass(frozen=True)
class SpotNotice:
    action: str
    time: datetime


def is_spot(get: Callable[[str], str]) -> bool:
    """Whether this instance is a Spot Instance (IMDS ``instance-life-cycle``)."""
    return get(LIFE_CYCLE).strip() == "spot"


def read_notice(get: Callable[[str], str]) -> SpotNotice | None:
    """The interruption notice, or None while there is none (IMDS answers 404). ``get`` reads one
    metadata path. A notice that is not what EC2 documents is a ``ValueError``."""
    text = _answer(get, INSTANCE_ACTION)
    if text is None:
        return None
    try:
        data = read_json(text)
        action, at = data["action"], _aware(data["time"])
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{INSTANCE_ACTION} is not EC2's notice: {text[:200]!r}") from exc
    if action not in ACTIONS:
        raise ValueError(f"{INSTANCE_ACTION} is not EC2's notice: {text[:200]!r}")
    return SpotNotice(action, at)


def notice_finding(notice: SpotNotice, now: datetime) -> Finding | None:
    """The finding the notice makes, stamped ``now`` (AWS's time); None for a notice from before
    the instance's last start."""
    if now - notice.time > LATE:
        return None
    deadline = notice.time.isoformat()
    return Finding(check="spot_interruption", fault_code=FAULT_CODE, status="failed",
                   summary=f"EC2 will {notice.action} this Spot Instance at {deadline}",
                   evidence={"instance_action": notice.action, "deadline": deadline, "read_from": "instance metadata"},
                   observed_at=now, once=f"{notice.action}@{deadline}")


def read_rebalance(get: Callable[[str], str]) -> datetime | None:
    """EC2's ``noticeTime`` of the rebalance recommendation, or None while there is none (IMDS
    answers 404). An answer that is not what EC2 documents is a ``ValueError``."""
    text = _answer(get, REBALANCE)
    if text is None:
        return None
    try:
        return _aware(read_json(text)["noticeTime"])
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{REBALANCE} is not EC2's recommendation: {text[:200]!r}") from exc


def _aware(value: object) -> datetime:
    """A time as EC2 writes it in metadata (ISO 8601, ``Z``); ``ValueError`` without its zone."""
    at = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if at.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    return at


def _answer(get: Callable[[str], str], path: str) -> str | None:
    """What instance metadata holds at ``path``; None while EC2 wrote nothing there (404)."""
    try:
        return get(path)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
