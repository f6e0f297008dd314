"""The CPU of one durable turn's own steps, each timed alone (issue 28 item 1's per-phase table).

    python -m bench._turn_phases [--rounds 5]

Prints one JSON object: microseconds of CPU (best of the rounds, `time.process_time`) per turn
for each pure step a durable ``add_turn`` takes in the writing process, on a session of 40 turns
(strategy truncation): the service's request handling (the subject parsed and checked as
`MemoryService` does for one request, the payload decoded, the reply encoded), `decide`,
`evolve`, encoding and sealing the event (checksum, AES-GCM), the runtime's counters and the
Prometheus request counter. What a turn costs beyond their sum is the machinery between them:
the asyncio loop, nats-py's parsing and writing of the four messages of a served turn (request,
publish, acknowledgement, reply), and thread hand-offs. Run it with another checkout on
``PYTHONPATH`` for that checkout's figures (the names it calls exist in both).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import msgspec

from bench._common import sample_turn
from convmem.actors import Metrics
from convmem.adapters import PrometheusMetrics
from convmem.adapters.backends._checksum import seal as checksum
from convmem.adapters.backends.keys import Keyring
from convmem.adapters.backends.keys._master import LocalMasterKeys
from convmem.adapters.backends.keys._stores import MemoryKeyStore
from convmem.adapters.frontends.service._inboxes import ReplyGuard, tenant_inbox
from convmem.adapters.frontends.service._protocol import (
    DEFAULT_API_PREFIX,
    decode_request,
    encode_ok,
    parse_subject,
    routed_subject,
)
from convmem.adapters.frontends.service._shares import tenant_token
from convmem.events import MemoryKey, ShortTermMemoryConfig, encode_event, encode_token
from convmem.projections import SessionState, decide, evolve
from convmem.projections._commands import AddTurn

__all__ = ["phases"]


def _best(fn: Callable[[], object], rounds: int, n: int = 3000) -> float:
    """Best CPU microseconds per call of `fn` over `rounds` rounds of `n` calls."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - started) / n * 1e6)
    return best


def phases(rounds: int, calls: int = 3000) -> dict[str, float]:
    config = ShortTermMemoryConfig(strategy="truncation")
    key = MemoryKey("bench", "user-1", "session-1")
    state = SessionState()
    for i in range(40):
        for event in decide(
            state, AddTurn(turn=sample_turn(i)), now=1.7e9 + i, command_id=f"c{i}", key=key, config=config
        ):
            state = evolve(state, event)
    command = AddTurn(turn=sample_turn(99))
    events = decide(state, command, now=1.8e9, command_id="cx")
    [added] = events

    prefix = DEFAULT_API_PREFIX
    subject = routed_subject(prefix, key.tenant_id, key.user_id, key.session_id, "add_turn")
    reply = tenant_inbox(encode_token(key.tenant_id)) + ".Xc3b1Qm0a9ZyT8kLpR2sVw.17"
    turn = sample_turn(3)
    body = {"user_id": key.user_id, "session_id": key.session_id, "timeout": 55.0}
    body["turn"] = {"user_message": turn.user_message, "assistant_response": turn.assistant_response}
    payload = msgspec.msgpack.encode(body)
    guard = ReplyGuard(prefix)
    answer = {"seq": 42, "index": 41}

    def service() -> None:  # what MemoryService does to one add_turn besides the write itself
        guard.allows(subject, reply)  # on receipt
        tenant_token(prefix, subject)  # the tenant's fair share
        parse_subject(prefix, subject)  # its quota
        tenant_token(prefix, subject)
        tenant_id, op = parse_subject(prefix, subject)  # the operation
        request = decode_request(op, payload)
        MemoryKey(tenant_id or "", request.user_id, request.session_id)  # type: ignore[union-attr]
        encode_ok(answer, msgpack=True)
        guard.allows(subject, reply)  # at the answer

    ring = Keyring(LocalMasterKeys([os.urandom(32)], source="bench"), MemoryKeyStore())
    context = ring.context(key) + b"42"

    def encode() -> None:
        data = ring.seal(key, encode_event(added), context)
        checksum(added.seq, added.event_id, data)

    metrics = Metrics()
    prometheus = PrometheusMetrics()

    def counters() -> None:
        metrics.count("writes.AddTurn")
        metrics.count("turns")
        metrics.observe_append(0.002)

    figures = {
        "service request handling (parse, check, decode, encode)": _best(service, rounds, calls),
        "decide": _best(lambda: decide(state, command, now=1.8e9, command_id="cx"), rounds, calls),
        "evolve": _best(lambda: evolve(state, added), rounds, calls),
        "encode + seal + checksum": _best(encode, rounds, calls),
        "runtime counters (Metrics)": _best(counters, rounds, calls),
        "Prometheus request counter (serve --metrics-port)": _best(
            lambda: prometheus.request("bench", "add_turn", None), rounds, calls
        ),
    }
    return {name: round(value, 2) for name, value in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    print(json.dumps(phases(parser.parse_args().rounds)))


if __name__ == "__main__":
    main()
