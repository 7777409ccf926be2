"""The deep health check the pipeline runs on a node: quick and full differ, full reports each
measurement beside its threshold, missing tools are 'not run' (never a pass), and nothing is
judged before the node has settled."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from nodemedic_agent.checks.base import CheckResult, Finding
from nodemedic_agent.checks.deep import Profile, gpu_burn, profile, settle
from nodemedic_agent.cli import main

from tests.agent.conftest import agent_config, tool

DCGM = Path(__file__).parent / "data" / "dcgm"  # dcgmi's reports (tests/agent/test_dcgm.py)


@pytest.fixture
def config_file(sim, tmp_path: Path) -> Path:
    cfg = agent_config(sim, tmp_path / "spool")
    path = tmp_path / "agent.toml"
    lines = []
    for key, value in cfg.model_dump(exclude_none=True).items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {json.dumps(value)}")
    for key, value in cfg.model_dump(exclude_none=True).items():
        if isinstance(value, dict) and value and all(not isinstance(v, dict) for v in value.values()):
            lines.append(f"[{key}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in value.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def check(config_file: Path, capsys, *args: str) -> tuple[int, dict]:
    code = main(["--config", str(config_file), "health-check", "--instance-type", "p5.48xlarge", *args])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_quick_and_full_run_different_checks_and_a_missing_tool_is_not_run(config_file, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no dcgmi, no all_reduce_perf here
    code, quick = check(config_file, capsys, "--level", "quick", "--settle-seconds", "0")
    assert code == 0 and quick["healthy"] and quick["level"] == "quick"
    assert {c["name"] for c in quick["checks"]} == {"gpu", "dcgm", "efa", "storage"}
    code, full = check(config_file, capsys, "--level", "full", "--settle-seconds", "0")
    names = {c["name"]: c for c in full["checks"]}
    assert {"dcgm_diag", "gpu_burn", "nccl_all_reduce"} <= set(names)
    assert all(names[n]["status"] == "not_run" and names[n]["ok"] is None and "not run:" in names[n]["detail"]
               for n in ("dcgm_diag", "gpu_burn", "nccl_all_reduce"))
    assert full["not_run"] == ["dcgm_diag", "gpu_burn", "nccl_all_reduce"]
    assert code == 0 and full["healthy"]  # what ran passed; what did not is said, not passed
    code, required = check(config_file, capsys, "--level", "full", "--settle-seconds", "0", "--require", "dcgm_diag")
    assert code == 1 and not required["healthy"]


def test_full_reports_each_measurement_with_its_threshold(config_file, capsys, monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool(bin_dir, "dcgmi", f"cat {DCGM / 'diag-4-pass.json'}\n")
    tool(bin_dir, "all_reduce_perf", 'echo "# Avg bus bandwidth    : 412.31"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    code, full = check(config_file, capsys, "--level", "full", "--settle-seconds", "0")
    nccl = next(c for c in full["checks"] if c["name"] == "nccl_all_reduce")
    assert nccl["ok"] and nccl["measurements"] == [
        {"target": "8 GPUs", "metric": "nccl_busbw_gbps", "value": 412.31, "threshold": 350}]
    assert next(c for c in full["checks"] if c["name"] == "dcgm_diag")["ok"]
    tool(bin_dir, "all_reduce_perf", 'echo "# Avg bus bandwidth    : 97.5"\n')
    tool(bin_dir, "dcgmi", f"cat {DCGM / 'diag-4-fail-gpu.json'}\nexit 226\n")
    code, slow = check(config_file, capsys, "--level", "full", "--settle-seconds", "0")
    failed = {c["name"]: c["detail"] for c in slow["checks"] if c["ok"] is False}
    assert code == 1 and not slow["healthy"]
    assert "97.5" in failed["nccl_all_reduce"] and "memory on GPU 1" in failed["dcgm_diag"]


class _FakeTorch:
    """Enough of PyTorch for the burn: GPU ``sick`` raises the CUDA error a failing GPU gives; on GPU
    ``hung`` waiting for the work never returns (until ``release`` is set)."""

    def __init__(self, gpus: int, sick: int, error: str, hung: int | None = None) -> None:
        self.gpus, self.sick, self.error, self.current, self.hung = gpus, sick, error, 0, hung
        self.release = threading.Event()
        self.bfloat16, self.uint8 = "bf16", "u8"
        torch = self

        class _Device:
            def __init__(self, i: int) -> None:
                self.i = i

            def __enter__(self) -> None:
                torch.current = self.i

            def __exit__(self, *_: object) -> None:
                torch.current = 0

        class _Event:
            clock = 0.0

            def __init__(self, enable_timing: bool) -> None:
                self.at = 0.0

            def record(self) -> None:
                _Event.clock += 0.5
                self.at = _Event.clock

            def synchronize(self) -> None:
                if torch.current == torch.hung:
                    torch.release.wait()

            def elapsed_time(self, end: _Event) -> float:
                return (end.at - self.at) * 1000

        self.cuda = type("cuda", (), {"is_available": staticmethod(lambda: True),
                                      "device_count": staticmethod(lambda: gpus), "device": _Device,
                                      "synchronize": staticmethod(lambda: None), "Event": _Event})

    def _tensor(self) -> object:
        if self.current == self.sick:
            raise RuntimeError(self.error)
        return type("T", (), {"copy_": lambda _self, _src: None})()

    def randn(self, *_: object, **__: object) -> object:
        return self._tensor()

    def empty(self, *_: object, **__: object) -> object:
        return self._tensor()

    def empty_like(self, _: object) -> object:
        return self._tensor()

    def matmul(self, *_: object) -> None:
        pass


def test_a_gpu_whose_burn_raises_a_cuda_error_fails_by_name_and_the_report_is_written(config_file, capsys,
                                                                                     monkeypatch, tmp_path):
    """A sick GPU raises in the burn itself ("uncorrectable ECC error", or memory a leftover process
    holds): the check crashed with a traceback, no report, every measurement lost."""
    import sys

    monkeypatch.setenv("PATH", str(tmp_path))  # no dcgmi, no all_reduce_perf
    error = "CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors might be asynchronously reported"
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(gpus=3, sick=1, error=error))
    code, full = check(config_file, capsys, "--level", "full", "--settle-seconds", "0")
    burn = next(c for c in full["checks"] if c["name"] == "gpu_burn")
    assert code == 1 and not full["healthy"] and burn["ok"] is False
    assert "gpu1: CUDA error: uncorrectable ECC error encountered CUDA kernel errors" in burn["detail"]
    assert {m["target"] for m in burn["measurements"]} == {"gpu0", "gpu2"}  # the others still measured


def test_a_gpu_whose_burn_never_finishes_fails_as_hung_and_the_check_answers(monkeypatch) -> None:
    """A GPU that stops processing work: waiting for its GEMM blocked the full check until the
    pipeline's command timed out, with no report. It fails by name once past its deadline, the GPUs
    before it measured; those after it are not (the burn stops there) and the report says so."""
    import sys

    fake = _FakeTorch(gpus=4, sick=-1, error="", hung=1)
    monkeypatch.setitem(sys.modules, "torch", fake)
    started = time.monotonic()
    try:
        burn = gpu_burn(Profile("test", 4, 1.0, 1.0, None, 0), seconds=0.1, grace_s=0.5)
    finally:
        fake.release.set()  # the hung call returns: its thread ends
    assert time.monotonic() - started < 5
    assert burn.ok is False
    assert burn.detail.startswith("gpu1: the burn did not finish in 1s (a GPU that hangs); gpu2-gpu3 not measured")
    assert {m["target"] for m in burn.measurements} == {"gpu0"}


def test_after_a_gpu_that_hangs_the_all_reduce_is_not_started(monkeypatch, tmp_path) -> None:
    """An all-reduce over a GPU that stopped processing work would hang too, for its 300 s limit,
    beside the burn's thread: it is reported not run, naming the GPU, and never started."""
    from nodemedic_agent.checks import deep

    tool(tmp_path, "all_reduce_perf", f": > {tmp_path / 'started'}\n")  # a shell builtin: PATH holds only this
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(deep, "gpu_burn", lambda p: deep.Measured("gpu_burn", False, "gpu1: ...", [], "gpu1"))
    _, burn, nccl = deep.full_checks(Profile("test", 8, 1.0, 1.0, None, 0), 3, 8)
    assert burn.ok is False and (nccl.ok, nccl.detail) == (None, "not run: gpu1 hangs (gpu_burn)")
    assert not (tmp_path / "started").exists()
    monkeypatch.setattr(deep, "gpu_burn", lambda p: deep.Measured("gpu_burn", True, "8 GPUs pass"))
    deep.full_checks(Profile("test", 8, 1.0, 1.0, None, 0), 3, 8)
    assert (tmp_path / "started").exists()  # a burn that finished: the all-reduce runs


def test_a_tool_on_path_that_cannot_start_is_not_run_with_the_reason(config_file, capsys, monkeypatch, tmp_path):
    """A broken install (a binary for another CPU, a truncated file): subprocess raised OSError
    ("Exec format error") and the check crashed with no report."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("dcgmi", "all_reduce_perf"):
        (bin_dir / name).write_bytes(b"\x7fELF\x02garbage")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    code, full = check(config_file, capsys, "--level", "full", "--settle-seconds", "0")
    checks = {c["name"]: c for c in full["checks"]}
    for name, tool_name in (("dcgm_diag", "dcgmi"), ("nccl_all_reduce", "all_reduce_perf")):
        assert checks[name]["status"] == "not_run" and f"not run: {tool_name} cannot start" in checks[name]["detail"]
    assert code == 0 and full["healthy"]  # nothing failed; what could not run is said


def test_a_bus_bandwidth_that_is_not_a_number_is_no_figure() -> None:
    """float("1.2.3") raised ValueError and crashed the check with no report."""
    from nodemedic_agent.checks.deep import nccl_busbw

    assert nccl_busbw("# Avg bus bandwidth    : 1.2.3") is None
    assert nccl_busbw("# Avg bus bandwidth    : 412.31 ") == nccl_busbw("# Avg bus bandwidth : 412.31 (x)") == 412.31


def test_an_nvlink_down_that_clears_within_the_settle_window_is_not_a_failure(sim, config_file, capsys):
    sim.inject("nvlink-down", gpu=3)
    threading.Timer(1.0, lambda: sim.inject("clear")).start()  # the links finish training
    code, report = check(config_file, capsys, "--settle-seconds", "10", "--settle-polls", "3")
    assert code == 0 and report["healthy"], report
    assert report["settle"]["clean_in_a_row"] == 3 and report["settle"]["polls"] > 3


def test_a_fault_that_stays_fails_once_the_settle_window_is_over(sim, config_file, capsys):
    sim.inject("nvlink-down", gpu=3)
    code, report = check(config_file, capsys, "--settle-seconds", "0.5")
    assert code == 1 and not report["healthy"]
    assert "NVLINK_DOWN" in next(c for c in report["checks"] if c["name"] == "gpu")["findings"]
    assert report["settle"]["waited_s"] >= 0.5


HEALTH_CHECK = ["health-check", "--instance-type", "p5.48xlarge"]


@pytest.mark.parametrize(("args", "named"), [
    # a NaN wait never ended: a node that stays unhealthy (an unreachable controller) was waited on forever
    ([*HEALTH_CHECK, "--settle-seconds", "nan"], "--settle-seconds"),
    ([*HEALTH_CHECK, "--settle-seconds", "-5"], "--settle-seconds"),
    ([*HEALTH_CHECK, "--settle-seconds", "1e12"], "--settle-seconds"),
    ([*HEALTH_CHECK, "--settle-polls", "0"], "--settle-polls"),
    ([*HEALTH_CHECK, "--settle-polls", "-1"], "--settle-polls"),
    (["burn-in-hold", "--retry-seconds", "nan"], "--retry-seconds"),
])
def test_a_wait_that_could_never_end_or_mean_anything_is_refused(sim, config_file, capsys, args, named):
    with pytest.raises(SystemExit) as refused:
        main(["--config", str(config_file), *args])
    assert refused.value.code == 2 and named in capsys.readouterr().err


def test_settle_judges_after_n_clean_polls_or_the_deadline() -> None:
    bad = CheckResult("gpu", "x", [Finding("nvml", "NVLINK_DOWN", "failed", "down")])
    good = CheckResult("gpu", "x")
    seq = iter([[bad], [bad], [good], [bad], [good], [good], [good]])
    clock = iter(range(100))
    results, how = settle(lambda: next(seq), 60, 3, 1, clock=lambda: float(next(clock)), sleep=lambda _: None)
    assert results == [good] and how["polls"] == 7 and how["clean_in_a_row"] == 3


def test_thresholds_come_from_the_instance_type_and_unknown_types_are_measured_not_judged() -> None:
    p5 = profile("p5.48xlarge", 8)
    assert (p5.gpus, p5.min_nccl_busbw_gbps) == (8, 350)
    # the H100 was measured healthy on hardware (docs/benchmarks.json): 85 % of that, not 60 % of the datasheet
    assert (p5.min_gemm_tflops, p5.min_hbm_gbps) == (pytest.approx(683.3 * 0.85, abs=0.1), pytest.approx(3004 * 0.85, abs=0.1))
    assert "85% of a healthy H100-SXM5-80GB as measured 2026-11-24" in p5.basis
    p5en = profile("p5en.48xlarge", 8)
    assert p5en.min_gemm_tflops == pytest.approx(657.7 * 0.85, abs=0.1) and "H200" in p5en.basis
    p4d = profile("p4d.24xlarge", 8)  # the A100 was not measured here: the datasheet rule, and it says so
    assert p4d.min_gemm_tflops == pytest.approx(312 * 0.6, abs=0.1) and "not yet measured on hardware" in p4d.basis
    unknown = profile("g6.xlarge", 1)
    assert unknown.min_gemm_tflops is None and unknown.settle_seconds == 90 and "not judged" in unknown.basis


def test_every_measured_gpu_threshold_sits_below_what_the_healthy_gpu_measured() -> None:
    """A calibrated threshold a healthy GPU of that model misses would fail good nodes: each must leave room
    under the measurement it came from, and the benchmark that measured it must be on record."""
    from nodemedic_agent.checks.deep import _types

    data = _types()
    recorded = {r["name"]: r for r in json.loads((Path(__file__).parents[2] / "docs" / "benchmarks.json").read_text())}
    for kind, spec in data["types"].items():
        measured = data["measured_gpus"].get(spec["gpu"])
        if not measured:
            continue
        p = profile(kind, spec["gpus"])
        assert p.min_gemm_tflops < measured["gemm_bf16_tflops"] and p.min_hbm_gbps < measured["hbm_copy_gbps"]
        runs = [r for name, r in recorded.items() if name.startswith("gpu node (") and "GEMM" in name
                and r["p50"] == measured["gemm_bf16_tflops"]]
        assert runs, f"{spec['gpu']}: no GEMM benchmark in docs/benchmarks.json measured {measured['gemm_bf16_tflops']}"


REAL_NCCL = (Path(__file__).parent / "data" / "all_reduce_perf_h100_1gpu.txt").read_text()


def test_the_nccl_check_reads_nccl_tests_real_output(config_file, capsys, monkeypatch, tmp_path) -> None:
    """all_reduce_perf's output as nccl-tests 2.19.6 printed it on an H100 (one GPU: bus bandwidth 0); an 8-GPU run
    prints the same lines with its figure; a run whose results were wrong says FAILED and fails the node."""
    from nodemedic_agent.checks.deep import nccl_busbw

    assert nccl_busbw(REAL_NCCL) == 0.0
    eight = REAL_NCCL.replace("nGpus 1", "nGpus 8").replace("# Avg bus bandwidth    : 0 ", "# Avg bus bandwidth    : 368.412 ")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "out.txt").write_text(eight)
    tool(bin_dir, "all_reduce_perf", f'cat "{bin_dir / "out.txt"}"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    code, full = check(config_file, capsys, "--level", "full", "--settle-seconds", "0")
    nccl = next(c for c in full["checks"] if c["name"] == "nccl_all_reduce")
    assert nccl["ok"] and nccl["measurements"][0]["value"] == 368.412 and code == 0
    corrupt = eight.replace("Out of bounds values : 0 OK", "Out of bounds values : 3 FAILED")
    assert corrupt != eight
    (bin_dir / "out.txt").write_text(corrupt)
    tool(bin_dir, "all_reduce_perf", f'cat "{bin_dir / "out.txt"}"\nexit 3\n')
    code, bad = check(config_file, capsys, "--level", "full", "--settle-seconds", "0")
    nccl = next(c for c in bad["checks"] if c["name"] == "nccl_all_reduce")
    assert code == 1 and nccl["ok"] is False and "3 wrong results" in nccl["detail"]
