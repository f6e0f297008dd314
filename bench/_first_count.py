"""How long a service instance's first count of a tenant's stored bytes takes (issue 28, a finding).

    python -m bench._first_count [EVENTS ...]
    python -m bench._first_count --writers N [--recount-every S] EVENTS


A `convmem serve` instance counts a tenant's stored bytes in full at the tenant's first write
after the instance starts (`TenantUsage`: so a restart forgets no quota), reading every stored
message of the tenant; that tenant's writes through the instance wait for the count. Here an
embedded server's stream is filled with EVENTS messages of 600 bytes for one tenant (50 users,
1,000 sessions; raw publishes, no convmem code), then the log's own count
(`JetStreamEventLog.stored_bytes`) is timed. Prints one JSON line per size.

With ``--writers N`` (the ``cores`` bench's stall, issue 28): the stream also holds as many bytes
of another tenant, the tenant's quota sits between its own bytes and the stream's (so the stream's
total cannot admit its first write: the full count must), and a `MemoryService` in this process
(``recount_every`` S, default 5) gets N first writes of the tenant at once, each its own session,
as a load process's warm-up sends them. Prints how long the first and the last answer took and
how many counts the service began; then the same for a fresh instance (a restart) and N new
sessions.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from typing import Any

import msgspec
import nats
import nats.errors

import convmem
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend, MemoryService, Quotas, TenantLimits
from convmem.adapters.frontends.service._inboxes import tenant_inbox
from convmem.adapters.frontends.service._protocol import DEFAULT_API_PREFIX, decode_reply, routed_subject
from convmem.events import MemoryKey, encode_token

__all__ = ["first_count", "first_writes"]


def first_count(events: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="convmem-bench-count-") as store:
        backend = JetStreamBackend.embedded(store)
        try:
            log = backend.log
            tenant, _, _ = MemoryKey("t1", "u1", "s1").tokens()
            stream, prefix = log._stream, log._keys.prefix

            async def fill() -> int:
                nc = await nats.connect(backend.url)
                js = nc.jetstream()
                payload = b"x" * 600
                for start in range(0, events, 1000):  # acknowledged in batches: none is dropped
                    acks = [
                        await js.publish_async(f"{prefix}.{tenant}.u{i % 50}.s{i % 1000}", payload)
                        for i in range(start, min(events, start + 1000))
                    ]
                    await asyncio.gather(*acks)
                stored = (await js.stream_info(stream)).state.messages
                await nc.close()
                return stored

            stored = asyncio.run(fill())
            started = time.perf_counter()
            counted, _ = log.stored_bytes("t1")
            seconds = time.perf_counter() - started
        finally:
            backend.close()
    return {
        "events": stored,
        "bytes": counted,
        "seconds": round(seconds, 2),
        "events_per_s": round(stored / seconds),
    }


def _fill(url: str, stream: str, prefix: str, tenants: list[str], events: int) -> None:
    """`events` messages of 600 bytes for each of `tenants`, acknowledged in batches (none dropped)."""

    async def fill() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        payload = b"x" * 600
        for tenant in tenants:
            for start in range(0, events, 1000):
                acks = [
                    await js.publish_async(f"{prefix}.{tenant}.u{i % 50}.s{i % 1000}", payload)
                    for i in range(start, min(events, start + 1000))
                ]
                await asyncio.gather(*acks)
        await nc.close()

    asyncio.run(fill())


def first_writes(events: int, writers: int, recount_every: float) -> dict[str, Any]:
    """N first writes of a tenant whose quota the stream's total does not clear (see the docstring)."""
    with tempfile.TemporaryDirectory(prefix="convmem-bench-stall-") as store:
        server = EmbeddedNatsServer(store).start()
        try:
            system = convmem.connect(server.url)
            try:
                log: Any = system.log
                tenant, other = MemoryKey("t1", "u", "s").tokens()[0], MemoryKey("t0", "u", "s").tokens()[0]
                _fill(server.url, log.stream, log._keys.prefix, [tenant, other], events)
                own, _ = log.stored_bytes("t1")
                quota = TenantLimits(max_in_flight=10_000, max_running=10_000, max_bytes=own * 3 // 2)
                service = MemoryService(
                    system, server.url, quotas=Quotas(default=quota, recount_every=recount_every)
                )
                counts = _counting(service)
                with service:
                    answered = asyncio.run(_first_writes(server.url, writers, "first"))
                fresh = MemoryService(  # a restart: a fresh instance, the tenant's next first writes
                    system, server.url, quotas=Quotas(default=quota, recount_every=recount_every)
                )
                fresh_counts = _counting(fresh)
                with fresh:
                    restarted = asyncio.run(_first_writes(server.url, writers, "again"))
            finally:
                system.close()
        finally:
            server.stop()
    times = [t for t in answered if t is not None]
    again = [t for t in restarted if t is not None]
    return {
        "events_of_the_tenant": events,
        "writers": writers,
        "recount_every_s": recount_every,
        "first_answer_s": round(min(times), 2) if times else None,
        "last_answer_s": round(max(times), 2) if times else None,
        "unanswered_in_60_s": writers - len(times),
        "counts_begun": len(counts),
        "after_a_restart": {
            "last_answer_s": round(max(again), 2) if again else None,
            "unanswered_in_60_s": writers - len(again),
            "counts_begun": len(fresh_counts),
        },
    }


def _counting(service: MemoryService) -> list[float]:
    """The service's byte counts, noted as each begins (the service's own counter, wrapped)."""
    usage: Any = service._usage
    counter, begun = usage._counter, []

    async def counted(tenant_id: str, after: int) -> tuple[int, int]:
        begun.append(time.perf_counter())
        result: tuple[int, int] = await counter(tenant_id, after)
        return result

    usage._counter = counted
    return begun


async def _first_writes(url: str, writers: int, name: str) -> list[float | None]:
    """When each write was answered (None: not within 60 s, as a load process's warm-up gives up)."""
    encode = msgspec.msgpack.Encoder().encode
    nc = await nats.connect(url, inbox_prefix=tenant_inbox(encode_token("t1")))
    try:
        started = time.perf_counter()

        async def write(n: int) -> float | None:
            turn = {"user_message": "hi", "assistant_response": "hello"}
            body = {"user_id": "w", "session_id": f"{name}{n}", "timeout": 55.0, "turn": turn}
            subject = routed_subject(DEFAULT_API_PREFIX, "t1", "w", f"{name}{n}", "add_turn")
            try:
                reply = decode_reply((await nc.request(subject, encode(body), timeout=60)).data)
            except nats.errors.TimeoutError:
                return None
            if not reply.ok:
                raise RuntimeError(f"add_turn refused: {reply.error}")
            return time.perf_counter() - started

        return list(await asyncio.gather(*(write(n) for n in range(writers))))
    finally:
        await nc.close()


def main() -> None:
    args = sys.argv[1:]
    if "--writers" in args:
        at = args.index("--writers")
        writers = int(args.pop(at + 1))
        args.pop(at)
        recount = 5.0
        if "--recount-every" in args:
            at = args.index("--recount-every")
            recount = float(args.pop(at + 1))
            args.pop(at)
        print(json.dumps(first_writes(int(args[0]) if args else 100_000, writers, recount)), flush=True)
        return
    for events in [int(a) for a in args] or [100_000]:
        print(json.dumps(first_count(events)), flush=True)


if __name__ == "__main__":
    main()
