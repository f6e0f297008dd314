"""`TenantUsage`: what a service instance knows of each tenant's stored bytes, to hold its quota.

Counting the log is exact and restart-safe, but reads the tenant's events
(some 28,000 a second); so the instances keep a tally per tenant instead:

* **what this instance wrote**: the log counts the bytes each append stores
  as it sends it (`appended`: JetStream's ``34 + subject + headers +
  payload`` per message, the measure of the stream's ``max_bytes``); a log
  that cannot say falls back to each answered write's request size (`wrote`);
* **a tally shared by every instance** (`Tallies`: on JetStream one key per
  tenant in the ``<stream>_USAGE`` bucket): every `recount_every` seconds an
  instance adds what it wrote since to the shared value (a conditional put
  on the revision it read, so concurrent adds all count) and reads what the
  others added. No message is read back for it;
* a tenant's tally is **the shared value plus what this instance wrote
  since its last add**. A fresh instance (a restart, a new worker) reads the
  shared value at the tenant's first write (one request, and on JetStream
  one more: whether the tenant has events past the position the value counts
  through) and is admitted on it; a value the log finds stale or damaged
  (events past it, a position behind one already seen, a key the bucket
  counts but serves none of) is read as none. Only a tenant never counted on
  this stream, or so read, has no shared value: its
  first count is a full one, and while the stream's bytes in all
  (`bound_of`, one request) plus what this instance wrote stay under the
  quota, its writes are admitted while that count runs in the background;
* **what this instance erased** (`erased`: the log adds up the stored size of
  each message it deletes, `JetStreamEventLog.erased_bytes`) is taken off the
  same way: off this instance's tally at once, off the shared value at an add
  made right after the erasure; the log's erasure notices then say so
  (`ErasureNotice.tallied`), and an instance that hears one reads the shared
  value before refusing the tenant, instead of counting it again;
* **a refusal rests on an exact count**: a write the tally would refuse
  first has the tally brought up to date (an add at most `recount_every`
  seconds old) and, when the last full count of the tenant by this instance
  is older than `full_every` seconds, or some of its events were erased
  since by a process that took no bytes off (an erasure notice not
  `tallied`: the CLI's, another convmem's; notices missed), counts every
  event of the tenant again and sets the shared value from that count (plus
  what other instances added while it ran). So deletions (erasure,
  retention's compaction, an operator's purge) and writes made outside the
  service instances are seen before any refusal.

So a tenant can pass its quota by what the instances write between two adds
(at most `recount_every` seconds of writes), plus what an instance that died
had not added yet, plus what was written outside the service instances, until
the next full count; erased bytes stay in the tally (on the safe side) until
then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from convmem.actors import EventLog
from convmem.errors import ConvmemError, LogUnavailable, PermissionDenied, QuotaExceeded

__all__ = [
    "ByteBound",
    "ByteCounter",
    "LocalTallies",
    "Tallies",
    "TenantUsage",
    "appended_of",
    "bound_of",
    "counter_of",
    "tallies_of",
    "usage_of",
]

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


@runtime_checkable
class Tallies(Protocol):
    """Each tenant's byte tally, shared by the service instances of one log (see the module docstring)."""

    async def get(self, tenant_id: str) -> tuple[int, int] | None:
        """(the tenant's tallied bytes, the value's revision); None when none was recorded."""
        ...

    async def put(self, tenant_id: str, value: int, revision: int) -> int | None:
        """Record `value` if the tally is still at `revision` (0: none yet): its new revision, or None
        when another instance changed it first."""
        ...

    async def prepare(self, within: float) -> None:
        """Be ready to answer at once (make the shared store and wait, at most `within` seconds, until
        it answers), before the instance takes requests; never raises: if the shared store cannot be
        made ready, this instance keeps tallies of its own (and says so in the log)."""
        ...


class LocalTallies:
    """`Tallies` of this instance alone (a log that keeps none: the in-memory log, one process)."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[int, int]] = {}

    async def get(self, tenant_id: str) -> tuple[int, int] | None:
        return self._values.get(tenant_id)

    async def put(self, tenant_id: str, value: int, revision: int) -> int | None:
        held = self._values.get(tenant_id)
        if (held[1] if held is not None else 0) != revision:
            return None
        self._values[tenant_id] = (value, revision + 1)
        return revision + 1

    async def prepare(self, within: float) -> None:
        """This instance's own tallies are a dictionary: ready from the start."""


@runtime_checkable
class _SharesTallies(Protocol):
    def usage_tally(self, tenant_id: str) -> tuple[int, int] | None: ...

    async def usage_tally_here(self, tenant_id: str) -> tuple[int, int] | None: ...

    def put_usage_tally(self, tenant_id: str, value: int, revision: int) -> int | None: ...

    async def put_usage_tally_here(self, tenant_id: str, value: int, revision: int) -> int | None: ...

    def prepare_usage_tallies(self, *, within: float) -> None: ...

    async def prepare_usage_tallies_here(self, *, within: float) -> None: ...

    def on_loop_thread(self) -> bool: ...


class _LogTallies:
    """`Tallies` kept by the log (JetStream: its ``<stream>_USAGE`` bucket), awaited on its loop when
    this is it, else on a thread by `off_loop`."""

    def __init__(self, log: _SharesTallies, off_loop: Callable[[Callable[[], Any]], Awaitable[Any]]) -> None:
        self._log = log
        self._off_loop = off_loop
        self._local: LocalTallies | None = None  # these credentials may not use the bucket

    async def get(self, tenant_id: str) -> tuple[int, int] | None:
        if self._local is not None:
            return await self._local.get(tenant_id)
        try:
            if self._log.on_loop_thread():
                return await self._log.usage_tally_here(tenant_id)
            got: tuple[int, int] | None = await self._off_loop(lambda: self._log.usage_tally(tenant_id))
        except PermissionDenied as exc:
            return await self._denied(exc).get(tenant_id)
        return got

    async def put(self, tenant_id: str, value: int, revision: int) -> int | None:
        if self._local is not None:
            return await self._local.put(tenant_id, value, revision)
        try:
            if self._log.on_loop_thread():
                return await self._log.put_usage_tally_here(tenant_id, value, revision)
            put: int | None = await self._off_loop(
                lambda: self._log.put_usage_tally(tenant_id, value, revision)
            )
        except PermissionDenied as exc:
            return await self._denied(exc).put(tenant_id, value, revision)
        return put

    async def prepare(self, within: float) -> None:
        if self._local is not None:
            return
        try:
            if self._log.on_loop_thread():
                await self._log.prepare_usage_tallies_here(within=within)
            else:
                await self._off_loop(lambda: self._log.prepare_usage_tallies(within=within))
        except PermissionDenied as exc:
            self._denied(exc)
        except ConvmemError as exc:  # the bucket cannot be made or does not answer: tallies of its own
            _log.warning(
                "convmem service: the shared byte tallies are not ready (%s): this instance keeps its "
                "own, and sees other instances' writes at its full counts",
                exc,
            )
            self._local = LocalTallies()

    @property
    def shares(self) -> bool:
        """Whether the tallies are the shared ones (not this instance's own, as when denied)."""
        return self._local is None

    def _denied(self, exc: PermissionDenied) -> LocalTallies:
        _log.warning(
            "convmem service: the shared byte tallies may not be used with these credentials (%s): "
            "each instance keeps its own, and sees other instances' writes at its full counts",
            exc,
        )
        self._local = LocalTallies()
        return self._local


def tallies_of(log: EventLog, off_loop: Callable[[Callable[[], Any]], Awaitable[Any]]) -> Tallies:
    """The shared tallies of `log`'s service instances (JetStream: its bucket), else this instance's own."""
    if isinstance(log, _SharesTallies):
        return _LogTallies(log, off_loop)
    return LocalTallies()


@runtime_checkable
class _CountsAppends(Protocol):
    def appended_bytes(self, tenant_id: str) -> int: ...


def appended_of(log: EventLog) -> Callable[[str], int] | None:
    """How many bytes `log` sent for a tenant's events (`JetStreamEventLog.appended_bytes`); None when
    it cannot say (the instance then counts each answered write's request size)."""
    return log.appended_bytes if isinstance(log, _CountsAppends) else None


@runtime_checkable
class _CountsErasures(Protocol):
    def erased_bytes(self, tenant_id: str) -> int: ...

    def tally_erasures(self, tallied: Callable[[str], bool]) -> None: ...


def usage_of(
    log: EventLog, off_loop: Callable[[Callable[[], Any]], Awaitable[Any]], *, recount_every: float
) -> TenantUsage:
    """The `TenantUsage` of a service instance serving `log` (blocking calls run by `off_loop`); a log
    that counts what it erases (`JetStreamEventLog.erased_bytes`) has it taken off the tallies, and
    its erasure notices say so for the tenants tallied here (`tally_erasures`)."""
    appended = appended_of(log)
    erases = log if appended is not None and isinstance(log, _CountsErasures) else None
    usage = TenantUsage(
        counter_of(log, off_loop),
        bound=bound_of(log, off_loop),
        tallies=tallies_of(log, off_loop),
        appended=appended,
        erased=erases.erased_bytes if erases is not None else None,
        recount_every=recount_every,
    )
    if erases is not None:
        erases.tally_erasures(usage.takes_erasures_of)
    return usage


_TRIES = 16
"""Conditional puts of one tally before giving up (as many other instances changed it meanwhile)."""


class _Tally:
    __slots__ = (
        "bound",
        "busy",
        "doubt",
        "dropped",
        "erased_mark",
        "first",
        "full_at",
        "mark",
        "own",
        "reread",
        "revision",
        "shared",
        "stale",
        "synced_at",
    )

    def __init__(self, mark: int, erased_mark: int = 0) -> None:
        self.shared: int | None = None  # the shared tally as last read or written (None: none known)
        self.revision = 0
        self.synced_at: float | None = None  # when `shared` was last read or written (None: never)
        self.mark = mark  # the log's `appended` for the tenant when this instance last added to `shared`
        self.own = 0  # request bytes answered since (a log that does not count its appends)
        self.erased_mark = erased_mark  # the log's `erased` for the tenant when last taken off `shared`
        self.reread = False  # an erasure taken off the shared tally since it was read: read it first
        self.dropped = False  # erased bytes left in the tally (`_read`): the add after an erasure counts
        self.full_at: float | None = None  # when this instance's last full count began (None: never)
        self.stale = False  # erased since the last full count: a refusal needs a full one first
        self.busy: asyncio.Future[None] | None = None  # the add or count under way
        self.first: asyncio.Future[None] | None = None  # the first read of the shared tally
        self.bound: int | None = None  # the log's bytes in all when first asked (before the first count)
        self.doubt = 0  # bytes the last full count may have counted twice (written while it ran)


class TenantUsage:
    """Per-tenant stored bytes for quota checks, on the service's loop (see the module docstring).

    `counter` counts a tenant's bytes in the log (`counter_of`); `bound`, when given, says how many
    bytes the log holds in all (`bound_of`); `tallies` keeps each tenant's shared tally (default: this
    instance's own, `LocalTallies`); `appended` says how many bytes the log sent for a tenant (None:
    `wrote`'s request sizes stand for them); `erased`, with `appended`, how many bytes of the tenant's
    the log erased (taken off the tally as they are written: no count after them); `clock` is
    monotonic seconds.
    """

    def __init__(
        self,
        counter: ByteCounter,
        *,
        recount_every: float,
        bound: ByteBound | None = None,
        tallies: Tallies | None = None,
        appended: Callable[[str], int] | None = None,
        erased: Callable[[str], int] | None = None,
        full_every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._counter = counter
        self._bound = bound
        self._shared: Tallies = tallies if tallies is not None else LocalTallies()
        self._appended = appended
        self._erased = erased if appended is not None else None
        self._every = recount_every
        self._full_every = max(full_every, recount_every)
        self._clock = clock
        self._tallies: dict[str, _Tally] = {}
        self._background: set[asyncio.Future[None]] = set()

    async def prepare(self, within: float) -> None:
        """Make the shared tallies ready before the instance's first request (see `Tallies.prepare`)."""
        await self._shared.prepare(within)

    def usage(self, tenant_id: str) -> int | None:
        """The tally of `tenant_id` (None before anything is known of it)."""
        tally = self._tallies.get(tenant_id)
        return None if tally is None or tally.synced_at is None else self._total(tenant_id, tally)

    async def check(self, tenant_id: str, allowed: int) -> None:
        """Raise `QuotaExceeded` if `tenant_id` stores `allowed` bytes or more (bringing its tally up
        to date first when due)."""
        tally = self._tally(tenant_id)
        now = self._clock()
        if tally.synced_at is None:
            if tally.first is None or (tally.first.done() and tally.first.exception() is not None):
                tally.first = asyncio.ensure_future(self._read_first(tenant_id, tally))
            await asyncio.shield(tally.first)  # nothing known yet: the shared tally (one request)
            if tally.synced_at is None:  # none recorded: never counted on this log
                if await self._cleared_by_bound(tenant_id, tally, allowed):
                    self._later(tenant_id, tally, full=True)
                    return
                await self._run(tenant_id, tally, full=True, any_full=True)
        if self._total(tenant_id, tally) >= allowed:  # refuse on an exact, fresh count only
            if (
                tally.stale
                or tally.full_at is None
                or now - tally.full_at >= self._full_every
                or self._total(tenant_id, tally) - tally.doubt < allowed  # over only by what it doubts
            ):
                await self._run(tenant_id, tally, full=True)
            elif tally.reread or tally.synced_at is None or now - tally.synced_at >= self._every:
                await self._run(tenant_id, tally, full=False)
        elif tally.synced_at is not None and now - tally.synced_at >= self._every:
            self._later(tenant_id, tally)
        usage = self._total(tenant_id, tally)
        if usage - tally.doubt >= allowed:  # a refusal never on bytes that may be counted twice
            raise QuotaExceeded(tenant_id=tenant_id, allowed=allowed, usage=usage)

    def within(self, tenant_id: str, allowed: int) -> bool:
        """`check` when it needs no request first: True when `tenant_id`'s tally is known and below
        `allowed` (an add that fell due starts in the background, as `check` starts it). False: await
        `check`."""
        tally = self._tallies.get(tenant_id)
        if tally is None or tally.synced_at is None or self._total(tenant_id, tally) >= allowed:
            return False
        if self._clock() - tally.synced_at >= self._every:
            self._later(tenant_id, tally)
        return True

    def wrote(self, tenant_id: str, size: int) -> None:
        """A write of `size` request bytes for `tenant_id` was answered through this instance (counted
        only when the log does not count what it appends)."""
        if self._appended is None:
            tally = self._tallies.get(tenant_id)
            if tally is not None:
                tally.own += size

    def erased(self, tenant_id: str) -> None:
        """Some of `tenant_id`'s events were erased through this instance: when the log counts what it
        erases (`erased`), its tally is exact already, and the other instances read it at an add made
        now; else count it in full before refusing it a write."""
        tally = self._tallies.get(tenant_id)
        if tally is None:
            return
        if self._erased is None:
            tally.stale = True
        else:
            self._push(tenant_id, tally)

    async def erasing(self, tenant_id: str) -> None:
        """Before an erasure through this instance: bring the tenant's tally up to date (an add), so
        that the add after it is made on the shared value of just before it (`_read`: a value put in
        between may be a count that read the stream after the deletes). Never raises."""
        tally = self._tallies.get(tenant_id)
        if self._erased is None or tally is None or tally.synced_at is None:
            return
        with contextlib.suppress(ConvmemError):
            await self._run(tenant_id, tally, full=False)

    def erased_everywhere(
        self, may_be_of: Callable[[str], bool] | None = None, *, tallied: bool = False
    ) -> None:
        """An erasure of a tenant unnamed (a notice names it only as a digest), for every tenant it
        `may_be_of` (None: every tenant): `tallied` (its eraser took its bytes off the shared tally,
        `ErasureNotice.tallied`) and the tallies here are shared: read the shared tally before
        refusing a write (and add what this log erased of it now); else count it in full first."""
        shares = getattr(self._shared, "shares", False)
        for tenant_id, tally in self._tallies.items():
            if may_be_of is None or may_be_of(tenant_id):
                if not (tallied and shares):
                    tally.stale = True
                    continue
                tally.reread = True
                if self._erased is not None and self._erased(tenant_id) != tally.erased_mark:
                    self._push(tenant_id, tally)

    def takes_erasures_of(self, tenant_id: str) -> bool:
        """Whether what the log erases of `tenant_id` from now on is taken off its shared tally (by
        this instance's adds): the log counts it, the tenant is tallied here and the tally is shared.
        Any thread (the log's notices ask it)."""
        return (
            self._erased is not None
            and tenant_id in self._tallies
            and bool(getattr(self._shared, "shares", False))
        )

    async def close(self) -> None:
        """Wait for the adds and counts in the background (on stop): what this instance wrote is
        added to the shared tallies before it goes."""
        for future in list(self._background):
            with contextlib.suppress(Exception):
                await future
        for tenant_id, tally in list(self._tallies.items()):
            if tally.synced_at is not None and self._own(tenant_id, tally) != 0:
                with contextlib.suppress(Exception):
                    await self._run(tenant_id, tally, full=False)

    def _tally(self, tenant_id: str) -> _Tally:
        tally = self._tallies.get(tenant_id)
        if tally is None:
            mark = self._appended(tenant_id) if self._appended is not None else 0
            erased_mark = self._erased(tenant_id) if self._erased is not None else 0
            tally = self._tallies[tenant_id] = _Tally(mark, erased_mark)
        return tally

    def _own(self, tenant_id: str, tally: _Tally) -> int:
        """What this instance wrote for the tenant since it last added to the shared tally, less what
        its log erased of the tenant since (negative when it erased more)."""
        wrote, erased = self._parts(tenant_id, tally)
        return wrote - erased

    def _parts(self, tenant_id: str, tally: _Tally) -> tuple[int, int]:
        """(bytes written, bytes erased) through this instance's log since its last add."""
        if self._appended is None:
            return tally.own, 0
        erased = self._erased(tenant_id) - tally.erased_mark if self._erased is not None else 0
        return self._appended(tenant_id) - tally.mark, erased

    def _total(self, tenant_id: str, tally: _Tally) -> int:
        return (tally.shared or 0) + self._own(tenant_id, tally)

    def _took(self, tenant_id: str, tally: _Tally, own: int, erased: int = 0) -> None:
        """`own` bytes of this instance's writes, and `erased` of its erasures, are in the shared
        tally now."""
        if self._appended is None:
            tally.own = max(0, tally.own - own)
        else:
            tally.mark += own
            tally.erased_mark += erased

    async def _cleared_by_bound(self, tenant_id: str, tally: _Tally, allowed: int) -> bool:
        """Before a tenant's first count: whether the log's bytes in all (asked once), plus what this
        instance wrote for the tenant since, stay below `allowed` (False when no bound is known)."""
        if self._bound is None:
            return False
        if tally.bound is None:
            try:
                tally.bound = await self._bound()
            except ConvmemError as exc:
                _log.warning("convmem service: the log's bytes in all not known, counting first: %s", exc)
                return False
        return tally.bound + self._own(tenant_id, tally) < allowed

    def _later(self, tenant_id: str, tally: _Tally, *, full: bool = False) -> None:
        if tally.busy is not None:
            return
        self._keep(asyncio.ensure_future(self._run(tenant_id, tally, full=full)))

    def _keep(self, future: asyncio.Future[None]) -> None:
        self._background.add(future)
        future.add_done_callback(self._done_later)

    def _push(self, tenant_id: str, tally: _Tally) -> None:
        """Add to the shared tally now (after the add or count under way, which may predate what is to
        be added): an erasure's bytes reach the other instances at once. Not before the shared tally
        was first read here (that read would take back what this add moves into it)."""
        if tally.synced_at is None:
            return

        async def push() -> None:
            while tally.busy is not None:
                await asyncio.shield(tally.busy)
            await self._run(tenant_id, tally, full=False)
            if tally.dropped:  # its bytes could not be taken off for sure: counted now instead
                tally.dropped = False
                await self._run(tenant_id, tally, full=True)

        self._keep(asyncio.ensure_future(push()))

    def _done_later(self, future: asyncio.Future[None]) -> None:
        self._background.discard(future)
        if not future.cancelled() and future.exception() is not None:
            _log.warning(
                "convmem service: bringing a tenant's byte tally up to date failed: %s", future.exception()
            )

    async def _read_first(self, tenant_id: str, tally: _Tally) -> None:
        """The shared tally, at the tenant's first write through this instance."""
        started = self._clock()
        try:
            known = await self._read(tenant_id, tally)
        except LogUnavailable as exc:  # as if none were recorded: admitted on the log's bytes, or counted
            _log.warning("convmem service: the shared byte tally of tenant %r not read: %s", tenant_id, exc)
            return
        if known:
            tally.synced_at = started

    async def _run(self, tenant_id: str, tally: _Tally, *, full: bool, any_full: bool = False) -> None:
        """Bring the tally up to date (`full`: count every event again), one add or count at a time.

        A caller that finds one running waits for it and takes it when it is enough: any add or count
        for an add; for a full count, a full count that began at most `recount_every` seconds before
        this caller asked (`any_full`: any full count), with no erasure since it began. Judged from
        when the caller asked, never
        from when the count ended: a count longer than `recount_every` (a large tenant on a busy
        machine) must not make every waiter count again, one after the other (each request waiting
        on all the counts before it: the ``cores`` bench's 60 s stall, issue 28).
        """
        asked = self._clock()
        while tally.busy is not None:  # another runs: wait for it, then see if it did enough
            await asyncio.shield(tally.busy)
            if (not full and not tally.reread) or (
                tally.full_at is not None
                and (any_full or tally.full_at >= asked - self._every)
                and not tally.stale
            ):
                return
        tally.busy = asyncio.ensure_future(self._work(tenant_id, tally, full=full))
        await asyncio.shield(tally.busy)

    async def _work(self, tenant_id: str, tally: _Tally, *, full: bool) -> None:
        try:
            await (self._full(tenant_id, tally) if full else self._add(tenant_id, tally))
        finally:
            tally.busy = None

    async def _add(self, tenant_id: str, tally: _Tally) -> None:
        """Add what this instance wrote since its last add, less what its log erased, to the shared
        tally; read the others'."""
        started = self._clock()
        tally.reread = False  # an erasure taken off the shared tally from here on sets it again
        if tally.shared is None:
            if not await self._read(tenant_id, tally):
                return  # none recorded: a full count makes it
            if self._parts(tenant_id, tally) == (0, 0):
                tally.synced_at = started
                return
        for _ in range(_TRIES):
            wrote, erased = self._parts(tenant_id, tally)
            if wrote == erased == 0:  # nothing to add: read what the others added
                await self._read(tenant_id, tally)
                tally.synced_at = started
                return
            assert tally.shared is not None
            value = max(0, tally.shared + wrote - erased)
            revision = await self._put(tenant_id, value, tally.revision)
            if revision is not None:
                tally.shared, tally.revision = value, revision
                self._took(tenant_id, tally, wrote, erased)
                tally.synced_at = started
                return
            if not await self._read(tenant_id, tally):  # changed by another instance: again on its value
                tally.synced_at = tally.first = tally.bound = None
                tally.shared = None
                return  # removed (an operator's purge): a full count makes it again
        raise LogUnavailable(f"the byte tally of tenant {tenant_id!r} changed {_TRIES} times under this add")

    async def _full(self, tenant_id: str, tally: _Tally) -> None:
        """Count every event of the tenant and make that the shared tally, plus what other instances
        added while the count ran (which it may have counted too: on the safe side)."""
        started = self._clock()
        tally.stale = tally.reread = False  # an erasure from here on sets them again
        tally.full_at = started
        try:
            before = await self._shared.get(tenant_id)
            own, _ = self._parts(tenant_id, tally)  # sent before the count: the count reads them
            counted, _ = await self._counter(tenant_id, 0)
        except ConvmemError:
            tally.stale = True
            raise
        # Erased (or being erased: each is counted before its delete is sent) before the count ended:
        # the count read them or not (on the safe side); those after are taken off the count.
        erased_mark = self._erased(tenant_id) if self._erased is not None else tally.erased_mark
        took = self._clock() - started
        if took >= self._every:  # writes that cannot be admitted on the tally wait this long
            _log.warning(
                "convmem service: counting the stored bytes of tenant %r took %.1fs", tenant_id, took
            )
        for _ in range(_TRIES):
            now = await self._shared.get(tenant_id)
            if now is None:
                value = counted
            elif before is None:  # another instance's first count ran beside this one
                value = max(counted, now[0])
            else:
                value = counted + max(0, now[0] - before[0])
            revision = await self._put(tenant_id, value, now[1] if now is not None else 0)
            if revision is not None:
                tally.shared, tally.revision = value, revision
                self._took(tenant_id, tally, own)
                tally.erased_mark = erased_mark
                others = max(0, now[0] - before[0]) if now is not None and before is not None else 0
                tally.doubt = max(0, self._parts(tenant_id, tally)[0]) + others  # written while it ran
                tally.synced_at = started
                return
        raise LogUnavailable(
            f"the byte tally of tenant {tenant_id!r} changed {_TRIES} times under this count"
        )

    async def _read(self, tenant_id: str, tally: _Tally) -> bool:
        """The shared tally as it is now (False, nothing changed, when none is recorded).

        A value another instance put while this log had erased bytes not yet taken off may be a full
        count that read the stream after those deletes: taking them off it again would count them
        twice on the unsafe side, so they are left in it (on the safe side) and the tenant is counted
        in full before a refusal."""
        held = await self._shared.get(tenant_id)
        if held is None:
            return False
        if held[1] != tally.revision and self._erased is not None:
            erased = self._erased(tenant_id)  # after the read: any delete it may reflect is counted
            if erased != tally.erased_mark:
                tally.erased_mark = erased
                tally.stale = tally.dropped = True
        tally.shared, tally.revision = held
        return True

    async def _put(self, tenant_id: str, value: int, revision: int) -> int | None:
        return await self._shared.put(tenant_id, value, revision)
