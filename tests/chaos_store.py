"""The chaos case of a full store: writes meet a JetStream store at its limit, then room is made.

Returns a `Tally` (tests/chaos.py), with the errors the planners saw in its notes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import nats
from chaos import CONFIG, Tally, ThreadLoad, keys_for, running_server, stored_texts

import convmem
from convmem.actors._bounds import MAX_SNAPSHOT_EVERY
from convmem.adapters.backends.jetstream._log import DEFAULT_PREFIX, DEFAULT_STREAM
from convmem.errors import ConvmemError
from convmem.events import ConversationTurn, MemoryKey

__all__ = ["full_store"]

OUTAGE = "check that nats-server is up"
"""The words of the error for a server that does not answer: a full store must not be reported so."""


TURN_BYTES = 2100
"""About what one padded turn takes in the store."""


def _padded(text: str) -> ConversationTurn:
    return ConversationTurn(user_message=text, assistant_response="x" * 2000)


async def _purge(url: str, key: MemoryKey) -> int:
    """What an operator does to make room: purge an old session's subject. Returns messages purged."""
    client = await nats.connect(url)
    try:
        answer = await client.request(
            f"$JS.API.STREAM.PURGE.{DEFAULT_STREAM}",
            json.dumps({"filter": f"{DEFAULT_PREFIX}.{'.'.join(key.tokens())}"}).encode(),
            timeout=10,
        )
        reply = json.loads(answer.data)
        assert reply.get("success"), reply
        return int(reply["purged"])
    finally:
        await client.close()


TMPFS = 8 << 20
"""The size of the small disk mounted for the case where the machine allows it."""


@contextlib.contextmanager
def small_disk(where: Path) -> Iterator[Path | None]:
    """An 8 MiB tmpfs mounted at `where` (unmounted on the way out), or None where mounting is refused."""
    where.mkdir(parents=True, exist_ok=True)
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        yield None
        return
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={TMPFS}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
        timeout=30,
    )
    if done.returncode != 0:
        yield None
        return
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True, check=False, timeout=30)


def full_store(
    tmp: Path, *, disk: Literal["tmpfs", "max_file_store"], sessions: int, give_up: float = 60.0
) -> Tally:
    """A store at its limit: an 8 MiB tmpfs where the machine allows mounting one (nats-server then
    limits itself to 75% of it), else a server started with a 2 MiB ``max_file_store``.

    An old session fills 60% of the limit; the load (45% of it, so that it
    fits once the old session is gone but not beside it) runs into the limit
    and retries; then the old session is purged and the load must finish
    without a server restart. Every acknowledged turn stored once; the errors seen while full must name the
    full store, not an outage.
    """
    with small_disk(tmp / "disk") as mounted:
        if disk == "tmpfs" and mounted is not None:
            store, limit, extra = mounted / "nats", TMPFS * 3 // 4, ""
            tally = Tally("full store (an 8 MiB tmpfs), then room made")
        else:
            store, limit = tmp / "nats", 2 << 20
            extra = (
                f"jetstream {{\n  store_dir: {json.dumps(str(store))}\n  sync_interval: always\n"
                f"  max_file_store: {limit}\n}}"
            )
            tally = Tally(f"full store ({limit >> 20} MiB max_file_store), then room made")
        _fill_and_free(tally, store, extra, limit, sessions=sessions, give_up=give_up)
    return tally


def _fill_and_free(
    tally: Tally, store: Path, extra: str, limit: int, *, sessions: int, give_up: float
) -> None:
    keys = keys_for(sessions)
    old = MemoryKey("chaos", "user", "old")
    turns = int(limit * 0.45 / (sessions * TURN_BYTES))
    with running_server(store, "always", extra_config=extra) as server:
        # No snapshots: what the store holds is the log alone, so the sizes above hold.
        never = MAX_SNAPSHOT_EVERY  # far more events than the store holds
        with convmem.connect(server.url, config=CONFIG, timeout=2.0, snapshot_every=never) as memory:
            session = memory.session(old)
            filled = 0
            while filled * TURN_BYTES < limit * 0.6:  # the old session takes 60% of the store
                try:
                    session.add_turn(_padded(f"old-{filled}"), timeout=5)
                except ConvmemError:
                    break
                filled += 1
            load = ThreadLoad(memory.session, tally, keys, turns, give_up=give_up, make_turn=_padded)
            load.start()
            try:
                tally.wait_errors(0, alive=load.alive)  # the store is full: writes fail
                tally.fault()
                tally.notes["full_after_acks"] = len(tally.stamps)
                tally.notes["purged"] = asyncio.run(_purge(server.url, old))
            finally:
                load.join()
        tally.stored = stored_texts(server.url, {k.session_id: k for k in keys})
    tally.notes["old_session_turns"] = filled
    tally.notes["errors_seen"] = sorted(m[:200] for m in tally.messages)[:5]
    tally.notes["reported_as_outage"] = sum(n for m, n in tally.messages.items() if OUTAGE in m)
