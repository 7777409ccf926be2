"""Fixtures for the node agent: a simulated GPU node, an EventBridge bus (moto) whose events land
in an SQS queue the test reads, and agents wired to both."""

from __future__ import annotations

import json
import stat
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.server import ThreadedMotoServer
from nodemedic.contracts.events import NodeIdentity
from nodemedic_agent.agent import Agent, acknowledgements, events_client
from nodemedic_agent.config import AgentConfig, parse_config
from nodemedic_agent.hardware.simulated import SimulatedHardware, SimulatedNode

from bench.moto_bus import free_port

BUS = "nodemedic-local"
NODE = NodeIdentity(instance_id="i-0123456789abcdef0", hostname="gpu-1.local", slurm_node="gpu-1")
FAKE_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class Bus:
    """The agent's bus; every event put on it is copied to a queue the test drains."""

    def __init__(self, endpoint_url: str | None = None) -> None:
        self.endpoint_url = endpoint_url
        kw = {"region_name": "us-east-1", "endpoint_url": endpoint_url}
        self.events = boto3.client("events", **kw)
        self.sqs = boto3.client("sqs", **kw)
        self.events.create_event_bus(Name=BUS)
        self.queue = self.sqs.create_queue(QueueName="agent-events")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.events.put_rule(Name="all", EventBusName=BUS, EventPattern=json.dumps({"source": ["nodemedic.agent"]}))
        self.events.put_targets(Rule="all", EventBusName=BUS, Targets=[{"Id": "q", "Arn": arn}])
        self.received: list[dict[str, Any]] = []

    def drain(self) -> list[dict[str, Any]]:
        while batch := self.sqs.receive_message(QueueUrl=self.queue, MaxNumberOfMessages=10).get("Messages"):
            for m in batch:
                self.received.append(json.loads(m["Body"]))
                self.sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=m["ReceiptHandle"])
        return self.received

    def health_events(self) -> list[dict[str, Any]]:
        return [e["detail"] for e in self.drain() if e["detail-type"] == "Node Health Event"]

    def heartbeats(self) -> list[dict[str, Any]]:
        return [e["detail"] for e in self.drain() if e["detail-type"] == "Node Heartbeat"]

    def wait_health(self, count: int, timeout: float = 10.0, settle: float = 0.6) -> list[dict[str, Any]]:
        """Wait for ``count`` health events, then ``settle`` seconds more to catch any extra."""
        deadline = time.monotonic() + timeout
        while len(self.health_events()) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(settle)
        return self.health_events()


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in FAKE_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def bus(fake_env: None) -> Iterator[Bus]:
    with mock_aws():
        yield Bus()


@pytest.fixture
def sim(tmp_path: Path) -> SimulatedNode:
    return SimulatedNode(tmp_path / "node").create(gpus=8, efa=2, shared_mounts=("/fsx",))


def agent_config(sim: SimulatedNode, spool: Path, **sections: dict[str, Any]) -> AgentConfig:
    data: dict[str, Any] = {
        "cluster": "local", "event_bus": BUS, "region": "us-east-1",
        "node": {"instance_id": NODE.instance_id, "slurm_node": NODE.slurm_node, "hostname": NODE.hostname},
        "intervals": {"heartbeat_seconds": 60, "poll_seconds": 0.05, "dedupe_window_seconds": 300},
        "expected": {"gpus": 8, "efa_devices": 2},
        "storage": {"shared_mounts": ["/fsx"], "probe_timeout_seconds": 1},
        "kernel_log": {"source": "file", "path": str(sim.kmsg_path)},
        "hardware": {"backend": "simulated", "simulated_dir": str(sim.dir)},
        "publish": {"spool_dir": str(spool), "max_backoff_seconds": 0.3},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return parse_config(data)


def no_metadata(path: str) -> str:
    """No instance metadata here (the agent is not on EC2): nothing is read from 169.254.169.254."""
    raise OSError(f"no instance metadata in tests ({path})")


@pytest.fixture
def make_agent(sim: SimulatedNode, tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    started: list[Agent] = []

    def make(start: bool = True, metadata: Callable[[str], str] = no_metadata, **sections: dict[str, Any]) -> Agent:
        config = agent_config(sim, tmp_path / "spool", **sections)
        agent = Agent(config, SimulatedHardware(sim.dir), NODE, events_client(config), acks=acknowledgements(config),
                      metadata=metadata)
        started.append(agent)
        if start:
            agent.start()
            time.sleep(0.2)  # the kernel log follower has opened the log
        return agent

    yield make
    for agent in started:
        agent.stop(graceful=False)


@pytest.fixture
def server(fake_env):
    """A real network endpoint for the bus that the test can take down and bring back."""
    port = free_port()

    class Endpoint:
        url = f"http://127.0.0.1:{port}"

        def __init__(self) -> None:
            self.server: ThreadedMotoServer | None = None

        def up(self) -> None:
            self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            self.server.start()

        def down(self) -> None:
            if self.server:
                self.server.stop()
                self.server = None

    endpoint = Endpoint()
    endpoint.up()
    yield endpoint
    if endpoint.server is None:
        endpoint.up()
    # the server's AWS state lives in this process: forget it (moto's reset API), or the next
    # test's bus "already exists"
    urllib.request.urlopen(urllib.request.Request(f"{endpoint.url}/moto-api/reset", method="POST"), timeout=10).close()
    endpoint.down()


def tool(bin_dir: Path, name: str, script: str) -> Path:
    """An executable shell script ``name`` in ``bin_dir``: a program a test puts on PATH."""
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path
