"""The writing loop of the planner processes that tests kill and restart (cluster_worker, chaos_worker).

Four threads go round their share of `keys` (round robin), each turn with its
idempotency key (its text), retrying a failed write with the same key until it
is acknowledged or `retry_for` seconds have passed. Each acknowledgement is
told as ``ACK <session> <text> <started>`` and each failure as ``RETRY <session>
<text> <error> <started>`` (`started`: when that try began, on the machine's
monotonic clock, which every process shares), so the parent knows what was
acknowledged when it kills the process, and which writes were in flight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import convmem
from convmem.errors import ConvmemError
from convmem.events import ConversationTurn, MemoryKey

_OUT = threading.Lock()


def say(line: str) -> None:
    """Print one line for the parent, whole and flushed, whichever thread says it."""
    with _OUT:
        print(line, flush=True)


def write_rounds(
    memory: convmem.MemorySystem,
    keys: list[MemoryKey],
    turns: range,
    *,
    text_of: Callable[[MemoryKey, int], str],
    timeout: float,
    retry_for: float,
) -> list[str]:
    """Write turn `n` of `turns` to every key in rounds; the ``<session> <text>`` of writes given up on."""
    failed: list[str] = []

    def plan(group: list[MemoryKey]) -> None:
        for n in turns:
            for key in group:
                text = text_of(key, n)
                turn = ConversationTurn(user_message=text, assistant_response="ok")
                deadline = time.monotonic() + retry_for
                while True:
                    started = time.monotonic()
                    try:
                        memory.session(key).add_turn(turn, timeout=timeout, idempotency_key=text)
                        break
                    except ConvmemError as exc:
                        say(f"RETRY {key.session_id} {text} {type(exc).__name__} {started!r}")
                        if time.monotonic() > deadline:
                            failed.append(f"{key.session_id} {text}")
                            return
                say(f"ACK {key.session_id} {text} {started!r}")

    threads = [threading.Thread(target=plan, args=(keys[i::4],)) for i in range(min(4, len(keys)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failed
