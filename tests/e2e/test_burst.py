"""100 duplicate health events for 10 real Slurm nodes, put as fast as EventBridge takes them:
exactly 10 incidents, and no node is touched twice. (make test's bounded burst; ``make bench``
puts 1,000 for 10 nodes and 1,000 for 500 nodes, bench/pipeline.py.)"""

import time

from tests.e2e.support import put_all, stack

EVENTS = 100


def test_a_burst_of_duplicate_events_for_ten_nodes_opens_ten_incidents() -> None:
    with stack(10, BreakerMaxPercent="100", BreakerMaxNodes="10", MaxConcurrentRemediations="10") as local:
        details = [local.health_event(local.node_names[i % 10], "XID 79") for i in range(EVENTS)]
        start = time.monotonic()
        for b in range(0, EVENTS, 10):
            put_all(local, details[b:b + 10])
        put_seconds = time.monotonic() - start
        executions = local.wait_for_executions(EVENTS, timeout=600)

        assert all(e["status"] == "SUCCEEDED" for e in executions), {e.get("error") for e in executions}
        decisions = [local.detect_decision(e) for e in executions]
        assert decisions.count("remediate") == 10 and decisions.count("deduplicated") == EVENTS - 10
        incidents = local.incidents()
        assert sorted(i.slurm_node for i in incidents) == sorted(local.node_names)
        assert all(i.status == "closed" for i in incidents)
        assert sum(i.duplicate_events for i in incidents) == EVENTS - 10
        assert sorted(local.drains()) == sorted(local.node_names)
        print(f"{EVENTS} events put in {put_seconds:.1f} s; all executions ended after {time.monotonic() - start:.1f} s")
