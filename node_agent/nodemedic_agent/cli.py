"""``nodemedic-agent``: run the agent, check a node once, hold a joining node for its burn-in, validate a
config, simulate faults."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodemedic_agent import __version__
from nodemedic_agent.config import DEFAULT_PATH, AgentConfig, ConfigError, load_config
from nodemedic_agent.watchdog import Stall, Worker

if TYPE_CHECKING:
    from nodemedic_agent.agent import Agent
    from nodemedic_agent.checks.base import CheckResult
    from nodemedic_agent.checks.polled import PolledChecks

EXIT_CONFIG = 2


def _config(args: argparse.Namespace) -> AgentConfig:
    return load_config(Path(args.config))


def _agent(config: AgentConfig, dry_run: bool) -> Agent:  # imported lazily: boto3 is slow to import
    from nodemedic_agent.agent import Agent, acknowledgements, events_client
    from nodemedic_agent.hardware import open_hardware
    from nodemedic_agent.identity import resolve_identity

    if dry_run:  # a dry run needs no AWS access at all
        return Agent(config, open_hardware(config), resolve_identity(config), None, dry_run=True)
    return Agent(config, open_hardware(config), resolve_identity(config), events_client(config),
                 acks=acknowledgements(config))


def cmd_run(args: argparse.Namespace) -> int:
    config = _config(args)
    agent = _agent(config, args.dry_run)
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    pending = len(agent.spool)
    logging.info("nodemedic-agent %s watching %s (%s) for cluster %s on bus %s; %d spooled events to deliver",
                 __version__, agent.node.slurm_node, agent.node.instance_id, config.cluster, config.event_bus, pending)
    failed: list[Exception] = []

    def start() -> None:
        try:
            agent.start()
        except Exception as exc:  # noqa: BLE001 - an agent that cannot start stops, saying why
            logging.exception("the agent could not start")
            failed.append(exc)
            stopped.set()

    # Started on a thread: its first GPU reading blocks for as long as a wedged driver does, and
    # this thread must still answer SIGTERM (systemd kills the agent 90 s after asking).
    threading.Thread(target=start, name="nodemedic-start", daemon=True).start()
    stopped.wait()
    logging.info("stopping: goodbye heartbeat, then flushing %d spooled events", len(agent.spool))
    agent.stop(graceful=True)
    return 1 if failed else 0


PROGRESS_S = 5.0  # check, health-check: how often a poll that has not returned says what it waits for


def _watched(poll: Callable[[], list[CheckResult]], checks: PolledChecks) -> tuple[list[CheckResult], list[Stall]]:
    """One poll of every check, on a thread of its own: a check that does not return (NVML on a
    wedged driver, a hung file system) would hang the command for good. Says on stderr what it
    waits for; gives up once a check has run past ``thresholds.check_stall_seconds`` (0: waits for
    ever) and returns the stalls instead of results, leaving the hung call behind."""
    worker = Worker(poll, "nodemedic-check")
    while not worker.wait(PROGRESS_S):
        for stall in checks.watchdog.stalls(0)[:1]:
            print(f"waiting for {stall.what}: {stall.seconds:.0f}s", file=sys.stderr, flush=True)
        stalls = checks.stalls()
        if stalls:
            return [], stalls
    return worker.result(), []


def cmd_check(args: argparse.Namespace) -> int:
    from nodemedic_agent.report import human

    config = _config(args)
    agent = _agent(config, args.dry_run)
    while True:
        results, stalls = _watched(agent.poll_once, agent.checks)
        if stalls:
            agent.report_stalls()  # CHECK_STALLED
            print(f"a check has not returned for {config.thresholds.check_stall_seconds:g}s (CHECK_STALLED): "
                  "the node cannot be checked", flush=True)
            _deliver(agent, config, args.dry_run)
            return 1
        print(human(results, agent.node, config.cluster), flush=True)
        _deliver(agent, config, args.dry_run)
        if args.once:
            return 0 if all(r.status == "healthy" for r in results) else 1
        agent.stop_event.wait(config.intervals.poll_seconds)


def _deliver(agent: Agent, config: AgentConfig, dry_run: bool) -> None:
    if not dry_run and agent.published:
        delivered = agent.publisher.flush(10.0)
        where = "delivered to " + config.event_bus if delivered else (
            f"NOT delivered ({agent.publisher.last_error}); kept in {agent.spool.dir} for the agent to send")
        print(f"{agent.published} event(s) {where}", flush=True)


def _instance_type() -> str | None:
    from nodemedic_agent.identity import imds

    try:
        return imds("instance-type", timeout_s=0.5)
    except OSError:
        return None


def cmd_health_check(args: argparse.Namespace) -> int:
    import time

    from nodemedic_agent.checks.base import CheckResult
    from nodemedic_agent.checks.deep import StalledError, full_checks, profile, settle
    from nodemedic_agent.checks.polled import PolledChecks
    from nodemedic_agent.hardware import open_hardware
    from nodemedic_agent.hardware.base import HardwareError
    from nodemedic_agent.identity import resolve_identity
    from nodemedic_agent.report import fitted, machine

    started = time.monotonic()
    config = _config(args)
    node = profile(args.instance_type or _instance_type(), config.expected.gpus)
    hardware = open_hardware(config)
    polled = PolledChecks(hardware, config)
    settle_s = node.settle_seconds if args.settle_seconds is None else args.settle_seconds

    def poll() -> list[CheckResult]:
        results, stalls = _watched(polled.run_all, polled)
        if stalls:
            findings = [polled.stalled(s) for s in stalls]
            raise StalledError([CheckResult(f.check, f.summary, [f]) for f in findings])
        return results

    try:
        results, settled = settle(poll, settle_s, args.settle_polls, min(config.intervals.poll_seconds, 5.0))
    except StalledError as stalled:  # the node cannot be checked: waiting longer, or a GPU burn, would hang too
        results, settled = stalled.results, {"stalled": True}
    report = machine(results, args.level, resolve_identity(config).instance_id)
    report["settle"] = settled
    if args.level == "full" and not settled.get("stalled"):
        try:
            visible = len(hardware.gpus())
        except HardwareError:
            visible = node.gpus
        measured = [m.report() for m in full_checks(node, args.dcgm_level, visible)]
        for m in measured:
            if m["ok"] is None and m["name"] in args.require:
                m.update(ok=False, status="failed", detail=f"required, {m['detail']}")
        report["checks"] += measured
        report["not_run"] = [m["name"] for m in measured if m["ok"] is None]
        report["healthy"] = report["healthy"] and all(m["ok"] is not False for m in measured)
    report["instance_type"] = node.instance_type
    report["duration_s"] = round(time.monotonic() - started, 1)
    print(fitted(report))
    return 0 if report["healthy"] else 1


def cmd_burn_in_hold(args: argparse.Namespace) -> int:
    from nodemedic_agent.burn_in import HoldError, hold
    from nodemedic_agent.identity import resolve_identity

    config = _config(args)
    node = resolve_identity(config)
    if not node.slurm_node:
        raise ValueError("burn-in-hold needs the node's Slurm name: set [node] slurm_node")
    b = config.burn_in
    try:
        result = hold(node.slurm_node, node.instance_id, prefix=b.drain_prefix, marker=Path(b.marker),
                      scontrol=b.scontrol,
                      retry_s=b.retry_seconds if args.retry_seconds is None else args.retry_seconds)
    except HoldError as exc:
        print(f"nodemedic-agent: {exc}", file=sys.stderr)
        return 1
    print(result.message, flush=True)
    return 0


def cmd_gpu_reset(args: argparse.Namespace) -> int:
    from nodemedic_agent.gpu_reset import HOLDERS, gpu_reset

    wanted = [g.strip() for g in args.gpus.split(",") if g.strip()] if args.gpus else []
    return gpu_reset(wanted, units=args.stop_unit or HOLDERS, say=lambda line: print(line, flush=True),
                     restore_after_s=args.restore_after)


def cmd_relay(args: argparse.Namespace) -> int:
    import boto3

    from nodemedic_agent.clock import AwsClock
    from nodemedic_agent.identity import resolve_identity, resolve_region
    from nodemedic_agent.relay import Relay

    config = _config(args)
    r = config.relay
    if not (r.queue_url and r.table):
        raise ConfigError(f"{args.config}: [relay] needs queue_url and table (the stack outputs RelayQueueUrl and "
                          "IncidentsTableName)")
    region, aws_time = resolve_region(config), AwsClock()
    # AWS's time for signing and for a request's age: the controller's own clock may be off
    sqs = aws_time.attach(boto3.client("sqs", region_name=region, endpoint_url=r.sqs_endpoint_url))
    ssm = aws_time.attach(boto3.client("ssm", region_name=region, endpoint_url=r.ssm_endpoint_url))
    dynamodb = aws_time.attach(boto3.client("dynamodb", region_name=region, endpoint_url=config.publish.dynamodb_endpoint_url))
    relay = Relay(cluster=config.cluster, instance_id=resolve_identity(config).instance_id, queue_url=r.queue_url,
                  table=r.table, sqs=sqs, ssm=ssm, dynamodb=dynamodb, now=aws_time.aws_now)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: relay.stop_event.set())
    logging.info("nodemedic-agent %s relaying cluster %s's Slurm documents on %s from %s", __version__, config.cluster,
                 relay.instance_id, r.queue_url)
    relay.serve()  # a command running when SIGTERM comes is finished first (the long poll ends within 20 s)
    logging.info("relay stopped: %d command(s) run, %d refused", relay.ran, relay.refused)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    config = _config(args)
    print(f"{args.config}: valid (cluster {config.cluster}, bus {config.event_bus}, hardware {config.hardware.backend})")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from nodemedic_agent.hardware.simulated import FAULTS, SimulatedNode

    if args.sim == "faults":
        for name, what in FAULTS.items():
            print(f"{name:<14} {what}")
        return 0
    node = SimulatedNode(args.dir)
    if args.sim == "init":
        node.create(gpus=args.gpus, efa=args.efa, shared_mounts=tuple(args.shared_mount))
        print(f"simulated node in {args.dir}: {args.gpus} GPUs, {args.efa} EFA devices; kernel log {node.kmsg_path}")
        return 0
    if not (node.dir / "state.json").exists():
        raise ConfigError(f"{args.dir} is not a simulated node (run: nodemedic-agent simulate init {args.dir})")
    extra = {"text": args.text} if args.text else {}
    node.inject(args.fault, gpu=args.gpu, xid=args.xid, efa=args.efa, **extra)
    print(f"injected {args.fault} into {args.dir}")
    return 0


def _number(parse: Callable[[str], float], low: float, high: float, unit: str) -> Callable[[str], Any]:
    """An option's type: a number ``parse`` reads, from ``low`` to ``high`` (NaN is neither: a NaN
    wait never ended, as no time is past it)."""
    def read(text: str) -> float:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of {unit}: {text!r}") from None
        if not low <= value <= high:  # False for NaN
            raise argparse.ArgumentTypeError(f"{text} {unit}: give {low:g} to {high:g}")
        return value
    return read


_seconds = _number(int, 60, 86_400, "seconds")  # the restore timer: long enough for a reset, at most a day
_wait_seconds = _number(float, 0, 3600, "seconds")  # the settle wait, the burn-in hold's retries
_polls = _number(int, 1, 100, "polls")


def parser() -> argparse.ArgumentParser:
    from nodemedic_agent.gpu_reset import RESTORE_AFTER_S

    p = argparse.ArgumentParser(
        prog="nodemedic-agent",
        description="NodeMedic node agent: detects GPU-node faults (NVML XIDs, ECC, NVLink, EFA, kernel log, "
                    "storage) and publishes Node Health Events and heartbeats to EventBridge.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("-c", "--config", default=os.environ.get("NODEMEDIC_AGENT_CONFIG", str(DEFAULT_PATH)),
                   help="TOML configuration file (default: $NODEMEDIC_AGENT_CONFIG or %(default)s)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the agent until SIGTERM (what the systemd unit starts)")
    run.add_argument("--dry-run", action="store_true", help="print events on stdout instead of sending them")
    run.set_defaults(func=cmd_run)

    check = sub.add_parser("check", help="run every polled check and print a health report")
    check.add_argument("--once", action="store_true", help="one report, then exit 0 healthy / 1 unhealthy")
    check.add_argument("--dry-run", action="store_true", help="print the events instead of sending them")
    check.set_defaults(func=cmd_check)

    hc = sub.add_parser("health-check", help="one JSON line {healthy, checks} for the pipeline's health gate")
    hc.add_argument("--level", choices=["quick", "full"], default="quick",
                    help="quick: the agent's checks, judged once settled. full: also DCGM diagnostics (dcgmi diag), "
                         "a GEMM/HBM burn per GPU (PyTorch) and an NCCL all-reduce (all_reduce_perf), each against "
                         "its instance type's threshold; a missing tool is reported 'not run', never a pass. A check "
                         "that has not returned after thresholds.check_stall_seconds, or a GPU burn that does not finish, fails "
                         "the node, naming it")
    hc.add_argument("--instance-type", default=None,
                    help="thresholds and settle time of this type (default: from instance metadata; unknown types "
                         "are measured, not judged)")
    hc.add_argument("--settle-seconds", type=_wait_seconds, default=None,
                    help="repeat the checks for up to this long until --settle-polls in a row are clean, before "
                         "any verdict (after a reboot, GPU reset or replacement NVLinks are still training); "
                         "0 to 3600; default: the instance type's, 0: judge the first poll")
    hc.add_argument("--settle-polls", type=_polls, default=3, help="clean polls in a row that end the settle wait (1 to 100)")
    hc.add_argument("--dcgm-level", type=int, choices=[1, 2, 3, 4], default=3, help="full: dcgmi diag -r LEVEL")
    hc.add_argument("--require", action="append", default=[], choices=["dcgm_diag", "gpu_burn", "nccl_all_reduce"],
                    help="full: this check failing to run fails the node (repeatable)")
    hc.set_defaults(func=cmd_health_check)

    hold = sub.add_parser(
        "burn-in-hold", help="before slurmd starts: drain this node until the pipeline's full deep health check "
                             "passes (a node drained already is left as it is); exit 1 when Slurm cannot be reached",
        description="Run as slurmd's ExecStartPre (systemd/slurmd-burn-in.conf). Drains the node with the reason "
                    "'<drain_prefix>:burn-in <instance> joined' and leaves a marker in /run; the running agent "
                    "publishes NODE_JOINED for it, and the pipeline lifts the drain only once the full check passes.")
    hold.add_argument("--retry-seconds", type=_wait_seconds, default=None,
                      help="retry an unreachable controller this long, 0 to 3600 (default: [burn_in] retry_seconds)")
    hold.set_defaults(func=cmd_burn_in_hold)

    reset = sub.add_parser(
        "gpu-reset", help="reset GPUs as the repair ladder's first rung (the stack's GpuResetCommand; as root)",
        description="Refuses while a compute process runs on the GPUs; arms a systemd timer that undoes the next "
                    "step should the reset be killed; stops the services that hold the GPUs open (the agent, DCGM) "
                    "and turns persistence mode off, runs nvidia-smi --gpu-reset, checks the GPUs answer, then "
                    "restores all of that whatever happened. Prints one JSON line last; exit 0: reset "
                    "and checked, 1: refused or failed, 2: no such GPU.")
    reset.add_argument("--gpus", help="comma-separated GPU indices or UUIDs (default: every GPU)")
    reset.add_argument("--stop-unit", action="append", metavar="UNIT",
                       help="a systemd unit that holds the GPUs, stopped for the reset if running "
                            "(repeatable; default: nodemedic-agent.service, nvidia-dcgm.service, dcgm.service)")
    reset.add_argument("--restore-after", type=_seconds, default=RESTORE_AFTER_S, metavar="SECONDS",
                       help="a systemd timer puts back what the reset stopped after this long, should the reset be "
                            f"killed: 60 to 86400 (default {RESTORE_AFTER_S})")
    reset.set_defaults(func=cmd_gpu_reset)

    relay = sub.add_parser(
        "relay", help="on a Slurm controller SSM Run Command cannot reach (HyperPod; the stack's SlurmChannel "
                      "relay): run the pipeline's Slurm documents from the relay queue until SIGTERM",
        description="Reads [relay] queue_url and table (the stack outputs RelayQueueUrl and IncidentsTableName). "
                    "Runs only requests for this instance and documents of this cluster, each parameter checked "
                    "against its document as SSM's agent checks it; each request at most once. Its role needs the "
                    "stack's RelayPolicy.")
    relay.set_defaults(func=cmd_relay)

    val = sub.add_parser("validate", help="validate the configuration file and exit")
    val.set_defaults(func=cmd_validate)

    sim = sub.add_parser("simulate", help="a simulated GPU node for tests and the demo (no GPU needed)")
    simsub = sim.add_subparsers(dest="sim", required=True, metavar="ACTION")
    init = simsub.add_parser("init", help="create a simulated node directory")
    init.add_argument("dir")
    init.add_argument("--gpus", type=int, default=8)
    init.add_argument("--efa", type=int, default=4)
    init.add_argument("--shared-mount", action="append", default=[], help="a shared file system path (repeatable)")
    inject = simsub.add_parser("inject", help="inject a fault (see: simulate faults)")
    inject.add_argument("dir")
    inject.add_argument("fault")
    inject.add_argument("--gpu", type=int, default=0)
    inject.add_argument("--xid", type=int, default=79)
    inject.add_argument("--efa", type=int, default=0)
    inject.add_argument("--text", help="xid: the message after the code, e.g. 'GPU recovery action changed "
                                       "from 0x0 (None) to 0x2 (Node Reboot Required)'")
    simsub.add_parser("faults", help="list the faults that can be injected")
    sim.set_defaults(func=cmd_simulate)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"nodemedic-agent: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ValueError as exc:  # identity / hardware selection problems named by the config
        print(f"nodemedic-agent: {exc}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
