"""`MemoryService`: the session protocol over NATS request/reply, for other processes and languages.

```python
system = convmem.connect("nats://127.0.0.1:4222")
with MemoryService(system, "nats://127.0.0.1:4222"):
    ...  # serving until the block ends
```

The service subscribes to ``{api_prefix}.v1.>`` in a queue group, so several
services on one NATS share the requests; optimistic concurrency on the log
keeps a session written through several of them correct, and reads check
the log's last sequence first, so a session read through one service shows
what was written through another. A partitioned service (a worker of
`convmem serve --workers`) takes the plain ``{api_prefix}.v1.*.*`` and the
partitions it owns (`_partitions`): a session is served by one process at a
time. Operator requests (``{api_prefix}.ops.v1.>``) are answered by every
instance (no queue group). Each instance is also a NATS micro-service named
``convmem`` (`nats micro ls`): ``$SRV.PING.convmem`` finds every replica,
and ``{api_prefix}.ops.status.{instance}`` asks one of them.

nats-py runs on the service's own loop thread. The blocking `MemorySystem`
calls run on a bounded thread pool, never on the loop. `FairShares` admits
each request into its tenant's queue, or refuses it at once with `Busy` past
the tenant's ``max_in_flight``, and tenants take turns at the free places; a
write of a tenant at its ``max_bytes`` quota is refused with `QuotaExceeded`
(`TenantUsage` keeps the tally; `Quotas` holds the limits). `stop()` drains:
it unsubscribes, answers every request already received, then closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

import nats
import nats.errors
import nats.micro
import nats.micro.service
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.micro.request import Request as MicroRequest

from convmem._version import __version__
from convmem.actors import ErasureNotice, MemorySystem
from convmem.actors._bounds import MAX_ACTOR_THREADS, check_count, check_seconds
from convmem.adapters._auth import NatsAuth, redact_url, scrub, url_secrets
from convmem.adapters._loop_thread import EventLoopThread
from convmem.adapters.backends import PrometheusMetrics
from convmem.adapters.backends.jetstream import NatsClient, close_quietly, server_list
from convmem.adapters.frontends.service._errors import ErrorInfo, error_info
from convmem.adapters.frontends.service._inboxes import ReplyGuard
from convmem.adapters.frontends.service._operations import Answer, ApiOperations, Changes
from convmem.adapters.frontends.service._partitions import Partitions
from convmem.adapters.frontends.service._protocol import (
    DEFAULT_API_PREFIX,
    MICRO_NAME,
    OPERATOR_OPS,
    SESSION_OPS,
    check_api_prefix,
    encode_error,
    parse_subject,
    status_subject,
    wants_msgpack,
)
from convmem.adapters.frontends.service._quotas import Quotas
from convmem.adapters.frontends.service._shares import FairShares, tenant_token
from convmem.adapters.frontends.service._turn_lane import REPLIES, Request, TurnLane
from convmem.adapters.frontends.service._usage import usage_of
from convmem.errors import (
    ConvmemError,
    InvalidConfig,
    LogUnavailable,
    QuotaExceeded,
    SessionClosed,
)
from convmem.events import encode_token

__all__ = ["OPERATOR_PENDING", "OPERATOR_PENDING_BYTES", "WRITES", "MemoryService"]

T = TypeVar("T")
_OPS = frozenset((*SESSION_OPS, *OPERATOR_OPS))

_log = logging.getLogger("convmem.service")

OPERATOR_PENDING = 64
"""Operator requests (a replica's status, the ``$SRV`` verbs) one subscription keeps waiting for its
handler, which takes them one at a time; past it (or past `OPERATOR_PENDING_BYTES`) they are dropped,
unanswered, and counted (``metrics`` → ``service.replies.dropped``). nats-py's default keeps 524,288
(or 128 MiB) a subscription: a flood at a replica whose status waits for its log held about 340
bytes of the worker's memory a request (100,000 of them: 34 MB), up to gigabytes over the ten."""
OPERATOR_PENDING_BYTES = 4 * 1024 * 1024
"""The payload bytes of the operator requests one subscription keeps waiting (a handler reads none)."""

WRITES = frozenset({"add_turn", "add_items", "pop_item", "clear", "restore", "fork", "agents_start"})
"""Operations that store events: refused with `QuotaExceeded` past the tenant's ``max_bytes``."""


class MemoryService:
    """Serves a `MemorySystem`'s sessions on NATS (see the module docstring).

    `url` is the NATS server of the API (it may differ from the log's). `max_concurrency` bounds the
    requests handled at once; `max_timeout` caps the seconds a request may ask for; `fresh_reads`
    (default on) makes reads check the log for writes made through other services; `drain_timeout`
    bounds how long `stop()` waits for requests in flight; `status_timeout` how long this replica's
    status may take before it reports itself unhealthy. `partitioned` makes it one of the workers
    that share the session partitions (`convmem serve --workers`; see `_partitions`): it answers the
    sessions of the partitions it owns, and any request on the plain subjects; `members_secret` (at
    least 16 bytes, shared by the workers) signs its membership announcements. `instance` names it
    (default: random); `worker` is shown in its status. `loop` (the loop the system's log runs on,
    left running by `stop()`) makes the service run there and await each ``add_turn`` on it, no
    thread in between. `auth` holds credentials and TLS settings (`NatsAuth`); `connect_options` go
    to nats-py's ``connect`` as they are. `quotas` bounds each tenant's requests in flight and
    running, and its stored bytes (`Quotas`; default: `TenantLimits`' defaults for every tenant).
    `metrics` (a `PrometheusMetrics`) counts each tenant's requests, errors and refusals.
    The service never closes `system` (its owner does, after).
    """

    dropped: int = 0
    """Requests dropped unanswered because their subscription's queue was full (`OPERATOR_PENDING`)."""
    _probe: asyncio.Future[tuple[dict[str, Any], dict[str, Any]]] | None = None
    """The running status probe (health, metrics): every status request asked meanwhile waits for it."""

    def __init__(
        self,
        system: MemorySystem,
        url: str,
        *,
        api_prefix: str = DEFAULT_API_PREFIX,
        queue_group: str = "convmem",
        max_concurrency: int = 64,
        max_timeout: float = 60.0,
        fresh_reads: bool = True,
        drain_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        name: str = "convmem-service",
        connect_options: Mapping[str, Any] | None = None,
        auth: NatsAuth | None = None,
        status_timeout: float = 5.0,
        partitioned: bool = False,
        members_secret: bytes | None = None,
        instance: str | None = None,
        worker: Mapping[str, Any] | None = None,
        loop: EventLoopThread | None = None,
        quotas: Quotas | None = None,
        metrics: PrometheusMetrics | None = None,
    ) -> None:
        check_count("max_concurrency", max_concurrency, most=MAX_ACTOR_THREADS)  # a thread each
        for field, seconds in (
            ("max_timeout", max_timeout),
            ("drain_timeout", drain_timeout),
            ("connect_timeout", connect_timeout),
            ("status_timeout", status_timeout),
        ):
            check_seconds(field, seconds)  # above 0, at most a day: a wait past that overflows
        self.system = system
        self.url = url
        self.api_prefix = check_api_prefix(api_prefix)
        self.queue_group = queue_group
        self.max_concurrency = max_concurrency
        self.max_timeout = max_timeout
        self.fresh_reads = fresh_reads
        self.drain_timeout = drain_timeout
        self.connect_timeout = connect_timeout
        self.name = name
        self.status_timeout = status_timeout
        self.partitioned = partitioned
        if partitioned and (not isinstance(members_secret, bytes) or len(members_secret) < 16):
            raise InvalidConfig(
                "members_secret",
                "a partitioned service needs the secret its fellow workers share (16 bytes or more): "
                "membership announcements without it are dropped",
            )
        self._members_secret = members_secret or b""
        self.instance = instance or uuid.uuid4().hex[:12]
        self._worker = dict(worker or {})
        self._given_loop = loop
        self._auth = auth or NatsAuth()
        self._connect_options = {**self._auth.options(), **(connect_options or {})}
        self._secrets = (*url_secrets(url), *self._auth.secrets)
        self._changes = Changes()  # told when a counter changes: `wait_for` re-checks its fact then
        self._guard = ReplyGuard(self.api_prefix, on_refused=self._changes.note)
        self._ops = ApiOperations(
            system,
            api_prefix=self.api_prefix,
            instance=self.instance,
            max_timeout=max_timeout,
            fresh_reads=fresh_reads,
            running=lambda: self.running,
            replies=self._replies,
            admit_fork=self._admit_fork,
        )
        self._lock = threading.Lock()
        self._state = "new"
        self._stopped = threading.Event()
        self._loop: EventLoopThread | None = None
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix=f"{name}-worker")
        self._nc: Client | None = None
        self._subs: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._admitting: list[tuple[Request, str]] | None = None  # started while `admit` runs: run after
        self._finishing = False  # a request's answer frees its place: what that starts runs next, not inside
        self.quotas = quotas if quotas is not None else Quotas()
        if not isinstance(self.quotas, Quotas):
            raise InvalidConfig("quotas", f"must be a Quotas, got {type(self.quotas).__name__}")
        self._shares = FairShares(self.quotas, max_concurrency)
        self._usage = usage_of(system.log, self._off_loop, recount_every=self.quotas.recount_every)
        # Per tenant token: the lock its forks take turns at, and how many hold or wait for it.
        self._forking: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._lane = TurnLane(  # a live session's add_turn, answered from callbacks
            api_prefix=self.api_prefix,
            quotas=self.quotas,
            usage=self._usage,
            ops=self._ops,
            system=system,
            send=self._answer_now,
            finished=self._request_ended,
        )
        self._unwatch: Callable[[], None] | None = None
        self._busy_replies: dict[tuple[str, bool], bytes] = {}
        self._micro: nats.micro.service.Service | None = None
        self._partitions: Partitions | None = None
        self._prometheus = metrics  # each tenant's requests, errors and refusals (None: `status` only)

    # Lifecycle ----------------------------------------------------------------------------

    @property
    def subjects(self) -> tuple[str, str]:
        """The subscribed subjects: session requests (queue group), operator requests.

        A partitioned worker takes the plain session subjects here, and its partitions' as it owns them.
        """
        sessions = f"{self.api_prefix}.v1.*.*" if self.partitioned else f"{self.api_prefix}.v1.>"
        return sessions, f"{self.api_prefix}.ops.v1.>"

    @property
    def running(self) -> bool:
        """Whether the service is subscribed and answering."""
        return self._state == "running"

    @property
    def stopping(self) -> bool:
        """Whether `stop()` has begun (requests in flight are still being answered)."""
        return self._state in ("stopping", "stopped")

    @property
    def in_flight(self) -> int:
        """Requests received and not yet answered."""
        return self._ops.stats.in_flight

    def wait_for(self, fact: Callable[[], bool], timeout: float) -> bool:
        """Block until `fact()` holds, re-checked each time a counter of this service changes.

        The changes: a request begun, answered or refused as Busy, a reply subject refused, a member
        announcement dropped. False when `timeout` seconds pass first. For tests and tools that wait
        on what the service counted, without polling.
        """
        return self._changes.wait_for(fact, timeout)

    def start(self) -> MemoryService:
        """Connect and subscribe; returns once requests are being received. Idempotent."""
        with REPLIES:
            if self._state == "running":
                return self
            if self._state != "new":
                raise SessionClosed("a stopped MemoryService cannot start again; make a new one")
            loop = self._given_loop or EventLoopThread(name=f"{self.name}-loop")
            try:
                # Connecting, then the byte tallies' bucket (`_open`): each within connect_timeout.
                wait = 2 * self.connect_timeout + 5.0
                loop.call(self._open, timeout=wait, what="starting the convmem service")
            except BaseException:
                if loop is not self._given_loop:
                    loop.stop()
                self._pool.shutdown(wait=False)
                self._state = "stopped"
                self._stopped.set()
                raise
            self._loop = loop
            self._ops.started_at = time.monotonic()
            self._state = "running"
        _log.info("convmem service %s answering on %s", self.instance, ", ".join(self.subjects))
        return self

    def stop(self) -> None:
        """Unsubscribe, answer the requests already received, close. Idempotent and thread-safe.

        A second caller waits for the first to finish. Must not be called
        from a request handler (it waits for the handlers).
        """
        with REPLIES:
            state = self._state
            if state in ("new", "running"):
                self._state = "stopping"
        if state in ("stopping", "stopped"):
            self._stopped.wait(self.drain_timeout + 10.0)
            return
        loop = self._loop
        try:
            if loop is not None:
                loop.call(self._drain, timeout=self.drain_timeout * 2 + 5.0, what="stopping the service")
        except ConvmemError as exc:
            _log.warning("convmem service %s did not stop cleanly: %s", self.instance, exc)
        finally:
            if loop is not None and loop is not self._given_loop:
                loop.stop()
            self._pool.shutdown(wait=True)
            self._state = "stopped"
            self._stopped.set()
            _log.info("convmem service %s stopped", self.instance)

    def run_forever(self, stop_event: threading.Event) -> None:
        """Serve until `stop_event` is set (say, by a SIGTERM handler), then `stop()`."""
        self.start()
        try:
            while not stop_event.wait(1.0):
                pass
        finally:
            self.stop()

    def __enter__(self) -> MemoryService:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"MemoryService({redact_url(self.url)!r}, api_prefix={self.api_prefix!r}, {self._state})"

    # On the loop ----------------------------------------------------------------------------

    async def _open(self) -> None:
        options: dict[str, Any] = {
            "name": self.name,
            "connect_timeout": max(1, int(self.connect_timeout)),
            "allow_reconnect": True,
            "max_reconnect_attempts": 1,  # on the first connect only; unbounded once connected
            "reconnect_time_wait": 0.25,
            "error_cb": self._on_error,
        }
        options.update(self._connect_options)
        nc = NatsClient()  # nats-py's client with the shortcuts of the request path
        try:
            await asyncio.wait_for(nc.connect(servers=server_list(self.url), **options), self.connect_timeout)
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            detail = scrub(str(exc) or type(exc).__name__, self._secrets)
            raise LogUnavailable(
                f"the convmem service cannot connect to NATS at {redact_url(self.url)} ({detail}); "
                "check the URL and the credentials"
            ) from None
        nc.options["max_reconnect_attempts"] = self._connect_options.get("max_reconnect_attempts", -1)
        self._nc = nc
        try:
            # The shared byte tallies answer before the first request does (a bucket made at a
            # tenant's first write would keep that write waiting while a cluster elects its leader).
            await self._usage.prepare(self.connect_timeout)
            sessions, operators = self.subjects
            self._subs = [
                await nc.subscribe_requests(sessions, self.queue_group, self._on_request),
                await nc.subscribe_requests(operators, "", self._on_request),
            ]
            self._micro = await nats.micro.add_service(
                _Guarded(nc, self._guard),  # type: ignore[arg-type]  # a Client in all it uses
                name=MICRO_NAME,
                version=__version__,
                description="convmem: short-term conversation memory (session API on NATS)",
                metadata={"instance": self.instance, "api_prefix": self.api_prefix},
                stats_handler=self._micro_stats,
            )
            await self._micro.add_endpoint(
                name="status", subject=status_subject(self.api_prefix, self.instance), handler=self._status
            )
            if self.partitioned:
                self._partitions = Partitions(
                    nc,
                    api_prefix=self.api_prefix,
                    queue_group=self.queue_group,
                    instance=self.instance,
                    subscribe=lambda subject, queue: nc.subscribe_requests(subject, queue, self._on_request),
                    secret=self._members_secret,
                    on_rejected=self._changes.note,
                )
                await self._partitions.start()
            await nc.flush(timeout=max(1, int(self.connect_timeout)))
            self._watch_erasures(asyncio.get_running_loop())
        except BaseException:
            await close_quietly(nc)
            raise

    def _watch_erasures(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have any process's erasure make its tenant's next byte count a full one (a notice names its
        tenant only as a digest: each tenant known here is checked; every tenant after missed notices),
        or, when its eraser took the bytes off the shared tally (`ErasureNotice.tallied`), a read of
        that tally. Every tenant's, as before, made a tenant's erasures cost each tenant at its quota
        a full count; every erasure, a tenant erasing and writing again a full count of itself."""
        watch = getattr(self.system.log, "watch_erasures", None)
        if watch is not None:

            def erased(notice: ErasureNotice | None) -> None:
                may_be_of = None if notice is None else notice.may_be_of
                tallied = notice is not None and notice.tallied  # its bytes taken off by its eraser
                loop.call_soon_threadsafe(
                    functools.partial(self._usage.erased_everywhere, may_be_of, tallied=tallied)
                )

            self._unwatch = watch(erased)

    async def _off_loop(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def _on_request(self, subject: bytes, reply: bytes, data: bytes) -> None:
        """A request as it is read: admitted into its tenant's turn (`FairShares`), or refused at
        once with `Busy` (as cheap as can be: a flood is refused here, on the loop, at its full rate)."""
        msg = Request(subject.decode(), reply.decode(), data)
        if msg.reply and not self._guard.allows(msg.subject, msg.reply):
            if self._prometheus is not None:
                self._prometheus.refused(tenant_token(self.api_prefix, msg.subject), "reply_subject")
            return  # a reply subject its requester may not listen on: not run, not answered
        token = tenant_token(self.api_prefix, msg.subject)
        started: list[tuple[Request, str]] = []
        self._admitting = started
        try:
            admitted = self._shares.admit(token, functools.partial(self._start, msg, token))
        finally:
            self._admitting = None
        if admitted:
            self._ops.stats.begin()
            self._changes.note()
            for request, its_token in started:  # counted in flight first, then run (it may end at once)
                self._run(request, its_token)
            return
        self._ops.stats.refused(_op_token(msg.subject), "Busy")
        self._changes.note()
        if self._prometheus is not None:
            self._prometheus.refused(token, "Busy")
        if msg.reply:
            self._answer_now(msg, self._busy_reply(token, wants_msgpack(msg.data)))

    def _busy_reply(self, token: str, msgpack: bool) -> bytes:
        """The `Busy` reply of `token`'s tenant (the same every time: made once, kept for a while)."""
        reply = self._busy_replies.get((token, msgpack))
        if reply is None:
            if len(self._busy_replies) >= 1024:
                self._busy_replies.clear()
            reply = encode_error(error_info(self._shares.busy(token)), msgpack=msgpack)
            self._busy_replies[token, msgpack] = reply
        return reply

    def _start(self, msg: Request, token: str) -> None:
        """`FairShares` starts the request: now, after its admission is counted, or after the answer
        that freed its place has been given (never inside it: a queue of requests that end at once
        would nest)."""
        if self._admitting is not None:
            self._admitting.append((msg, token))
        elif self._finishing:
            asyncio.get_running_loop().call_soon(self._run, msg, token)
        else:
            self._run(msg, token)

    def _run(self, msg: Request, token: str) -> None:
        """An ``add_turn`` of a live session on the log's own loop is begun here and answered from the
        log's acknowledgement (`TurnLane.begin`); any other request is served in a task of its own."""
        if self._given_loop is not None and self._lane.begin(msg, token):
            return
        task = asyncio.get_running_loop().create_task(self._serve(msg))
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._finished(done, token))

    def _finished(self, task: asyncio.Task[None], token: str) -> None:
        self._tasks.discard(task)
        self._done(token)

    def _done(self, token: str) -> None:
        """A request of `token`'s tenant was answered: its place goes to the next (started after this)."""
        self._finishing = True
        try:
            self._shares.done(token)
        finally:
            self._finishing = False

    def _request_ended(self, msg: Request, op: str, error: str | None, token: str) -> None:
        """A request answered from a callback (`TurnLane`): counted as `_serve` counts, its place freed."""
        self._ops.stats.end(op, error)
        self._changes.note()
        if self._prometheus is not None:
            self._count(msg.subject, op, error, False)
        self._done(token)

    def _answer_now(self, msg: Request, reply: bytes) -> None:
        """`_respond` from a callback, for a request whose reply subject `_on_request` let through
        (`ReplyGuard`'s rule is a function of the subject and the reply subject alone): sent at once
        when the client can take it without waiting, else in a task (a reconnecting client, a reply
        over ``max_payload``...), which checks it again as every other answer is checked."""
        nc = self._nc
        assert nc is not None
        if isinstance(nc, NatsClient) and nc.send_now(msg.reply, "", b"", reply):
            return
        task = asyncio.get_running_loop().create_task(self._respond_logged(nc, msg, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _respond_logged(self, nc: Client, msg: Request, reply: bytes) -> None:
        try:
            await self._respond(nc, msg, reply)
        except Exception:
            _log.exception("convmem service: request on %s not answered", msg.subject)

    async def _over_quota(self, msg: Request) -> tuple[str, str] | Answer | None:
        """(tenant id, op) of a request within its quota, or its refusal; None: no tenant's request."""
        try:
            tenant_id, op = parse_subject(self.api_prefix, msg.subject)
        except ConvmemError:
            return None  # answered as it deserves by the operation itself
        if tenant_id is None:
            return None
        allowed = self.quotas.of_token(tenant_token(self.api_prefix, msg.subject)).max_bytes
        if op in WRITES and allowed is not None:
            try:
                await self._usage.check(tenant_id, allowed)
            except ConvmemError as exc:
                info = error_info(exc)
                return Answer(op, info.type, encode_error(info, msgpack=wants_msgpack(msg.data)))
        elif op == "erase" and allowed is not None:
            await self._usage.erasing(tenant_id)  # its bytes then taken off the shared tally for sure
        return tenant_id, op

    def _admit_fork(self, tenant_id: str, size: Callable[[], int]) -> None:
        """On a worker thread, before a fork stores its copy (of `size()` bytes, counted only for a
        tenant with a quota): `QuotaExceeded` when the tenant's bytes and the copy would pass its
        quota. Forks of a tenant run one at a time (`_one_fork_at_a_time`), so the tally it reads
        holds every earlier fork's copy."""
        allowed = self.quotas.of_token(encode_token(tenant_id)).max_bytes
        if allowed is None:
            return
        adding = size()
        usage = self._usage.usage(tenant_id) or 0
        if usage + adding > allowed:
            raise QuotaExceeded(tenant_id=tenant_id, allowed=allowed, usage=usage, adding=adding)

    @contextlib.asynccontextmanager
    async def _one_fork_at_a_time(self, subject: str) -> AsyncIterator[None]:
        """A fork stores a copy of a session from a request of a few bytes: a tenant's forks under a
        byte quota run one at a time, each admitted on the bytes of those before it."""
        try:
            tenant_id, op = parse_subject(self.api_prefix, subject)
        except ConvmemError:
            tenant_id = op = None
        token = tenant_token(self.api_prefix, subject)
        if op != "fork" or tenant_id is None or self.quotas.of_token(token).max_bytes is None:
            yield
            return
        lock, users = self._forking.setdefault(token, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._forking[token]

    async def _serve(self, msg: Request) -> None:
        async with self._one_fork_at_a_time(msg.subject):
            await self._serve_now(msg)

    async def _serve_now(self, msg: Request) -> None:
        assert self._nc is not None
        op, error, refused = "unknown", None, False
        try:
            request = await self._over_quota(msg)
            if isinstance(request, Answer):
                answer, refused = request, True
            elif self._given_loop is not None and self._ops.on_loop(msg.subject):
                answer = await self._ops.add_turn_here(msg.subject, msg.data)
            else:
                answer, cpu = await asyncio.get_running_loop().run_in_executor(
                    self._pool, self._answer_measured, msg.subject, msg.data
                )
                self._shares.measured(tenant_token(self.api_prefix, msg.subject), cpu)
            op, error = answer.op, answer.error
            if isinstance(request, tuple) and error is None:
                self._used(*request, len(msg.data), erased=answer.erased)
            if msg.reply:
                await self._respond(self._nc, msg, answer.reply)
        except Exception:
            _log.exception("convmem service: request on %s not answered", msg.subject)
        finally:
            self._ops.stats.end(op, error)
            self._changes.note()
            if self._prometheus is not None:
                self._count(msg.subject, op, error, refused)

    def _answer_measured(self, subject: str, data: bytes) -> tuple[Answer, float]:
        """On a worker thread: the request's answer, and the CPU seconds this thread spent on it."""
        began = time.thread_time()
        answer = self._ops.answer(subject, data)
        return answer, time.thread_time() - began

    def _count(self, subject: str, op: str, error: str | None, refused: bool) -> None:
        assert self._prometheus is not None
        token = tenant_token(self.api_prefix, subject)
        self._prometheus.request(token, op, error)
        if refused and error is not None:
            self._prometheus.refused(token, error)  # QuotaExceeded

    def _used(self, tenant_id: str, op: str, size: int, *, erased: bool = False) -> None:
        """Note what a request that succeeded did to its tenant's stored bytes (an erasure that removed
        no event changed nothing: else each made the next refusal of a tenant at its quota count
        every event of it again)."""
        if op in WRITES:
            self._usage.wrote(tenant_id, size)
        elif erased:
            self._usage.erased(tenant_id)

    async def _respond(self, nc: Client, msg: Request, reply: bytes) -> None:
        if not self._guard.allows(msg.subject, msg.reply):  # checked on receipt too: every answer passes here
            return
        try:
            await nc.publish(msg.reply, reply)
        except nats.errors.MaxPayloadError:
            error = ErrorInfo(
                type="ReplyTooLarge",
                message=f"the reply is {len(reply)} bytes, over the server's max_payload of "
                f"{nc.max_payload}; raise max_payload on the server or ask for a smaller view",
            )
            await nc.publish(msg.reply, encode_error(error, msgpack=wants_msgpack(msg.data)))

    def _micro_stats(self, _endpoint: Any) -> dict[str, Any]:
        """Custom data of ``$SRV.STATS`` (on the loop: cheap counters only)."""
        worker = {"worker": self.worker()} if self._worker or self._partitions else {}
        stats = {**self._ops.stats.snapshot(), "replies": self._replies()}
        return {"live_sessions": self.system.live_sessions(), **stats, **worker}

    def worker(self) -> dict[str, Any]:
        """What this worker says of itself in its status: its `worker` mapping, its partitions, its peers."""
        shares = self._partitions
        more: dict[str, int] = {}
        if shares is not None:
            more = {"partitions": len(shares.owned), "members": len(shares.members)}
            more["rejected"] = shares.rejected
        return {**self._worker, **more}

    def _replies(self) -> dict[str, Any]:
        """The requests not answered: refused for their reply subject (`ReplyGuard`), dropped (`dropped`)."""
        return {**self._guard.snapshot(), "dropped": self.dropped}

    async def _status(self, request: MicroRequest) -> None:
        """This replica's health and metrics (``{api_prefix}.ops.status.{instance}``), off the loop.

        One probe at a time: a status asked while the last probe still waits for the log (its asker
        was told 504 already) waits for that probe, so a flood of status requests at a replica whose
        log hangs holds one worker thread, not one each until every tenant's request waits.
        """
        probe = self._probe
        if probe is None or probe.done():
            probe = self._probe = asyncio.get_running_loop().run_in_executor(self._pool, self._probe_now)
        wait = self.status_timeout
        try:
            health, metrics = await asyncio.wait_for(asyncio.shield(probe), wait)
        except TimeoutError:
            await request.respond_error("504", f"this replica did not get its log's answer within {wait:g}s")
            return
        if self._worker or self._partitions is not None:
            health = {**health, "worker": self.worker()}
        await request.respond(json.dumps({"health": health, "metrics": metrics}).encode())

    def _probe_now(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """On a worker thread: this replica's health, then its metrics."""
        return self._ops.health(), self._ops.metrics()

    async def _drain(self) -> None:
        if self._micro is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._micro.stop()
        subs = list(self._subs)
        if self._partitions is not None:
            subs += await self._partitions.leave()
        for sub in subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.drain()  # type: ignore[no-untyped-call]  # no new requests; received ones are handled
        idle: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def now_idle() -> None:
            if not idle.done():
                idle.set_result(None)

        self._shares.when_idle(now_idle)
        try:
            await asyncio.wait_for(idle, self.drain_timeout)  # the admitted ones, queued too, answered
        except TimeoutError:
            _log.warning(
                "%d requests were still in flight after %ss", self._shares.in_flight, self.drain_timeout
            )
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=1.0)  # their last callbacks
        if self._unwatch is not None:
            self._unwatch()
        await self._usage.close()
        nc = self._nc
        if nc is not None and not nc.is_closed:
            try:
                await asyncio.wait_for(nc.drain(), self.drain_timeout)
            except Exception:  # a dead server: close without draining
                await close_quietly(nc)

    def health(self) -> dict[str, Any]:
        """What ``ops.v1.health`` answers (whether the log answers, live sessions, load)."""
        return self._ops.health()

    def metrics(self) -> dict[str, Any]:
        """What ``ops.v1.metrics`` answers (the memory system's counters and this service's)."""
        return self._ops.metrics()

    async def _on_error(self, exc: Exception) -> None:
        if isinstance(exc, nats.errors.SlowConsumerError):  # told once a message dropped: a flood, counted
            self.dropped += 1
            self._changes.note()
            if self.dropped & (self.dropped - 1):
                return  # logged at the 1st, 2nd, 4th, 8th, ... drop
            _log.warning(
                "convmem service: dropped a request on %r unanswered, its subscription's queue full; "
                "%d dropped",
                exc.subject[:120],
                self.dropped,
            )
            return
        _log.warning("convmem service NATS error: %s", scrub(str(exc) or type(exc).__name__, self._secrets))


def _op_token(subject: str) -> str:
    """The op token of a session subject (``...v1.<tenant>.<op>[.p<N>]``), unchecked: for counting."""
    tokens = subject.rsplit(".", 2)
    op = tokens[-2] if tokens[-1].startswith("p") and tokens[-1][1:].isdigit() else tokens[-1]
    return op if op in _OPS else "unknown"  # no hostile name grows the counters


class _Guarded:
    """The service's client as NATS micro sees it: each of its subscriptions passes `ReplyGuard` first.

    nats-py's micro-service answers ``$SRV.PING/INFO/STATS`` and its
    endpoints (the replica's status) on whatever reply subject a request
    carries; through this, a request whose reply subject its requester may
    not listen on never reaches micro's handlers. Micro's handlers take a
    subscription's requests one at a time: at most `OPERATOR_PENDING` wait
    (nats-py's default is 524,288), the rest are dropped and counted.
    """

    def __init__(self, nc: Client, guard: ReplyGuard) -> None:
        self._nc = nc
        self._guard = guard

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nc, name)

    async def subscribe(self, subject: str, queue: str = "", cb: Any = None, **kwargs: Any) -> Subscription:
        if cb is None:
            raise InvalidConfig("subscribe", "the service subscribes with a callback only")
        handler = cb

        async def guarded(msg: Msg) -> None:
            if msg.reply and not self._guard.allows(msg.subject, msg.reply):
                return
            await handler(msg)

        kwargs.setdefault("pending_msgs_limit", OPERATOR_PENDING)  # micro's handlers take one at a time
        kwargs.setdefault("pending_bytes_limit", OPERATOR_PENDING_BYTES)
        return await self._nc.subscribe(subject, queue=queue, cb=guarded, **kwargs)
