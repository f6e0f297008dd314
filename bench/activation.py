"""5. Session activation from a snapshot plus the log's tail (JetStream backend).

`act_sessions` sessions each get `act_turns` turns through a `MemorySystem`
with a small `snapshot_every`, so each has a JetStream KV snapshot a few events
behind its last event (27 turns, every 10 events: snapshot at seq 20, a tail
of 8 events). Then, with every session passivated:

* ``MemorySystem.load(key)``: snapshot get + tail read + decode + fold, per key;
* first read of a passivated session: ``SessionHandle.get_llm_context()``
  (registry, load, actor start), then the session is passivated again;
* reference: the same sessions rebuilt from the whole log, no snapshot store.

The rounds of the three are interleaved key by key.
"""

from __future__ import annotations

import time

from bench._common import (
    Figure,
    Result,
    Sizes,
    Target,
    embedded_backend,
    in_threads,
    percentile,
    sample_turn,
    session_keys,
)
from convmem.actors import MemorySystem, load_state
from convmem.events import ShortTermMemoryConfig

__all__ = ["run"]


def run(sizes: Sizes) -> Result:
    result = Result()
    keys = session_keys(sizes.act_sessions, user="act")
    config = ShortTermMemoryConfig(strategy="truncation")
    load_ms: list[float] = []
    first_read_ms: list[float] = []
    full_ms: list[float] = []
    with (
        embedded_backend(None) as backend,
        MemorySystem(
            config, log=backend.log, snapshots=backend.snapshots, snapshot_every=sizes.act_snapshot_every
        ) as system,
    ):
        handles = [system.session(k) for k in keys]

        def fill(share: int) -> None:
            for handle in handles[share::8]:
                for n in range(sizes.act_turns):
                    handle.add_turn(sample_turn(n), timeout=60)

        in_threads(fill, 8, timeout=600)
        for key in keys:
            system.passivate(key)
        missing = [k for k in keys if backend.snapshots.load(k) is None]
        if missing:
            raise AssertionError(f"{len(missing)} sessions have no snapshot")
        tail = system.load(keys[0])[1]
        for _round in range(2):
            for key, handle in zip(keys, handles, strict=True):
                started = time.perf_counter()
                system.load(key)
                load_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                load_state(backend.log, None, key)
                full_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                handle.get_llm_context()
                first_read_ms.append((time.perf_counter() - started) * 1000)
                system.passivate(key)
    events = sizes.act_turns + 1
    for label, values in (
        ("MemorySystem.load(key)", load_ms),
        ("first get_llm_context of a passivated session", first_read_ms),
    ):
        for p in (50.0, 99.0):
            result.add(
                Figure(
                    f"{label} p{p:g}",
                    percentile(values, p),
                    "ms",
                    reference=percentile(full_ms, p),
                    reference_label=f"full replay of the {events} events from the log (no snapshot), p{p:g}",
                    target=Target("value", "<=", 5.0) if p == 50.0 else None,
                )
            )
    result.details = {
        "sessions": sizes.act_sessions,
        "events_per_session": events,
        "snapshot_every": sizes.act_snapshot_every,
        "snapshot_seq": tail.snapshot_seq,
        "tail_events": tail.events_applied,
        "samples": len(load_ms),
    }
    result.notes.append(
        f"{sizes.act_sessions} sessions of {events} events, snapshot_every={sizes.act_snapshot_every} "
        f"(snapshot at seq {tail.snapshot_seq}, tail of {tail.events_applied} events); "
        "JetStream KV snapshots, "
        "server default flush; two rounds over every key"
    )
    return result
