"""A sweeper process for the retention tests: sweeps, and kills itself (kill -9) in its drop step.

    python tests/retention_worker.py URL MAX_TURNS DELETES

Connects to the NATS server at URL and sweeps every session with a
``max_turns = MAX_TURNS`` policy. Its JetStream log erases the dropped
messages some at a time; once DELETES of them are erased, before it sends
the next deletion, it prints ``KILLED-AFTER <n> deletes`` and sends itself
SIGKILL, as a crash would stop it: no cleanup, no close. A sweep that never
gets that far prints ``SWEPT`` and the report's summary.
"""

from __future__ import annotations

import os
import signal
import sys

import convmem
from convmem.adapters.backends.jetstream._write import SessionWriter
from convmem.events import RetentionPolicies, RetentionPolicy, ShortTermMemoryConfig


def main() -> int:
    url, max_turns, deletes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    erase_one = SessionWriter._erase_one
    done = [0]

    async def counted(writer: SessionWriter, position: int) -> None:
        # The deletions of one window start together and are all answered before the next
        # window's start: a count at a window's end kills between two windows.
        if done[0] == deletes:
            print(f"KILLED-AFTER {done[0]} deletes", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        done[0] += 1
        await erase_one(writer, position)

    SessionWriter._erase_one = counted  # type: ignore[method-assign]
    memory = convmem.connect(url, config=ShortTermMemoryConfig(strategy="truncation"), timeout=5.0)
    report = memory.sweep_retention(policies=RetentionPolicies(default=RetentionPolicy(max_turns=max_turns)))
    print(f"SWEPT {report.summary()}", flush=True)
    memory.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
