"""make test's bounded event storm (``make bench`` runs 20,000 events for 10,000 nodes,
bench/storm.py): 2,000 events for 2,000 nodes, 200 of them faulty, through Detect and the Gate
with concurrent workers. Every invariant of the storm holds: each event decided once, junk and
unknown nodes rejected, one incident per faulty node, the breaker tripped once and holding the
rest, one page, nothing failed or stranded."""

import pytest
from nodemedic_sandbox.embedded_aws import EmbeddedAWS

from bench.storm import Fleet, Runner, check, compose


def test_a_storm_of_two_thousand_events_keeps_every_invariant() -> None:
    storm = compose(nodes=2000, faulty=200, events=2000, seconds=5, seed=7, resend_s=1)
    with EmbeddedAWS() as aws:
        runner = Runner(storm, aws, Fleet(2000), concurrency=16, retry_scale=0.01)
        runner.run([])
        try:
            facts = check(runner, storm)
        except SystemExit as broken:
            pytest.fail(str(broken))
    # the template's defaults: 4 slots, a breaker limit of 8 nodes: 4 admitted, 4 wait, the 9th trips it
    assert facts["admitted"] == runner.policy.max_concurrent == 4
    assert facts["incident_statuses"] == {"open": 4, "held": 196}
    assert facts["breaker_reason"].startswith(
        "breaker_limit: 9 nodes under remediation within 60 min (4 waiting for a slot) exceed the limit of 8")
