"""A caller that gives up takes its request with it; an in-process CLI call leaves logging as it was.

Both leaks showed only at the end of a run: a request task left to time out on its own ended in
"Task exception was never retrieved", logged through a handler whose stream pytest had closed.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import nats

from convmem.adapters.backends.jetstream import EmbeddedNatsServer
from convmem.adapters.backends.jetstream._watch import ConnectionWatch, request_denied
from convmem.adapters.frontends.cli import main


def _requests_in_flight() -> list[asyncio.Task[object]]:
    """Requests still waiting for their reply (one being cancelled is not waiting)."""
    return [
        task
        for task in asyncio.all_tasks()
        if not task.done()
        and not task.cancelling()
        and getattr(task.get_coro(), "__qualname__", "") == "Client.request"
    ]


def test_a_cancelled_request_cancels_the_request_it_started(nats_server: EmbeddedNatsServer) -> None:
    """Given a subscriber that never answers, when the caller is cancelled, no request is left waiting."""

    async def scenario() -> tuple[int, int]:
        nc = await nats.connect(nats_server.url)
        try:
            arrived: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            async def silent(msg: object) -> None:
                if not arrived.done():
                    arrived.set_result(None)

            await nc.subscribe("convmem.test.silent", cb=silent)
            await nc.flush()
            caller = asyncio.ensure_future(
                request_denied(nc, ConnectionWatch(()), "convmem.test.silent", b"x", timeout=600.0)
            )
            await asyncio.wait_for(arrived, 30)  # the request is on the wire, waiting for its reply
            during = len(_requests_in_flight())
            caller.cancel()
            await asyncio.gather(caller, return_exceptions=True)
            return during, len(_requests_in_flight())
        finally:
            await nc.close()

    during, after = asyncio.run(scenario())
    assert during == 1
    assert after == 0


def test_an_in_process_command_leaves_the_root_logger_as_it_found_it(tmp_path: Path) -> None:
    """Given the root logger as it is, when main() runs a command, its handlers and levels remain."""
    root = logging.getLogger()
    before = (root.handlers[:], root.level, logging.getLogger("nats").level)
    code = main(["--data-dir", str(tmp_path / "no-such-store"), "sessions"])
    assert code == 3
    assert (root.handlers, root.level, logging.getLogger("nats").level) == before
