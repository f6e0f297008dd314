"""A planner process for the chaos suite: writes turns and prints one line per acknowledged turn.

    python tests/chaos_worker.py URL SESSIONS TURNS START

Writes turns START .. TURNS-1 to each of the sessions ``chaos:user:s0`` ..
(round robin, four threads), each with its idempotency key (its text,
``s<i>-<n>``), retrying a failed write with the same key. After each
acknowledgement it prints ``ACK <session> <text> <started>``, after each failure
``RETRY <session> <text> <error> <started>``, flushed, so the parent knows exactly what
was acknowledged when it kills this process; ``DONE`` at the end. A process
started after another was killed continues the same sessions from the
lowest turn any session had acknowledged: turns already stored are sent
again with their keys and must not be stored twice.
"""

from __future__ import annotations

import sys

from retrying_writer import say, write_rounds

import convmem
from convmem.events import MemoryKey, ShortTermMemoryConfig

RETRY_FOR = 120.0


def main() -> int:
    url, sessions, turns, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    keys = [MemoryKey("chaos", "user", f"s{i}") for i in range(sessions)]

    with convmem.connect(url, config=ShortTermMemoryConfig(strategy="truncation"), timeout=2.0) as memory:
        failed = write_rounds(
            memory,
            keys,
            range(start, turns),
            text_of=lambda key, n: f"{key.session_id}-{n}",
            timeout=3,
            retry_for=RETRY_FOR,
        )
    if failed:
        say(f"GAVE-UP {' '.join(failed)}")
        return 1
    say("DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
