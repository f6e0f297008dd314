"""The flooding tenant of the `fairness` measure, a process of its own (its CPU is not the victim's).

    python -m bench._flood URL TENANT WINDOW [API_PREFIX]
    python -m bench._flood echo URL API_PREFIX

A plain nats-py client, as a hostile program would use: WINDOW asyncio tasks
each send a cheap request (``context`` of one of the tenant's sessions, on
its routed subject, msgpack) and send the next as soon as its reply comes, so
WINDOW requests are always in flight, at the fastest rate the replies allow.
Prints ``{"phase": "flooding"}`` once the first replies came back, then floods
until a line arrives on stdin; then prints the counts of replies by kind
(``ok``, the error types, ``timeout``), the seconds and the rate.

``echo``: a trivial responder on ``API_PREFIX.>`` (answers every request
with a fixed error reply at once), the control the `fairness` measure
floods in place of the service: what the flood costs the machine alone.
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
import nats.aio.msg
import nats.errors

from convmem.adapters.frontends.service._inboxes import tenant_inbox
from convmem.adapters.frontends.service._protocol import DEFAULT_API_PREFIX, decode_reply, routed_subject
from convmem.events import encode_token

_encode = msgspec.msgpack.Encoder().encode


async def _flood(url: str, tenant: str, window: int, stop: threading.Event, prefix: str) -> dict[str, object]:
    inbox = tenant_inbox(encode_token(tenant))  # the service answers a tenant on its own inbox only
    nc = await nats.connect(url, allow_reconnect=False, pending_size=64 << 20, inbox_prefix=inbox)
    counts: Counter[str] = Counter()
    first = asyncio.Event()
    requests = []
    for n in range(16):
        body = {"user_id": "flooder", "session_id": f"s{n}", "timeout": 5.0}
        subject = routed_subject(prefix, tenant, "flooder", f"s{n}", "context")
        requests.append((subject, _encode(body)))

    async def sender(index: int) -> None:
        n = index
        while not stop.is_set():
            subject, payload = requests[n % len(requests)]
            n += 1
            try:
                reply = decode_reply((await nc.request(subject, payload, timeout=10.0)).data)
                counts["ok" if reply.ok else (reply.error.type if reply.error else "error")] += 1
            except nats.errors.TimeoutError:
                counts["timeout"] += 1
            first.set()

    tasks = [asyncio.ensure_future(sender(i)) for i in range(window)]
    await first.wait()
    print(json.dumps({"phase": "flooding"}), flush=True)
    began, at_start = time.perf_counter(), sum(counts.values())
    await asyncio.to_thread(stop.wait)
    seconds = time.perf_counter() - began
    answered = sum(counts.values()) - at_start
    await asyncio.gather(*tasks, return_exceptions=True)
    await nc.close()
    return {"phase": "done", "counts": dict(counts), "seconds": seconds, "per_s": answered / seconds}


async def _echo(url: str, prefix: str) -> None:
    nc = await nats.connect(url, allow_reconnect=False, pending_size=64 << 20)
    reply = b'{"v": 1, "ok": false, "error": {"type": "Busy", "message": "a fixed reply"}}'

    async def answer(msg: nats.aio.msg.Msg) -> None:
        await nc.publish(msg.reply, reply)

    await nc.subscribe(f"{prefix}.>", cb=answer)
    await nc.flush()
    print(json.dumps({"phase": "echoing"}), flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await nc.close()


def main() -> int:
    if sys.argv[1] == "echo":
        asyncio.run(_echo(sys.argv[2], sys.argv[3]))
        return 0
    url, tenant, window = sys.argv[1], sys.argv[2], int(sys.argv[3])
    prefix = sys.argv[4] if len(sys.argv) > 4 else DEFAULT_API_PREFIX
    stop = threading.Event()

    def wait_for_stop() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    print(json.dumps(asyncio.run(_flood(url, tenant, window, stop, prefix))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
