"""What SSM's agent does with a Command document before it runs it: check each parameter against
the document's declaration (present or defaulted, ``allowedValues``, ``allowedPattern``: "Creating
SSM documents: parameters" in the Systems Manager user guide), then replace each ``{{ name }}`` in
its ``aws:runShellScript`` lines by the value. The relay (:mod:`nodemedic_agent.relay`) runs the
stack's documents this way; the local stack's SSM does too."""

from __future__ import annotations

import re
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}")


def parameter_problems(name: str, document: dict[str, Any], given: dict[str, list[str]]) -> list[str]:
    """Why SSM would refuse these values (``InvalidParameters``); empty when it would not."""
    declared: dict[str, dict[str, Any]] = document.get("parameters", {})
    problems = [f"{k} is not a parameter of {name}" for k in given if k not in declared]
    for key, spec in declared.items():
        values = given.get(key)
        if values is None:
            if "default" not in spec:
                problems.append(f"{key} is required")
            continue
        for value in values:
            if "allowedValues" in spec and value not in spec["allowedValues"]:
                problems.append(f"{key}={value!r} is not one of {spec['allowedValues']}")
            if "allowedPattern" in spec and not re.search(spec["allowedPattern"], value):
                problems.append(f"{key}={value!r} does not match {spec['allowedPattern']}")
    return problems


def render_document(document: dict[str, Any], given: dict[str, list[str]]) -> str:
    """The shell an SSM agent runs for an ``aws:runShellScript`` document: ``{{ name }}``
    replaced by the parameter's value (its default when not given)."""
    values = {k: given.get(k, [str(spec.get("default", ""))]) for k, spec in document.get("parameters", {}).items()}
    lines = [line for step in document["mainSteps"] if step["action"] == "aws:runShellScript"
             for line in step["inputs"]["runCommand"]]
    return _PLACEHOLDER.sub(lambda m: "\n".join(values[m.group(1)]), "\n".join(lines))
