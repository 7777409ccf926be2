"""The heartbeat roster survives a round trip through DynamoDB at fleet sizes past one item."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws
from nodemedic.store.roster import SHARD_BYTES, RosterConflictError, RosterHead, RosterStore, shards


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        db = boto3.client("dynamodb")
        db.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
        yield RosterStore(db, "t", "prod")


def entry(i: int) -> dict:
    return {"node": {"instance_id": f"i-{i:017x}", "hostname": f"ip-10-0-{i // 250}-{i % 250}.ec2.internal",
                     "slurm_node": f"gpu-st-p5-{i}"}, "last_seen": "2026-11-22T03:14:07.120000+00:00",
            "interval_s": 15.0, "reported_at": None}


def test_a_2500_node_roster_is_sharded_and_read_back_whole(store: RosterStore):
    roster = {f"i-{i:017x}": entry(i) for i in range(2500)}
    store.save(roster, RosterHead())
    loaded, head = store.load()
    assert loaded == roster and head.version == 1
    store.save(dict(list(roster.items())[:10]), head)  # the fleet shrinks: stale shards are not read
    assert len(store.load()[0]) == 10


def test_a_fleet_with_long_node_names_and_perf_samples_fits_dynamodbs_item_limit(store: RosterStore):
    """1,000 nodes a shard fitted short names only: an EKS node named by its host name (42
    characters, twice in each entry) with ten performance samples takes about 575 bytes, so a
    1,000-node shard was 575 KB, which DynamoDB refuses (400 KB): every sweep failed."""
    def eks(i: int) -> dict:
        name = f"ip-10-0-{i // 250}-{i % 250}.us-west-2.compute.internal"
        return {"node": {"instance_id": f"i-{i:017x}", "hostname": name, "k8s_node": name},
                "last_seen": "2026-11-22T03:14:07.120000+00:00", "interval_s": 15.0, "reported_at": None,
                "perf": [[0.9876, 95.3, 3, "p5.48xlarge"]] * 10}

    roster = {f"i-{i:017x}": eks(i) for i in range(2500)}
    store.save(roster, RosterHead())
    loaded, head = store.load()
    assert loaded == roster and head.version == 1
    parts = shards(roster)
    assert len(parts) > 3 and all(len(p.encode()) <= SHARD_BYTES for p in parts)
    assert {k: v for p in parts for k, v in json.loads(p).items()} == roster


def test_a_sweeper_that_lost_the_race_writes_nothing(store: RosterStore):
    store.save({"i-00000000000000001": entry(1)}, RosterHead())
    _, head = store.load()
    store.save({"i-00000000000000002": entry(2)}, head)
    with pytest.raises(RosterConflictError):
        store.save({}, head)
    assert list(store.load()[0]) == ["i-00000000000000002"]


def test_a_sweep_finding_another_under_way_skips_until_that_one_saves_or_its_lease_ends(store: RosterStore):
    """Two sweeps at once each took part of the queue's heartbeats, and each judged silence
    without the other's part. Now the second finds the first's lease and skips, changing nothing."""
    from datetime import UTC, datetime, timedelta

    t0, hold = datetime(2026, 11, 28, 1, 0, tzinfo=UTC), timedelta(seconds=30)
    store.claim(t0, hold)
    with pytest.raises(RosterConflictError, match="another sweep is under way"):
        store.claim(t0 + timedelta(seconds=10), hold)
    _, head = store.load()  # a lease alone is no roster
    assert head == RosterHead()
    store.save({"i-00000000000000001": entry(1)}, RosterHead(head.version, t0))  # saving ends the lease
    second = store.claim(t0 + timedelta(seconds=10), hold)
    store.release(second)  # a sweep that failed gives it back
    crashed = store.claim(t0 + timedelta(seconds=11), hold)
    with pytest.raises(RosterConflictError):
        store.claim(crashed - timedelta(seconds=1), hold)
    store.claim(crashed + timedelta(microseconds=1), hold)  # a crashed sweep's lease ends by itself
    roster, head = store.load()
    assert list(roster) == ["i-00000000000000001"] and head == RosterHead(1, t0)
