"""Probes behind the proposed fixes in RESULTS.md: ``python -m bench._probes [NAME ...]``.

Not part of the harness (nothing here runs in ``python -m bench`` or in CI):
each probe measures a *prototype* of a proposed change to convmem beside
convmem as it is, in one process, so the proposal comes with its measured
effect. Prototypes reach into private attributes or patch a function for the
length of one call; they break when convmem changes, which is fine for a probe.

Probes: ``throughput`` (where add_turn throughput goes, layer by layer),
``view_cache`` (get_llm_context with a per-state view cache), ``fold``
(replay with a fast rendered length), ``decode`` (turn validation with an
ASCII fast path), ``passivation`` (RSS with stopped actors forgotten at once),
``batch`` (an atomic batch against single publishes on disk and on tmpfs),
``collector`` (a full garbage collection with turn structs tracked or not).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import nats
import psutil

import convmem.events._turn as turn_module
import convmem.projections._evolve as evolve_module
from bench import throughput as tp
from bench._common import (
    FULL,
    async_batch,
    compare,
    embedded_backend,
    memory_store_root,
    nats_server,
    sample_turn,
    session_keys,
    sync_batch,
)
from bench.context import _convmem, _penguiflow
from bench.replay import _histories
from bench.scale import _settle, _touch
from convmem.actors import MemorySystem, SessionHandle
from convmem.actors._session import SessionActor
from convmem.adapters import InMemoryEventLog
from convmem.events import ShortTermMemoryConfig, TurnAdded, decode_event, encode_event
from convmem.projections import llm_context, replay
from convmem.projections._state import rendered_turn_length

__all__ = ["PROBES", "main"]


def throughput() -> None:
    """add_turn from 64 threads vs log.append from 64 threads vs SessionWriter on the loop vs raw."""
    turns = [sample_turn(n) for n in range(64)]
    keys = session_keys(1000)
    total = 9600
    with embedded_backend(None) as backend:
        assert backend.server is not None
        system = MemorySystem(
            ShortTermMemoryConfig(strategy="truncation"),
            log=backend.log,
            snapshots=backend.snapshots,
            max_live_sessions=1100,
        )
        handles = [system.session(k) for k in keys]
        tp._start_sessions(handles, 64, turns[0])
        raw = asyncio.run(tp._raw_publish(backend.server.url, 1000, tp._payloads(total, turns, "a")))
        convmem = tp._convmem_rate(handles, 64, turns, total)
        seqs = {k: system.cell(k).state.version for k in keys}
        system.close()
        log = backend.log

        def event(key: Any, tag: str) -> TurnAdded:
            seq = seqs[key] = seqs[key] + 1
            return TurnAdded(seq=seq, event_id=f"{tag}/{uuid.uuid4().hex}", at=1.0, index=seq, turn=turns[0])

        def caller(i: int) -> None:
            mine = keys[i::64]
            for n in range(total // 64):
                key = mine[n % len(mine)]
                added = event(key, "thread")
                log.append(key, [added], expected_seq=added.seq - 1)

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(64)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        from_threads = total / (time.perf_counter() - started)
        writer, conn = log._writer, log._conn

        async def on_loop() -> float:
            async def worker(i: int) -> None:
                mine = keys[i::64]
                for n in range(total // 64):
                    key = mine[n % len(mine)]
                    added = event(key, "loop")
                    await writer.append(
                        key, log.subject(key), (added,), (encode_event(added),), added.seq - 1
                    )

            began = time.perf_counter()
            await asyncio.gather(*(worker(i) for i in range(64)))
            return total / (time.perf_counter() - began)

        loop_rate = conn.call(on_loop, what="probe", timeout=600)
    print(
        f"throughput (sync=default): raw publish_async {raw:,.0f}/s; SessionWriter.append x64 on the loop "
        f"{loop_rate:,.0f}/s; JetStreamEventLog.append from 64 threads {from_threads:,.0f}/s; "
        f"SessionHandle.add_turn from 64 threads {convmem:,.0f}/s"
    )


class _CachedView:
    """The proposed `get_llm_context`: the view computed once per state object, then reused."""

    def __init__(self, handle: SessionHandle) -> None:
        self._handle = handle
        self._state: object = None
        self._view: dict[str, Any] = {}

    def __call__(self) -> dict[str, Any]:
        system = self._handle._system
        state = system.cell(self._handle.key).state
        if state is not self._state:
            self._view, self._state = llm_context(state, system.estimator), state
        return {"conversation_memory": dict(self._view["conversation_memory"])}


def view_cache() -> None:
    with MemorySystem(ShortTermMemoryConfig(strategy="truncation"), log=InMemoryEventLog()) as system:
        for window in (5, 50, 500):
            turns = [sample_turn(n) for n in range(window)]
            reference, handle = _penguiflow(window, turns), _convmem(system, window, turns)
            cached = _CachedView(handle)
            assert cached() == handle.get_llm_context()
            loop = asyncio.new_event_loop()
            best = compare(
                {
                    "penguiflow": async_batch(loop, reference.get_llm_context),
                    "today": sync_batch(handle.get_llm_context),
                    "cached": sync_batch(cached),
                },
                seconds=0.15,
            )
            loop.close()
            print(
                f"view cache @ {window} turns: PenguiFlow {best['penguiflow'] * 1e6:.2f} us, convmem today "
                f"{best['today'] * 1e6:.2f} us ({best['penguiflow'] / best['today']:.2f}x), with the cache "
                f"{best['cached'] * 1e6:.2f} us ({best['penguiflow'] / best['cached']:.1f}x)"
            )


_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f"\\]')
_PLAIN_TURN = len('{"assistant": "", "user": ""}')


def fast_rendered_turn_length(turn: Any, *, include_digest: bool) -> int:
    """The proposed `rendered_turn_length`: no json.dumps for a plain turn with nothing to escape."""
    if turn.trajectory_digest is None and not turn.artifacts_shown:
        user, assistant = turn.user_message, turn.assistant_response
        if not _NEEDS_ESCAPE.search(user) and not _NEEDS_ESCAPE.search(assistant):
            return _PLAIN_TURN + len(user) + len(assistant)
    return rendered_turn_length(turn, include_digest=include_digest)


def _patched(module: Any, name: str, value: object, fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        original = getattr(module, name)
        setattr(module, name, value)
        try:
            return fn()
        finally:
            setattr(module, name, original)

    return run


def fold() -> None:
    histories = _histories(dataclasses.replace(FULL, rp_sessions=300))
    total = sum(len(v) for v in histories.values())

    def today() -> object:
        return {k: replay(v) for k, v in histories.items()}

    fast = _patched(evolve_module, "rendered_turn_length", fast_rendered_turn_length, today)
    assert fast() == today()
    best = compare({"today": sync_batch(today), "fast": sync_batch(fast)}, seconds=0.5, rounds=5)
    print(
        f"fold: replay() today {total / best['today']:,.0f} events/s, with the fast rendered length "
        f"{total / best['fast']:,.0f} events/s"
    )


def decode() -> None:
    histories = _histories(dataclasses.replace(FULL, rp_sessions=300))
    data = [encode_event(e) for events in histories.values() for e in events]
    surrogate, invalid = turn_module._SURROGATE, turn_module.InvalidTurn

    def check_strings(field: str, value: object) -> None:
        if isinstance(value, str):
            if not value.isascii() and surrogate.search(value):
                raise invalid(field, "contains a lone surrogate, which cannot be stored as UTF-8")
        elif isinstance(value, Mapping):
            for key, inner in value.items():
                check_strings(field, key)
                check_strings(f"{field}.{key}", inner)
        elif isinstance(value, list | tuple):
            for i, inner in enumerate(value):
                check_strings(f"{field}[{i}]", inner)

    def today() -> object:
        return [decode_event(d) for d in data]

    fast = _patched(turn_module, "_check_strings", check_strings, today)
    assert fast() == today()
    best = compare({"today": sync_batch(today), "fast": sync_batch(fast)}, seconds=0.5, rounds=5)
    print(
        f"decode: today {len(data) / best['today']:,.0f} events/s, with an isascii() fast path in "
        f"_check_strings {len(data) / best['fast']:,.0f} events/s"
    )


def passivation() -> None:
    """RSS growth over 20,000 new sessions, as is and with stopped actors forgotten in on_stop."""
    me = psutil.Process()
    original = SessionActor.on_stop

    def on_stop(self: SessionActor) -> None:
        original(self)
        system = self._system
        with system._lock:
            if system._stopping.get(self._key) is self.actor_ref:
                del system._stopping[self._key]

    for variant in ("today", "forget on stop"):
        if variant != "today":
            SessionActor.on_stop = on_stop  # type: ignore[method-assign]
        try:
            with (
                embedded_backend(None, store_root=memory_store_root()) as backend,
                MemorySystem(
                    ShortTermMemoryConfig(strategy="truncation"), log=backend.log, snapshots=backend.snapshots
                ) as system,
            ):
                keys = session_keys(21_000, user=variant.replace(" ", "-"))
                _touch(system, keys[:1000], 16)
                _settle(system)
                before = me.memory_info().rss
                _touch(system, keys[1000:], 16)
                _settle(system)
                after = me.memory_info().rss
                print(
                    f"passivation, {variant}: RSS {before / 2**20:.0f} MiB at 1,000 sessions, "
                    f"{after / 2**20:.0f} MiB at 21,000 ({after / before:.2f}x); "
                    f"{len(system._stopping)} stopped actors still held"
                )
        finally:
            SessionActor.on_stop = original  # type: ignore[method-assign]


def batch() -> None:
    """Median ms of a 2-message atomic batch and of a single publish, file store on disk and on tmpfs."""

    async def measure(url: str) -> tuple[float, float]:
        nc = await nats.connect(url)
        config = {"name": "B", "subjects": ["b.>"], "allow_atomic": True, "storage": "file"}
        await nc.request("$JS.API.STREAM.CREATE.B", json.dumps(config).encode())
        batches, singles = [], []
        for i in range(30):
            batch_id = uuid.uuid4().hex
            started = time.perf_counter()
            headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": "1"}
            await nc.publish(f"b.{i}", b"x" * 500, headers=headers)
            headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": "2", "Nats-Batch-Commit": "1"}
            await nc.request(f"b.{i}", b"y" * 500, headers=headers, timeout=5)
            middle = time.perf_counter()
            await nc.request(f"b.{i}", b"z" * 500, timeout=5)
            batches.append(middle - started)
            singles.append(time.perf_counter() - middle)
        await nc.close()
        return sorted(batches)[15] * 1000, sorted(singles)[15] * 1000

    for where in (None, memory_store_root()):
        with nats_server(None, store_root=where) as server:
            atomic, single = asyncio.run(measure(server.url))
        print(
            f"batch, store on {where or tempfile.gettempdir()} (default flush): atomic batch of 2 "
            f"{atomic:.2f} ms, single publish {single:.2f} ms (medians of 30)"
        )


def collector() -> None:
    """A full collection with 120,000 turn records alive: the records as today, and with gc=False."""
    import gc  # noqa: PLC0415 (this probe alone)

    def kinds(tracked: bool) -> tuple[type[msgspec.Struct], type[msgspec.Struct]]:
        class Turn(msgspec.Struct, frozen=True, kw_only=True, gc=tracked):
            user_message: str
            assistant_response: str
            artifacts_shown: dict[str, Any] = msgspec.field(default_factory=dict)
            artifacts_hidden_refs: tuple[str, ...] = ()

        class Record(msgspec.Struct, frozen=True, kw_only=True, array_like=True, gc=tracked):
            index: int
            turn: Turn
            at: float
            rendered_len: int

        return Turn, Record

    for tracked in (True, False):
        turn, record = kinds(tracked)
        alive = [
            record(
                index=i,
                turn=turn(user_message="u" * 100, assistant_response="a" * 300),
                at=1.0,
                rendered_len=1,
            )
            for i in range(120_000)
        ]
        timings = []
        for _ in range(5):
            started = time.perf_counter()
            gc.collect()
            timings.append(time.perf_counter() - started)
        print(
            f"collector, turn structs gc={tracked}: full collection {min(timings) * 1000:.1f} ms with "
            f"{len(alive):,} records alive ({len(gc.get_objects()):,} tracked objects)"
        )
        del alive


PROBES: dict[str, Callable[[], None]] = {
    "throughput": throughput,
    "view_cache": view_cache,
    "fold": fold,
    "decode": decode,
    "passivation": passivation,
    "batch": batch,
    "collector": collector,
}


def main(names: list[str]) -> None:
    for name in names or list(PROBES):
        PROBES[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
