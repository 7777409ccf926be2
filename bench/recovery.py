"""Job downtime with and without a hot spare, on the local stack with real Slurm.

One 4-node training job fills the cluster's 4 nodes. Faults (XID 79: replace) hit a node of the
job, one at a time; each incident is awaited until closed. With a spare (``HotSpares=1``) the
requeued job starts on the spare at once and the failed node is replaced and fully checked
behind it, then joins the pool; without one, the job waits for the replacement to boot, pass
the quick check and be resumed. Boot time is simulated: a new or rebooted instance answers SSM
only ``--boot-seconds`` after its launch (default 9 s = the published ~900 s divided by 100, the
scale of the pipeline's retry waits here: one clock for both).

Measured per incident: job downtime = the job's new start (Slurm's StartTime) - the fault's
observed_at; time to recover (incident closed - observed_at); Step Functions state transitions
(states entered + retries, from the execution history) and Lambda invocations (every run of a
function while the incident was open, the callback's HealthCheckResult included).
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from nodemedic_sandbox.local import LocalMode

from bench.pipeline import PERMISSIVE_POLICY, history_counts
from bench.results import record, summarize

PUBLISHED_BOOT_S = 900  # HyperPod's replace step (~15 min), the time a new instance takes
TIME_SCALE = 0.01  # the retry waits of the state machine, and the default boot: both 1/100 of AWS's


def run(spares: int, faults: int, boot_s: float) -> dict[str, list[float]]:
    label = f"{'with' if spares else 'without'} a hot spare"
    out: dict[str, list[float]] = {"downtime": [], "recover": [], "transitions": [], "invocations": []}
    with LocalMode(nodes=4, spares=spares, boot_seconds=boot_s, scheduler="slurm", retry_time_scale=TIME_SCALE,
                   extra_parameters=PERMISSIVE_POLICY) as local:
        sfn = local.aws.client("stepfunctions")
        job = local.scheduler.submit(4, name="train")
        _running(local, job, 60)
        print(f"{label}: {local.scheduler_note}; {faults} faults, boot {boot_s:g} s", flush=True)
        for i in range(faults):
            nodes = local.scheduler.hostnames(local.scheduler.job(job)["NodeList"])
            sick = nodes[i % len(nodes)]
            invoked_before = len(local.aws.invocations)
            before = {e["name"] for e in local.executions()}
            put = time.time()
            local.put_event(local.health_event(sick, "XID 79", observed_at=datetime.fromtimestamp(put, UTC)))
            [execution] = [e for e in local.wait_for_executions(i + 1, timeout=300) if e["name"] not in before]
            incident = local.incident(execution["name"])
            if execution["status"] != "SUCCEEDED" or incident.status != "closed":
                raise SystemExit(f"{label}: fault {i} on {sick}: {execution['status']} {incident.status} "
                                 f"{execution.get('cause')}")
            if bool(incident.stages["spare"].result["spare"]) != bool(spares):
                raise SystemExit(f"{label}: fault {i} used spare {incident.stages['spare'].result}")
            running = incident.stages["jobs"].result["running"]
            if job not in running:
                raise SystemExit(f"{label}: fault {i}: job {job} not running again: {incident.stages['jobs'].result}")
            counts = history_counts(sfn, execution["executionArn"])
            out["downtime"].append(running[job])
            out["recover"].append((incident.closed_at - incident.observed_at).total_seconds())
            out["transitions"].append(counts["transitions"])
            # every Lambda run for the incident, the ones Step Functions does not schedule itself
            # included (the callback task's, and HealthCheckResult's from the SSM event)
            out["invocations"].append(len(local.aws.invocations) - invoked_before)
            _running(local, job, 60)
            if (i + 1) % 5 == 0:
                print(f"  {i + 1}/{faults}: job downtime p50 {sorted(out['downtime'])[len(out['downtime']) // 2]:.1f} s",
                      flush=True)
    return out


def _running(local: LocalMode, job: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while local.scheduler.job(job)["JobState"] != "RUNNING":
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job} not running: {local.scheduler.job(job)}")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=25, help="faults per run (two runs: with and without a spare)")
    parser.add_argument("--boot-seconds", type=float, default=PUBLISHED_BOOT_S * TIME_SCALE,
                        help="simulated boot of a new or rebooted instance (default: 900 s / 100, the scale of "
                             "the retry waits)")
    args = parser.parse_args()
    cmd = f"make bench (python -m bench.recovery --faults {args.faults} --boot-seconds {args.boot_seconds:g})"
    common = {"boot_seconds": args.boot_seconds, "boot_scale": f"published {PUBLISHED_BOOT_S} s / "
              f"{PUBLISHED_BOOT_S / args.boot_seconds:g}", "retry_scale": f"1/{1 / TIME_SCALE:g}",
              "fault": "XID 79 -> replace; one 4-node job fills 4 nodes"}
    results = []
    for spares in (1, 0):
        m = run(spares, args.faults, args.boot_seconds)
        how = "with a hot spare" if spares else "without a spare (replace, then resume)"
        results += [
            summarize(f"recovery {how}: job downtime (fault -> job RUNNING again)", "s", m["downtime"], cmd, **common),
            summarize(f"recovery {how}: time to recover (fault -> incident closed)", "s", m["recover"], cmd, **common),
            summarize(f"recovery {how}: Step Functions state transitions per incident", "transitions",
                      m["transitions"], cmd, target="<= 30"),
            summarize(f"recovery {how}: Lambda invocations per incident", "invocations", m["invocations"], cmd),
        ]
    record(results)


if __name__ == "__main__":
    main()
