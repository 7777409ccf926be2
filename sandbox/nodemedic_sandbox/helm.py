"""The official Helm binary (``sandbox/install-helm.sh`` fetches it once per machine), for the
Helm chart's tests: ``helm lint`` and ``helm template`` render the chart exactly as an install
would, and the real API server then dry-runs what they render."""

from __future__ import annotations

import subprocess
from pathlib import Path

from nodemedic_sandbox.kube_apiserver import cache_dir

VERSION = "v3.17.1"
CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "nodemedic"


def binary() -> Path:
    return cache_dir() / f"helm-{VERSION}"


def unavailable_reason() -> str | None:
    """Why Helm cannot run here, or None when it can."""
    if not binary().is_file():
        return f"no helm at {binary()} (fetch it once per machine: `make helm`, no root needed)"
    return None


def run(*args: str, values: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``helm <args> [-f values]``, in a clean Helm home (no user repositories or plugins)."""
    command = [str(binary()), *args, *(["-f", str(values)] if values else [])]
    return subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": "/nonexistent",
                               "HELM_CONFIG_HOME": "/nonexistent", "HELM_DATA_HOME": "/nonexistent"})
