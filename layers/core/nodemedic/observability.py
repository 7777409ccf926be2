"""Logging and metrics helpers shared by the stage handlers."""

from __future__ import annotations

from datetime import UTC, datetime

from aws_lambda_powertools import Metrics, single_metric
from aws_lambda_powertools.metrics import MetricUnit

from nodemedic.contracts.events import INSTANCE_LOST
from nodemedic.contracts.incident import IncidentRef

NAMESPACE = "NodeMedic"


def utc_now() -> datetime:
    return datetime.now(UTC)


def seconds_since_fault(incident: IncidentRef) -> float:
    """Seconds from the fault (``observed_at``) to now: every TimeTo* metric is measured so."""
    return (utc_now() - incident.observed_at).total_seconds()


def record_durations(metrics: Metrics, incident: IncidentRef, durations: dict[str, float]) -> None:
    """Emit ``TimeTo*`` metrics (seconds from the fault) with dimensions Cluster and FaultClass,
    and each once more with Cluster alone (what the dashboard's stage view and the MTTR alarm read:
    an alarm cannot aggregate across dimension values). A burn-in (a node that joined) is
    recorded under FaultClass ``burn_in`` only, and a lost instance's rejoin (``INSTANCE_LOST``:
    EC2 ended a Slurm node's instance) under ``instance_lost`` only: neither is a failure, so
    neither is in the cluster's MTTR.

    Node and incident ids are metadata, never dimensions (keeps cardinality low).
    """
    metrics.add_dimension(name="Cluster", value=incident.cluster)
    metrics.add_dimension(name="FaultClass", value=incident.fault_class)
    for name, seconds in durations.items():
        metrics.add_metric(name=name, unit=MetricUnit.Seconds, value=max(0.0, seconds))
        if incident.action == "burn_in" or incident.fault_code == INSTANCE_LOST:
            continue  # a joined node's check, a Spot node's rejoin: no failure, not in MTTR or its alarm
        with single_metric(name=name, unit=MetricUnit.Seconds, value=max(0.0, seconds), namespace=NAMESPACE,
                           default_dimensions={"Cluster": incident.cluster}):
            pass
    metrics.add_metadata(key="incident", value=incident.incident_id)
    metrics.add_metadata(key="node", value=incident.slurm_node)
    metrics.add_metadata(key="instance", value=incident.instance_id)
