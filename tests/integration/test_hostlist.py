"""Slurm's compressed host lists (``squeue -o %N``), expanded as Slurm itself expands them: the
requeue document reports each job's nodes compressed (a 2,000-node job's names spelled out would
not fit in the 24,000 characters SSM returns), and the adapter expands them. Real
``scontrol show hostnames`` is the oracle."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nodemedic.domain.scontrol import expand_hostlist
from nodemedic.orchestrators.slurm import SlurmViaSSM
from nodemedic.providers.run_command import Documents

from tests.conftest import require_slurm
from tests.unit.test_slurm_parsing import RecordingRunner

FIXED = ["gpu-[1-3,7]", "p5-[0001-0003,0010],login", "r[1-2]-n[01-02]", "n[08-10]", "node[9-11]", "a,b,c",
         "gpu-1", "n[1-3]x[1-2]", "ip-10-1-0-[17-19]"]


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``scontrol show hostnames`` needs only a readable slurm.conf, no controller."""
    require_slurm()
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=hostlist\nSlurmctldHost=localhost\nNodeName=n1\nPartitionName=p Nodes=n1\n")
    return {**os.environ, "SLURM_CONF": str(conf)}


def _slurm_expands(env: dict[str, str], expression: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", expression], env=env, capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return out.split()


@pytest.mark.parametrize("expression", FIXED)
def test_a_host_list_expands_as_slurm_expands_it(scontrol: dict[str, str], expression: str) -> None:
    assert expand_hostlist(expression) == _slurm_expands(scontrol, expression)


ranges = st.tuples(st.integers(0, 120), st.integers(0, 12), st.integers(1, 4)).map(
    lambda t: f"{t[0]:0{t[2]}d}" + (f"-{t[0] + t[1]:0{t[2]}d}" if t[1] else ""))
groups = st.lists(ranges, min_size=1, max_size=3).map(lambda rs: "[" + ",".join(rs) + "]")
hosts = st.tuples(st.sampled_from(["gpu-", "p5-", "ip-10-1-0-", "node"]), groups,
                  st.one_of(st.just(""), st.tuples(st.just("-n"), groups).map("".join))).map("".join)


@settings(max_examples=60, deadline=None)
@given(st.lists(hosts, min_size=1, max_size=3).map(",".join))
def test_generated_host_lists_expand_as_slurm_expands_them(scontrol: dict[str, str], expression: str) -> None:
    assert expand_hostlist(expression) == _slurm_expands(scontrol, expression)


@pytest.mark.parametrize("bad", ["gpu-[1-3", "gpu-1]", "n[[1-2]]", "n[a-b]", "n[1-999999999]", "r[1-99999]-n[1-99999]"])
def test_what_is_not_a_host_list_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(bad)


def test_a_requeued_2000_node_job_reports_its_nodes_in_a_few_characters() -> None:
    line = "requeued 4242 p5-[0001-2000]\nrequeued 4243 gpu-[1-2],login\nnot_requeued 4244 Job is pending"
    evacuated = SlurmViaSSM(RecordingRunner(line), "i-0ctl", 60, Documents("c1")).evacuate("p5-0001")  # type: ignore[arg-type]
    assert evacuated.requeued == ["4242", "4243"] and evacuated.not_requeued == ["4244 Job is pending"]
    assert evacuated.job_nodes["4242"] == [f"p5-{i:04d}" for i in range(1, 2001)]
    assert evacuated.job_nodes["4243"] == ["gpu-1", "gpu-2", "login"]
