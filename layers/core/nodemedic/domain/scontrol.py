"""Reading ``scontrol show ... -o`` records: the pipeline's Slurm adapter and the node agent's
burn-in hold parse Slurm's answers the same way; the burn-in hold's drain reason, which the
agent writes and the pipeline's reconciler reads; and Slurm's compressed host lists."""

from __future__ import annotations

import re

_FIELD_SPLIT = re.compile(r"\s+(?=[A-Za-z][\w/:]*=)")
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
MAX_HOSTS = 100_000  # more hosts than any cluster has: a malformed range, not a job's nodes
_REASON_SUFFIX = re.compile(r"\s*\[[^\]]*@[^\]]*\]$")
_STAMPED_REASON = re.compile(r"(?:^|\s)Reason=(.*?\s\[[^\[\]\s]*@[^\[\]\s]*\])(?=\s|$)")


def parse_scontrol_record(line: str) -> dict[str, str]:
    """Parse one ``scontrol show ... -o`` line into ``{key: value}`` (values may hold spaces).

    A value ends where the next ``Key=`` starts, except a node's drain reason: free text that may
    hold ``word=`` ("rma ticket=42"), it runs to the ``[user@time]`` stamp Slurm appends to it
    (``Comment=``/``Extra=`` may follow)."""
    fields: dict[str, str] = {}
    stamped = _STAMPED_REASON.search(line)
    if stamped:
        fields["Reason"] = stamped.group(1)
        line = line[:stamped.start()] + line[stamped.end():]
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


def expand_hostlist(expression: str) -> list[str]:
    """Slurm's compressed host list (``squeue -o %N``: ``p5-[0001-0003,0010],login``,
    ``r[1-2]-n[01-02]``) as host names, in the order ``scontrol show hostnames`` prints them: a
    range keeps its lower bound's zero padding; several bracket groups combine, the first varying
    slowest. ValueError for what is not a host list."""
    parts, depth, part = [], 0, ""
    for c in expression.strip() + ",":
        if c == "," and depth == 0:
            parts.append(part)
            part = ""
            continue
        depth += (c == "[") - (c == "]")
        if depth not in (0, 1):
            raise ValueError(f"not a host list: {expression!r}")
        part += c
    if depth or part:
        raise ValueError(f"not a host list: {expression!r}")
    hosts = [host for p in parts if p for host in _expand_part(p, expression)]
    if len(hosts) > MAX_HOSTS:
        raise ValueError(f"host list of more than {MAX_HOSTS:,} hosts: {expression[:100]!r}")
    return hosts


def _expand_part(part: str, expression: str) -> list[str]:
    found = _BRACKETS.search(part)
    if not found:
        if "[" in part or "]" in part:
            raise ValueError(f"not a host list: {expression!r}")
        return [part]
    head, rest = part[:found.start()], _expand_part(part[found.end():], expression)
    hosts: list[str] = []
    for item in found.group(1).split(","):
        low, _, high = item.partition("-")
        if not low.isdigit() or not (high or low).isdigit():
            raise ValueError(f"not a host list: {expression!r}")
        if len(hosts) + (int(high or low) - int(low) + 1) * len(rest) > MAX_HOSTS:  # counted before it is built
            raise ValueError(f"host list of more than {MAX_HOSTS:,} hosts: {expression[:100]!r}")
        hosts += [f"{head}{n:0{len(low)}d}{tail}" for n in range(int(low), int(high or low) + 1) for tail in rest]
    return hosts
