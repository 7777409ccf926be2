"""1,000 duplicate health events for 10 real Slurm nodes within one second: exactly 10 incidents,
and no node is touched twice."""

import time

from tests.e2e.support import put_all, stack


def test_a_thousand_duplicate_events_for_ten_nodes_open_ten_incidents() -> None:
    with stack(10, BreakerMaxPercent="100", BreakerMaxNodes="10", MaxConcurrentRemediations="10") as local:
        details = [local.health_event(local.node_names[i % 10], "XID 79") for i in range(1000)]
        start = time.monotonic()
        for b in range(0, 1000, 10):
            put_all(local, details[b:b + 10])
        put_seconds = time.monotonic() - start
        executions = local.wait_for_executions(1000, timeout=900)

        assert all(e["status"] == "SUCCEEDED" for e in executions), {e.get("error") for e in executions}
        decisions = [local.detect_decision(e) for e in executions]
        assert decisions.count("remediate") == 10 and decisions.count("deduplicated") == 990
        incidents = local.incidents()
        assert sorted(i.slurm_node for i in incidents) == sorted(local.node_names)
        assert all(i.status == "closed" for i in incidents)
        assert sum(i.duplicate_events for i in incidents) == 990
        assert sorted(local.drains()) == sorted(local.node_names)
        print(f"1,000 events put in {put_seconds:.1f} s; all executions ended after {time.monotonic() - start:.1f} s")
