"""What the Kubernetes adapter reads as JSON from the cluster - its own node annotations (which
anyone allowed to patch a node can rewrite) and the API server's refusals - when that text is
nested deeper than Python's JSON decoder goes: read as unreadable, never a crash of the stage."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kubernetes.client.exceptions import ApiException
from nodemedic.orchestrators.eks_auth import budget_refusal
from nodemedic.orchestrators.kubernetes import CHECKPOINTED, PAUSED_CLIENTS, _evicting_record, _marker, _Node, refusal

DEEP = "[" * 100_000


def _node(annotations: dict[str, str]) -> _Node:
    raw = SimpleNamespace(metadata=SimpleNamespace(name="gpu-1", resource_version="7", annotations=annotations,
                                                   labels={}),
                          spec=SimpleNamespace(taints=[], unschedulable=True))
    return _Node(raw, "nodemedic")


def _refused(status: int, body: str) -> ApiException:
    exc = ApiException(status=status, reason="Too Many Requests")
    exc.body = body
    return exc


def test_an_evicting_record_nested_too_deep_names_no_workload() -> None:
    assert _evicting_record(DEEP, 1.0) == {}
    assert _evicting_record('{"since": 1.0, "workloads": ["ml/Job/train"]}', 1.0) == {"ml/Job/train": None}
    assert _evicting_record('{"since": NaN, "workloads": ["ml/Job/train"]}', 1.0) == {}  # no drain's record


@pytest.mark.parametrize(("members", "read"), [
    ('{"ml/Job/train": 4}', 4), ('{"ml/Job/train": 0}', None), ('{"ml/Job/train": -2}', None),
    ('{"ml/Job/train": "4"}', None), ('{"ml/Job/train": true}', None), ('{"ml/Job/train": 4.5}', None),
    ('[4]', None), ('{}', None)])
def test_an_evicting_records_pod_count_is_a_positive_integer_or_unknown(members: str, read: int | None) -> None:
    """An unknown count (a record written before counts, or garbled) means the jobs stage reads the
    workload's start alone, as it did before."""
    value = '{"since": 1.0, "workloads": ["ml/Job/train"], "members": ' + members + "}"
    assert _evicting_record(value, 1.0) == {"ml/Job/train": read}


def test_a_paused_clients_record_nested_too_deep_is_no_pause() -> None:
    assert _node({PAUSED_CLIENTS: DEEP}).paused_clients is None
    assert _node({PAUSED_CLIENTS: '{"owner": "inc-1", "labels": {"a": null}}'}).paused_clients == ("inc-1", {"a": None})


@pytest.mark.parametrize("status", [429, 403])
def test_a_refusal_whose_body_is_nested_too_deep_is_said_as_it_came(status: int) -> None:
    exc = _refused(status, DEEP)
    assert budget_refusal(exc) is False
    assert refusal(exc).startswith(f"{status} Too Many Requests: [[[")


@pytest.mark.parametrize(("annotation", "marker"), [("1764150000", 1764150000.0), ("1764150000.5", 1764150000.5),
                                                    ("nan", None), ("NaN", None), ("inf", None), ("-inf", None),
                                                    ("1e400", None), ("-5", None), ("0", None), ("soon", None)])
def test_a_pods_checkpoint_marker_is_an_epoch_or_nothing(annotation: str, marker: float | None) -> None:
    """A NaN marker read as a checkpoint just written (NaN differs from every earlier marker), so the
    drain requeued the job at once with no checkpoint; an infinite one recorded infinite work saved."""
    pod = SimpleNamespace(metadata=SimpleNamespace(annotations={CHECKPOINTED: annotation}))
    assert _marker(pod) == marker
