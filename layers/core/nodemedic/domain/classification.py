"""Fault classification: fault code -> (fault class, action, ladder), from data.

An ``XID n`` takes its action from NVIDIA's Xid catalog (``xid_catalog.csv``): the code's
resolution bucket, mapped to NodeMedic's action and ladder in ``fault_table.json``
(``xid_buckets``). Every other code, and the few Xids where NodeMedic deviates from its bucket
(each saying why), is a rule in ``fault_table.json``. An operator overrides single codes with a
JSON object ``{"XID 74": "monitor", ...}`` (template parameter ``FaultActionOverrides``). A code
in neither is ``unknown``: recorded and counted, never acted on. The node agent imports the same
table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, cast, get_args

from nodemedic.contracts.incident import Action, Confidence, Rung, default_ladder
from nodemedic.contracts.problems import read_json
from nodemedic.domain.xid import catalog


@dataclass(frozen=True)
class Classification:
    fault_code: str
    fault_class: str
    action: Action
    note: str
    overridden: bool = False
    confidence: Confidence = "high"
    ladder: tuple[Rung, ...] = ()

    @property
    def reason(self) -> str:
        origin = "operator override" if self.overridden else "fault table"
        return f"{self.fault_code} ({self.fault_class}) -> {self.action} [{origin}]: {self.note}"


@lru_cache(maxsize=1)
def fault_table() -> dict[str, Any]:
    text = resources.files("nodemedic.domain").joinpath("fault_table.json").read_text()
    return cast(dict[str, Any], json.loads(text))


UNREPAIRED: frozenset[str] = frozenset({"monitor", "retire"})  # no ladder: nothing is repaired


def parse_overrides(raw: str) -> dict[str, Action]:
    """Parse an operator's override JSON; a bad one is an error, never silently ignored."""
    try:
        data = read_json(raw or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"fault action overrides are not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("fault action overrides must be a JSON object of code -> action")
    # burn_in: a joined node's, never a fault's; retire: capacity AWS ends (exempt from the
    # breaker), never a fault's
    allowed = tuple(a for a in get_args(Action) if a not in ("burn_in", "retire"))
    for code, action in data.items():
        if action not in allowed:
            raise ValueError(f"override for {code!r}: action {action!r} is not one of {allowed}")
    return cast(dict[str, Action], data)


XID_CODE = re.compile(r"^XID (\d{1,5})$")


def _rule(fault_code: str) -> dict[str, Any]:
    """The fault table's rule for a code, else its Xid catalog bucket's, else the default."""
    table = fault_table()
    rule = next((r for r in table["rules"] if r["code"] == fault_code), None)
    if rule is not None:
        return cast(dict[str, Any], rule)
    m = XID_CODE.match(fault_code)
    entry = catalog().get(int(m.group(1))) if m else None
    if entry is None:
        return cast(dict[str, Any], table["default"])
    bucket = table["xid_buckets"][entry.immediate]
    return {**bucket, "note": f"{entry.mnemonic} ({entry.description}), NVIDIA bucket "
                              f"{entry.immediate or 'none'}: {bucket['note']}"}


def classify(fault_code: str, overrides: dict[str, Action] | None = None) -> Classification:
    rule = _rule(fault_code)
    action = cast(Action, rule["action"])
    overridden = bool(overrides) and fault_code in (overrides or {})
    if overridden:
        action = (overrides or {})[fault_code]
    own_ladder = rule.get("ladder") and not overridden and action not in UNREPAIRED
    ladder = tuple(rule["ladder"]) if own_ladder else ladder_for("" if overridden else rule["fault_class"], action)
    return Classification(fault_code, rule["fault_class"], action, rule["note"], overridden,
                          cast(Confidence, rule.get("confidence", "high")), ladder)


def ladder_for(fault_class: str, action: Action) -> tuple[Rung, ...]:
    """The escalation ladder of a fault: per class if the table has one, else per action (an
    operator's override of the action picks the action's ladder: pass no class)."""
    if action in UNREPAIRED:
        return ()
    ladders = fault_table()["ladders"]
    rungs = ladders["by_class"].get(fault_class) or ladders["by_action"].get(action)
    return tuple(rungs) if rungs else default_ladder(action)


def hyperpod_fault_code(repair_action: str, recommendation: str) -> str:
    """The fault code of an unhealthy verdict of HyperPod's health monitoring agent: HyperPod
    recovers the node itself when its ``RepairAction`` names a repair (the cluster's NodeRecovery
    is Automatic), which NodeMedic only records; otherwise the agent's advice, a reboot where it
    says so, else a replacement."""
    if repair_action.strip().lower() not in ("", "none"):
        return "HYPERPOD_SELF_REPAIR"
    return "HYPERPOD_REBOOT" if "reboot" in recommendation.lower() else "HYPERPOD_REPLACE"


def alarm_fault_code(metric_name: str | None) -> str:
    """The fault code of a CloudWatch alarm on ``metric_name`` (``ALARM`` when not in the table)."""
    return str(fault_table()["alarm_metrics"].get(metric_name or "", "ALARM"))
