"""Fault classification: fault code -> (fault class, action), from a data table.

The table ships as ``fault_table.json`` (seeded from public XID guidance) and an operator
overrides single codes with a JSON object ``{"XID 74": "monitor", ...}`` (template parameter
``FaultActionOverrides``). The node agent imports the same table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, cast, get_args

from nodemedic.contracts.incident import Action, Confidence, Rung, default_ladder


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


def parse_overrides(raw: str) -> dict[str, Action]:
    """Parse an operator's override JSON; a bad one is an error, never silently ignored."""
    try:
        data = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"fault action overrides are not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("fault action overrides must be a JSON object of code -> action")
    allowed = get_args(Action)
    for code, action in data.items():
        if action not in allowed:
            raise ValueError(f"override for {code!r}: action {action!r} is not one of {allowed}")
    return cast(dict[str, Action], data)


def classify(fault_code: str, overrides: dict[str, Action] | None = None) -> Classification:
    table = fault_table()
    rule = next((r for r in table["rules"] if r["code"] == fault_code), table["default"])
    action = cast(Action, rule["action"])
    overridden = bool(overrides) and fault_code in (overrides or {})
    if overridden:
        action = (overrides or {})[fault_code]
    return Classification(fault_code, rule["fault_class"], action, rule["note"], overridden,
                          cast(Confidence, rule.get("confidence", "high")),
                          ladder_for("" if overridden else rule["fault_class"], action))


def ladder_for(fault_class: str, action: Action) -> tuple[Rung, ...]:
    """The escalation ladder of a fault: per class if the table has one, else per action (an
    operator's override of the action picks the action's ladder: pass no class)."""
    if action == "monitor":
        return ()
    ladders = fault_table()["ladders"]
    rungs = ladders["by_class"].get(fault_class) or ladders["by_action"].get(action)
    return tuple(rungs) if rungs else default_ladder(action)


def alarm_fault_code(metric_name: str | None) -> str:
    """The fault code of a CloudWatch alarm on ``metric_name`` (``ALARM`` when not in the table)."""
    return str(fault_table()["alarm_metrics"].get(metric_name or "", "ALARM"))
