"""Structural rules of statemachines/remediation.asl.json that the local interpreter cannot show."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASL = json.loads((ROOT / "statemachines" / "remediation.asl.json").read_text())
STATES = ASL["States"]


def successors(state: dict) -> list[str]:
    """The states ``state`` may go to next: Next, Default, each Choice's and each Catch's."""
    return [t for t in [state.get("Next"), state.get("Default"), *(c["Next"] for c in state.get("Choices", [])),
                        *(c["Next"] for c in state.get("Catch", []))] if t in STATES]


def predecessors(name: str) -> list[str]:
    return [key for key, state in STATES.items() if name in successors(state)]


def _delays(retry: dict) -> list[float]:
    """The waits of a retrier, one per attempt (ASL's defaults: BackoffRate 2.0, MaxAttempts 3)."""
    return [min(retry["IntervalSeconds"] * retry.get("BackoffRate", 2.0) ** n, retry.get("MaxDelaySeconds", 1e9))
            for n in range(retry.get("MaxAttempts", 3))]


def test_a_fail_state_never_re_raises_a_runtime_error_name():
    """A Fail state whose error comes from ErrorPath is only reached through a Choice that sends
    States.* errors (reserved by Step Functions; e.g. States.Timeout) to a Fail with a fixed name."""
    dynamic = [name for name, s in STATES.items() if s["Type"] == "Fail" and "ErrorPath" in s]
    assert dynamic
    for name in dynamic:
        for pred in predecessors(name):
            guard = STATES[pred]
            assert guard["Type"] == "Choice", f"{name} is reached from {pred} without a States.* guard"
            [rule] = guard["Choices"]
            assert rule == {"Variable": "$.error.Error", "StringMatches": "States.*", "Next": rule["Next"]}
            assert not STATES[rule["Next"]]["Error"].startswith("States.")


def test_detect_retries_a_timeout_and_every_stage_catches_everything():
    assert any("States.Timeout" in r["ErrorEquals"] for r in STATES["Detect"]["Retry"])
    for stage in ("Detect", "Drain", "SwapSpare", "Repair", "CheckHealth", "Resume"):
        assert any("States.ALL" in c["ErrorEquals"] for c in STATES[stage]["Catch"]), stage


def test_the_deep_health_check_is_a_callback_and_an_unanswered_check_climbs_the_ladder():
    check = STATES["CheckHealth"]
    assert check["Resource"] == "arn:${Partition}:states:::lambda:invoke.waitForTaskToken"
    assert check["Parameters"]["Payload"]["task_token.$"] == "$$.Task.Token"
    assert check["TimeoutSecondsPath"] == "$.repair.check_timeout_s"
    [timeout] = [c for c in check["Catch"] if "States.Timeout" in c["ErrorEquals"]]
    assert timeout["Next"] == "Healthy"  # judged like an unhealthy answer: next rung, or quarantine
    assert not any(s["Type"] == "Wait" for s in STATES.values())  # no polling loops anywhere


def test_a_capacity_error_is_retried_later_then_escalated_not_failed():
    repair = STATES["Repair"]
    [retry] = [r for r in repair["Retry"] if r["ErrorEquals"] == ["CapacityError"]]
    assert retry["IntervalSeconds"] >= 60 and retry["MaxAttempts"] >= 3
    assert repair["Catch"][0] == {"ErrorEquals": ["CapacityError"], "ResultPath": "$.error", "Next": "Escalate"}


def test_a_rung_the_provider_refuses_while_it_works_on_the_node_waits_then_escalates():
    """HyperPod refuses a reboot or replacement of a node it is working on (its own repair, a patch):
    the rung is tried again every minute for an hour (a HyperPod replacement takes about 15 min at
    P90), then the incident is escalated with the node drained, not failed as a NodeMedic error."""
    repair = STATES["Repair"]
    [retry] = [r for r in repair["Retry"] if r["ErrorEquals"] == ["ProviderBusyError"]]
    assert retry["IntervalSeconds"] * retry["MaxAttempts"] >= 3600 and retry["BackoffRate"] == 1
    [catch] = [c for c in repair["Catch"] if "ProviderBusyError" in c["ErrorEquals"]]
    assert catch["Next"] == "Escalate" and repair["Catch"].index(catch) < len(repair["Catch"]) - 1  # before States.ALL


def test_each_state_that_sends_to_a_new_instance_waits_for_its_ssm_agent_to_register():
    """SSM refuses a command to an instance whose agent has not registered yet (InvalidInstanceId,
    InstanceNotManagedError here): a replacement's join (Repair) and a rung's or a joined node's
    check (CheckHealth, Verify) are sent again for as long as a GPU instance may take to boot, the
    waits doubling to two minutes so that a slow boot costs a few state transitions, not dozens:
    a 15-minute boot (HyperPod's published replace) costs at most 11 retries, each a transition."""
    for name in ("Repair", "CheckHealth", "Verify"):
        [retry] = [r for r in STATES[name]["Retry"] if r["ErrorEquals"] == ["InstanceNotManagedError"]]
        delays = _delays(retry)
        assert sum(delays) >= 15 * 60 and max(delays) <= 120, name
        assert sum(1 for n in range(len(delays)) if sum(delays[:n]) < 5 * 60) <= 8, name  # a 5-minute boot
        assert sum(1 for n in range(len(delays)) if sum(delays[:n]) < 15 * 60) <= 11, name  # a 15-minute boot


def test_hyperpods_own_check_is_read_again_for_hours_and_a_check_it_never_decides_climbs_the_ladder():
    """On HyperPod the check function answers its task itself once HyperPod's deep health check
    (DCGM level 4, stress tests) has decided; until then it raises HealthCheckPendingError. A
    replacement's boot and check take hours there: the state reads again, at most every five
    minutes, for over two hours, then judges the check unanswered (next rung; the verification:
    the second signal)."""
    for name, judged_by in (("CheckHealth", "Healthy"), ("Verify", "VerifyResult")):
        state = STATES[name]
        [retry] = [r for r in state["Retry"] if r["ErrorEquals"] == ["HealthCheckPendingError"]]
        assert "MaxDelaySeconds" in retry, name
        delays = _delays(retry)
        assert sum(delays) >= 2 * 3600 and max(delays) <= 300, name
        [caught] = [c for c in state["Catch"] if "HealthCheckPendingError" in c["ErrorEquals"]]
        assert caught["Next"] == judged_by and "States.Timeout" in caught["ErrorEquals"], name


def test_no_arn_names_a_partition_literally():
    """arn:aws:... breaks GovCloud (aws-us-gov) and China (aws-cn): the partition is substituted."""
    text = (ROOT / "statemachines" / "remediation.asl.json").read_text()
    assert "arn:aws:" not in text and "arn:aws:" not in (ROOT / "template.yaml").read_text()


def test_every_page_keeps_trying_sns_for_twenty_minutes():
    """A page is how someone learns an incident failed or a node is held: SNS unavailable for a
    while (a regional blip, throttling) must not lose it. Step Functions waits for a retry at no
    cost; the delays double up to MaxDelaySeconds, with no jitter to shorten them."""
    pages = {name: state for name, state in STATES.items() if state.get("Resource", "").endswith(":sns:publish")}
    assert len(pages) >= 7
    for name, state in pages.items():
        [retry] = state["Retry"]
        assert retry["ErrorEquals"] == ["States.ALL"] and "JitterStrategy" not in retry, name
        delays = _delays(retry)
        assert sum(delays) >= 20 * 60, (name, sum(delays))


def test_a_degraded_node_waits_a_week_for_its_job_at_a_few_transitions_an_hour():
    """Drained after its job, a DEGRADED node's repair waits for the job to end. It read the job
    every two minutes for a week: 5,040 attempts, about 15,000 history events of the 25,000 an
    execution may have. Now the reads space out to ten minutes."""
    [retry] = [r for r in STATES["Repair"]["Retry"] if r["ErrorEquals"] == ["NodeDrainingError"]]
    delays = _delays(retry)
    assert sum(delays) >= 7 * 86400 and max(delays) <= 600 and len(delays) <= 1100


def _loop() -> set[str]:
    """The states on a cycle of the state graph (Tarjan's strongly connected components)."""
    graph = {name: successors(state) for name, state in STATES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cyclic: set[str] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component or v in graph[v]:
                cyclic.update([v, *component])

    for v in graph:
        if v not in index:
            visit(v)
    return cyclic


def test_the_longest_execution_stays_under_step_functions_history_quota():
    """A Standard workflow's execution fails once its history reaches 25,000 events (Step Functions
    developer guide, "Quotas related to state machine executions"), and the incident would end
    half-done. Counted at its worst: every retrier of every state runs out, and the ladder's
    states (the only cycle: one pass per rung) run for each rung there is. An attempt of a Lambda
    task is three events (LambdaFunctionScheduled, Started, Failed); of a service integration that
    waits (.waitForTaskToken, .sync) four (TaskScheduled, Started, Submitted, Failed), else three."""
    from nodemedic.contracts.incident import RUNGS

    loop = _loop()
    assert "Repair" in loop and "CheckHealth" in loop and "Drain" not in loop
    events = 2  # ExecutionStarted, ExecutionSucceeded
    for name, state in STATES.items():
        attempts = 1 + sum(r.get("MaxAttempts", 3) for r in state.get("Retry", []))
        waits = state.get("Resource", "").endswith((".waitForTaskToken", ".sync"))
        per_pass = 2 + ((4 if waits else 3) * attempts if state["Type"] == "Task" else 0)  # entered, exited
        events += per_pass * (len(RUNGS) if name in loop else 1)
    assert events < 25_000, events
