"""What a check finds and reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from nodemedic.domain.classification import classify

Status = Literal["healthy", "degraded", "failed", "error"]
_RANK = {"healthy": 0, "degraded": 1, "error": 2, "failed": 3}


@dataclass(frozen=True)
class Finding:
    """One fault seen by one check; becomes one Node Health Event (after dedupe)."""

    check: str  # the contract's Check: nvml, dcgm, kernel_log, efa, storage
    fault_code: str
    status: Status
    summary: str
    component: dict[str, Any] | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    observed_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    once: str = ""  # set: this finding is one occurrence (a join), never folded with another

    @property
    def key(self) -> str:
        """What dedupe folds: the same fault code on the same numbered GPU/NIC. The kernel log and
        NVML (or a polled check) seeing one fault give the same key even when only one of them
        knows the device's name, so the pair becomes one event."""
        if self.once:
            return f"{self.fault_code}|{self.once}"
        index = (self.component or {}).get("index")
        return f"{self.fault_code}|{index}|{self.evidence.get('check', '')}"  # check errors: one key per check


@dataclass
class CheckResult:
    name: str
    detail: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def status(self) -> Status:
        worst: Status = "healthy"
        for f in self.findings:
            if _RANK[f.status] > _RANK[worst]:
                worst = f.status
        return worst


def status_of(fault_code: str, overrides: dict[str, str] | None = None) -> Status:
    """``failed`` when the pipeline acts on the fault (fault table, operator overrides), else ``degraded``."""
    action = (overrides or {}).get(fault_code) or classify(fault_code).action
    return "degraded" if action == "monitor" else "failed"


def check_error(check: str, name: str, error: Exception) -> CheckResult:
    """A check that could not read its source: reported, never a crash."""
    message = f"{type(error).__name__}: {error}"[:500]
    finding = Finding(check, "CHECK_ERROR", "error", f"{name} check could not run: {message}",
                      evidence={"check": name, "error": message})
    return CheckResult(name, f"could not run: {message}", [finding])
