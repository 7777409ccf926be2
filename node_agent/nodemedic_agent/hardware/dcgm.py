"""What DCGM's command line prints as JSON, read by its structure: ``dcgmi health -c -j`` (the
health watches) and ``dcgmi diag -r N -j`` (the diagnostics).

The shapes are DCGM's own (github.com/NVIDIA/DCGM, ``dcgmi/Health.cpp``, ``dcgmi/Diag.cpp``,
``dcgmi/DcgmiOutput.cpp``, ``testing/python3/dcgm_diag_schema.json``):

- health: ``{"header": ["Health Monitor Report"], "body": {"Overall Health": {"value": V},
  "<entity group>": {"children": {"<entity id>": {"value": V, "children": {"Errors": {"children":
  {"<system>": {"value": V, "overflow": [message parts]}}}}}}}}}``, where V is ``Healthy``,
  ``Warning``, ``Failure`` or ``Internal error``, and a long message is cut into parts of about 54
  characters.
- diag, DCGM 4: ``{"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [{"entity_group", "entity_id", "status", "warnings": [{"warning", "error_id"...}]}],
  "test_summary": {"status"}}]}], "runtime_error"?}}``; DCGM 3 names the root ``DCGM GPU
  Diagnostic`` and a result's entity ``gpu_id``. ``status`` is ``Pass``, ``Skip`` or ``Fail``:
  both print a result that only warned as ``Fail`` in JSON (``Warn`` is read too, should a version
  print it); a test not run has no result. With ``--iterations`` the runs are under ``iterations``.

DCGM's health *Warning* (PCIe replays, an InfoROM checksum, SBE rates) is not a failure: NVIDIA's
NVSentinel treats it as non-fatal too. Anything that is not one of these shapes is a ValueError:
never read as healthy.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from nodemedic.contracts.problems import read_json

# what dcgmi prints (on stdout) when nv-hostengine is not running (dcgmi/Command.cpp)
HOST_ENGINE_DOWN = re.compile(r"unable to establish a connection|connect to host engine", re.I)
HEALTH_VALUES = ("Healthy", "Warning", "Failure")
OVERALL = "Overall Health"
DIAG_ROOTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")  # DCGM 4, DCGM 3


@dataclass(frozen=True)
class HealthIncident:
    """One entity's system that is not healthy (``group`` GPU, NvSwitch...; no entity: the
    overall verdict alone)."""

    group: str
    entity: str
    system: str
    message: str

    def __str__(self) -> str:
        where = " ".join(p for p in (self.group, self.entity, self.system) if p)
        return f"{where}: {self.message}"


@dataclass(frozen=True)
class DcgmHealth:
    """The health watches' verdict: each entity's system that failed, and each that warned."""

    failures: list[HealthIncident] = field(default_factory=list)
    warnings: list[HealthIncident] = field(default_factory=list)

    @staticmethod
    def gpu(incidents: list[HealthIncident]) -> int | None:
        """The one GPU all ``incidents`` are about, if they are about one GPU."""
        entities = {(i.group, i.entity) for i in incidents}
        if len(entities) == 1 and (group_entity := entities.pop())[0] == "GPU" and group_entity[1].isdigit():
            return int(group_entity[1])
        return None


@dataclass(frozen=True)
class DiagReport:
    """What ``dcgmi diag`` found: tests that failed (with their entities and messages; an error
    that stopped it running is one, ``runtime error: ...``), tests that warned, and how many
    results were read."""

    failed: list[str] = field(default_factory=list)
    warned: list[str] = field(default_factory=list)
    results: int = 0


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object, found {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list, found {type(value).__name__}")
    return value


def _loads(text: str, what: str) -> dict[str, Any]:
    try:
        return _object(read_json(text), what)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} printed no JSON: {exc}") from exc


def _message(node: dict[str, Any]) -> str:
    parts = node.get("overflow") or []
    return " ".join(str(p).strip() for p in (parts if isinstance(parts, list) else [parts])).strip()


def parse_health(text: str) -> DcgmHealth:
    """``dcgmi health -c -j``'s report. ``Internal error`` anywhere, or an unknown shape, raises."""
    body = _object(_loads(text, "dcgmi health").get("body"), "dcgmi health: body")
    overall = _object(body.get(OVERALL), f"dcgmi health: {OVERALL}").get("value")
    if overall not in HEALTH_VALUES:
        raise ValueError(f"dcgmi health: overall health is {overall!r}")
    found: dict[str, list[HealthIncident]] = {"Failure": [], "Warning": []}
    for group, group_node in body.items():
        if group == OVERALL:
            continue
        for entity, entity_node in _object(_object(group_node, group).get("children", {}), group).items():
            entity_node = _object(entity_node, f"{group} {entity}")
            errors = _object(_object(entity_node.get("children", {}), f"{group} {entity}").get("Errors", {}),
                             f"{group} {entity} Errors").get("children", {})
            systems = _object(errors, f"{group} {entity} Errors")
            for system, system_node in systems.items():
                value = _object(system_node, f"{group} {entity} {system}").get("value")
                if value not in HEALTH_VALUES:
                    raise ValueError(f"dcgmi health: {group} {entity} {system} is {value!r}")
                if value != "Healthy":
                    found[value].append(HealthIncident(group, entity, system, _message(system_node) or value))
            value = entity_node.get("value")
            if value not in HEALTH_VALUES:
                raise ValueError(f"dcgmi health: {group} {entity} is {value!r}")
            if value != "Healthy" and not systems:
                found[value].append(HealthIncident(group, entity, "", value))
    if overall != "Healthy" and not found[overall]:  # the verdict without the entity that gave it
        found[overall].append(HealthIncident("", "", OVERALL, overall))
    return DcgmHealth(failures=found["Failure"], warnings=found["Warning"])


def _entity(result: dict[str, Any]) -> str:
    if "entity_id" in result:
        return f"{result.get('entity_group') or 'entity'} {result['entity_id']}"
    if "gpu_id" in result:
        return f"GPU {result['gpu_id']}"
    return ""


def _warnings(result: dict[str, Any]) -> list[str]:
    """A result's messages: only their text is read, so any shape of them is taken (a list of
    objects, DCGM 3's objects keyed ``warnings``, one string), never a reason to fail a report."""
    given = result.get("warnings")
    texts = []
    for w in given if isinstance(given, list) else [given]:
        text = w.get("warning") or w.get("warnings") if isinstance(w, dict) else w
        if text:
            texts.append(str(text).strip())
    return texts


def _run_report(run: dict[str, Any], failed: list[str], warned: list[str]) -> int:
    """Adds one run's failed and warned tests (its runtime error is a failure); returns how many
    results it had."""
    root = next((run[k] for k in DIAG_ROOTS if k in run), None)
    if root is None:
        raise ValueError(f"dcgmi diag: none of {', '.join(DIAG_ROOTS)} in its JSON")
    root = _object(root, "dcgmi diag")
    if root.get("runtime_error"):
        failed.append(f"runtime error: {str(root['runtime_error']).strip()[:300]}")
    results = 0
    for category in _list(root.get("test_categories"), "test_categories"):
        for test in _list(_object(category, "category").get("tests"), "tests"):
            test = _object(test, "test")
            name = str(test.get("name") or "unnamed test")
            for result in [*_list(test.get("results"), f"{name} results"), test.get("test_summary")]:
                if result is None:
                    continue
                status = _object(result, f"{name} result").get("status")
                results += 1
                if status in ("Pass", "Skip", "Not Run"):
                    continue
                if status not in ("Fail", "Warn"):
                    raise ValueError(f"dcgmi diag: {name} has status {status!r}")
                entity = _entity(result)
                line = f"{name}{' on ' + entity if entity else ''}"
                detail = "; ".join(_warnings(result))
                (failed if status == "Fail" else warned).append(f"{line}: {detail[:300]}" if detail else line)
    return results


def parse_diag(text: str) -> DiagReport:
    """``dcgmi diag -j``'s report (one run, or ``--iterations``). A report in which no test
    gave a result, or of an unknown shape, raises; a ``runtime_error`` is a failure."""
    data = _loads(text, "dcgmi diag")
    failed: list[str] = []
    warned: list[str] = []
    results = sum(_run_report(_object(run, "iteration"), failed, warned)
                  for run in (_list(data.get("iterations"), "iterations") if "iterations" in data else [data]))
    if data.get("Overall Result") == "Fail" and not failed:
        failed.append(f"overall: {str(data.get('Warning') or 'Fail')[:300]}")
    if not results and not failed:
        raise ValueError("dcgmi diag: no test gave a result")
    # the same test failing on the same entity in several iterations is one failure
    return DiagReport(failed=list(dict.fromkeys(failed)), warned=list(dict.fromkeys(warned)), results=results)
