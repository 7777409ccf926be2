"""The /dev/kmsg reader against this machine's real kernel log (needs root to write a record)."""

from __future__ import annotations

import os
import threading
import uuid

import pytest
from nodemedic_agent.checks.kernel_log import KernelLogFollower


@pytest.mark.skipif(not os.access("/dev/kmsg", os.W_OK), reason="writing /dev/kmsg needs root")
def test_the_kmsg_reader_sees_a_new_kernel_record_and_not_the_old_ones():
    follower = KernelLogFollower("kmsg", "/dev/kmsg", threading.Event())
    marker = f"nodemedic agent test record {uuid.uuid4()}"
    seen: list[str] = []

    def read() -> None:
        for message, _ in follower.messages():
            seen.append(message)
            if marker in message:
                follower.stop.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    threading.Event().wait(0.3)  # the reader has skipped to the end of the log
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(marker + "\n")
    reader.join(timeout=5)
    follower.stop.set()
    assert any(marker in m for m in seen)
    assert not any("Linux version" in m for m in seen)  # history before the start is skipped
    assert follower.stats.skipped == 0
