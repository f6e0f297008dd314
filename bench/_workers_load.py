"""The load generator of the `workers` measure, a process of its own (so its CPU is counted apart).

    python -m bench._workers_load URL MODE SESSIONS CALLERS TURNS TAG [--wait]

MODE ``async``: CALLERS asyncio tasks send ``add_turn`` requests (msgpack,
each on the session's routed subject, as convmem's clients send them) on one
nats-py connection and wait for each reply: the least client CPU per turn, so
the service is what is measured. MODE ``threads``: CALLERS threads call the
blocking `RemoteSession.add_turn` of one `RemoteMemory`, as a threaded
planner would. Either way every session gets one turn first (not timed), then
TURNS turns are timed. Prints one JSON line: turns/s and this process's CPU
seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time

import msgspec
import nats

from bench._common import sample_turn, session_keys
from convmem.adapters import RemoteMemory
from convmem.adapters.frontends.service._inboxes import tenant_inbox
from convmem.adapters.frontends.service._protocol import DEFAULT_API_PREFIX, decode_reply, routed_subject
from convmem.events import MemoryKey, encode_token

_encode = msgspec.msgpack.Encoder().encode


def _request(key: MemoryKey, n: int) -> tuple[str, bytes]:
    turn = sample_turn(n)
    body = {
        "user_id": key.user_id,
        "session_id": key.session_id,
        "timeout": 55.0,
        "turn": {"user_message": turn.user_message, "assistant_response": turn.assistant_response},
    }
    subject = routed_subject(DEFAULT_API_PREFIX, key.tenant_id, key.user_id, key.session_id, "add_turn")
    return subject, _encode(body)


async def _async_load(url: str, keys: list[MemoryKey], callers: int, turns: int, wait: bool) -> float:
    [tenant] = {key.tenant_id for key in keys}  # one connection, one inbox: the tenant's own
    nc = await nats.connect(url, allow_reconnect=False, inbox_prefix=tenant_inbox(encode_token(tenant)))
    try:
        requests = [_request(key, n) for n, key in enumerate(keys)]

        async def send(subject: str, payload: bytes) -> None:
            reply = decode_reply((await nc.request(subject, payload, timeout=60)).data)
            if not reply.ok:
                raise RuntimeError(f"add_turn refused: {reply.error}")

        async def caller(index: int, count: int) -> None:
            mine = requests[index::callers]
            for n in range(count):
                await send(*mine[n % len(mine)])

        await asyncio.gather(*(caller(i, len(requests[i::callers])) for i in range(callers)))  # warm-up
        await asyncio.get_running_loop().run_in_executor(None, _ready, wait)
        per_caller = turns // callers
        _phase("start")
        started = time.perf_counter()
        await asyncio.gather(*(caller(i, per_caller) for i in range(callers)))
        rate = per_caller * callers / (time.perf_counter() - started)
        _phase("end")
        return rate
    finally:
        await nc.close()


def _thread_load(url: str, keys: list[MemoryKey], callers: int, turns: int, wait: bool) -> float:
    with RemoteMemory(url, timeout=60.0, encoding="msgpack") as remote:
        sessions = [remote.session(key) for key in keys]
        texts = [sample_turn(n) for n in range(64)]
        per_caller = turns // callers
        barrier = threading.Barrier(callers + 1)
        errors: list[BaseException] = []

        def caller(index: int) -> None:
            mine = sessions[index::callers]
            for session in mine:  # warm-up: every session started
                session.add_turn(texts[0])
            barrier.wait()
            barrier.wait()
            try:
                for n in range(per_caller):
                    mine[n % len(mine)].add_turn(texts[n % len(texts)])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
        for thread in threads:
            thread.start()
        barrier.wait()
        _ready(wait)
        barrier.wait()
        _phase("start")
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        _phase("end")
        if errors:
            raise errors[0]
        return per_caller * callers / elapsed


_cpu: list[float] = []


def _ready(wait: bool) -> None:
    """With ``--wait``: say the warm-up is over and wait for the go (a line on standard input)."""
    if wait:
        print(json.dumps({"phase": "ready"}), flush=True)
        sys.stdin.readline()


def _phase(name: str) -> None:
    """Say when the timed part starts and ends (the parent samples every process's CPU then)."""
    times = os.times()
    _cpu.append(times.user + times.system)
    print(json.dumps({"phase": name}), flush=True)


def main() -> int:
    url, mode, sessions, callers, turns, tag = sys.argv[1:7]
    wait = "--wait" in sys.argv[7:]
    keys = session_keys(int(sessions), tenant="bench", user=f"u{tag}")
    if mode == "async":
        rate = asyncio.run(_async_load(url, keys, int(callers), int(turns), wait))
    else:
        rate = _thread_load(url, keys, int(callers), int(turns), wait)
    print(json.dumps({"phase": "done", "turns_per_s": rate, "cpu_s": _cpu[-1] - _cpu[0]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
