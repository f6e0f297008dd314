"""4. Replay: events per second rebuilding every session, from JetStream and from memory.

A log of `rp_sessions` sessions, each a `SessionStarted` and turns (100,000
events over 1,000 sessions in the full run), is written round-robin over the
sessions, so the stream interleaves sessions as a real one does: two
sessions through the log's own `append`, the rest published by nats-py with
the same bytes and headers (``Nats-Msg-Id``, ``Convmem-Seq``), pipelined, as
appends one at a time would take minutes. Then every session is rebuilt:

* JetStream: `JetStreamEventLog.read_all()` (batched direct gets), decode
  every record, group by session, `replay()` each session; the reference is
  `read_all()` alone (the transport's rate, no decoding, no folding);
* in memory, decode + fold: the same from an `InMemoryEventLog`;
* in memory, fold only: `replay()` over events already decoded, per session
  (``replay`` batches runs of turns), and `evolve()` one event at a time.

The server runs with its default flush: writing the log is set-up, not measured.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TypeVar

import nats

from bench._common import (
    Figure,
    Result,
    Sizes,
    Target,
    embedded_backend,
    in_threads,
    sample_turn,
    session_keys,
)
from bench._profile import py_spy
from convmem.actors import EventLog, LoggedEvent
from convmem.adapters import InMemoryEventLog, JetStreamEventLog
from convmem.adapters.backends.jetstream._read import MSG_ID, SEQ_HEADER
from convmem.events import (
    AnyEvent,
    ConversationTurn,
    MemoryKey,
    SessionStarted,
    ShortTermMemoryConfig,
    TurnAdded,
    decode_event,
    encode_event,
)
from convmem.projections import SessionState, evolve, replay

__all__ = ["run"]

T = TypeVar("T")

_CHUNK = 10


def _histories(sizes: Sizes) -> dict[MemoryKey, list[AnyEvent]]:
    config = ShortTermMemoryConfig(strategy="truncation")
    turns: list[ConversationTurn] = [sample_turn(n) for n in range(97)]
    out: dict[MemoryKey, list[AnyEvent]] = {}
    for s, key in enumerate(session_keys(sizes.rp_sessions, user="replay")):
        events: list[AnyEvent] = [
            SessionStarted(seq=1, event_id=f"r{s}/start", at=1.7e9, key=key, config=config)
        ]
        for n in range(1, sizes.rp_events_per_session):
            events.append(
                TurnAdded(
                    seq=n + 1, event_id=f"r{s}/{n}", at=1.7e9 + n, index=n, turn=turns[(s + n) % len(turns)]
                )
            )
        out[key] = events
    return out


def _write(log: EventLog, histories: dict[MemoryKey, list[AnyEvent]], writers: int) -> None:
    """Append every history in chunks, round-robin over sessions (each writer owns some sessions)."""
    keys = list(histories)

    def writer(share: int) -> None:
        mine = keys[share::writers]
        longest = max((len(histories[k]) for k in mine), default=0)
        for start in range(0, longest, _CHUNK):
            for key in mine:
                chunk = histories[key][start : start + _CHUNK]
                if chunk:
                    log.append(key, chunk, expected_seq=start)

    in_threads(writer, writers, timeout=900)


async def _publish(url: str, log: JetStreamEventLog, histories: dict[MemoryKey, list[AnyEvent]]) -> None:
    """Publish the events as the log stores them (bytes and headers), round-robin, pipelined."""
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        js = nc.jetstream()
        longest = max(len(events) for events in histories.values())
        subjects = {key: log.subject(key) for key in histories}
        for n in range(longest):
            for key, events in histories.items():
                if n < len(events):
                    event = events[n]
                    headers = {MSG_ID: event.event_id, SEQ_HEADER: str(event.seq)}
                    await js.publish_async(subjects[key], encode_event(event), headers=headers)
        await asyncio.wait_for(js.publish_async_completed(), 300)
    finally:
        await nc.close()


def _rebuild(records: Iterable[LoggedEvent]) -> dict[MemoryKey, SessionState]:
    """Decode every record, group by session, fold each session (what an audit of a stream does)."""
    grouped: dict[MemoryKey, list[AnyEvent]] = defaultdict(list)
    for record in records:
        grouped[record.key].append(decode_event(record.data, seq=record.position))
    return {key: replay(events) for key, events in grouped.items()}


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def _fold_each(histories: dict[MemoryKey, list[AnyEvent]]) -> dict[MemoryKey, SessionState]:
    out = {}
    for key, events in histories.items():
        state = SessionState()
        for event in events:
            state = evolve(state, event)
        out[key] = state
    return out


def _check(states: dict[MemoryKey, SessionState], sizes: Sizes) -> None:
    if len(states) != sizes.rp_sessions or any(
        s.version != sizes.rp_events_per_session for s in states.values()
    ):
        raise AssertionError("a rebuilt session does not hold every event")


def run(sizes: Sizes) -> Result:
    result = Result()
    histories = _histories(sizes)
    total = sum(len(events) for events in histories.values())

    with embedded_backend(None) as backend:
        assert backend.server is not None
        _write(backend.log, dict(list(histories.items())[:2]), writers=1)  # the log's own appends...
        rest = dict(list(histories.items())[2:])
        asyncio.run(_publish(backend.server.url, backend.log, rest))  # ...and the same bytes, faster
        read_s = min(_timed(lambda: sum(1 for _ in backend.log.read_all()))[0] for _ in range(2))
        js_s, states = min(
            (_timed(lambda: _rebuild(backend.log.read_all())) for _ in range(2)), key=lambda x: x[0]
        )
        _check(states, sizes)
        if sizes.profile and total / js_s < 50_000:
            with py_spy(sizes.out_dir, "replay-jetstream", result.details):
                _rebuild(backend.log.read_all())

    memory = InMemoryEventLog()
    _write(memory, histories, writers=1)
    mem_read_s = min(_timed(lambda: sum(1 for _ in memory.read_all()))[0] for _ in range(3))
    mem_s, states = min((_timed(lambda: _rebuild(memory.read_all())) for _ in range(3)), key=lambda x: x[0])
    _check(states, sizes)
    fold_s, states = min(
        (_timed(lambda: {k: replay(v) for k, v in histories.items()}) for _ in range(3)), key=lambda x: x[0]
    )
    _check(states, sizes)
    each_s, _ = min((_timed(lambda: _fold_each(histories)) for _ in range(3)), key=lambda x: x[0])
    records = list(memory.read_all())
    decode_s, _ = min(
        (_timed(lambda: [decode_event(r.data) for r in records]) for _ in range(3)), key=lambda x: x[0]
    )

    if sizes.profile and total / fold_s < 500_000:
        with py_spy(sizes.out_dir, "replay-fold", result.details):
            for _ in range(3):
                _rebuild(memory.read_all())
    result.add(
        Figure(
            "JetStream read_all + decode + fold",
            total / js_s,
            "events/s",
            reference=total / read_s,
            reference_label="JetStream read_all alone (no decode, no fold)",
            target=Target("value", ">=", 50_000),
        )
    )
    result.add(
        Figure(
            "in memory: read_all + decode + fold",
            total / mem_s,
            "events/s",
            target=Target("value", ">=", 500_000),
        )
    )
    result.add(
        Figure(
            "in memory: fold only, replay() per session",
            total / fold_s,
            "events/s",
            target=Target("value", ">=", 500_000),
        )
    )
    result.add(Figure("in memory: fold only, evolve() per event", total / each_s, "events/s"))
    result.add(Figure("decode only (msgpack -> event structs)", total / decode_s, "events/s"))
    result.details |= {
        "events": total,
        "sessions": sizes.rp_sessions,
        "seconds": {
            "jetstream_read_all": read_s,
            "jetstream_rebuild": js_s,
            "memory_read_all": mem_read_s,
            "memory_rebuild": mem_s,
            "fold_replay": fold_s,
            "fold_evolve": each_s,
            "decode": decode_s,
        },
    }
    result.notes.append(
        f"{total:,} events over {sizes.rp_sessions:,} sessions "
        "(a SessionStarted and turns of ~530 characters "
        "each), written interleaved; best of 2 (JetStream) or 3 (memory) runs"
    )
    return result
