"""A planner process for the fault tests: writes turns and prints one line per acknowledged turn.

    python tests/fault_worker.py URL WRITER SESSIONS TURNS

Writes TURNS turns to each of SESSIONS sessions (round robin, several threads),
each with an idempotency key, retrying a failed write with the same key until
it is acknowledged. After each acknowledgement it prints ``ACK <session> <text>``
and flushes, so the parent knows exactly what was acknowledged before it kills us.
"""

from __future__ import annotations

import sys
import threading

import convmem
from convmem.errors import ConvmemError
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig


def main() -> int:
    url, writer, sessions, turns = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    out = threading.Lock()
    config = ShortTermMemoryConfig(strategy="truncation")

    with convmem.connect(url, config=config, timeout=2.0) as memory:

        def plan(session_ids: list[int]) -> None:
            for n in range(turns):
                for s in session_ids:
                    key = MemoryKey("fault", "user", f"s{s}")
                    text = f"{writer}-{n}"
                    turn = ConversationTurn(user_message=text, assistant_response="ok")
                    for _ in range(200):
                        try:
                            memory.session(key).add_turn(turn, timeout=5, idempotency_key=text)
                            break
                        except ConvmemError as exc:
                            with out:
                                print(f"RETRY s{s} {text} {type(exc).__name__}", flush=True)
                    else:
                        with out:
                            print(f"GAVE-UP s{s} {text}", flush=True)
                        continue
                    with out:
                        print(f"ACK s{s} {text}", flush=True)

        groups = [list(range(i, sessions, 4)) for i in range(min(4, sessions))]
        threads = [threading.Thread(target=plan, args=(g,)) for g in groups]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
