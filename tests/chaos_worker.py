"""A planner process for the chaos suite: writes turns and prints one line per acknowledged turn.

    python tests/chaos_worker.py URL SESSIONS TURNS START

Writes turns START .. TURNS-1 to each of the sessions ``chaos:user:s0`` ..
(round robin, four threads), each with its idempotency key (its text,
``s<i>-<n>``), retrying a failed write with the same key. After each
acknowledgement it prints ``ACK <session> <text>``, after each failure
``RETRY <session> <text> <error>``, flushed, so the parent knows exactly what
was acknowledged when it kills this process; ``DONE`` at the end. A process
started after another was killed continues the same sessions from the
lowest turn any session had acknowledged: turns already stored are sent
again with their keys and must not be stored twice.
"""

from __future__ import annotations

import sys
import threading
import time

import convmem
from convmem.errors import ConvmemError
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

RETRY_FOR = 120.0


def main() -> int:
    url, sessions, turns, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    out = threading.Lock()
    keys = [MemoryKey("chaos", "user", f"s{i}") for i in range(sessions)]
    failed: list[str] = []

    def say(line: str) -> None:
        with out:
            print(line, flush=True)

    with convmem.connect(url, config=ShortTermMemoryConfig(strategy="truncation"), timeout=2.0) as memory:

        def plan(group: list[MemoryKey]) -> None:
            for n in range(start, turns):
                for key in group:
                    text = f"{key.session_id}-{n}"
                    turn = ConversationTurn(user_message=text, assistant_response="ok")
                    deadline = time.monotonic() + RETRY_FOR
                    while True:
                        try:
                            memory.session(key).add_turn(turn, timeout=3, idempotency_key=text)
                            break
                        except ConvmemError as exc:
                            say(f"RETRY {key.session_id} {text} {type(exc).__name__}")
                            if time.monotonic() > deadline:
                                failed.append(text)
                                return
                    say(f"ACK {key.session_id} {text}")

        threads = [threading.Thread(target=plan, args=(keys[i::4],)) for i in range(min(4, sessions))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if failed:
        say(f"GAVE-UP {' '.join(failed)}")
        return 1
    say("DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
