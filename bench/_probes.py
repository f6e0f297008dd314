"""Probes behind the proposed fixes in RESULTS.md: ``python -m bench._probes [NAME ...]``.

Not part of the harness (nothing here runs in ``python -m bench`` or in CI):
each probe measures a *prototype* of a proposed change to convmem beside
convmem as it is, in one process, so the proposal comes with its measured
effect. Prototypes reach into private attributes or patch a function for the
length of one call; they break when convmem changes, which is fine for a probe.

Probes: ``throughput`` (where add_turn throughput goes, layer by layer),
``batch`` (an atomic batch against single publishes on disk and on tmpfs),
``collector`` (a full garbage collection with turn structs tracked or not).
The probes of run 1's other proposals (``view_cache``, ``fold``, ``decode``,
``passivation``) were removed once their changes landed; their figures stay in
RESULTS.md as measured.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import nats

from bench import throughput as tp
from bench._common import (
    embedded_backend,
    memory_store_root,
    nats_server,
    sample_turn,
    session_keys,
)
from convmem.actors import MemorySystem
from convmem.adapters.backends.jetstream._write import PendingAppend
from convmem.events import ShortTermMemoryConfig, TurnAdded, encode_event

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
        seqs = {k: system.session(k).snapshot_state().version for k in keys}
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

        async def fast_on_loop() -> float:
            async def worker(i: int) -> None:
                mine = keys[i::64]
                for n in range(total // 64):
                    key = mine[n % len(mine)]
                    added = event(key, "fast")
                    done: concurrent.futures.Future[int] = concurrent.futures.Future()
                    done.set_running_or_notify_cancel()
                    subject, payload = log.subject(key), encode_event(added)
                    await writer.start_append(
                        PendingAppend(key, subject, (added,), (payload,), added.seq - 1, done, "probe")
                    )
                    await asyncio.wrap_future(done)

            began = time.perf_counter()
            await asyncio.gather(*(worker(i) for i in range(64)))
            return total / (time.perf_counter() - began)

        fast_rate = conn.call(fast_on_loop, what="probe", timeout=600)
    print(
        f"throughput (sync=default): raw publish_async {raw:,.0f}/s; SessionWriter.start_append (the hot "
        f"path) x64 on the loop {fast_rate:,.0f}/s; SessionWriter.append (the full path) x64 on the loop "
        f"{loop_rate:,.0f}/s; JetStreamEventLog.append from 64 threads {from_threads:,.0f}/s; "
        f"SessionHandle.add_turn from 64 threads {convmem:,.0f}/s"
    )


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
    "batch": batch,
    "collector": collector,
}


def main(names: list[str]) -> None:
    for name in names or list(PROBES):
        PROBES[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
