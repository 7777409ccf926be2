"""The health report people read (``check``) and the one the pipeline reads (``health-check``)."""

from __future__ import annotations

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
