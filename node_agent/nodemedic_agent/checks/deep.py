"""The deep health check's two levels, and the settle rule that comes before any verdict.

``quick`` (about a minute at most) is the agent's polled checks, judged only once the node has
settled: right after a reboot, GPU reset or replacement, NVLinks are still training and GPUs may
still be appearing, so the checks are repeated until ``settle_polls`` polls in a row are clean, or
until ``settle_seconds`` have passed (then what is still failing fails the node).

``full`` (up to 15 minutes) adds what measures the hardware: DCGM diagnostics (``dcgmi diag``),
a GEMM throughput and HBM bandwidth burn per GPU, and an intra-node NCCL all-reduce
(``all_reduce_perf`` from nccl-tests), each measured value reported beside its threshold (per
instance type, ``instance_types.json``). A tool that is not installed is reported as *not run*,
with the reason: never as a pass. ``require`` makes a not-run check fail the node.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from nodemedic_agent.checks.base import CheckResult
from nodemedic_agent.hardware.dcgm import HOST_ENGINE_DOWN, parse_diag
from nodemedic_agent.watchdog import Worker


@dataclass(frozen=True)
class Profile:
    """What a healthy node of an instance type measures (``instance_types.json``)."""

    instance_type: str
    gpus: int
    min_gemm_tflops: float | None
    min_hbm_gbps: float | None
    min_nccl_busbw_gbps: float | None
    settle_seconds: float
    basis: str = "no thresholds: measured, not judged"  # where the GEMM/HBM thresholds come from


@lru_cache(maxsize=1)
def _types() -> dict[str, Any]:
    text = resources.files("nodemedic.domain").joinpath("instance_types.json").read_text()
    return dict(json.loads(text))


def profile(instance_type: str | None, gpus: int) -> Profile:
    """The type's thresholds: from its GPU measured healthy on hardware where it was, else from the datasheet."""
    data = _types()
    spec = data["types"].get(instance_type or "", {})
    d = data["defaults"]
    name = instance_type or "unknown"
    measured = data["measured_gpus"].get(spec.get("gpu"))
    gemm: float | None
    hbm: float | None
    if not spec:
        gemm = hbm = None
        basis = f"no thresholds for {name}: measured, not judged"
    elif measured:
        f = d["calibrated_fraction"]
        gemm, hbm = round(measured["gemm_bf16_tflops"] * f, 1), round(measured["hbm_copy_gbps"] * f, 1)
        basis = f"{name} thresholds: {f:.0%} of a healthy {spec['gpu']} as measured {measured['measured']}"
    else:
        gemm = round(spec["peak_bf16_tflops"] * d["min_gemm_fraction"], 1)
        hbm = round(spec["peak_hbm_gbps"] * d["min_hbm_fraction"], 1)
        basis = (f"{name} thresholds: {d['min_gemm_fraction']:.0%} of the {spec['gpu']} datasheet's BF16 peak, "
                 f"{d['min_hbm_fraction']:.0%} of its HBM bandwidth (not yet measured on hardware)")
    return Profile(name, int(spec.get("gpus", gpus)), gemm, hbm, spec.get("min_nccl_busbw_gbps"),
                   float(spec.get("settle_seconds", d["settle_seconds"])), basis)


@dataclass
class Measured:
    """One check of the full level: ``ok`` is None when it could not run (``detail`` says why)."""

    name: str
    ok: bool | None
    detail: str
    measurements: list[dict[str, Any]] = field(default_factory=list)
    hung: str = ""  # the GPU whose work never finished: what runs after it on the GPUs would hang too

    def report(self) -> dict[str, Any]:
        status = "not_run" if self.ok is None else ("healthy" if self.ok else "failed")
        return {"name": self.name, "ok": self.ok, "status": status, "detail": self.detail,
                "findings": [] if self.ok is not False else [f"DEEP_CHECK_{self.name.upper()}"],
                "measurements": self.measurements}


class StalledError(Exception):
    """A poll whose check never returned: these results (CHECK_STALLED) are the verdict."""

    def __init__(self, results: list[CheckResult]) -> None:
        super().__init__("a check has not returned")
        self.results = results


def settle(run: Callable[[], list[CheckResult]], settle_s: float, polls: int, interval_s: float,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
           ) -> tuple[list[CheckResult], dict[str, Any]]:
    """Poll until ``polls`` clean polls in a row, or ``settle_s`` has passed: the last results,
    and how the verdict was reached."""
    start = clock()
    streak = rounds = 0
    while True:
        results = run()
        rounds += 1
        clean = all(r.status in ("healthy", "degraded") for r in results)
        streak = streak + 1 if clean else 0
        waited = clock() - start
        if streak >= polls or waited >= settle_s:
            return results, {"polls": rounds, "clean_in_a_row": streak, "waited_s": round(waited, 1),
                             "settle_seconds": settle_s}
        sleep(interval_s)


def _run(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)


def dcgm_diag(level: int = 3, timeout_s: float = 900) -> Measured:
    """``dcgmi diag -r LEVEL -j``, read by its structure (:func:`parse_diag`): a test that failed
    on any entity, an error that stopped the run, a non-zero exit or a report that cannot be
    read fails the node; a test that warned is said, and passes."""
    if shutil.which("dcgmi") is None:
        return Measured("dcgm_diag", None, "not run: dcgmi (DCGM) is not installed")
    try:
        out = _run(["dcgmi", "diag", "-r", str(level), "-j"], timeout_s)
    except subprocess.TimeoutExpired:
        return Measured("dcgm_diag", False, f"level {level} did not finish in {timeout_s:.0f}s")
    except OSError as exc:  # on PATH but cannot start (a broken install): the GPUs are not judged by it
        return Measured("dcgm_diag", None, f"not run: dcgmi cannot start: {exc}")
    said = " ".join((out.stdout + " " + out.stderr).split())
    if out.returncode != 0 and HOST_ENGINE_DOWN.search(said):  # DCGM is down, not the GPUs: as if not installed
        return Measured("dcgm_diag", None, f"not run: DCGM's host engine is not reachable ({said[:200]})")
    try:
        report = parse_diag(out.stdout)
    except ValueError as exc:
        return Measured("dcgm_diag", False, f"level {level}: exit {out.returncode}, {exc}; "
                        f"stderr: {out.stderr.strip()[:200]}")
    ok = out.returncode == 0 and not report.failed
    warned = f"; warnings: {' | '.join(report.warned)}" if report.warned else ""
    if ok:
        detail = f"level {level}: pass ({report.results} results){warned}"
    else:
        detail = f"level {level}: failed {' | '.join(report.failed) or f'(exit {out.returncode})'}{warned}"
    return Measured("dcgm_diag", ok, detail[:2000])


# A GPU's burn that has not finished this long after its measuring time hangs (a GPU that stopped
# processing work): CUDA's start, the allocations and the warm-up take seconds on a healthy one
BURN_GRACE_S = 60.0


def gpu_burn(p: Profile, seconds: float = 10.0, grace_s: float = BURN_GRACE_S) -> Measured:
    """Per GPU: dense BF16 GEMM TFLOPS and device-to-device copy GB/s, against the thresholds. A
    GPU whose burn raises a CUDA error fails with the error's text; one whose burn does not finish
    (``seconds`` + ``grace_s``) fails as hung, and the burn stops there (the GPUs after it are not
    measured). The report is still written."""
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return Measured("gpu_burn", None, "not run: PyTorch is not installed")
    if not torch.cuda.is_available():
        return Measured("gpu_burn", None, "not run: no CUDA device visible to PyTorch")
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    hung = ""
    gpus = torch.cuda.device_count()
    for i in range(gpus):
        try:
            tflops, gbps = _burn_one(torch, i, seconds, seconds + grace_s)
        except TimeoutError:
            rest = f"; gpu{i + 1}-gpu{gpus - 1} not measured" if i + 1 < gpus else ""
            failed.append(f"gpu{i}: the burn did not finish in {seconds + grace_s:.0f}s (a GPU that hangs){rest}")
            hung = f"gpu{i}"
            break
        except RuntimeError as exc:  # a CUDA error (a sick GPU, memory another process holds): this GPU fails
            failed.append(f"gpu{i}: {' '.join(str(exc).split())[:200]}")
            continue
        rows.append({"target": f"gpu{i}", "metric": "gemm_bf16_tflops", "value": round(tflops, 1),
                     "threshold": p.min_gemm_tflops})
        rows.append({"target": f"gpu{i}", "metric": "hbm_copy_gbps", "value": round(gbps, 1),
                     "threshold": p.min_hbm_gbps})
    below = failed + [f"{r['target']} {r['metric']} {r['value']} < {r['threshold']:.0f}" for r in rows
                      if r["threshold"] is not None and r["value"] < r["threshold"]]
    verdict = "; ".join(below) if below else f"{gpus} GPUs pass"
    return Measured("gpu_burn", not below, f"{verdict} ({p.basis})", rows, hung)


def _burn_one(torch: Any, gpu: int, seconds: float, deadline_s: float) -> tuple[float, float]:
    """GPU ``gpu``'s GEMM TFLOPS and copy GB/s, measured on a thread of its own: a GPU that stops
    processing work blocks the call that waits for it for good. TimeoutError past ``deadline_s``
    (the thread is left behind)."""
    def burn() -> tuple[float, float]:
        with torch.cuda.device(gpu):
            return _gemm_tflops(torch, seconds / 2), _copy_gbps(torch, seconds / 2)

    worker = Worker(burn, f"nodemedic-burn-gpu{gpu}")
    if not worker.wait(deadline_s):
        raise TimeoutError(f"gpu{gpu}")
    return worker.result()


def _timed(torch: Any, work: Callable[[], None], seconds: float) -> tuple[int, float]:
    work()  # warm up
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters, elapsed = 0, 0.0
    start.record()
    while elapsed < seconds:
        for _ in range(10):
            work()
        iters += 10
        end.record()
        end.synchronize()
        elapsed = start.elapsed_time(end) / 1000
    return iters, elapsed


def _gemm_tflops(torch: Any, seconds: float, n: int = 8192) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    iters, elapsed = _timed(torch, lambda: torch.matmul(a, b), seconds)
    return 2 * n**3 * iters / elapsed / 1e12


def _copy_gbps(torch: Any, seconds: float, size: int = 2 * 2**30) -> float:
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    iters, elapsed = _timed(torch, lambda: dst.copy_(src), seconds)
    return 2 * size * iters / elapsed / 1e9  # read + write


def nccl_busbw(stdout: str) -> float | None:
    """The ``# Avg bus bandwidth : N`` line of nccl-tests' output, in GB/s."""
    m = re.search(r"^#\s*Avg bus bandwidth\s*:\s*([0-9]+(?:\.[0-9]+)?)(?![0-9.])", stdout, re.MULTILINE)
    return float(m.group(1)) if m else None


def nccl_all_reduce(p: Profile, gpus: int, timeout_s: float = 300) -> Measured:
    if gpus < 2:  # one rank's all-reduce moves nothing: nccl-tests reports a bus bandwidth of 0
        return Measured("nccl_all_reduce", None, f"not run: {gpus} GPU, an all-reduce needs two")
    binary = shutil.which("all_reduce_perf")
    if binary is None:
        return Measured("nccl_all_reduce", None, "not run: all_reduce_perf (nccl-tests) is not on PATH")
    try:
        out = _run([binary, "-b", "1G", "-e", "1G", "-g", str(gpus), "-n", "20"], timeout_s)
    except subprocess.TimeoutExpired:
        return Measured("nccl_all_reduce", False, f"did not finish in {timeout_s:.0f}s")
    except OSError as exc:
        return Measured("nccl_all_reduce", None, f"not run: all_reduce_perf cannot start: {exc}")
    busbw = nccl_busbw(out.stdout)
    wrong = re.search(r"^#\s*Out of bounds values\s*:\s*([0-9]+)\s+FAILED", out.stdout, re.MULTILINE)
    if wrong:  # nccl-tests checks every result; a wrong one is a fault whatever the bandwidth
        return Measured("nccl_all_reduce", False, f"{wrong.group(1)} wrong results (data corruption), exit {out.returncode}")
    if out.returncode != 0 or busbw is None:
        return Measured("nccl_all_reduce", False, f"exit {out.returncode}: {(out.stderr or out.stdout).strip()[-200:]}")
    row = {"target": f"{gpus} GPUs", "metric": "nccl_busbw_gbps", "value": busbw, "threshold": p.min_nccl_busbw_gbps}
    ok = p.min_nccl_busbw_gbps is None or busbw >= p.min_nccl_busbw_gbps
    return Measured("nccl_all_reduce", ok, f"bus bandwidth {busbw:.1f} GB/s"
                    + (f" (threshold {p.min_nccl_busbw_gbps:g})" if p.min_nccl_busbw_gbps else ""), [row])


def full_checks(p: Profile, dcgm_level: int, gpus: int) -> list[Measured]:
    """``gpus``: how many the node shows (a missing GPU fails the quick check's count already)."""
    diag, burn = dcgm_diag(dcgm_level), gpu_burn(p)
    if burn.hung:  # an all-reduce over a GPU that stopped processing work would hang to its time limit
        return [diag, burn, Measured("nccl_all_reduce", None, f"not run: {burn.hung} hangs (gpu_burn)")]
    return [diag, burn, nccl_all_reduce(p, gpus)]
