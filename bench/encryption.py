"""Encryption at rest: durable writes and reads with and without it, side by side, alternating rounds.

One embedded-style nats-server (``sync_interval: always``: every append
fsynced before its ack) serves two systems on streams of their own: one
storing events plain (``KeySettings(encrypt=False)``), one sealing each
event with its user's data key (a `Keyring` on a folder key store and a
master key file, as the embedded default has). Each round writes
`turns` durable `add_turn`s from `callers` threads over fresh sessions of
97 users (their data keys made and cached in the untimed warm-up) to each,
then reads each variant's whole stream back in log order (`EventLog.read_all`,
batched direct gets, which opens sealed bytes, and `decode_event` of each,
as replay, verify and export do).
Rounds alternate which variant goes first (writes: A B, then B A; reads,
after both writes: A B B A, each variant's two reads averaged); each figure
is the median of its rounds, the sealed one against the plain one, with the target of
staying within 15% (ratio >= 0.85). Beside them: the cost of sealing and of
opening one typical `TurnAdded`, in microseconds.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench._common import Figure, Result, Sizes, Target, in_threads, nats_server, sample_turn
from convmem.actors import MemorySystem, SessionHandle
from convmem.adapters import JetStreamBackend
from convmem.adapters.backends.keys import (
    DirKeyStore,
    Keyring,
    KeySettings,
    generate_key_text,
    master_key_from_file,
)
from convmem.adapters.backends.keys._master import write_key_file
from convmem.events import MemoryKey, ShortTermMemoryConfig, TurnAdded, decode_event, encode_event

__all__ = ["run"]

_CONFIG = ShortTermMemoryConfig(strategy="truncation")
_USERS = 97


def _keys(prefix: str, count: int) -> list[MemoryKey]:
    return [MemoryKey("bench", f"user-{i % _USERS}", f"{prefix}-{i}") for i in range(count)]


def _write(system: MemorySystem, keys: list[MemoryKey], callers: int, turns: int) -> float:
    """Durable turns per second from `callers` threads, each on its share of `keys`."""
    handles: list[SessionHandle] = [system.session(k) for k in keys]
    per_caller = turns // callers
    samples = [sample_turn(n) for n in range(64)]
    gate = threading.Barrier(callers + 1)

    def work(index: int) -> None:
        mine = handles[index::callers]
        gate.wait()
        for n in range(per_caller):
            mine[n % len(mine)].add_turn(samples[(index + n) % len(samples)], timeout=60)

    started = [0.0]

    def starter() -> None:
        gate.wait()
        started[0] = time.perf_counter()

    thread = threading.Thread(target=starter)
    thread.start()
    in_threads(work, callers, timeout=300)
    thread.join()
    return per_caller * callers / (time.perf_counter() - started[0])


def _read(system: MemorySystem) -> float:
    """Events per second of the whole stream read back in log order and decoded (as a replay reads)."""
    started = time.perf_counter()
    events = 0
    for record in system.log.read_all(tenant_id="bench"):
        decode_event(record.data)
        events += 1
    return events / (time.perf_counter() - started)


def _per_event_micros(keyring: Keyring, count: int) -> tuple[float, float]:
    key = MemoryKey("bench", "user-0", "micro")
    event = TurnAdded(seq=2, event_id="e" * 32, at=1.7e9, index=1, turn=sample_turn(1))
    data = encode_event(event)
    context = keyring.context(key) + b"2"
    started = time.perf_counter()
    for _ in range(count):
        sealed = keyring.seal(key, data, context)
    seal = (time.perf_counter() - started) / count * 1e6
    started = time.perf_counter()
    for _ in range(count):
        keyring.open(sealed, context, where="bench")
    return seal, (time.perf_counter() - started) / count * 1e6


def run(sizes: Sizes) -> Result:
    rounds = 1 if sizes.smoke else 7
    sessions = 20 if sizes.smoke else 300
    callers = 4 if sizes.smoke else 32
    turns = 80 if sizes.smoke else 3000
    result = Result()
    rates: dict[str, dict[str, list[float]]] = {v: {"write": [], "read": []} for v in ("plain", "sealed")}
    with tempfile.TemporaryDirectory(prefix="convmem-bench-keys-") as folder, nats_server("always") as server:
        master = Path(folder, "master.key")
        write_key_file(master, generate_key_text())
        keyring = Keyring(master_key_from_file(master), DirKeyStore(Path(folder, "keys")))
        with (
            JetStreamBackend.connect(
                server.url,
                stream="BENCH_PLAIN",
                prefix="bench.plain",
                bucket="BENCH_PLAIN_SNAP",
                keys=KeySettings(encrypt=False),
            ) as plain,
            JetStreamBackend.connect(
                server.url,
                stream="BENCH_SEALED",
                prefix="bench.sealed",
                bucket="BENCH_SEALED_SNAP",
                keys=keyring,
            ) as sealed,
            MemorySystem(
                log=plain.log, snapshots=None, config=_CONFIG, max_live_sessions=100_000
            ) as on_plain,
            MemorySystem(
                log=sealed.log, snapshots=None, config=_CONFIG, max_live_sessions=100_000
            ) as on_sealed,
        ):
            systems = {"plain": on_plain, "sealed": on_sealed}
            for variant, system in systems.items():  # warm-up: connections, data keys of every user
                _write(system, _keys(f"warm-{variant}", _USERS), min(callers, _USERS), _USERS)
            for n in range(rounds):
                order = ("plain", "sealed") if n % 2 == 0 else ("sealed", "plain")
                for variant in order:
                    keys = _keys(f"r{n}-{variant}", sessions)
                    rates[variant]["write"].append(_write(systems[variant], keys, callers, turns))
                # Reads after both writes, in A B B A order: neither reads while the server still
                # flushes its own writes, and drift over the round touches both alike.
                read: dict[str, list[float]] = {"plain": [], "sealed": []}
                for variant in (*order, *reversed(order)):
                    read[variant].append(_read(systems[variant]))
                for variant, pair in read.items():
                    rates[variant]["read"].append(statistics.mean(pair))
        seal_us, open_us = _per_event_micros(keyring, 2_000 if sizes.smoke else 20_000)
        keyring.close()
    for what, unit, label in (
        ("write", "turns/s", "durable add_turn"),
        ("read", "events/s", "log read_all + decode"),
    ):
        plain_rate = statistics.median(rates["plain"][what])
        sealed_rate = statistics.median(rates["sealed"][what])
        result.add(
            Figure(
                f"{label}, encrypted against plain",
                sealed_rate,
                unit,
                reference=plain_rate,
                reference_label="plain",
                target=Target("ratio", ">=", 0.85),
                note=f"median of {rounds} alternating rounds; sealed {_rounded(rates['sealed'][what])}, "
                f"plain {_rounded(rates['plain'][what])}",
            )
        )
    result.add(Figure("seal one TurnAdded (~600 bytes)", seal_us, "us"))
    result.add(Figure("open one TurnAdded (~600 bytes)", open_us, "us"))
    result.notes.append(
        f"{sessions} fresh sessions of {_USERS} users per round, {callers} threads, {turns} turns; "
        "sync_interval always; sealed: AES-256-GCM per event, data keys cached"
    )
    result.details = {v: {w: [round(r, 1) for r in rs] for w, rs in d.items()} for v, d in rates.items()}
    return result


def _rounded(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:,.0f}" for v in values) + "]"
