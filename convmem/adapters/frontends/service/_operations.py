"""`ApiOperations`: one request's bytes in, one reply's bytes out, against a `MemorySystem`.

This is the worker-thread half of `MemoryService` (it blocks on the memory
system; the service runs it off the event loop). Every outcome is a reply:
an error of any kind becomes a structured error reply, never silence.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from convmem.actors import MemorySystem, SessionHandle, list_session_page
from convmem.adapters.frontends._views import check_limit, items_view, start_session, whole_history
from convmem.adapters.frontends.service._errors import MalformedRequest, error_info
from convmem.adapters.frontends.service._protocol import (
    AddItemsRequest,
    AddTurnRequest,
    AgentsItemsRequest,
    ContextRequest,
    EraseRequest,
    ForkRequest,
    Request,
    RestoreRequest,
    SessionCursor,
    SessionsRequest,
    ViewRequest,
    decode_request,
    encode_error,
    encode_ok,
    parse_subject,
    wants_msgpack,
)
from convmem.errors import ConvmemError, InvalidInput
from convmem.events import MemoryKey
from convmem.projections import (
    MEMORY_VIEWS,
    SessionState,
    agent_items,
    estimate_tokens,
    llm_context,
    to_dict,
)

__all__ = ["TIMEOUT_STEPS", "Answer", "ApiOperations", "Changes", "RequestStats"]

_log = logging.getLogger("convmem.service")

_VIEWS: dict[str, Callable[[SessionState], list[Any]]] = {
    "agents": agent_items,
    **{memory_type.value: view.messages for memory_type, view in MEMORY_VIEWS.items()},
}
"""The ``views`` operation's views (`VIEWS`): the Agents items and every conversation memory's."""
_PROBE = MemoryKey("_convmem", "_health", "_probe")
"""A key nobody writes: reading its last sequence proves the log answers."""
MAX_LISTED = 1_000
"""The most sessions one ``sessions`` request lists: each is read (its snapshot and the events after
it) and folded, so a request for every session of a tenant holding millions would read them all, on
the server every tenant shares, for an answer too large to send."""
MAX_HISTORY_EVENTS = 10_000
"""The most events one ``agents_items`` request reads from the log: asked for items past the session's
live turns (``get_items()`` without a limit on a session longer than ``live_turns``), the request
reads and folds the session's whole subject, on the server every tenant shares; a longer session is
refused with `MalformedRequest` naming ``limit`` (a limit within its live turns reads nothing)."""
TIMEOUT_STEPS = 16
"""A request's `timeout` is rounded up to a 1/16 of a second: at most 16 values a second of max_timeout."""
_MESSAGE_OVERHEAD = 34 + 256
"""What the stream counts for a stored event beyond its subject and payload, at most: JetStream's 34
bytes a message (see `_usage`) and the headers convmem writes with it (its id, seq, checksum and
batch headers take about 200)."""


def _limit(limit: int | None) -> int | None:
    try:
        return check_limit(limit)
    except InvalidInput as exc:
        raise MalformedRequest(exc.field, exc.problem) from None


class Answer(msgspec.Struct, frozen=True):
    """What one request came to: its op, the error type if it failed, the reply bytes."""

    op: str
    error: str | None
    reply: bytes
    erased: bool = False
    """An ``erase`` that removed events (the tenant's bytes are known again only by a count)."""


class Changes:
    """A change of a service's counters, announced: a waiter re-checks its fact at each one (no polling)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._waiting = 0  # waiters, counted under the condition's lock before they look at their fact

    def note(self) -> None:
        """A counter changed (called after the change is made, outside the counter's own lock).

        Nobody waiting, nobody to tell: a waiter counts itself before it first looks at its fact,
        so one that looked before this change is counted here, and one that looks after sees it.
        """
        if self._waiting:
            with self._changed:
                self._changed.notify_all()

    def wait_for(self, fact: Callable[[], bool], timeout: float) -> bool:
        """Until `fact()` holds, re-checked after each change; False when `timeout` seconds pass first.

        A wait that runs out is False even if the fact holds by then: a change that was never
        announced is a broken counter, not one to be found by looking again.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            self._waiting += 1
            try:
                while not fact():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._changed.wait(remaining):
                        return False
                return True
            finally:
                self._waiting -= 1


class RequestStats:
    """Request counters of one service instance (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self.in_flight = 0

    def begin(self) -> None:
        with self._lock:
            self.in_flight += 1

    def end(self, op: str, error: str | None) -> None:
        with self._lock:
            self.in_flight -= 1
            self._requests[op] += 1
            if error is not None:
                self._errors[error] += 1

    def refused(self, op: str, error: str) -> None:
        """A request refused on arrival (never in flight)."""
        with self._lock:
            self._requests[op] += 1
            self._errors[error] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": sum(self._requests.values()),
                "errors": sum(self._errors.values()),
                "in_flight": self.in_flight,
                "by_op": dict(self._requests),
                "errors_by_type": dict(self._errors),
            }


class ApiOperations:
    """The API's operations on `system` (see `MemoryService` for the settings)."""

    def __init__(
        self,
        system: MemorySystem,
        *,
        api_prefix: str,
        instance: str,
        max_timeout: float,
        fresh_reads: bool,
        running: Callable[[], bool],
        replies: Callable[[], dict[str, Any]] | None = None,
        admit_fork: Callable[[str, Callable[[], int]], None] | None = None,
    ) -> None:
        self.system = system
        self.admit_fork = admit_fork
        """Told (tenant id, how to count the bytes its copy will store) before a fork stores it; raises
        `QuotaExceeded` to refuse it."""
        self.api_prefix = api_prefix
        self.instance = instance
        self.max_timeout = max_timeout
        self.fresh_reads = fresh_reads
        self.stats = RequestStats()
        self.started_at = time.monotonic()
        self._running = running
        self._replies = replies

    def answer(self, subject: str, data: bytes) -> Answer:
        """The reply to one request (in the request's encoding)."""
        msgpack, op = wants_msgpack(data), "unknown"
        try:
            tenant_id, op = parse_subject(self.api_prefix, subject)
            request = decode_request(op if tenant_id is not None else None, data)
            if tenant_id is None:
                result = self.metrics() if op == "metrics" else self.health()
                op = f"ops.{op}"
            else:
                assert isinstance(request, Request)
                result = self._session_op(tenant_id, op, request)
                if op == "erase":
                    return Answer(
                        op, None, encode_ok(result, msgpack=msgpack), erased=result["events_purged"] > 0
                    )
            return Answer(op, None, encode_ok(result, msgpack=msgpack))
        except Exception as exc:
            return _failed(op, subject, exc, msgpack=msgpack)

    def on_loop(self, subject: str) -> bool:
        """Whether the request on `subject` is an ``add_turn`` (`add_turn_here` answers it on a loop)."""
        rest = subject[len(self.api_prefix) + 1 :].split(".")
        return len(rest) in (3, 4) and rest[2] == "add_turn" and rest[0] == "v1"

    async def add_turn_here(self, subject: str, data: bytes) -> Answer:
        """An ``add_turn``'s reply, the write awaited on the running loop (no thread in between when
        the system's log runs on this loop: decided, appended and answered here)."""
        msgpack, op = wants_msgpack(data), "add_turn"
        try:
            tenant_id, op = parse_subject(self.api_prefix, subject)
            request = decode_request(op, data)
            assert tenant_id is not None
            assert isinstance(request, AddTurnRequest)
            key = MemoryKey(tenant_id, request.user_id, request.session_id)
            result = await self.system.session(key).aio.add_turn(
                request.turn, timeout=self._timeout(request), idempotency_key=request.idempotency_key
            )
            return Answer(op, None, encode_ok(result, msgpack=msgpack))
        except Exception as exc:
            return _failed(op, subject, exc, msgpack=msgpack)

    def timeout_of(self, request: Request) -> float:
        """The seconds `request` may take: its timeout within `max_timeout` (`MalformedRequest`: not > 0)."""
        return self._timeout(request)

    @staticmethod
    def failed(op: str, subject: str, exc: Exception, *, msgpack: bool) -> Answer:
        """The error reply to `op` on `subject` (anything but a `ConvmemError` logged with its traceback)."""
        return _failed(op, subject, exc, msgpack=msgpack)

    def _timeout(self, request: Request) -> float:
        if request.timeout is None:
            return self.max_timeout
        if not request.timeout > 0:
            raise MalformedRequest("timeout", f"must be a number of seconds > 0, got {request.timeout}")
        # Rounded up to a step: the loop keeps a line of deadlines (and a timer) per timeout value for
        # as long as that timeout, so a tenant's timeouts, each its own, kept one a request.
        return min(math.ceil(request.timeout * TIMEOUT_STEPS) / TIMEOUT_STEPS, self.max_timeout)

    def _session_op(self, tenant_id: str, op: str, request: Request) -> Any:
        timeout = self._timeout(request)
        if isinstance(request, EraseRequest) and request.scope == "user":
            MemoryKey(tenant_id, request.user_id, "*")  # checks both ids as every key does
            return self._erase_user(tenant_id, request.user_id)
        if isinstance(request, SessionsRequest):
            return self._sessions(tenant_id, request)
        key = MemoryKey(tenant_id, request.user_id, request.session_id)
        handle = self.system.session(key)
        if isinstance(request, AddTurnRequest):
            return handle.add_turn(request.turn, timeout=timeout, idempotency_key=request.idempotency_key)
        if isinstance(request, AddItemsRequest):
            return handle.add_items(request.items, timeout=timeout)
        if isinstance(request, RestoreRequest):
            return handle.from_dict(request.state, timeout=timeout)
        if isinstance(request, EraseRequest):
            return self._erase(key)
        if isinstance(request, ForkRequest):
            return self._fork(key, request)
        if isinstance(request, ContextRequest) and request.query is not None:
            state = self._fresh(handle, timeout)
            return llm_context(state, handle.estimator_of(state), query=request.query)
        if isinstance(request, ViewRequest):
            return _VIEWS[request.view](self._fresh(handle, timeout))
        if isinstance(request, AgentsItemsRequest):
            limit = _limit(request.limit)
            state = self._fresh(handle, timeout)
            return items_view(state, limit, lambda: self._whole_history(key, state))
        match op:
            case "pop_item":
                return handle.pop_item(timeout=timeout)
            case "clear":
                return handle.clear(timeout=timeout)
            case "flush":
                self._fresh(handle, timeout)
                return handle.flush(timeout=timeout)
            case "context":
                state = self._fresh(handle, timeout)
                return llm_context(state, handle.estimator_of(state))
            case "tokens":
                state = self._fresh(handle, timeout)
                return estimate_tokens(state, handle.estimator_of(state))
            case "health":
                return self._fresh(handle, timeout).health.value
            case "export_state":
                return to_dict(self._fresh(handle, timeout))
            case "agents_start":
                self._fresh(handle, timeout)
                return start_session(self.system, key, timeout=timeout)
        raise MalformedRequest("op", f"{op!r} has no handler")  # parse_subject lets none through

    def _fresh(self, handle: SessionHandle, timeout: float) -> SessionState:
        """The session's state as its handle's reads see it (`view_state`: one with nothing stored
        yet follows the configuration it will start with), reloaded first when the log has events
        this process has not seen.

        Another service (or process) may have written the session since this
        one last did: without the check, a read through this service would
        miss a turn written through the other.
        """
        system = self.system
        if self.fresh_reads and (system.is_live(handle.key) or system.is_cached(handle.key)):
            state = handle.snapshot_state()
            if system.log.last_seq(handle.key) != state.version:
                return handle.view_state(handle.refresh(timeout=timeout))
            return handle.view_state(state)
        return handle.view_state(handle.snapshot_state())  # loading it reads the log anyway

    def _whole_history(self, key: MemoryKey, state: SessionState) -> SessionState:
        """`key`'s whole history for an ``agents_items`` that reaches past its live turns, read from
        the log when it holds at most `MAX_HISTORY_EVENTS` events (`state.version`, its last seq, is
        how many the read would return); `MalformedRequest` naming ``limit`` otherwise."""
        most = MAX_HISTORY_EVENTS
        if state.version > most:
            live = len(agent_items(state))
            raise MalformedRequest(
                "limit",
                f"session {key.session_id!r} holds {state.version:,} events, more than the {most:,} one "
                f"agents_items request reads past its live turns: give a limit of at most {live:,} "
                "(the items of its live turns, served without a read of the log; with the Agents SDK, "
                "SessionSettings(limit=...))",
            )
        return whole_history(self.system, key)

    def _erase(self, key: MemoryKey) -> dict[str, int]:
        erased = self.system.erase(key, if_held=True)  # a tenant's erasure of nothing keeps no receipt
        return {"events_purged": erased.events_purged, "sessions": erased.sessions}

    def _sessions(self, tenant_id: str, request: SessionsRequest) -> list[dict[str, Any]] | dict[str, Any]:
        most = MAX_LISTED
        if request.limit is not None and not 1 <= request.limit <= most:
            raise MalformedRequest(
                "limit",
                f"must be from 1 to {most:,} (the most sessions one request lists), got {request.limit}",
            )
        user = request.user_id or None
        if user is not None:
            MemoryKey(tenant_id, user, "*")  # checks the ids as every key does
        paged = request.after is not msgspec.UNSET
        after: MemoryKey | None = None
        if isinstance(request.after, SessionCursor):
            try:
                after = MemoryKey(tenant_id, request.after.user_id, request.after.session_id)
            except InvalidInput as exc:
                raise MalformedRequest(f"after.{exc.field}", exc.problem) from None
        limit = request.limit if request.limit is not None else most + (0 if paged else 1)
        page = list_session_page(
            self.system.log,
            self.system.snapshots,
            tenant_id=tenant_id,
            user_id=user,
            limit=limit,
            after=after,
        )
        rows = page.rows
        if paged:
            last = page.next_after
            return {
                "sessions": [r.as_json() for r in rows],
                "more": last is not None,
                "after": {"user_id": last.user_id, "session_id": last.session_id} if last else None,
            }
        if len(rows) > most:
            whose = f"user {user!r} of tenant {tenant_id!r}" if user else f"tenant {tenant_id!r}"
            raise MalformedRequest(
                "limit",
                f"{whose} has more than {most:,} sessions, the most one request lists: give after "
                f"(null for the first page) to list them all in pages of at most {most:,}, or a limit "
                f"(at most {most:,}) for the first ones in key order, or a user_id",
            )
        return [r.as_json() for r in rows]

    def _fork(self, key: MemoryKey, request: ForkRequest) -> dict[str, int]:
        if request.at_position is not None and request.at_time is not None:
            raise MalformedRequest("at_time", "give at_position or at_time, not both")
        to = MemoryKey(key.tenant_id, request.to_user_id or key.user_id, request.to_session_id)
        at: int | datetime | None = request.at_position
        if request.at_time is not None:
            at = datetime.fromtimestamp(request.at_time, tz=UTC)
        if self.admit_fork is not None:
            self.admit_fork(key.tenant_id, lambda: self._fork_bytes(key, to, request.at_position))
        forked = self.system.fork(key, to=to, at=at)
        return {"events": forked.events, "forked_at": forked.forked_at}

    def _fork_bytes(self, key: MemoryKey, to: MemoryKey, at_position: int | None) -> int:
        """What a fork of `key` into `to` stores, as the stream counts it, at most: each event's bytes,
        subject, headers and the stream's overhead (the whole source when the fork is at a time)."""
        subject = getattr(self.system.log, "subject", None)  # a JetStream log's; others count the key's
        per_message = _MESSAGE_OVERHEAD + len(subject(to) if subject else ".".join(to.tokens()))
        return sum(
            len(record.data) + per_message
            for record in self.system.log.read(key)
            if at_position is None or record.position <= at_position
        )

    def _erase_user(self, tenant_id: str, user_id: str) -> dict[str, int]:
        erased = self.system.erase_user(tenant_id, user_id, if_held=True)
        return {"events_purged": erased.events_purged, "sessions": erased.sessions}

    def health(self) -> dict[str, Any]:
        """What ``ops.v1.health`` answers: whether the log answers, live sessions, load."""
        try:
            self.system.log.last_seq(_PROBE)
            log = "ok"
        except ConvmemError as exc:
            log = str(exc)
        healthy = log == "ok" and self._running() and not self.system.closed
        return {
            "status": "ok" if healthy else "unavailable",
            "log": log,
            "instance": self.instance,
            "uptime_s": round(time.monotonic() - self.started_at, 3),
            "live_sessions": self.system.live_sessions(),
            "in_flight": self.stats.in_flight,
        }

    def metrics(self) -> dict[str, Any]:
        """What ``ops.v1.metrics`` answers: the memory system's counters and this service's."""
        snapshot = self.system.metrics.snapshot()
        counts: dict[str, int] = snapshot["counts"]
        return {
            "instance": self.instance,
            "turns": counts.get("turns", 0),
            "summaries": counts.get("summaries", 0),
            "summary_failures": counts.get("summary_failures", 0),
            "conflicts": counts.get("conflicts", 0),
            "health_transitions": {
                name.removeprefix("health."): n for name, n in counts.items() if name.startswith("health.")
            },
            "live_sessions": self.system.live_sessions(),
            "append_ms": snapshot.get("append_ms"),
            "counts": counts,
            "service": {
                **self.stats.snapshot(),
                **({"replies": self._replies()} if self._replies is not None else {}),
            },
        }


def _failed(op: str, subject: str, exc: Exception, *, msgpack: bool) -> Answer:
    """The error reply to `op` on `subject`; anything but a `ConvmemError` is logged with its traceback."""
    if not isinstance(exc, ConvmemError):
        _log.exception("convmem service: %s on %s failed", op, subject)
    info = error_info(exc)
    return Answer(op, info.type, encode_error(info, msgpack=msgpack))
