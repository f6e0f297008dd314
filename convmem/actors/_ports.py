"""The ports: small Protocols that adapters implement and the runtime alone uses.

Every port is synchronous and thread-safe: session actors are threads and
call them directly; an adapter built on asyncio (the JetStream log) runs its
own loop thread and waits on it with a timeout. Each port has an in-memory
implementation in `convmem.adapters` and one contract suite in the tests that
every implementation passes. The optional capability `LoopEventLog` is what a
log built on an event loop adds for speed; `Settle` is the one shape in which
work handed to another thread or loop is answered. `Summarizer`, convmem's one
summarizer protocol, is defined beside the requests it answers
(`convmem.projections.SummaryRequest`) and is a port here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar, runtime_checkable

import msgspec

from convmem.events import Event, MemoryKey
from convmem.projections import SessionState, Summarizer, encode_state, state_hash

__all__ = [
    "Clock",
    "EventLog",
    "LoggedEvent",
    "LoopEventLog",
    "Settle",
    "Snapshot",
    "SnapshotStore",
    "Summarizer",
    "Timer",
]

T_contra = TypeVar("T_contra", contravariant=True)


class LoggedEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One stored event as the log returns it, still encoded.

    `position` is the log-wide order (a JetStream stream sequence); `seq` is
    the event's session sequence as the log recorded it beside the bytes
    (None when the bytes were not written by convmem). Decoding is left to
    the reader, so a poison message is reported with its position instead of
    breaking the read.

    `intact` says the record carried the checksum its writer stored with it
    and that it matched (the bytes are as written); `damage` says why a
    record failed its check (the checksum did not match, or the store holds
    messages it cannot read back: then `position` is 0 and `seq` the one the
    first of them would have; such a record takes no place in the sequence). A
    record without a checksum (written before convmem checksummed them, or not by
    convmem) is neither.
    """

    key: MemoryKey
    seq: int | None
    position: int
    data: bytes
    event_id: str | None = None
    intact: bool = False
    damage: str | None = None


class EventLog(Protocol):
    """An append-only log of session events with optimistic concurrency."""

    def append(self, key: MemoryKey, events: Sequence[Event], *, expected_seq: int) -> int:
        """Store `events` after the session's event `expected_seq` (0: none yet).

        The events' own `seq` must run `expected_seq + 1, expected_seq + 2, ...`.
        An event whose `event_id` is already stored for this key is not stored
        again (a retried append is exactly-once). Returns the session's last
        seq after the append. Raises `ConcurrencyConflict` when the session's
        last seq is not `expected_seq`, `LogUnavailable` when the log cannot
        answer in time.
        """
        ...

    def read(self, key: MemoryKey, *, after_seq: int = 0) -> list[LoggedEvent]:
        """The session's events with seq above `after_seq`, in order."""
        ...

    def last_seq(self, key: MemoryKey) -> int:
        """The seq of the session's last stored event (0 when it has none)."""
        ...

    def read_all(
        self,
        *,
        tenant_id: str | None = None,
        user_id: str | None = None,
        until_position: int | None = None,
    ) -> Iterator[LoggedEvent]:
        """Every stored event (of a tenant, of a user) in log order, for audit.

        Stops after `until_position` when given. `user_id` needs `tenant_id`.
        """
        ...

    def keys(self, *, tenant_id: str | None = None, user_id: str | None = None) -> list[MemoryKey]:
        """The keys that have events (of a tenant, of a user)."""
        ...

    def erase(self, key: MemoryKey, *, at: float) -> int:
        """Remove a session's events from the store; returns the events removed.

        Nothing of the session stays, no tombstone either: the session reads
        as never written, and a stale writer expecting an old last seq
        conflicts instead of writing the erased history back. While the
        erasure runs, readers may see a `SessionErased` above the events (a
        fence that stops writers), never a part of the history. A log that is
        an `ErasureWatch` tells every watcher once it is done.
        """
        ...

    def erase_user(self, tenant_id: str, user_id: str, *, at: float) -> int:
        """`erase` every session of one user; returns the events removed."""
        ...

    def drop_before(self, key: MemoryKey, *, seq: int) -> int:
        """Remove the session's stored messages before the event at `seq` that opens its history.

        That event is retention's `HistoryCompacted` (it carries what the fold
        needs, so the history then begins with it and replays to the same
        state) or a `SessionErased` fence (what came before it is no longer
        the session's). Their bytes are erased as `erase` erases them.
        Returns how many messages were removed (0 when none is left: it may
        be run again). `InvalidInput` when the session has no such event at
        `seq`: nothing else may open a history.
        """
        ...

    def close(self) -> None:
        """Release connections; further calls raise `SessionClosed`."""
        ...


class Settle(Protocol[T_contra]):
    """Something settled once, with a result or an error: how work handed elsewhere tells its outcome.

    The one shape for every hand-off of the runtime: a
    `concurrent.futures.Future` is one; so is a session's append under way
    (its log settles it with the append's outcome), an asyncio caller's answer
    (settled on any thread, read on the caller's loop), and what an event
    loop thread settles for work posted to it. Queued work asks
    `set_running_or_notify_cancel()` before it starts (False: it was
    cancelled, skip it); `cancel()` settles work that will never start.
    Settling twice is the settler's error; `done()` tells whether it was.
    """

    def set_running_or_notify_cancel(self) -> bool: ...

    def done(self) -> bool: ...

    def cancel(self) -> bool: ...

    def set_result(self, result: T_contra, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


@runtime_checkable
class LoopEventLog(Protocol):
    """An `EventLog` whose appends run on an event loop of its own, begun without waiting.

    Optional: when the log has it, a session begins its append, lets go of the
    thread that decided it, and is settled from the loop (see
    `convmem.actors._session`): no thread waits for the network, and an asyncio
    caller's write needs no thread at all.

    - `start_append(key, events, *, expected_seq, settle)` checks and encodes
      the events on the calling thread (raising, before anything is sent,
      what `append` raises for bad input or a closed log), starts the append
      on the loop, from any thread (the loop's own included), and returns.
      `settle` is settled exactly once: with the session's last seq, or with
      the error `append` would raise (`LogUnavailable` when no
      acknowledgement came within the log's timeout, `SessionClosed` when the
      log closed first). It must be quick: it may run on the loop.
    - `on_loop_thread()` tells whether the caller is the loop's thread:
      blocking calls made there are refused, as they would deadlock.
    """

    def start_append(
        self,
        key: MemoryKey,
        events: Sequence[Event],
        *,
        expected_seq: int,
        settle: Settle[int],
    ) -> None: ...

    def on_loop_thread(self) -> bool:
        """Whether the caller is the loop's own thread (where a blocking call would deadlock)."""
        ...


class Snapshot(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An encoded session state covering the session's events up to `seq`.

    `event_id` is the id of the event at `seq` (empty in snapshots saved
    before it was recorded): a snapshot is used only while the log still
    holds that very event, so one saved by a stale process after an erasure
    never stands in for a new session that reached the same seq.

    `position` is that event's log-wide position (`LoggedEvent.position`; 0 in
    snapshots saved before it was recorded, or when the saver could not read
    it): when the log no longer holds the session, an erasure's receipt is
    weighed against it by position (`erasure_after`), not by the event's time.
    Fields at their default are left out of the stored bytes (a snapshot of
    unknown position is stored as one saved before positions were recorded).
    """

    key: MemoryKey
    seq: int
    state_hash: str
    data: bytes
    event_id: str = ""
    position: int = 0


def snapshot_of(key: MemoryKey, state: SessionState, event_id: str, *, position: int = 0) -> Snapshot:
    """`state` as the snapshot of `key` at the state's version (`event_id`: the event there, at log
    `position` when known)."""
    return Snapshot(
        key=key,
        seq=state.version,
        state_hash=state_hash(state),
        data=encode_state(state),
        event_id=event_id,
        position=position,
    )


def position_of(log: EventLog, key: MemoryKey, seq: int, event_id: str) -> int:
    """The log position of `key`'s event at `seq` (the one of `event_id`), or 0 when the log does not
    hold it readable: what the log keeps of the session's last append when it can say
    (`known_position`: a snapshot follows the write it covers, so no request), else one read of the
    session's tail."""
    known = getattr(log, "known_position", None)
    if known is not None:
        position = known(key, seq, event_id)
        if position:
            return int(position)
    for record in log.read(key, after_seq=seq - 1):
        same = not event_id or record.event_id in (None, event_id)
        if record.seq == seq and record.damage is None and same:
            return record.position
    return 0


class SnapshotStore(Protocol):
    """Latest snapshot per session; losing one only costs a longer replay."""

    def load(self, key: MemoryKey) -> Snapshot | None:
        """The session's latest snapshot, or None (also when it cannot be read)."""
        ...

    def save(self, snapshot: Snapshot) -> None:
        """Store `snapshot` unless a newer one (higher seq) is already stored."""
        ...

    def delete(self, key: MemoryKey) -> None:
        """Forget the session's snapshot, every stored part of it included (even a crashed save's)."""
        ...

    def keys(self, *, tenant_id: str | None = None, user_id: str | None = None) -> list[MemoryKey]:
        """The keys that hold a snapshot or any part of one (of a tenant, of a user), in key order.

        An erasure lists sessions from here as well as from the log: a snapshot
        whose events are gone must not be invisible to it. `user_id` needs `tenant_id`.
        """
        ...

    def close(self) -> None:
        """Release connections."""
        ...


class Timer(Protocol):
    """A scheduled callback that can be cancelled."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Time and timers. The system clock in production, a manual one in tests."""

    def now(self) -> float:
        """Epoch seconds."""
        ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Run `callback` (quick, non-blocking) once `now() >= when`."""
        ...
