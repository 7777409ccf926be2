"""Where the agent reads the node: real NVML/sysfs/OS, or a simulated node for tests and the demo."""

from __future__ import annotations

from nodemedic_agent.config import AgentConfig
from nodemedic_agent.hardware.base import Hardware


def open_hardware(config: AgentConfig) -> Hardware:
    """The backend the config names. NVML that cannot start is not fatal: its checks report
    a check error instead (see :class:`~nodemedic_agent.hardware.nvml.NvmlHardware`)."""
    if config.hardware.backend == "simulated":
        from nodemedic_agent.hardware.simulated import SimulatedHardware

        if not config.hardware.simulated_dir:
            raise ValueError("hardware.simulated_dir is required with hardware.backend = 'simulated'")
        return SimulatedHardware(config.hardware.simulated_dir)
    from nodemedic_agent.hardware.nvml import NvmlHardware

    return NvmlHardware(config.hardware.sysfs_root, dcgm=config.hardware.dcgm)
