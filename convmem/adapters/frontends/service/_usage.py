"""`TenantUsage`: what a service instance knows of each tenant's stored bytes, to hold its quota.

Counting the log is exact and restart-safe, but reads the tenant's events;
so each instance keeps a tally per tenant:

* the first write of a tenant after the instance starts needs a full count
  of its events in the log (as JetStream counts them against ``max_bytes``:
  subject, headers, payload and its record framing). That count reads every
  event of the tenant (some 28,000 a second), so where the log can say how
  many bytes it holds in all (`bound_of`: the stream's own count, one
  request), a tenant whose writes cannot reach its quota by that bound (the
  log's bytes when first asked, plus what this instance answered for it
  since) is admitted while its first count runs in the background; only a
  write the bound does not clear waits for the count;
* each write answered through this instance adds its request's size (an
  estimate of what it stored) until the next count;
* a write more than `recount_every` seconds after the last count starts a
  count in the background of only what was appended since (any process's
  writes), which replaces the estimates; a write that the tally would refuse
  waits for that count first, so a refusal rests on a count at most
  `recount_every` seconds old;
* an erasure (through this instance, or any process's erasure notice, which
  does not say whose) makes the count before the tenant's next refusal a
  full one: erased bytes stay in the tally (on the safe side) until then;
  deletions no notice tells (retention's compaction, an operator's purge)
  are seen because a refusal also needs a full count at most `full_every`
  seconds old.

So a tenant can pass its quota by at most one request, plus what other
instances write for it between two counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from convmem.actors import EventLog
from convmem.errors import ConvmemError, QuotaExceeded

__all__ = ["ByteBound", "ByteCounter", "TenantUsage", "bound_of", "counter_of"]

_log = logging.getLogger("convmem.service")

ByteCounter = Callable[[str, int], Awaitable[tuple[int, int]]]
"""(tenant id, after position) -> (bytes of its events past that position, the last position counted)."""
ByteBound = Callable[[], Awaitable[int]]
"""() -> bytes the whole log holds: no tenant's count is more."""
Blocking = Callable[[], tuple[int, int]]


@runtime_checkable
class _CountsBytes(Protocol):
    def stored_bytes(self, tenant_id: str, *, after_position: int = 0) -> tuple[int, int]: ...

    async def stored_bytes_here(self, tenant_id: str, *, after_position: int = 0) -> tuple[int, int]: ...

    def on_loop_thread(self) -> bool: ...


def counter_of(log: EventLog, off_loop: Callable[[Blocking], Awaitable[tuple[int, int]]]) -> ByteCounter:
    """How to count a tenant's stored bytes in `log`: its own count (JetStream: awaited right here when
    its connection runs on this loop, else on a thread by `off_loop`), else the sizes of its events."""
    if isinstance(log, _CountsBytes):
        counts = log

        async def count(tenant_id: str, after: int) -> tuple[int, int]:
            if counts.on_loop_thread():
                return await counts.stored_bytes_here(tenant_id, after_position=after)
            return await off_loop(lambda: counts.stored_bytes(tenant_id, after_position=after))

        return count

    def by_reading(tenant_id: str, after: int) -> tuple[int, int]:
        total, last = 0, after
        for record in log.read_all(tenant_id=tenant_id):
            if record.position > after:
                total += len(record.data)
                last = max(last, record.position)
        return total, last

    return lambda tenant_id, after: off_loop(lambda: by_reading(tenant_id, after))


@runtime_checkable
class _BoundsBytes(Protocol):
    def all_stored_bytes(self) -> int: ...

    async def all_stored_bytes_here(self) -> int: ...

    def on_loop_thread(self) -> bool: ...


def bound_of(log: EventLog, off_loop: Callable[[Callable[[], int]], Awaitable[int]]) -> ByteBound | None:
    """How to ask `log` for the bytes it holds in all (JetStream: the stream's own count, awaited
    here on its connection's loop, else on a thread by `off_loop`); None when it cannot say."""
    if not isinstance(log, _BoundsBytes):
        return None
    bounds = log

    async def bound() -> int:
        if bounds.on_loop_thread():
            return await bounds.all_stored_bytes_here()
        return await off_loop(bounds.all_stored_bytes)

    return bound


class _Tally:
    __slots__ = ("bound", "counted", "counted_at", "counting", "estimate", "full_at", "position", "stale")

    def __init__(self) -> None:
        self.counted = 0  # bytes as of the last count, through log position `position`
        self.position = 0
        self.estimate = 0  # request bytes written through this instance since the last count
        self.counted_at: float | None = None  # None: never counted
        self.full_at = 0.0  # when the last full count began
        self.stale = False  # erased since the last count: the next count is a full one
        self.counting: asyncio.Future[None] | None = None
        self.bound: int | None = None  # the log's bytes in all when first asked (before the first count)

    @property
    def total(self) -> int:
        return self.counted + self.estimate


class TenantUsage:
    """Per-tenant stored bytes for quota checks, on the service's loop (see the module docstring).

    `counter` counts a tenant's bytes in the log (`counter_of`); `bound`, when given, says how many
    bytes the log holds in all (`bound_of`); `clock` is monotonic seconds.
    """

    def __init__(
        self,
        counter: ByteCounter,
        *,
        recount_every: float,
        bound: ByteBound | None = None,
        full_every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._counter = counter
        self._bound = bound
        self._every = recount_every
        self._full_every = max(full_every, recount_every)
        self._clock = clock
        self._tallies: dict[str, _Tally] = {}
        self._background: set[asyncio.Future[None]] = set()

    def usage(self, tenant_id: str) -> int | None:
        """The tally of `tenant_id` (None before its first count)."""
        tally = self._tallies.get(tenant_id)
        return None if tally is None or tally.counted_at is None else tally.total

    async def check(self, tenant_id: str, allowed: int) -> None:
        """Raise `QuotaExceeded` if `tenant_id` stores `allowed` bytes or more (counting first if due)."""
        tally = self._tallies.setdefault(tenant_id, _Tally())
        now = self._clock()
        if tally.counted_at is None:
            if await self._cleared_by_bound(tally, allowed):
                self._count_later(tenant_id, tally, full=True)
                return
            await self._count(tenant_id, tally, full=True)
        elif tally.total >= allowed:  # refuse on fresh counts only
            if tally.stale or now - tally.full_at >= self._full_every:
                await self._count(tenant_id, tally, full=True)
            elif now - tally.counted_at >= self._every:
                await self._count(tenant_id, tally, full=False)
        elif now - tally.counted_at >= self._every:
            self._count_later(tenant_id, tally)
        if tally.total >= allowed:
            raise QuotaExceeded(tenant_id=tenant_id, allowed=allowed, usage=tally.total)

    def within(self, tenant_id: str, allowed: int) -> bool:
        """`check` when it needs no count first: True when `tenant_id` is counted and below `allowed`
        (a recount that fell due starts in the background, as `check` starts it). False: await `check`."""
        tally = self._tallies.get(tenant_id)
        if tally is None or tally.counted_at is None or tally.total >= allowed:
            return False
        if self._clock() - tally.counted_at >= self._every:
            self._count_later(tenant_id, tally)
        return True

    def wrote(self, tenant_id: str, size: int) -> None:
        """A write of `size` request bytes for `tenant_id` was answered through this instance."""
        tally = self._tallies.get(tenant_id)
        if tally is not None:
            tally.estimate += size

    def erased(self, tenant_id: str) -> None:
        """Some of `tenant_id`'s events were erased: count it in full before refusing it a write."""
        tally = self._tallies.get(tenant_id)
        if tally is not None:
            tally.stale = True

    def erased_everywhere(self) -> None:
        """An erasure of an unnamed tenant (notices name none): as `erased`, for every tenant."""
        for tally in self._tallies.values():
            tally.stale = True

    async def close(self) -> None:
        """Wait for the counts in the background (on stop)."""
        for future in list(self._background):
            with contextlib.suppress(Exception):
                await future

    async def _cleared_by_bound(self, tally: _Tally, allowed: int) -> bool:
        """Before a tenant's first count: whether the log's bytes in all (asked once), plus what this
        instance answered for the tenant since, stay below `allowed` (False when no bound is known)."""
        if self._bound is None:
            return False
        if tally.bound is None:
            try:
                tally.bound = await self._bound()
            except ConvmemError as exc:
                _log.warning("convmem service: the log's bytes in all not known, counting first: %s", exc)
                return False
        return tally.bound + tally.estimate < allowed

    def _count_later(self, tenant_id: str, tally: _Tally, *, full: bool = False) -> None:
        if tally.counting is not None:
            return
        future = asyncio.ensure_future(self._count(tenant_id, tally, full=full))
        self._background.add(future)
        future.add_done_callback(self._counted_later)

    def _counted_later(self, future: asyncio.Future[None]) -> None:
        self._background.discard(future)
        if not future.cancelled() and future.exception() is not None:
            _log.warning("convmem service: counting a tenant's stored bytes failed: %s", future.exception())

    async def _count(self, tenant_id: str, tally: _Tally, *, full: bool) -> None:
        """Bring the tally up to date (`full`: count every event again), one count at a time.

        A caller that finds a count running waits for it and takes it when it is enough: any count
        for a tally that is not `full`; for a `full` one, a full count that began at most
        `recount_every` seconds before this caller asked, with no erasure since it began. Judged
        from when the caller asked, never from when the count ended: a count longer than
        `recount_every` (a large tenant on a busy machine) must not make every waiter count again,
        one after the other (each request waiting on all the counts before it: the ``cores``
        bench's 60 s stall, issue 28).
        """
        asked = self._clock()
        while tally.counting is not None:  # another count runs: wait for it, then see if it did enough
            await asyncio.shield(tally.counting)
            if not full or (tally.full_at >= asked - self._every and not tally.stale):
                return
        tally.counting = asyncio.ensure_future(self._recount(tenant_id, tally, full=full))
        await asyncio.shield(tally.counting)

    async def _recount(self, tenant_id: str, tally: _Tally, *, full: bool) -> None:
        try:
            after = 0 if full else tally.position
            estimate, started = tally.estimate, self._clock()
            if full:
                tally.stale = False  # an erasure from here on sets it again
                tally.full_at = started
            try:
                counted, position = await self._counter(tenant_id, after)
            except ConvmemError:
                tally.stale = tally.stale or full
                raise
            took = self._clock() - started
            if took >= self._every:  # writes that cannot be admitted on the tally wait this long
                _log.warning(
                    "convmem service: counting the stored bytes of tenant %r took %.1fs (%s count)",
                    tenant_id,
                    took,
                    "a full" if full else "a partial",
                )
            tally.counted = counted if full else tally.counted + counted
            tally.position = position
            tally.estimate = max(0, tally.estimate - estimate)  # writes during the count may count twice
            tally.counted_at = started
        finally:
            tally.counting = None
