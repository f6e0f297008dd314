"""How long a service instance's first count of a tenant's stored bytes takes (issue 28, a finding).

    python -m bench._first_count [EVENTS ...]

A `convmem serve` instance counts a tenant's stored bytes in full at the tenant's first write
after the instance starts (`TenantUsage`: so a restart forgets no quota), reading every stored
message of the tenant; that tenant's writes through the instance wait for the count. Here an
embedded server's stream is filled with EVENTS messages of 600 bytes for one tenant (50 users,
1,000 sessions; raw publishes, no convmem code), then the log's own count
(`JetStreamEventLog.stored_bytes`) is timed. Prints one JSON line per size.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time

import nats

from convmem.adapters import JetStreamBackend
from convmem.events import MemoryKey

__all__ = ["first_count"]


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


def main() -> None:
    for events in [int(a) for a in sys.argv[1:]] or [100_000]:
        print(json.dumps(first_count(events)), flush=True)


if __name__ == "__main__":
    main()
