"""The agent's own files on the node (its dedupe memory, the events to send again, the kernel log
cursors, the burn-in marker) can be anything after a crash, a full disk or a hand edit: each is
read as far as it can be, or set aside, and the agent starts. A file that stopped it would stop it
at every restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nodemedic_agent.burn_in import joined
from nodemedic_agent.checks.log_cursor import JournalCursor, KmsgCursor, load_cursor
from nodemedic_agent.dedupe import Deduper

CORRUPT = ["", "{", "[]", "5", "null", '"text"', '{"k": 5}', '{"k": {}}', '{"k": {"sent_at": "x"}}',
           '{"k": {"sent_at": 1, "extra": 2}}', '[{"sends": 1}]', '[5]', '{"boot_id": 5}', '{"seq": -1}',
           '{"cursor": ["c"]}', "[" * 100_000 + "]" * 100_000, "\udcff"]


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode(errors="surrogateescape"))
    return path


@pytest.mark.parametrize("text", CORRUPT, ids=range(len(CORRUPT)))
def test_a_corrupt_dedupe_memory_is_forgotten(tmp_path: Path, text: str) -> None:
    dedupe = Deduper(300, state_file=write(tmp_path / "dedupe.json", text))
    assert dedupe.admit("XID 79:gpu:3") == 1  # remembered nothing: the fault is sent


@pytest.mark.parametrize("suppressed", [-5, True, 1.5])
def test_a_remembered_send_with_no_count_of_repeats_is_no_memory(tmp_path: Path, suppressed: object) -> None:
    """A send remembered with a negative count of repeats folded the fault, then made the next
    event's count less than one, which the contract refuses: that event was never sent."""
    path = write(tmp_path / "dedupe.json", json.dumps({"XID 79:gpu:3": {"sent_at": 990.0, "suppressed": suppressed}}))
    assert Deduper(300, clock=lambda: 1000.0, state_file=path).admit("XID 79:gpu:3") == 1


@pytest.mark.parametrize("text", CORRUPT, ids=range(len(CORRUPT)))
def test_a_corrupt_cursor_is_no_cursor(tmp_path: Path, text: str) -> None:
    path = write(tmp_path / "cursor.json", text)
    assert load_cursor(path, KmsgCursor.from_json) is None and load_cursor(path, JournalCursor.from_json) is None


@pytest.mark.parametrize("text", CORRUPT, ids=range(len(CORRUPT)))
def test_a_corrupt_burn_in_marker_is_no_marker_or_read_as_far_as_it_goes(tmp_path: Path, text: str) -> None:
    finding = joined(write(tmp_path / "burn-in-hold.json", text))
    assert finding is None or finding.fault_code == "NODE_JOINED"


@pytest.mark.parametrize("text", CORRUPT, ids=range(len(CORRUPT)))
def test_an_agent_starts_whatever_its_state_files_hold(tmp_path: Path, text: str, make_agent, sim) -> None:  # type: ignore[no-untyped-def]
    spool = tmp_path / "spool"
    spool.mkdir()
    for name in ("dedupe.json", "reassert.json", "kmsg-cursor.json", "journal-cursor.json"):
        write(spool / name, text)
    agent = make_agent(intervals={"reassert_seconds": 0.2})
    sim.inject("xid", xid=79, gpu=3)
    assert agent.published or _published(agent)


def _published(agent) -> bool:  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not agent.published:
        time.sleep(0.05)
    return bool(agent.published)


def test_a_journal_cursor_names_its_own_entry_and_no_other() -> None:
    """The journal source seeks to its saved cursor (``journalctl --cursor``) and passes over the
    entry it names: that entry only, however journalctl writes the rest of its cursor."""
    saved = JournalCursor("s=3f8e2a6c4b1d4e0f9a7b5c3d1e2f4a6b;i=1a;b=0f3c9a;m=1;t=6614e5710c6a2;x=b8d3d6710233440a")
    assert saved.names(saved.cursor)
    assert saved.names("s=3f8e2a6c4b1d4e0f9a7b5c3d1e2f4a6b;i=1a;b=0f3c9a;m=1;t=6614e5710c6a2;x=0")
    assert not saved.names("s=3f8e2a6c4b1d4e0f9a7b5c3d1e2f4a6b;i=1b;b=0f3c9a;m=2;t=6614e5710c6a3;x=1")  # the next
    assert not saved.names("s=f0ce62dd38254bd480fb11ff8e992f09;i=1a;b=0f3c9a;m=1;t=6614e5710c6a2;x=1")  # another file's
    assert not saved.names("") and not JournalCursor("not a journal cursor").names("s=;i=")
