"""The expensive tenant of the `cpu_fairness` measure, a process of its own (its CPU is not the service's).

    python -m bench._heavy URL TENANT WINDOW OP QUERY_CHARS SESSIONS

A plain nats-py client with WINDOW requests always in flight (within the
tenant's shares: at most ``max_running``), each a legal but CPU-expensive
read: ``context`` with a query of QUERY_CHARS characters (recall over the
session's live turns), ``export_state`` or ``views``, round-robin over
SESSIONS sessions ``heavy/s{n}``. Prints ``{"phase": "loading"}`` once the
first replies came back, then loads until a line arrives on stdin; then
prints the counts of replies by kind, the seconds, the rate and the
requests' own p50/p99.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections import Counter

import msgspec
import nats
import nats.errors

from convmem.adapters.frontends.service._inboxes import tenant_inbox
from convmem.adapters.frontends.service._protocol import DEFAULT_API_PREFIX, decode_reply, routed_subject
from convmem.events import encode_token

_encode = msgspec.msgpack.Encoder().encode
_WORDS = (
    "budget",
    "deadline",
    "invoice",
    "supplier",
    "warehouse",
    "shipment",
    "refund",
    "contract",
    "meeting",
)


def long_query(chars: int) -> str:
    """A query of about `chars` ASCII characters made of words the sessions hold."""
    words: list[str] = []
    n = 0
    while sum(len(w) + 1 for w in words) < chars:
        words.append(f"{_WORDS[n % len(_WORDS)]}{n % 97}")
        n += 1
    return " ".join(words)[:chars]


async def _load(
    url: str, tenant: str, window: int, op: str, chars: int, sessions: int, stop: threading.Event
) -> dict:
    nc = await nats.connect(
        url, allow_reconnect=False, pending_size=64 << 20, inbox_prefix=tenant_inbox(encode_token(tenant))
    )
    counts: Counter[str] = Counter()
    took: list[float] = []
    first = asyncio.Event()
    requests = []
    for n in range(sessions):
        body: dict[str, object] = {"user_id": "heavy", "session_id": f"s{n}", "timeout": 60.0}
        if op == "context":
            body["query"] = long_query(chars)
        if op == "views":
            body["view"] = "window"
        requests.append((routed_subject(DEFAULT_API_PREFIX, tenant, "heavy", f"s{n}", op), _encode(body)))

    async def sender(index: int) -> None:
        n = index
        while not stop.is_set():
            subject, payload = requests[n % len(requests)]
            n += 1
            began = time.perf_counter()
            try:
                reply = decode_reply((await nc.request(subject, payload, timeout=120.0)).data)
                kind = "ok" if reply.ok else (reply.error.type if reply.error else "error")
            except nats.errors.TimeoutError:
                kind = "timeout"
            counts[kind] += 1
            if kind == "ok" and first.is_set():
                took.append(time.perf_counter() - began)
            first.set()

    tasks = [asyncio.ensure_future(sender(i)) for i in range(window)]
    await first.wait()
    print(json.dumps({"phase": "loading"}), flush=True)
    began, at_start = time.perf_counter(), sum(counts.values())
    await asyncio.to_thread(stop.wait)
    seconds = time.perf_counter() - began
    answered = sum(counts.values()) - at_start
    await asyncio.gather(*tasks, return_exceptions=True)
    await nc.close()
    took.sort()
    pick = lambda p: round(took[min(len(took) - 1, int(len(took) * p / 100))] * 1000, 1) if took else None  # noqa: E731
    return {
        "phase": "done",
        "counts": dict(counts),
        "seconds": seconds,
        "answered": answered,
        "per_s": answered / seconds,
        "p50_ms": pick(50),
        "p99_ms": pick(99),
    }


def main() -> int:
    url, tenant, window, op, chars, sessions = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        sys.argv[4],
        int(sys.argv[5]),
        int(sys.argv[6]),
    )
    stop = threading.Event()

    def wait_for_stop() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    print(json.dumps(asyncio.run(_load(url, tenant, window, op, chars, sessions, stop))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
