"""The health report people read (``check``) and the one the pipeline reads (``health-check``)."""

from __future__ import annotations

import json
from typing import Any

from nodemedic.contracts.events import NodeIdentity

from nodemedic_agent.checks.base import CheckResult

MARK = {"healthy": "ok  ", "degraded": "WARN", "failed": "FAIL", "error": "ERR "}


def human(results: list[CheckResult], node: NodeIdentity, cluster: str) -> str:
    lines = [f"NodeMedic health report: {node.slurm_node or node.hostname} ({node.instance_id}), cluster {cluster}"]
    for r in results:
        lines.append(f"  [{MARK[r.status]}] {r.name:<8} {r.status:<9} {r.detail}")
        for f in r.findings:
            lines.append(f"           - {f.fault_code}: {f.summary}")
    worst = "healthy" if all(r.status == "healthy" for r in results) else "UNHEALTHY"
    lines.append(f"overall: {worst}")
    return "\n".join(lines)


def machine(results: list[CheckResult], level: str, instance_id: str) -> dict[str, Any]:
    """``{"healthy": bool, "checks": [...]}`` as the DeepHealthCheck stage parses it. A degraded
    check (e.g. thermal slowdown) does not fail the gate; failed and error do."""
    checks = [{"name": r.name, "ok": r.status in ("healthy", "degraded"), "status": r.status, "detail": r.detail,
               "findings": [f.fault_code for f in r.findings]} for r in results]
    return {"healthy": all(c["ok"] for c in checks), "level": level, "instance_id": instance_id, "checks": checks}


# SSM returns only the first 24,000 characters a command prints (GetCommandInvocation): the
# pipeline reads the report from the last line, so the line must fit, whatever a tool printed
REPORT_LIMIT = 20_000
DETAIL_LIMIT = 500


def fitted(report: dict[str, Any], limit: int = REPORT_LIMIT) -> str:
    """The report as one JSON line of at most ``limit`` characters: each check's detail is cut to
    DETAIL_LIMIT, then, if still too long, the measurements go (each check keeps its verdict and
    says how many it dropped). The verdicts are never cut."""
    for check in report["checks"]:
        detail = str(check.get("detail", ""))
        if len(detail) > DETAIL_LIMIT:
            check["detail"] = detail[:DETAIL_LIMIT - 3] + "..."
    line = json.dumps(report)
    if len(line) > limit:
        for check in report["checks"]:
            dropped = len(check.pop("measurements", None) or [])
            if dropped:
                check["measurements_dropped"] = dropped
        line = json.dumps(report)
    return line
