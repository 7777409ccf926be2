"""The agent on a real NVIDIA GPU: NVML read through the agent's own backend, and the quick and full
health checks the pipeline runs, judged as the pipeline judges them.

Nothing here can run without a GPU, its driver and nvidia-ml-py, so these tests skip (also in CI)
saying why; they are run on the lent GPU machine (docs/health-checks.md, "On a real GPU"), and
bench/gpu_node.py records the figures.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")


def _gpu_count() -> tuple[int, str]:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return 0, f"no NVIDIA driver here (NVML: {exc})"
    try:
        return pynvml.nvmlDeviceGetCount(), "NVML sees no GPU"
    finally:
        pynvml.nvmlShutdown()


GPUS, WHY = _gpu_count()
if not GPUS:
    pytest.skip(f"needs a real NVIDIA GPU: {WHY}", allow_module_level=True)

from nodemedic_agent.hardware.nvml import NvmlHardware  # noqa: E402 - only once a GPU is known to exist

from bench.gpu_node import health_check, write_config  # noqa: E402 - the benchmark's own way to run a check


@pytest.fixture
def hardware():
    hw = NvmlHardware(dcgm=False)
    yield hw
    hw.close()


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path, GPUS)


def test_the_nvml_backend_reads_every_gpu_as_healthy(hardware) -> None:
    gpus = hardware.gpus()
    assert [g.index for g in gpus] == list(range(GPUS))
    for g in gpus:
        assert g.uuid.startswith("GPU-") and g.pci_bus_id and not g.lost
        assert g.ecc_dbe_volatile == 0 and not (g.remap_pending or g.remap_failure or g.retired_pages_pending)
        assert g.max_sm_clock_mhz > 0 and 0 < g.sm_clock_mhz <= g.max_sm_clock_mhz
        assert g.pcie_max_width > 0 and g.pcie_width == g.pcie_max_width  # a healthy link trains at full width
        assert g.nvlink_links_down == 0


def test_waiting_for_xids_on_a_quiet_gpu_returns_nothing(hardware) -> None:
    assert hardware.wait_xid(0.5) == []


def test_the_quick_check_passes_a_healthy_gpu_after_settling(config) -> None:
    _, report, code = health_check(config, "quick", "p5.48xlarge")
    assert code == 0 and report["healthy"], report
    gpu = next(c for c in report["checks"] if c["name"] == "gpu")
    assert gpu["status"] == "healthy" and not gpu["findings"]
    assert report["settle"]["clean_in_a_row"] == 3


def test_the_full_check_measures_each_gpu_against_its_threshold(config) -> None:
    pytest.importorskip("torch", reason="the GPU burn needs PyTorch")
    _, report, code = health_check(config, "full", "p5.48xlarge")
    burn = next(c for c in report["checks"] if c["name"] == "gpu_burn")
    assert burn["status"] == "healthy", burn
    targets = {(m["target"], m["metric"]) for m in burn["measurements"]}
    assert targets == {(f"gpu{i}", metric) for i in range(GPUS) for metric in ("gemm_bf16_tflops", "hbm_copy_gbps")}
    assert all(m["value"] >= m["threshold"] > 0 for m in burn["measurements"])
    nccl = next(c for c in report["checks"] if c["name"] == "nccl_all_reduce")
    if GPUS < 2:
        assert nccl["status"] == "not_run" and "needs two" in nccl["detail"]
    assert code == 0 and report["healthy"], report


def test_a_burn_below_its_threshold_fails_the_node(config) -> None:
    """The same real measurement judged against a threshold no GPU reaches: the check fails, naming it."""
    pytest.importorskip("torch", reason="the GPU burn needs PyTorch")
    from nodemedic_agent.checks.deep import Profile, gpu_burn

    impossible = Profile("bench", GPUS, 1e6, 1e9, None, 0)
    result = gpu_burn(impossible, seconds=1.0)
    assert result.ok is False
    assert "gpu0 gemm_bf16_tflops" in result.detail and "< 1000000" in result.detail


def test_the_gpu_reset_rung_sees_a_job_on_the_gpu_as_nvidia_smi_lists_it() -> None:
    """The reset rung's safety check, read-only: nvidia-smi's real process list is parsed, a process
    holding GPU 0 is named, so the rung would refuse. (Nothing is reset: the lent machine's GPU must
    never be.)"""
    pytest.importorskip("torch", reason="a CUDA process is started with PyTorch")
    import subprocess
    import sys

    from nodemedic_agent.gpu_reset import GpuReset

    rung = GpuReset(say=lambda _: None)
    gpus = rung.targets([])
    assert [g.index for g in gpus] == [str(i) for i in range(GPUS)]
    assert all(g.uuid.startswith("GPU-") for g in gpus)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, torch; x = torch.ones(1 << 20, device='cuda:0'); "
                               "torch.cuda.synchronize(); print('ready', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        seen = rung.busy(gpus)
        assert any(s.startswith(f"pid {holder.pid} (") and s.endswith(" on GPU 0") for s in seen), seen
    finally:
        holder.communicate(input="", timeout=60)
    for _ in range(20):  # the driver drops an exited process from its list within moments
        if not any(s.startswith(f"pid {holder.pid} (") for s in rung.busy(gpus)):
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"pid {holder.pid} is still listed 10 s after it exited")


def test_a_gpu_whose_memory_another_process_holds_fails_the_burn_by_name(config) -> None:
    """What a node left with a stuck process looks like to the full check: the burn cannot allocate,
    and the check says so for that GPU, in a report (it crashed with a traceback and no report)."""
    pytest.importorskip("torch", reason="a CUDA process is started with PyTorch")
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", "import sys, torch; free, _ = torch.cuda.mem_get_info(0); "
                               "x = torch.empty(free - (1 << 30), dtype=torch.uint8, device='cuda:0'); "
                               "torch.cuda.synchronize(); print('ready', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        _, report, code = health_check(config, "full", "p5.48xlarge", "--settle-seconds", "0")
    finally:
        holder.communicate(input="", timeout=60)
    burn = next(c for c in report["checks"] if c["name"] == "gpu_burn")
    assert code == 1 and not report["healthy"] and burn["ok"] is False, burn
    assert "gpu0: " in burn["detail"] and "out of memory" in burn["detail"].lower(), burn["detail"]


def _agent(config: Path, *args: str, seconds: float | None = None) -> tuple[int, str, str]:
    """The agent's CLI on this GPU; with ``seconds``, a daemon stopped (SIGTERM) after that long."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "nodemedic_agent.cli", "--config", str(config), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if seconds is not None:
        time.sleep(seconds)
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _stall_limit(config: Path, seconds: float) -> Path:
    """A limit far under the default 300 s: every NVML call the agent makes, the Xid event wait
    (1 s) included, must return well within it on a healthy GPU, or the agent reports CHECK_STALLED.
    Without DCGM (the lent machines have none), which the config requires of a limit this short."""
    text = config.read_text().replace('backend = "nvml"\n', 'backend = "nvml"\ndcgm = false\n')
    config.write_text(text + f"[thresholds]\ncheck_stall_seconds = {seconds}\n"
                      "[intervals]\nheartbeat_seconds = 0.5\npoll_seconds = 1\n")
    return config


def test_the_agent_on_a_healthy_gpu_reports_no_stall_under_a_tight_limit(config) -> None:
    """The watchdog on real NVML: the polled checks run on a worker thread, the Xid event wait blocks
    in the driver for its 1 s timeout, and the first GPU reading includes nvmlInit. None may read as a
    check that never returns. (A stall itself cannot be made on this GPU without wedging it.)"""
    code, out, err = _agent(_stall_limit(config, 3), "run", "--dry-run", seconds=15)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    stalled = [e for e in events if e["Detail"].get("fault_code") == "CHECK_STALLED"]
    assert not stalled, stalled
    assert "watching gpu-bench" in err and "has not returned" not in err, err[-3000:]
    assert code == 0, err[-3000:]


def test_check_once_on_a_healthy_gpu_answers_without_waiting(config) -> None:
    """``check --once`` polls on a thread and says on stderr what it waits for after 5 s: on a
    healthy GPU it answers before that, healthy."""
    started = time.monotonic()
    code, out, err = _agent(_stall_limit(config, 3), "check", "--once", "--dry-run")
    assert code == 0 and "waiting for" not in err and "CHECK_STALLED" not in out, (out, err[-3000:])
    assert time.monotonic() - started < 30
