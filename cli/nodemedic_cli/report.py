"""MTTD/MTTR and per-stage durations from the incident ledger, as numbers and as one HTML page.

Every duration is measured as the pipeline measures it: from the fault's ``observed_at``.
MTTD = detected_at - observed_at; MTTR = closed_at - observed_at (closed incidents only: held,
failed, quarantined ones did not recover); job downtime = the requeued jobs RUNNING again;
a stage's duration = its completed_at - started_at.
"""

from __future__ import annotations

import html
import statistics
from collections import defaultdict
from datetime import datetime
from typing import Any

from nodemedic.contracts.incident import STAGES, Incident
from nodemedic.contracts.stages import DrainOutput
from pydantic import BaseModel, Field, ValidationError

STAGE_COLOURS = {"detect": "#6c757d", "gate": "#adb5bd", "verify": "#17a2b8", "drain": "#fd7e14",
                 "approval": "#ffc107", "spare": "#20c997", "jobs": "#28a745", "repair": "#dc3545",
                 "resume": "#007bff", "shadow": "#6f42c1"}


class Stat(BaseModel):
    n: int
    p50: float | None
    p90: float | None


class ClassReport(BaseModel):
    fault_class: str
    incidents: int
    recovered: int
    mttd_s: Stat
    mttr_s: Stat
    job_downtime_s: Stat
    stages_s: dict[str, Stat]


class Degraded(BaseModel):
    """A node marked DEGRADED (slow, not dead) and what showed it."""

    slurm_node: str
    incident_id: str
    fault_code: str
    status: str
    detected_at: datetime
    evidence: str


class TrainingTime(BaseModel):
    """What the incidents cost training, measured from the ledger (the ETTR-relevant figures):
    planned (announced ahead) and unplanned apart."""

    kind: str  # "planned" or "unplanned"
    incidents: int
    jobs_requeued: int
    job_downtime_s: float = Field(description="sum over incidents of the requeued jobs' longest downtime")
    jobs_checkpointed: int = Field(description="jobs that reported their checkpoint before the requeue")
    work_saved_s: float = Field(description="work the checkpoints before the requeues kept")
    work_lost_s: float = Field(description="work since the last checkpoint at the requeues (where measured)")


class Report(BaseModel):
    since: datetime | None
    incidents: int
    by_status: dict[str, int]
    overall: ClassReport = Field(description="failures only: a joined node's burn-in is no failure")
    by_fault_class: list[ClassReport]
    degraded: list[Degraded] = Field(default_factory=list)
    training_time: list[TrainingTime] = Field(default_factory=list)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, -(-len(ordered) * int(q) // 100)) - 1]


def stat(values: list[float]) -> Stat:
    if not values:
        return Stat(n=0, p50=None, p90=None)
    return Stat(n=len(values), p50=round(statistics.median(values), 3), p90=round(_pct(values, 90), 3))


def in_period(incidents: list[Incident], since: datetime | None) -> list[Incident]:
    """Incidents detected since ``since``: the server's clock, not the node's (a node whose clock
    was years off must not hide its incident from the report)."""
    return [i for i in incidents if since is None or i.detected_at >= since]


def mttd_values(incidents: list[Incident]) -> list[float]:
    return [(i.detected_at - i.observed_at).total_seconds() for i in incidents]


def mttr_values(incidents: list[Incident]) -> list[float]:
    """Recovered (closed) incidents only: held, failed, quarantined ones did not recover."""
    return [(i.closed_at - i.observed_at).total_seconds() for i in incidents if i.status == "closed" and i.closed_at]


def _job_downtime(incident: Incident) -> float | None:
    """The requeued jobs' longest downtime, as the jobs stage recorded it; None where it recorded
    no number (no jobs stage, or a value that is not one)."""
    jobs = incident.stages.get("jobs")
    d = jobs.result.get("job_downtime_s") if jobs else None
    return float(d) if isinstance(d, int | float) and not isinstance(d, bool) else None


def _class_report(name: str, incidents: list[Incident]) -> ClassReport:
    mttd, mttr = mttd_values(incidents), mttr_values(incidents)
    downtime = [d for d in map(_job_downtime, incidents) if d is not None]
    stages: dict[str, list[float]] = defaultdict(list)
    for i in incidents:
        for stage, record in i.stages.items():
            if record.completed_at:
                stages[stage].append((record.completed_at - record.started_at).total_seconds())
    return ClassReport(fault_class=name, incidents=len(incidents), recovered=len(mttr), mttd_s=stat(mttd),
                       mttr_s=stat(mttr), job_downtime_s=stat(downtime),
                       stages_s={s: stat(stages[s]) for s in STAGES if stages.get(s)})


def _training_time(kind: str, incidents: list[Incident]) -> TrainingTime:
    requeued = checkpointed = 0
    downtime = 0.0
    saved = lost = 0.0
    for i in incidents:
        drain = i.stages.get("drain")
        if drain and drain.completed_at:
            try:
                out = DrainOutput.model_validate(drain.result)
            except ValidationError:  # a record written by another version: counted as far as it goes
                continue
            requeued += len(out.requeued_jobs)
            if out.checkpoint:
                checkpointed += sum(job.outcome == "checkpointed" for job in out.checkpoint.jobs)
                saved += out.checkpoint.work_saved_s
                lost += out.checkpoint.work_lost_s
        downtime += _job_downtime(i) or 0.0
    return TrainingTime(kind=kind, incidents=len(incidents), jobs_requeued=requeued, job_downtime_s=round(downtime, 1),
                        jobs_checkpointed=checkpointed, work_saved_s=round(saved, 1), work_lost_s=round(lost, 1))


def build(incidents: list[Incident], since: datetime | None = None) -> Report:
    chosen = in_period(incidents, since)
    classes: dict[str, list[Incident]] = defaultdict(list)
    for i in chosen:
        classes[i.fault_class].append(i)
    statuses: dict[str, int] = defaultdict(int)
    for i in chosen:
        statuses[i.status] += 1
    degraded = [Degraded(slurm_node=i.slurm_node, incident_id=i.incident_id, fault_code=i.fault_code, status=i.status,
                         detected_at=i.detected_at, evidence=_evidence(i))
                for i in chosen if i.action == "degrade"]
    return Report(since=since, incidents=len(chosen), by_status=dict(sorted(statuses.items())),
                  overall=_class_report("all failures", [i for i in chosen if i.action != "burn_in"]),
                  by_fault_class=[_class_report(c, classes[c]) for c in sorted(classes)], degraded=degraded,
                  training_time=[_training_time("planned", [i for i in chosen if i.fault_class == "planned"]),
                                 _training_time("unplanned", [i for i in chosen if i.fault_class != "planned"
                                                              and i.action != "burn_in"])])


def _evidence(incident: Incident) -> str:
    """What the detecting event said: its summary, else its raw facts."""
    detect = incident.stages.get("detect")
    facts = detect.result.get("evidence", {}) if detect else {}
    if not isinstance(facts, dict):
        return ""
    return str(facts.get("summary") or ", ".join(f"{k}={v}" for k, v in facts.items()))


# -- the HTML page -------------------------------------------------------------------------
def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _timeline(incidents: list[Incident]) -> str:
    """One row per incident: its stages as bars on a shared axis of seconds since the fault."""
    rows = [i for i in sorted(incidents, key=lambda i: i.observed_at) if i.stages]
    if not rows:
        return "<p>No incidents in the period.</p>"
    ends = [max([(r.completed_at or r.started_at) for r in i.stages.values()] + [i.closed_at or i.detected_at])
            for i in rows]
    longest = max(1.0, *((e - i.observed_at).total_seconds() for i, e in zip(rows, ends, strict=True)))
    step = _tick(longest / 6)
    ticks = int(-(-longest // step))
    span = ticks * step
    left, width, row_h, right = 230, 720, 22, 110
    height = 40 + row_h * len(rows)
    scale = width / span
    parts = [f'<svg class="timeline" viewBox="0 0 {left + width + right} {height}" width="100%" '
             f'role="img" aria-label="Incident stage timeline">']
    for k in range(ticks + 1):  # axis
        x = left + k * step * scale
        parts.append(f'<line x1="{x:.1f}" y1="20" x2="{x:.1f}" y2="{height - 10}" stroke="#e9ecef"/>'
                     f'<text x="{x:.1f}" y="14" class="axis" text-anchor="middle">{k * step} s</text>')
    for n, inc in enumerate(rows):
        y = 26 + n * row_h
        label = f"{inc.incident_id[:8]} {inc.slurm_node} {inc.fault_code}"
        parts.append(f'<text x="4" y="{y + 13}" class="label">{html.escape(label)}</text>')
        for stage in STAGES:
            record = inc.stages.get(stage)
            if record is None:
                continue
            start = max(0.0, (record.started_at - inc.observed_at).total_seconds())
            end = max(start, ((record.completed_at or record.started_at) - inc.observed_at).total_seconds())
            w = max(2.0, (end - start) * scale)
            parts.append(f'<rect x="{left + start * scale:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 6}" '
                         f'rx="2" fill="{STAGE_COLOURS[stage]}"><title>{stage}: {start:.1f}–{end:.1f} s'
                         f'</title></rect>')
        mark = "✔ recovered" if inc.status == "closed" else inc.status
        parts.append(f'<text x="{left + width + 8}" y="{y + 13}" class="label">{html.escape(mark)}</text>')
    parts.append("</svg>")
    legend = "".join(f'<span class="key"><i style="background:{c}"></i>{s}</span>' for s, c in STAGE_COLOURS.items())
    return "".join(parts) + f'<div class="legend">{legend}</div>'


def _tick(at_least: float) -> int:
    """The first round axis step (seconds) not below ``at_least``: 1, 2, 5, 10, 15, 30 s, minutes,
    hours, days, then whole multiples of days: any duration gets an axis."""
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if step >= at_least:
            return step
    return 86400 * int(-(-at_least // 86400))


def _histogram(title: str, values: list[float], colour: str) -> str:
    if not values:
        return f"<figure><figcaption>{title}: no data</figcaption></figure>"
    top = max(1.0, *values)
    bins = 10
    counts = [0] * bins
    for v in values:  # a negative duration (a node clock before the fix) counts in the first bin
        counts[max(0, min(bins - 1, int(v / top * bins)))] += 1
    peak = max(counts)
    w, h = 420, 160
    bars = "".join(
        f'<rect x="{30 + k * (w - 40) / bins:.1f}" y="{h - 25 - c / peak * (h - 45):.1f}" '
        f'width="{(w - 40) / bins - 3:.1f}" height="{c / peak * (h - 45):.1f}" fill="{colour}">'
        f'<title>{top * k / bins:.1f}–{top * (k + 1) / bins:.1f} s: {c}</title></rect>'
        for k, c in enumerate(counts))
    axis = (f'<text x="30" y="{h - 8}" class="axis">0 s</text>'
            f'<text x="{w - 10}" y="{h - 8}" class="axis" text-anchor="end">{top:.1f} s</text>')
    s = stat(values)
    return (f'<figure><svg viewBox="0 0 {w} {h}" width="{w}">{bars}{axis}</svg>'
            f'<figcaption>{title}: p50 {_fmt(s.p50)} s, p90 {_fmt(s.p90)} s (n={s.n})</figcaption></figure>')


def render_html(report: Report, incidents: list[Incident], title: str) -> str:
    chosen = in_period(incidents, report.since)
    mttd, mttr = mttd_values(chosen), mttr_values(chosen)
    rows = "".join(
        f"<tr><td>{html.escape(c.fault_class)}</td><td>{c.incidents}</td><td>{c.recovered}</td>"
        f"<td>{_fmt(c.mttd_s.p50)}</td><td>{_fmt(c.mttd_s.p90)}</td><td>{_fmt(c.mttr_s.p50)}</td>"
        f"<td>{_fmt(c.mttr_s.p90)}</td><td>{_fmt(c.job_downtime_s.p50)}</td><td>{_fmt(c.job_downtime_s.p90)}</td></tr>"
        for c in [*report.by_fault_class, report.overall])
    stages = "".join(f"<tr><td>{s}</td><td>{v.n}</td><td>{_fmt(v.p50)}</td><td>{_fmt(v.p90)}</td></tr>"
                     for s, v in report.overall.stages_s.items())
    statuses = ", ".join(f"{k}: {v}" for k, v in report.by_status.items()) or "none"
    degraded = ("<table><tr><th>node</th><th>incident</th><th>fault</th><th>status</th><th>evidence</th></tr>" + "".join(
        f"<tr><td>{html.escape(d.slurm_node)}</td><td>{html.escape(d.incident_id)}</td><td>{html.escape(d.fault_code)}"
        f"</td><td>{html.escape(d.status)}</td><td style='text-align:left'>{html.escape(d.evidence)}</td></tr>"
        for d in report.degraded) + "</table>") if report.degraded else "<p>none</p>"
    training = "".join(
        f"<tr><td>{t.kind}</td><td>{t.incidents}</td><td>{t.jobs_requeued}</td><td>{t.job_downtime_s:.0f}</td>"
        f"<td>{t.jobs_checkpointed}</td><td>{t.work_saved_s:.0f}</td><td>{t.work_lost_s:.0f}</td></tr>"
        for t in report.training_time)
    period = f"since {report.since:%Y-%m-%d %H:%M} UTC" if report.since else "all incidents in the ledger"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font: 14px/1.45 system-ui, -apple-system, Segoe UI, sans-serif; margin: 24px; color: #212529; }}
h1 {{ font-size: 22px; margin: 0 0 4px; }} h2 {{ font-size: 16px; margin: 28px 0 8px; }}
.sub {{ color: #6c757d; }} table {{ border-collapse: collapse; }}
td, th {{ border-bottom: 1px solid #dee2e6; padding: 4px 10px; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }} th {{ background: #f8f9fa; }}
.axis {{ font-size: 10px; fill: #6c757d; }} .label {{ font-size: 11px; fill: #212529; }}
.legend {{ margin-top: 6px; }} .key {{ margin-right: 12px; font-size: 12px; }}
.key i {{ display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }}
figure {{ display: inline-block; margin: 0 24px 0 0; }} figcaption {{ font-size: 12px; color: #495057; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<div class="sub">{period} · {report.incidents} incidents ({statuses}) · seconds from each fault's observed_at</div>
<h2>Stage timeline per incident</h2>
{_timeline(chosen)}
<h2>MTTD and MTTR</h2>
{_histogram("MTTD", mttd, "#6c757d")}{_histogram("MTTR (recovered incidents)", mttr, "#007bff")}
<h2>By fault class</h2>
<table><tr><th>fault class</th><th>incidents</th><th>recovered</th><th>MTTD p50</th><th>MTTD p90</th>
<th>MTTR p50</th><th>MTTR p90</th><th>job down p50</th><th>job down p90</th></tr>{rows}</table>
<h2>Training time (seconds): planned and unplanned incidents</h2>
<table><tr><th>incidents</th><th>n</th><th>jobs requeued</th><th>job downtime</th><th>jobs checkpointed first</th>
<th>work saved</th><th>work lost</th></tr>{training}</table>
<h2>Degraded nodes (slow, not dead: drained after their job)</h2>
{degraded}
<h2>Stage durations (all incidents)</h2>
<table><tr><th>stage</th><th>n</th><th>p50</th><th>p90</th></tr>{stages}</table>
</body></html>
"""


def as_dict(report: Report) -> dict[str, Any]:
    return report.model_dump(mode="json")
