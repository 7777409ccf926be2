"""Real node agents for the local cluster: one per node, on simulated GPUs/EFA/kernel log,
publishing to the embedded bus exactly as they would to EventBridge."""

from __future__ import annotations

import json
import urllib.error
from collections.abc import Callable
from datetime import datetime
from email.message import Message
from pathlib import Path
from typing import Any

from nodemedic.contracts.events import NodeIdentity
from nodemedic.planned_events import ENDED_EVENT
from nodemedic_agent.agent import Agent, acknowledgements, events_client
from nodemedic_agent.burn_in import HoldResult, hold
from nodemedic_agent.config import parse_config
from nodemedic_agent.hardware.simulated import SimulatedHardware, SimulatedNode
from nodemedic_agent.scheduled_events import HISTORY, SCHEDULED
from nodemedic_agent.spot import LIFE_CYCLE

from nodemedic_sandbox.cluster import SimCluster
from nodemedic_sandbox.embedded_aws import AGENT_KEY
from nodemedic_sandbox.node import burn_in_marker


class NodeAgents:
    def __init__(self, cluster: SimCluster, bus: str, nodes: list[str], heartbeat_s: float = 15.0,
                 poll_s: float = 2.0, table: str | None = None, reassert_s: float = 60.0,
                 scheduled_s: float = 300.0) -> None:
        self.scheduled_s = scheduled_s  # how often an agent reads its instance's scheduled events
        self.cluster = cluster
        self.bus = bus
        self.table = table  # the stack's ledger: where an agent reads the pipeline's decision on its events
        self.reassert_s = reassert_s
        self.nodes = nodes
        self.heartbeat_s = heartbeat_s
        self.poll_s = poll_s
        self.agents: dict[str, Agent] = {}
        self.sims: dict[str, SimulatedNode] = {}

    def start(self) -> NodeAgents:
        for node in self.nodes:
            self.start_node(node)
        return self

    def start_node(self, node: str) -> Agent:
        root = self.cluster.state_dir / "agents" / node
        sim = self.sims[node] = SimulatedNode(root / "hw").create(gpus=8, efa=4)
        instance_id = self.cluster.instance_of(node)
        config = parse_config({
            "cluster": self.cluster.name, "event_bus": self.bus, "region": self.cluster.aws.region,
            "node": {"instance_id": instance_id, "slurm_node": node, "hostname": f"{node}.local"},
            "intervals": {"heartbeat_seconds": self.heartbeat_s, "poll_seconds": self.poll_s,
                          "reassert_seconds": self.reassert_s, "scheduled_events_seconds": self.scheduled_s},
            "expected": {"gpus": 8, "efa_devices": 4},
            "kernel_log": {"source": "file", "path": str(sim.kmsg_path)},
            "hardware": {"backend": "simulated", "simulated_dir": str(sim.dir)},
            "publish": {"spool_dir": str(root / "spool"), "max_backoff_seconds": 2,
                        "acknowledgements_table": self.table},
            "burn_in": {"marker": str(self.marker(node)), "drain_prefix": self.cluster.drain_prefix,
                        "retry_seconds": 10},
        }, origin=f"agent config of {node}")
        identity = NodeIdentity(instance_id=instance_id, hostname=f"{node}.local", slurm_node=node)
        # signed as the nodes' instance role: the local IAM holds the agent to the stack's AgentPublishPolicy
        credentials = {"aws_access_key_id": AGENT_KEY, "aws_secret_access_key": "local"}
        agent = self.agents[node] = Agent(config, SimulatedHardware(sim.dir), identity,
                                          events_client(config, **credentials),
                                          acks=acknowledgements(config, **credentials),
                                          metadata=self._metadata(instance_id))
        return agent.start()

    def marker(self, node: str) -> Path:
        return burn_in_marker(self.cluster.state_dir, node)

    def boot(self, node: str) -> HoldResult:
        """The instance behind ``node`` boots again outside NodeMedic (an operator's reboot, a
        repair by hand): as on a real node, the burn-in hold runs before slurmd starts (slurmd's
        drop-in), then slurmd, then the agent, which publishes NODE_JOINED for the hold."""
        if node in self.agents:
            self.agents.pop(node).stop(graceful=False)
        self.cluster.scheduler.stop_node(node)
        self.marker(node).unlink(missing_ok=True)  # /run is empty after a boot
        result = hold(node, self.cluster.instance_of(node), prefix=self.cluster.drain_prefix,
                      marker=self.marker(node), env=self.cluster.scheduler.env, retry_s=10)
        self.cluster.scheduler.start_node(node)
        self.start_node(node)
        return result

    def inject(self, node: str, fault: str, **kwargs: Any) -> None:
        self.sims[node].inject(fault, **kwargs)

    def kill(self, node: str) -> None:
        """The node dies: its agent stops without a goodbye heartbeat."""
        self.agents.pop(node).stop(graceful=False)

    def stop_node(self, node: str) -> None:
        """A clean shutdown: the agent says goodbye and the cloud stops watching the node."""
        self.agents.pop(node).stop(graceful=True, flush_timeout_s=1.0)

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop(graceful=True, flush_timeout_s=1.0)
        self.agents.clear()


    def _metadata(self, instance_id: str) -> Callable[[str], str]:
        """A simulated node's instance metadata: an on-demand instance, so its agent reads no Spot
        interruption notice (the local mode sends EC2's warning through EventBridge instead); its
        scheduled events are those the embedded EC2 holds for the instance, in IMDS's shape (EC2
        User Guide, "View scheduled events"), the ones over in the history, each path 404 while
        empty."""
        def metadata(path: str) -> str:
            if path == LIFE_CYCLE:
                return "on-demand"
            if path not in (SCHEDULED, HISTORY):
                raise OSError(f"no instance metadata {path} in the local mode")
            events = [_imds_event(e) for e in self.cluster.aws.scheduled_events_of(instance_id)]
            shown = [e for e in events if (e["State"] == "active") == (path == SCHEDULED)]
            if not shown:
                raise urllib.error.HTTPError(f"http://169.254.169.254/latest/meta-data/{path}", 404, "Not Found",
                                             Message(), None)
            return json.dumps(shown)
        return metadata


def _imds_event(event: dict[str, str]) -> dict[str, str]:
    """A scheduled event as ``DescribeInstanceStatus`` holds it, as instance metadata shows it."""
    def when(iso: str) -> str:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).strftime("%d %b %Y %H:%M:%S GMT")
    over = event["Description"].startswith(ENDED_EVENT)
    shown = {"Code": event["Code"], "Description": event["Description"], "EventId": event["InstanceEventId"],
             "NotBefore": when(event["NotBefore"]),
             "State": ("canceled" if "Canceled" in event["Description"] else "completed") if over else "active"}
    return shown | ({"NotAfter": when(event["NotAfter"])} if event.get("NotAfter") else {})
