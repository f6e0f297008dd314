"""1. Durable `add_turn` throughput against the raw nats-py `publish_async` ceiling.

convmem: a `MemorySystem` on `JetStreamBackend.embedded` (file storage, one
replica), `strategy="truncation"`, every session started beforehand (not
timed) and kept live (`max_live_sessions` above the session count, so this
measures writes, not activation; churn is the `scale` measure's). Many
threads call the blocking `SessionHandle.add_turn`, each on its own share of
the sessions, and every call returns only after JetStream acknowledged it.

Ceiling: a separate nats-py connection publishes the same encoded
`TurnAdded` bytes with `js.publish_async` (up to 4,000 acks outstanding) to a
separate stream on the same server, spread over as many subjects as there are
sessions, each with a `Nats-Msg-Id` header as convmem's appends carry. The two
alternate (ceiling, convmem, ceiling, convmem, ceiling); each figure is the
best of its rounds.

Both are measured once with the server's default flush and once with
``sync_interval: always`` (the embedded default).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time

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
    sync_label,
)
from bench._profile import py_spy
from convmem.actors import AsyncSessionHandle, MemorySystem, SessionHandle
from convmem.adapters import JetStreamBackend
from convmem.events import ConversationTurn, ShortTermMemoryConfig, TurnAdded, encode_event

__all__ = ["run"]

_RAW_STREAM = "BENCH_RAW"


def _payloads(count: int, turns: list[ConversationTurn], run: str) -> list[tuple[str, bytes]]:
    """Encoded `TurnAdded` events as convmem stores them, with distinct message ids."""
    out = []
    for i in range(count):
        event_id = f"{run}-{i:08d}-0123456789abcdef0123456789/1"
        event = TurnAdded(seq=i + 2, event_id=event_id, at=1.7e9 + i, index=i + 1, turn=turns[i % len(turns)])
        out.append((event_id, encode_event(event)))
    return out


async def _raw_publish(url: str, sessions: int, payloads: list[tuple[str, bytes]]) -> float:
    """Messages per second that nats-py's `publish_async` gets acknowledged."""
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        js = nc.jetstream()
        await js.add_stream(name=_RAW_STREAM, subjects=["bench.raw.>"])
        started = time.perf_counter()
        for i, (event_id, data) in enumerate(payloads):
            await js.publish_async(f"bench.raw.s{i % sessions}", data, headers={"Nats-Msg-Id": event_id})
        await asyncio.wait_for(js.publish_async_completed(), 120)
        return len(payloads) / (time.perf_counter() - started)
    finally:
        await nc.close()


def _convmem_rate(
    handles: list[SessionHandle], callers: int, turns: list[ConversationTurn], total: int
) -> float:
    per_caller = total // callers
    barrier = threading.Barrier(callers + 1)
    errors: list[BaseException] = []

    def caller(index: int) -> None:
        mine = handles[index::callers]
        barrier.wait()
        try:
            for n in range(per_caller):
                mine[n % len(mine)].add_turn(turns[n % len(turns)], timeout=60)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(callers)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join(timeout=600)
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return per_caller * callers / elapsed


def _system(backend: JetStreamBackend, sizes: Sizes) -> MemorySystem:
    """Every session stays live: this measures writes, not activation (churn is `scale`'s)."""
    return MemorySystem(
        ShortTermMemoryConfig(strategy="truncation"),
        log=backend.log,
        snapshots=backend.snapshots,
        max_live_sessions=sizes.tp_sessions + 24,
    )


def _figure(how: str, rate: float, ceiling: float) -> Figure:
    return Figure(
        f"add_turn turns/s, {how}",
        rate,
        "turns/s",
        reference=ceiling,
        reference_label="nats-py publish_async msgs/s (same payloads, same server)",
        target=Target("ratio", ">=", 0.5),
    )


def _start_sessions(handles: list[SessionHandle], callers: int, turn: ConversationTurn) -> None:
    def start(share: int) -> None:
        for handle in handles[share::callers]:
            handle.add_turn(turn, timeout=60)

    in_threads(start, callers, timeout=600)


def _one_mode(sizes: Sizes, sync_interval: str | None, result: Result) -> None:
    label = sync_label(sync_interval)
    turns = [sample_turn(n) for n in range(64)]
    keys = session_keys(sizes.tp_sessions)
    total = sizes.tp_turns - sizes.tp_turns % sizes.tp_callers
    with embedded_backend(sync_interval) as backend:
        assert backend.server is not None
        url = backend.server.url
        system = _system(backend, sizes)
        try:
            handles = [system.session(k) for k in keys]
            _start_sessions(handles, sizes.tp_callers, turns[0])
            # Two rounds of (ceiling, convmem), then the ceiling once more: best of each.
            raws, rates = [], []
            for run in range(2):
                raws.append(
                    asyncio.run(_raw_publish(url, sizes.tp_sessions, _payloads(total, turns, f"r{run}")))
                )
                rates.append(_convmem_rate(handles, sizes.tp_callers, turns, total // 2))
            raws.append(asyncio.run(_raw_publish(url, sizes.tp_sessions, _payloads(total, turns, "r2"))))
            rate, ceiling = max(rates), max(raws)
            append = system.metrics.snapshot().get("append_ms", {})
            if sizes.profile and rate < 0.5 * ceiling:
                with py_spy(sizes.out_dir, f"throughput-{label}", result.details):
                    _convmem_rate(handles, sizes.tp_callers, turns, total)
        finally:
            system.close()
    result.add(_figure(f"{sizes.tp_callers} threads, {sizes.tp_sessions} sessions [{label}]", rate, ceiling))
    result.details[label] = {
        "convmem_turns_per_s": rate,
        "convmem_rounds_per_s": rates,
        "raw_rounds_per_s": raws,
        "turns": total,
        "append_ms": append,
        "payload_bytes": len(_payloads(1, turns, "x")[0][1]),
    }


async def _async_rate(
    handles: list[AsyncSessionHandle], callers: int, turns: list[ConversationTurn], total: int
) -> float:
    per_caller = total // callers

    async def caller(index: int) -> None:
        mine = handles[index::callers]
        for n in range(per_caller):
            await mine[n % len(mine)].add_turn(turns[n % len(turns)], timeout=60)

    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    return per_caller * callers / (time.perf_counter() - started)


async def _async_mode(sizes: Sizes, sync_interval: str | None, result: Result) -> None:
    """The same load from asyncio tasks, with the connection on their loop (`connect_here`)."""
    label = sync_label(sync_interval)
    turns = [sample_turn(n) for n in range(64)]
    keys = session_keys(sizes.tp_sessions)
    total = sizes.tp_turns - sizes.tp_turns % sizes.tp_callers
    with tempfile.TemporaryDirectory(prefix="convmem-bench-") as store:
        backend = await JetStreamBackend.embedded_here(store, sync_interval=sync_interval)
        assert backend.server is not None
        url = backend.server.url
        system = _system(backend, sizes)
        try:
            handles = [system.session(k).aio for k in keys]
            for share in range(sizes.tp_callers):  # open every session (activation), not timed
                await asyncio.gather(*(h.add_turn(turns[0]) for h in handles[share :: sizes.tp_callers]))
            raws, rates = [], []
            for run in range(2):
                raws.append(await _raw_publish(url, sizes.tp_sessions, _payloads(total, turns, f"a{run}")))
                rates.append(await _async_rate(handles, sizes.tp_callers, turns, total // 2))
            raws.append(await _raw_publish(url, sizes.tp_sessions, _payloads(total, turns, "a2")))
            rate, ceiling = max(rates), max(raws)
            if sizes.profile and rate < 0.5 * ceiling:
                with py_spy(sizes.out_dir, f"throughput-async-{label}", result.details):
                    await _async_rate(handles, sizes.tp_callers, turns, total)
        finally:
            await system.aclose()
            await backend.aclose()
    way = f"{sizes.tp_callers} asyncio tasks, connection on their loop, {sizes.tp_sessions} sessions"
    result.add(_figure(f"{way} [{label}]", rate, ceiling))
    result.details[f"async-{label}"] = {
        "convmem_turns_per_s": rate,
        "convmem_rounds_per_s": rates,
        "raw_rounds_per_s": raws,
        "turns": total,
    }


def run(sizes: Sizes) -> Result:
    result = Result()
    for sync_interval in (None, "always"):
        _one_mode(sizes, sync_interval, result)
        asyncio.run(_async_mode(sizes, sync_interval, result))
    result.notes.append(
        "convmem: add_turn with every session live (max_live_sessions above the session count), "
        "strategy truncation, two ways: the blocking SessionHandle from many threads (the connection "
        "on convmem's own loop thread), and AsyncSessionHandle from as many asyncio tasks with the "
        "connection on their loop (JetStreamBackend.embedded_here); "
        "ceiling: nats-py js.publish_async of the same encoded "
        "TurnAdded bytes with Nats-Msg-Id headers to a separate stream on the same server; "
        "rounds alternate, best of each"
    )
    return result
