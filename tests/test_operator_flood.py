"""An operator's flood of status requests at a replica whose health probe hangs, on a real nats-server.

A replica's status (``{api_prefix}.ops.status.{instance}``) and the NATS micro
``$SRV`` verbs are answered by nats-py's micro-service, outside the tenants'
fair shares: one subscription each, its requests taken one at a time. Two
things bound what a flood of them costs the tenants:

* one status probe at a time: a status asked while the last probe still waits
  for the log (its asker told 504 already) waits for that probe, so the flood
  holds one worker thread, and a tenant's request still gets one;
* a bounded queue: at most `OPERATOR_PENDING` requests wait for the handler,
  the rest are dropped unanswered and counted (nats-py's default keeps 524,288
  a subscription, each about 340 bytes of the worker's memory).

Counts only: threads that entered the hung probe, requests dropped, replies.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import nats
import pytest
from nats.aio.msg import Msg
from runtime_helpers import WAIT

from convmem.actors import MemorySystem
from convmem.adapters import EmbeddedNatsServer, InMemoryEventLog, MemoryService, RemoteSession
from convmem.adapters.frontends.service._inboxes import OPERATOR_INBOX
from convmem.adapters.frontends.service._protocol import status_subject
from convmem.adapters.frontends.service._service import OPERATOR_PENDING
from convmem.events import ConversationTurn, MemoryKey

KEY = MemoryKey("acme", "alice", "chat-1")
PROBE_TENANT = "_convmem"  # the health probe reads the last seq of a key of this tenant, nobody's


class ProbeHangs(InMemoryEventLog):
    """An in-memory log whose health probe (`last_seq` of the probe's key) hangs while `hang` is set;
    every other read answers. Counts the probes that entered it."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = threading.Event()
        self.release = threading.Event()
        self.entered = 0
        self._changed = threading.Condition()

    def last_seq(self, key: MemoryKey) -> int:
        if key.tenant_id == PROBE_TENANT and self.hang.is_set():
            with self._changed:
                self.entered += 1
                self._changed.notify_all()
            self.release.wait(WAIT)
        return super().last_seq(key)

    def until_entered(self, n: int) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.entered >= n, WAIT)


@pytest.fixture
def hung(nats_server: EmbeddedNatsServer) -> Iterator[ProbeHangs]:
    log = ProbeHangs()
    try:
        yield log
    finally:
        log.release.set()


def _turn(text: str) -> ConversationTurn:
    return ConversationTurn(user_message=text, assistant_response="ok")


def test_a_status_flood_at_a_hung_probe_holds_one_worker_thread(
    nats_server: EmbeddedNatsServer, hung: ProbeHangs
) -> None:
    """Six status requests, each told 504 in turn, start one probe; the tenant's write gets a thread
    (two threads in all: before, every one was held by a probe and the write waited)."""
    with (
        MemorySystem(log=hung) as system,
        MemoryService(system, nats_server.url, max_concurrency=2, status_timeout=0.05) as service,
        RemoteSession(nats_server.url, KEY, timeout=WAIT) as session,
    ):
        assert session.add_turn(_turn("before")) == 1
        hung.hang.set()

        async def flood() -> list[str]:
            nc = await nats.connect(nats_server.url, inbox_prefix=OPERATOR_INBOX)
            try:
                codes = []
                for _ in range(6):
                    reply = await nc.request(status_subject(service.api_prefix, service.instance), b"", WAIT)
                    codes.append((reply.headers or {}).get("Nats-Service-Error-Code", "ok"))
                return codes
            finally:
                await nc.close()

        assert asyncio.run(flood()) == ["504"] * 6
        assert hung.until_entered(1)
        assert session.add_turn(_turn("during")) == 2  # a worker thread was free for it
        assert hung.entered == 1
        hung.release.set()


def test_a_flood_of_status_requests_waits_in_a_bounded_queue(
    nats_server: EmbeddedNatsServer, hung: ProbeHangs
) -> None:
    """1,000 status requests while the first waits for the hung probe: at most OPERATOR_PENDING wait
    behind it, the rest are dropped and counted; every one not dropped is answered once released."""
    n = 1000
    with (
        MemorySystem(log=hung) as system,
        MemoryService(system, nats_server.url, status_timeout=WAIT) as service,
    ):
        hung.hang.set()
        subject = status_subject(service.api_prefix, service.instance)

        async def flood() -> tuple[list[str], int]:
            nc = await nats.connect(nats_server.url, inbox_prefix=OPERATOR_INBOX)
            answered: list[str] = []
            grew = asyncio.Event()

            async def on_reply(msg: Msg) -> None:
                answered.append(msg.subject)
                grew.set()

            async def until_answered(count: int) -> None:
                async with asyncio.timeout(WAIT):
                    while len(answered) < count:
                        grew.clear()
                        await grew.wait()

            try:
                await nc.subscribe(f"{OPERATOR_INBOX}.flood.*", cb=on_reply)
                for i in range(n):
                    await nc.publish(subject, b"", reply=f"{OPERATOR_INBOX}.flood.{i}")
                await nc.flush()
                least = n - 1 - OPERATOR_PENDING  # one at the handler, OPERATOR_PENDING waiting
                held = await asyncio.to_thread(service.wait_for, lambda: service.dropped >= least, WAIT)
                assert held, f"{service.dropped} of {n} dropped, expected at least {least}"
                assert hung.until_entered(1)
                dropped = service.dropped
                hung.release.set()
                # Once every request kept is answered, one more is answered last (one queue, in order).
                await until_answered(n - dropped)
                await nc.publish(subject, b"", reply=f"{OPERATOR_INBOX}.flood.marker")
                await until_answered(n - dropped + 1)
                return answered, dropped
            finally:
                await nc.close()

        answered, dropped = asyncio.run(flood())
        assert dropped >= n - 1 - OPERATOR_PENDING
        assert len(answered) == n - dropped + 1
        assert answered[-1].endswith(".marker")
        assert service.metrics()["service"]["replies"]["dropped"] == dropped
