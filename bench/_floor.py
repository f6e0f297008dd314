"""The floor under a served durable turn: a process that does nothing but what nats-py must do.

    python -m bench._floor [--turns 6000] [--callers 32]

A responder process (this module with ``--respond URL``) subscribes to requests; for each it
publishes the payload to a JetStream stream with a reply subject of its own (as convmem's fast
append path does), and when the stream's acknowledgement comes it answers the request: the four
messages of a served ``add_turn`` (request, publish, acknowledgement, reply) through nats-py on
one asyncio loop, with no convmem code at all. The load comes from this process (asyncio
callers, `nc.request`); the responder's CPU per turn, read from /proc, is the floor that
`convmem serve`'s workers' CPU per durable turn sits on. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nats

from bench._common import memory_store_root, nats_server, sample_turn

__all__ = ["floor"]

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


async def _respond(url: str) -> None:
    nc = await nats.connect(url, allow_reconnect=False)
    js = nc.jetstream()
    await js.add_stream(name="FLOOR", subjects=["floor.log.>"])
    waiting: dict[str, str] = {}
    tokens = iter(range(1 << 62))
    prefix = nc.new_inbox() + "."

    async def on_ack(msg: nats.aio.msg.Msg) -> None:
        reply = waiting.pop(msg.subject[len(prefix) :], None)
        if reply is not None:
            await nc.publish(reply, b'{"ok":true}')

    async def on_request(msg: nats.aio.msg.Msg) -> None:
        token = str(next(tokens))
        waiting[token] = msg.reply
        await nc.publish(f"floor.log.{token}", msg.data, reply=prefix + token)

    await nc.subscribe(prefix + "*", cb=on_ack)
    await nc.subscribe("floor.req", cb=on_request)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await nc.close()


async def _load(url: str, turns: int, callers: int) -> float:
    nc = await nats.connect(url, allow_reconnect=False)
    payload = json.dumps({"turn": sample_turn(1).user_message}).encode()

    async def caller(n: int) -> None:
        for _ in range(n):
            await nc.request("floor.req", payload, timeout=60)

    await asyncio.gather(*(caller(10) for _ in range(callers)))  # warm-up
    started = time.perf_counter()
    await asyncio.gather(*(caller(turns // callers) for _ in range(callers)))
    elapsed = time.perf_counter() - started
    await nc.close()
    return turns // callers * callers / elapsed


def floor(turns: int, callers: int) -> dict[str, float]:
    with nats_server("always", store_root=memory_store_root()) as server:
        responder = subprocess.Popen(
            [sys.executable, "-m", "bench._floor", "--respond", server.url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert responder.stdout is not None
            assert responder.stdin is not None
            if responder.stdout.readline().strip() != "ready":
                raise RuntimeError("the floor's responder did not start")
            before, began = _cpu(responder.pid), time.perf_counter()
            rate = asyncio.run(_load(server.url, turns, callers))
            spent, wall = _cpu(responder.pid) - before, time.perf_counter() - began
            responder.stdin.write("stop\n")
            responder.stdin.flush()
            responder.wait(30)
        finally:
            if responder.poll() is None:
                responder.kill()
                responder.wait()
    done = turns // callers * callers + 10 * callers
    return {
        "turns_per_s": round(rate),
        "responder_cpu_us_per_turn": round(spent / done * 1e6, 1),
        "wall_s": round(wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="The nats-py floor under a served durable turn.")
    parser.add_argument("--turns", type=int, default=6000)
    parser.add_argument("--callers", type=int, default=32)
    parser.add_argument("--respond", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.respond:
        asyncio.run(_respond(args.respond))
    else:
        print(json.dumps(floor(args.turns, args.callers)))


if __name__ == "__main__":
    main()
