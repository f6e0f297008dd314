"""The service's ``add_turn`` lane: a live session's turn begun from the request's callback and
answered from the log's acknowledgement, with no task, future or thread in between.

`MemoryService._run` hands an ``add_turn`` of a session live on the log's own loop to `TurnLane.begin`:
parsed, checked (its tenant's quota when the tally needs no count), decided and its append sent
right there; `TurnReply` (a `Settle` of the turn's number) is settled by the log's acknowledgement
and answers the request; `Deadlines` (the actors') times the requests out, one timer per timeout value. A turn
that must wait first (its tenant's bytes to be counted, its session to be read from the log) is
left to the service's request path (`MemoryService._serve`), which answers it as any other request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from convmem.actors import AsyncSessionHandle, Deadlines, MemorySystem, SettleOnce
from convmem.adapters.frontends.service._operations import Answer, ApiOperations
from convmem.adapters.frontends.service._protocol import (
    AddTurnRequest,
    decode_request,
    encode_ok,
    parse_subject,
    wants_msgpack,
)
from convmem.adapters.frontends.service._quotas import Quotas
from convmem.adapters.frontends.service._usage import TenantUsage
from convmem.errors import ConvmemError, OperationTimeout, SessionClosed
from convmem.events import MemoryKey

__all__ = ["REPLIES", "Request", "TurnLane", "TurnReply"]

_log = logging.getLogger("convmem.service")

_HANDLES = 8192
"""Session handles `TurnLane` keeps by their ids (`handle`); past it, it starts again."""


class TurnLane:
    """A `MemoryService`'s ``add_turn`` lane (see the module docstring); runs on the service's loop.

    It is given what it uses of its service: the API prefix, the tenants' quotas and byte tally,
    the operations (`ApiOperations`: timeouts, failures as answers), the memory system, `send`
    (a reply on its way to the requester) and `finished` (the request counted as answered and its
    tenant's place freed: `(request, op, error type or None, tenant token)`).
    """

    def __init__(
        self,
        *,
        api_prefix: str,
        quotas: Quotas,
        usage: TenantUsage,
        ops: ApiOperations,
        system: MemorySystem,
        send: Callable[[Request, bytes], None],
        finished: Callable[[Request, str, str | None, str], None],
    ) -> None:
        self._api_prefix = api_prefix
        self._quotas = quotas
        self._usage = usage
        self.ops = ops
        self._system = system
        self._send = send
        self._finished = finished
        self._handles: dict[tuple[str, str, str], AsyncSessionHandle] = {}  # checked keys' handles, bounded
        self.deadlines: Deadlines[TurnReply] = Deadlines()  # the timeouts of the requests `begin` answers

    def begin(self, msg: Request, token: str) -> bool:
        """An ``add_turn`` with no task: parsed, checked, decided and its append sent right here; its
        reply goes out from the log's acknowledgement (`TurnReply`). False, with nothing done, for
        any other request, and when it needs to wait first (its tenant's bytes to be counted, its
        session to be read from the log): `MemoryService._serve` takes it then."""
        subject, data = msg.subject, msg.data
        try:
            tenant_id, op = parse_subject(self._api_prefix, subject)
        except ConvmemError:
            return False  # answered as it deserves by the operation itself
        if tenant_id is None or op != "add_turn":
            return False
        allowed = self._quotas.of_token(token).max_bytes
        if allowed is not None and not self._usage.within(tenant_id, allowed):
            return False  # a count first, or a refusal on a fresh count: `_over_quota` awaits it
        msgpack = wants_msgpack(data)
        reply = TurnReply(self, msg, token, tenant_id, msgpack)
        try:
            request = decode_request(op, data)
            assert isinstance(request, AddTurnRequest)
            wait = self.ops.timeout_of(request)
            begun = self.handle(tenant_id, request.user_id, request.session_id).add_turn_now(
                request.turn, reply, idempotency_key=request.idempotency_key
            )
        except Exception as exc:
            self.answered(reply, self.ops.failed(op, subject, exc, msgpack=msgpack))
            return True
        if not begun:
            return False  # not live here: activating reads the log, off this loop
        if not reply.sent:
            self.deadlines.add(reply, wait)
        return True

    def handle(self, tenant_id: str, user_id: str, session_id: str) -> AsyncSessionHandle:
        """The asyncio handle of a session, its key checked once (kept for the sessions seen lately)."""
        ids = (tenant_id, user_id, session_id)
        handle = self._handles.get(ids)
        if handle is None:
            handle = self._system.async_session(MemoryKey(tenant_id, user_id, session_id))
            if len(self._handles) >= _HANDLES:
                self._handles.clear()
            self._handles[ids] = handle
        return handle

    def answered(self, reply: TurnReply, answer: Answer) -> None:
        """On the loop: `begin`'s request answered (once; a late outcome after its timeout
        is dropped), counted as `MemoryService._serve` counts, and its place freed."""
        if reply.sent:
            return
        reply.sent = True
        if reply.wait is not None:
            self.deadlines.answered(reply.wait)
        msg, error = reply.msg, answer.error
        try:
            if error is None:
                self._usage.wrote(reply.tenant_id, len(msg.data))  # `_used` of a write
            if msg.reply:
                self._send(msg, answer.reply)
        except Exception:
            _log.exception("convmem service: request on %s not answered", msg.subject)
        finally:
            self._finished(msg, answer.op, error, reply.token)


class Request(NamedTuple):
    """A request as the service reads it (what it reads of nats-py's `Msg`)."""

    subject: str
    reply: str
    data: bytes


REPLIES = threading.Lock()
"""Guards every `TurnReply`'s state (settled on the loop or an actor's thread; held for a moment)."""


class TurnReply(SettleOnce):
    """The answer of an ``add_turn`` begun by `TurnLane.begin` (a `Settle` of its turn number).

    Settled on the service's loop (the log's acknowledgement), or on an actor's thread when the
    session was busy (handed to the loop then). `expire` answers `OperationTimeout` when the
    request's timeout runs out first; the write may still complete, and its late outcome is dropped.
    """

    __slots__ = (
        "_lane",
        "_loop",
        "msg",
        "msgpack",
        "sent",
        "tenant_id",
        "token",
        "wait",
    )
    _lock = REPLIES

    def __init__(self, lane: TurnLane, msg: Request, token: str, tenant_id: str, msgpack: bool) -> None:
        super().__init__()
        self._lane = lane
        self._loop = asyncio.get_running_loop()
        self.msg = msg
        self.token = token
        self.tenant_id = tenant_id
        self.msgpack = msgpack
        self.wait: float | None = None
        """Its timeout, once `Deadlines` keeps it."""
        self.sent = False
        """Answered (on the loop)."""

    def expire(self, wait: float) -> None:
        """On the loop, once the request's timeout ran out: `OperationTimeout`; the write may go on."""
        if self.sent:
            return
        self._withdraw()  # not started yet: it never will be
        error = OperationTimeout(
            f"write did not finish within {wait:g}s (it may still complete; retry with the same "
            "idempotency_key to store it once)"
        )
        self._on_loop(None, error)

    def set_result(self, number: int, /) -> None:
        self._mark_finished()
        if asyncio._get_running_loop() is not self._loop:
            self._settled(number, None)
        elif not self.sent:  # the usual way, straight from the log's acknowledgement
            self._lane.answered(self, Answer("add_turn", None, encode_ok(number, msgpack=self.msgpack)))

    def _cancelled(self, error: BaseException) -> None:
        self._settled(None, error)

    def _finished(self, result: Any, error: BaseException | None) -> None:
        self._settled(result, error)

    def _settled(self, number: int | None, error: BaseException | None) -> None:
        if asyncio._get_running_loop() is self._loop:
            self._on_loop(number, error)
        else:  # an actor's thread (the session was busy): the loop answers
            with contextlib.suppress(RuntimeError):  # a closed loop: the service is gone
                self._loop.call_soon_threadsafe(self._on_loop, number, error)

    def _on_loop(self, number: int | None, error: BaseException | None) -> None:
        if self.sent:
            return
        msgpack, lane = self.msgpack, self._lane
        if error is None:
            try:
                answer = Answer("add_turn", None, encode_ok(number, msgpack=msgpack))
            except Exception as exc:
                answer = lane.ops.failed("add_turn", self.msg.subject, exc, msgpack=msgpack)
        elif isinstance(error, Exception):
            answer = lane.ops.failed("add_turn", self.msg.subject, error, msgpack=msgpack)
        else:  # an interrupt on the thread that ran the write: not ours to swallow, but answered
            closed = SessionClosed(f"the write was interrupted: {error!r}")
            answer = lane.ops.failed("add_turn", self.msg.subject, closed, msgpack=msgpack)
        lane.answered(self, answer)
