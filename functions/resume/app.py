"""Resume stage: return the node (to service or the spare pool), see the jobs RUNNING, close;
or await the requeued jobs only; or end the incident quarantined / escalated / failed / retired."""

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext
from nodemedic import wiring
from nodemedic.aws_retries import throttling_is_retryable
from nodemedic.contracts.stages import JobsOutput, ResumeInput
from nodemedic.observability import record_durations, utc_now
from nodemedic.settings import settings
from nodemedic.stages.failure import fail
from nodemedic.stages.resume import await_jobs, end_unrecovered, resume, retire

logger = Logger(service="resume")
metrics = Metrics()


def _job_downtime(incident: Any, jobs: JobsOutput | None) -> None:
    if jobs and jobs.running:
        record_durations(metrics, incident, {"JobDowntime": jobs.job_downtime_s or 0.0})


def _release_claims(incident_id: str) -> None:
    """Once the incident has ended, the spare and the replacement it claimed are free again. Never
    fails the step: the reconciler releases what is left."""
    try:
        released = wiring.ledger().release_claims(incident_id)
    except Exception as exc:  # noqa: BLE001 - the incident has ended; the reconciler's run releases them
        logger.warning("claims not released; the reconciler releases them", error=str(exc)[:300])
    else:
        if released:
            logger.info("claims released", claims=[f"{c.kind} {c.key}" for c in released])


@logger.inject_lambda_context
@throttling_is_retryable
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = ResumeInput.model_validate(event)
    logger.append_keys(incident=request.incident.incident_id, node=request.incident.slurm_node, step=request.step)
    out = _step(request)
    if request.step != "jobs":  # every other step ends the incident
        _release_claims(request.incident.incident_id)
    return out


def _step(request: ResumeInput) -> dict[str, Any]:
    incident = request.incident
    s = settings()
    if request.step == "fail":
        ended = fail(incident, request.error, orchestrator=wiring.orchestrator(), ledger=wiring.ledger(),
                     prefix=s.drain_reason_prefix, clock=utc_now)
        logger.error("incident failed", status=ended.status, page=ended.message)
        return ended.model_dump(mode="json")
    if request.step in ("quarantine", "escalate"):
        ended = end_unrecovered(incident, "quarantined" if request.step == "quarantine" else "escalated",
                                ledger=wiring.ledger(), clock=utc_now, error=request.error, reason=request.reason)
        logger.warning("incident not recovered", status=ended.status, page=ended.message)
        return ended.model_dump(mode="json")
    if request.step == "retire":
        ended = retire(incident, ledger=wiring.ledger(), clock=utc_now)
        logger.info("incident retired", status=ended.status, outcome=ended.message)
        return ended.model_dump(mode="json")
    if request.step == "jobs":
        jobs = await_jobs(incident, orchestrator=wiring.orchestrator(), ledger=wiring.ledger(),
                          wait_s=s.job_start_wait_seconds, clock=utc_now)
        logger.info("requeued jobs", running=jobs.running, pending=jobs.pending)
        _job_downtime(incident, jobs)
        return jobs.model_dump(mode="json")
    out = resume(incident, request.destination, orchestrator=wiring.orchestrator(), ledger=wiring.ledger(),
                 prefix=s.drain_reason_prefix, job_wait_s=s.job_start_wait_seconds, pool_size=s.hot_spares,
                 clock=utc_now, hands_off=wiring.hands_off)
    if out.retired:  # its capacity ends: kept drained, so not recovered (no TimeToRecover)
        logger.info("incident retired", node_state=out.node_state)
        return out.model_dump(mode="json")
    logger.info("incident closed", resumed=out.resumed, destination=out.destination, node_state=out.node_state)
    record_durations(metrics, incident, {"TimeToResume": out.time_to_recover_s,
                                         "TimeToRecover": out.time_to_recover_s})
    if request.destination == "service":  # with a spare, AwaitJobs recorded the job's downtime already
        _job_downtime(incident, out.jobs)
    return out.model_dump(mode="json")
