"""Reading ``scontrol show ... -o`` records: the pipeline's Slurm adapter and the node agent's
burn-in hold parse Slurm's answers the same way; and the burn-in hold's drain reason, which the
agent writes and the pipeline's reconciler reads."""

from __future__ import annotations

import re

_FIELD_SPLIT = re.compile(r"\s+(?=[A-Za-z][\w/:]*=)")
_REASON_SUFFIX = re.compile(r"\s*\[[^\]]*@[^\]]*\]$")


def parse_scontrol_record(line: str) -> dict[str, str]:
    """Parse one ``scontrol show ... -o`` line into ``{key: value}`` (values may hold spaces)."""
    fields: dict[str, str] = {}
    for part in _FIELD_SPLIT.split(line.strip()):
        key, sep, value = part.partition("=")
        if sep:
            fields[key] = value.strip()
    return fields


def drain_reason(fields: dict[str, str]) -> str:
    """A node record's reason without the ``[user@time]`` stamp Slurm appends ("" when none)."""
    return _REASON_SUFFIX.sub("", fields.get("Reason", "")).strip()


def burn_in_reason(prefix: str, instance_id: str) -> str:
    """The drain reason of a joined node's burn-in hold."""
    return f"{prefix}:burn-in {instance_id} joined"


def burn_in_instance(prefix: str, reason: str) -> str | None:
    """The instance a burn-in hold's drain reason names, or None for any other reason."""
    found = re.fullmatch(rf"{re.escape(prefix)}:burn-in (\S+) joined", reason)
    return found.group(1) if found else None
