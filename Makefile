# NodeMedic - `make demo` runs the local demo, `make test` the whole suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# make demo SCHEDULER=k8s: the demo on a real kube-apiserver (built once by `make kube`) instead of Slurm
# make demo SCHEDULER=k8s PROVIDER=karpenter: its nodes from a Karpenter NodePool instead of an Auto Scaling group
SCHEDULER ?= auto
PROVIDER ?= autoscaling
DEMO_NEEDS := $(if $(filter k8s kubernetes,$(SCHEDULER)),kube,slurm)

.PHONY: help venv slurm kube helm chromium awscli journal demo test lint unit chaos bench gpu-check agent-wheel agent-wheelhouse clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/.installed: pyproject.toml layers/core/requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "NodeMedic needs Python 3.11+ (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

venv: $(BIN)/.installed  ## build the environment in .venv/

slurm:  ## install Debian's Slurm packages for the local cluster (as root)
	@sandbox/install-debian.sh Slurm "slurmctld slurmd scontrol" "the local mode will use its simulated scheduler" \
	  slurmctld slurmd slurm-client munge

kube:  ## build a real kube-apiserver for the Kubernetes tests, once per machine (as root; cached in ~/.cache/nodemedic)
	@sandbox/install-kube-apiserver.sh

helm:  ## fetch the official Helm binary for the Helm chart's tests, once per machine (cached in ~/.cache/nodemedic)
	@sandbox/install-helm.sh

chromium:  ## install Debian's Chromium, which renders the HTML report in a test (as root)
	@sandbox/install-debian.sh Chromium "chromium|chromium-browser" "the HTML report's rendering test will be skipped" \
	  chromium fonts-dejavu-core

awscli:  ## install Debian's AWS CLI, which the agent installer's S3 fetch runs in a test (as root)
	@sandbox/install-debian.sh "the AWS CLI" aws "the installer's S3 fetch test will be skipped" awscli

journal:  ## install Debian's systemd-journal-remote, which writes the journal the agent's journal source is tested on (as root)
	@sandbox/install-debian.sh systemd-journal-remote /lib/systemd/systemd-journal-remote \
	  "the agent's real-journal tests will be skipped" systemd-journal-remote

demo: venv $(DEMO_NEEDS)  ## run the local end-to-end demo (SCHEDULER=k8s: on Kubernetes; PROVIDER=karpenter with it)
	$(BIN)/nodemedic demo --scheduler $(SCHEDULER) --provider $(PROVIDER)

# what the agent's wheel carries (node_agent/pyproject.toml), checked against the oldest Python it installs on
AGENT_PACKAGES = node_agent/nodemedic_agent layers/core/nodemedic/contracts layers/core/nodemedic/domain
AGENT_MIN_PYTHON = $(shell sed -n 's/^requires-python = ">=\([0-9.]*\)"/\1/p' node_agent/pyproject.toml)

lint: venv  ## cfn-lint the template, ruff the code, mypy --strict what runs in Lambda, on the nodes (the agent, also as its oldest Python), for the operator (the CLI) and the local stack
	$(BIN)/cfn-lint template.yaml
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/mypy --python-version $(AGENT_MIN_PYTHON) $(AGENT_PACKAGES)

# make test's pytest workers (pytest-xdist); a test file runs whole on one worker, on its own stack.
# The tests wait on their stacks a third of the time: on 2 cores, 3 workers ran the suite in 800-843 s, 2 in 1,018 s
TEST_WORKERS ?= 3

test: venv slurm kube helm chromium awscli journal lint  ## run the whole test suite on TEST_WORKERS workers (it lists the tests over 10 s)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --durations=25 --durations-min=10

unit: venv  ## fast tests only (no local stack): units and the stages on in-memory Slurm
	$(BIN)/pytest tests/unit tests/stages

chaos: venv slurm kube  ## every chaos scenario and soak (make test runs a bounded subset); the report goes to docs/chaos.md
	CHAOS_REPORT=docs/chaos.md $(BIN)/pytest tests/chaos -m "" -n $(TEST_WORKERS) -p no:cacheprovider

GPU_PYTHON ?= python3
gpu-check:  ## on a GPU machine: the real-GPU tests (tests/gpu), then bench/gpu_node.py (GPU_PYTHON: a python with nvidia-ml-py, pydantic, PyTorch)
	PYTHONPATH=node_agent:layers/core:.$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m pytest --noconftest -p no:cacheprovider -o addopts= -rs -v tests/gpu
	PYTHONPATH=node_agent:layers/core:.$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m bench.gpu_node $(GPU_BENCH_ARGS)

bench: venv  ## run the benchmarks (about 50 min); results in docs/benchmarks.{json,md} and docs/fleet.md
	$(BIN)/python -m bench.agent_latency --faults 200
	$(BIN)/python -m bench.agent_idle --seconds 60
	$(BIN)/python -m bench.silent_node --nodes 8
	$(BIN)/python -m bench.coldstart
	$(BIN)/python -m bench.pipeline overhead --incidents 100
	$(BIN)/python -m bench.pipeline burst --nodes 10 --events 1000
	$(BIN)/python -m bench.pipeline burst --nodes 500 --events 1000 --wait
	$(BIN)/python -m bench.recovery --faults 25
	$(BIN)/python -m bench.health_check --runs 20
	$(BIN)/python -m bench.fleet_report
	$(BIN)/python -m bench.fleet_scale --nodes 10000 --minutes 4
	$(BIN)/python -m bench.storm --nodes 10000 --events 20000 --faulty 2000 --seconds 60
	$(BIN)/python -m bench.bookkeeping --ended 10000 --events 50000 --open 20

agent-wheel: venv  ## build the node agent wheel into dist/ (install it with node_agent/lifecycle/install-agent.sh)
	$(BIN)/pip wheel --quiet --no-deps -w dist node_agent

agent-wheelhouse: venv  ## build the agent and its dependencies into dist/ for CPython 3.10-3.14, x86_64 and aarch64 (install-agent.sh --wheelhouse: no PyPI on the node)
	node_agent/lifecycle/build-wheelhouse.sh --out dist --python $(BIN)/python

clean:  ## remove the environment and caches
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist *.egg-info node_agent/build node_agent/*.egg-info
