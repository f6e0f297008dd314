"""The `EventLog` contract: the promises every event log keeps, as a suite a new back end runs.

A back end's tests subclass `EventLogContract` and give an ``open_log``
fixture: a factory of handles on one fresh log (the same object for an
in-process log, a second connection, another process in effect, for a
networked one), each handle closed in the fixture's teardown::

    class TestMyLog(EventLogContract):
        @pytest.fixture
        def open_log(self) -> Iterator[OpenLog]:
            handles: list[EventLog] = []
            shared = MyLog()
            def open_one() -> EventLog:
                handles.append(shared)
                return shared
            yield open_one
            for handle in handles:
                handle.close()

This module needs pytest (the ``testing`` extra); ``import convmem`` never loads it.
"""

from __future__ import annotations

import itertools
import queue
import threading
import uuid
from collections.abc import Callable

import pytest

from convmem.actors import ErasureNotice, ErasureWatch, EventLog
from convmem.errors import ConcurrencyConflict, InvalidInput, SessionClosed
from convmem.events import (
    Event,
    HistoryCompacted,
    MemoryKey,
    SessionCleared,
    SessionErased,
    ShortTermMemoryConfig,
    decode_event,
)

__all__ = ["KEY", "EventLogContract", "OpenLog", "events", "seqs"]

OpenLog = Callable[[], EventLog]
"""A factory of handles on one log (the fixture ``open_log`` a back end's test class gives)."""

_ids = itertools.count()


def events(first: int, count: int = 1, *, tag: str = "") -> list[Event]:
    """`count` events with seqs from `first`, each with an id never used before."""
    return [
        SessionCleared(
            seq=seq, event_id=f"{tag}{next(_ids)}-{uuid.uuid4().hex}", at=float(seq), cleared_through=0
        )
        for seq in range(first, first + count)
    ]


KEY = MemoryKey("acme", "alice", "s1")


def seqs(log: EventLog, key: MemoryKey = KEY, after: int = 0) -> list[int | None]:
    return [r.seq for r in log.read(key, after_seq=after)]


TENANTS = [MemoryKey(t, u, s) for t in ("t1", "t2") for u in ("u1", "u2") for s in ("s1", "s2")]


def fill(log: EventLog, keys: list[MemoryKey], rounds: int = 2) -> list[tuple[MemoryKey, int]]:
    """Interleave appends over `keys`; returns (key, seq) in the order they were stored."""
    order = []
    for seq in range(1, rounds + 1):
        for key in keys:
            log.append(key, events(seq), expected_seq=seq - 1)
            order.append((key, seq))
    return order


def compacted(seq: int) -> HistoryCompacted:
    """A retention compaction of KEY at `seq` (it carries the state; here an empty one)."""
    return HistoryCompacted(
        seq=seq,
        event_id=f"retention/{uuid.uuid4().hex}",
        at=float(seq),
        key=KEY,
        config=ShortTermMemoryConfig(),
    )


HOSTILE = [
    MemoryKey("a.b", "c", "d"),
    MemoryKey("a", "b.c", "d"),
    MemoryKey("a", "b", "c.d"),
    MemoryKey("a:b", "c", "d"),
    MemoryKey("a", "b:c", "d"),
    MemoryKey("a", "*", "d"),
    MemoryKey("a", ">", "d"),
    MemoryKey("*", "b", "d"),
    MemoryKey(">", "b", "d"),
    MemoryKey("a", "b", "*"),
    MemoryKey("a", "b", ">"),
    MemoryKey("a b", "c", "d"),
    MemoryKey("a", "b c", "d"),
    MemoryKey("=41", "b", "d"),
    MemoryKey("A", "b", "d"),
    MemoryKey("a", "b", "d"),
    MemoryKey("ü", "b", "d"),
    MemoryKey("u", "b", "d"),
    MemoryKey("用户", "🙂", "d"),
    MemoryKey("alice@example.com", "first.last+tag@sub.example.org", "s-1"),
    MemoryKey("\\", ":", "a\\:b"),
    MemoryKey("a" * 256, "b", "d"),
]


def run_threads(count: int, work: Callable[[int], None]) -> None:
    """Run `work(i)` on `count` threads released together; re-raise the first failure."""
    barrier = threading.Barrier(count)
    failures: list[BaseException] = []

    def body(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            work(index)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a writer thread hung"
    if failures:
        raise failures[0]


class EventLogContract:
    """Every promise of `EventLog`, one test each; subclass it with an ``open_log`` fixture."""

    @pytest.fixture
    def log(self, open_log: OpenLog) -> EventLog:
        """One handle on the fresh log."""
        return open_log()

    def test_a_new_session_has_no_events(self, log: EventLog) -> None:
        """A key never written reads as empty with last seq 0."""
        assert log.read(KEY) == []
        assert log.last_seq(KEY) == 0
        assert log.keys() == []

    def test_appended_events_read_back_in_order(self, log: EventLog) -> None:
        """Events come back in order with their seq, id, bytes and rising positions."""
        first, more = events(1), events(2, 3)
        assert log.append(KEY, first, expected_seq=0) == 1
        assert log.append(KEY, more, expected_seq=1) == 4
        records = log.read(KEY)
        assert [r.seq for r in records] == [1, 2, 3, 4]
        assert [r.event_id for r in records] == [e.event_id for e in first + more]
        assert [decode_event(r.data) for r in records] == first + more
        assert all(r.key == KEY for r in records)
        positions = [r.position for r in records]
        assert positions == sorted(set(positions))
        assert log.last_seq(KEY) == 4

    def test_an_empty_append_returns_the_last_seq(self, log: EventLog) -> None:
        """Appending nothing stores nothing and reports where the session is."""
        log.append(KEY, events(1, 2), expected_seq=0)
        assert log.append(KEY, [], expected_seq=2) == 2
        assert seqs(log) == [1, 2]

    @pytest.mark.parametrize("expected", [0, 1, 3])
    def test_a_wrong_expected_seq_conflicts_with_the_actual_seq(self, log: EventLog, expected: int) -> None:
        """An append expecting any seq but the last is refused, naming both seqs, and stores nothing."""
        log.append(KEY, events(1, 2), expected_seq=0)
        with pytest.raises(ConcurrencyConflict) as caught:
            log.append(KEY, events(expected + 1), expected_seq=expected)
        assert (caught.value.expected_seq, caught.value.actual_seq) == (expected, 2)
        assert caught.value.key == KEY.composite()
        assert seqs(log) == [1, 2]

    def test_a_retried_append_is_stored_once(self, log: EventLog) -> None:
        """Appending the same event again (a retry after a lost ack) succeeds and stores nothing new."""
        batch = events(1)
        assert log.append(KEY, batch, expected_seq=0) == 1
        assert log.append(KEY, batch, expected_seq=0) == 1
        assert seqs(log) == [1]

    def test_a_retried_batch_is_stored_once(self, log: EventLog) -> None:
        """A retried append of several events stores none of them twice."""
        log.append(KEY, events(1), expected_seq=0)
        batch = events(2, 3)
        assert log.append(KEY, batch, expected_seq=1) == 4
        assert log.append(KEY, batch, expected_seq=1) == 4
        assert seqs(log) == [1, 2, 3, 4]

    def test_a_retry_from_another_handle_is_stored_once(self, open_log: OpenLog) -> None:
        """A retry through another connection (another process) is still exactly-once."""
        first, second = open_log(), open_log()
        batch = events(1, 2)
        first.append(KEY, batch, expected_seq=0)
        assert second.append(KEY, batch, expected_seq=0) == 2
        assert seqs(first) == [1, 2]

    def test_a_retry_that_extends_a_stored_prefix_stores_only_the_rest(self, log: EventLog) -> None:
        """Retrying with more events than were stored appends just the new ones."""
        batch = events(1, 3)
        log.append(KEY, batch[:2], expected_seq=0)
        assert log.append(KEY, batch, expected_seq=0) == 3
        assert [r.event_id for r in log.read(KEY)] == [e.event_id for e in batch]

    def test_a_retry_after_other_writers_moved_on_stores_nothing(self, log: EventLog) -> None:
        """A late retry of stored events reports the session's last seq and writes nothing."""
        mine = events(1)
        log.append(KEY, mine, expected_seq=0)
        log.append(KEY, events(2, 2), expected_seq=1)
        assert log.append(KEY, mine, expected_seq=0) == 3
        assert seqs(log) == [1, 2, 3]

    @pytest.mark.parametrize("bad_seqs", [[2], [1, 3], [1, 1], [1, 2, 4]])
    def test_seqs_must_run_on_from_the_expected_seq(self, log: EventLog, bad_seqs: list[int]) -> None:
        """Events whose seqs do not run expected+1, expected+2, ... are refused whole."""
        bad = [
            SessionCleared(seq=s, event_id=f"bad-{uuid.uuid4().hex}", at=1.0, cleared_through=0)
            for s in bad_seqs
        ]
        with pytest.raises(InvalidInput):
            log.append(KEY, bad, expected_seq=0)
        assert log.read(KEY) == []

    def test_read_after_seq_returns_only_later_events(self, log: EventLog) -> None:
        """read(after_seq=n) is the session's tail after event n."""
        log.append(KEY, events(1, 5), expected_seq=0)
        assert seqs(log, after=3) == [4, 5]
        assert seqs(log, after=5) == []
        assert seqs(log, after=0) == [1, 2, 3, 4, 5]

    def test_read_all_returns_every_event_in_log_order(self, log: EventLog) -> None:
        """read_all interleaves sessions in the order the log stored them, positions rising."""
        order = fill(log, TENANTS)
        records = list(log.read_all())
        assert [(r.key, r.seq) for r in records] == order
        assert [r.position for r in records] == sorted(r.position for r in records)

    def test_read_all_filters_by_tenant_and_by_user(self, log: EventLog) -> None:
        """read_all(tenant) and read_all(tenant, user) keep only those sessions, in log order."""
        order = fill(log, TENANTS)
        tenant = [(k, s) for k, s in order if k.tenant_id == "t2"]
        user = [(k, s) for k, s in order if (k.tenant_id, k.user_id) == ("t1", "u2")]
        assert [(r.key, r.seq) for r in log.read_all(tenant_id="t2")] == tenant
        assert [(r.key, r.seq) for r in log.read_all(tenant_id="t1", user_id="u2")] == user

    def test_read_all_stops_at_until_position(self, log: EventLog) -> None:
        """read_all(until_position=p) ends with the event at position p."""
        fill(log, TENANTS)
        every = list(log.read_all())
        cut = every[5].position
        assert list(log.read_all(until_position=cut)) == every[:6]
        assert [r.position for r in log.read_all(tenant_id="t1", until_position=cut)] == [
            r.position for r in every[:6] if r.key.tenant_id == "t1"
        ]
        assert list(log.read_all(until_position=0)) == []

    def test_read_all_ends_where_the_log_ended_when_iteration_began(self, log: EventLog) -> None:
        """Events appended while an audit reads are not part of that read."""
        fill(log, TENANTS[:2])
        reading = log.read_all()
        first = next(reading)
        log.append(TENANTS[0], events(3), expected_seq=2)
        assert len([first, *reading]) == 4

    def test_read_all_of_a_user_needs_the_tenant(self, log: EventLog) -> None:
        """A user id alone does not name a user: read_all refuses it."""
        with pytest.raises(InvalidInput):
            list(log.read_all(user_id="u1"))

    def test_keys_lists_the_sessions_that_have_events(self, log: EventLog) -> None:
        """keys() lists written sessions, filtered by tenant, by user, or both."""
        fill(log, TENANTS, rounds=1)
        assert set(log.keys()) == set(TENANTS)
        assert set(log.keys(tenant_id="t1")) == {k for k in TENANTS if k.tenant_id == "t1"}
        assert set(log.keys(tenant_id="t2", user_id="u1")) == {MemoryKey("t2", "u1", s) for s in ("s1", "s2")}
        assert set(log.keys(user_id="u2")) == {k for k in TENANTS if k.user_id == "u2"}
        assert log.keys(tenant_id="nobody") == []
        assert log.keys(tenant_id="") == []
        assert list(log.read_all(tenant_id="")) == []

    def test_erase_removes_a_session_and_leaves_nothing(self, log: EventLog) -> None:
        """erase() removes every event and counts them; no tombstone stays: the key reads as never written."""
        log.append(KEY, events(1, 3), expected_seq=0)
        other = MemoryKey("acme", "alice", "s2")
        log.append(other, events(1), expected_seq=0)
        assert log.erase(KEY, at=99.0) == 3
        assert log.read(KEY) == []
        assert log.last_seq(KEY) == 0
        assert seqs(log, other) == [1]
        assert [r.key for r in log.read_all()] == [other]
        assert log.keys() == [other]

    def test_a_stale_writer_cannot_write_erased_history_back(self, open_log: OpenLog) -> None:
        """After erase, a writer expecting the old last seq conflicts; the session may only start afresh."""
        writer, eraser = open_log(), open_log()
        writer.append(KEY, events(1, 2), expected_seq=0)
        eraser.erase(KEY, at=5.0)
        with pytest.raises(ConcurrencyConflict) as caught:
            writer.append(KEY, events(3), expected_seq=2)
        assert caught.value.actual_seq == 0
        assert writer.append(KEY, events(1), expected_seq=0) == 1
        assert seqs(eraser) == [1]

    def test_a_session_begun_again_over_the_fence_keeps_its_events(self, log: EventLog) -> None:
        """A writer that saw the erasure's fence and began anew above it keeps its history after erase."""
        log.append(KEY, events(1, 2), expected_seq=0)
        log.append(KEY, [SessionErased(seq=3, event_id=f"erased/{uuid.uuid4().hex}", at=1.0)], expected_seq=2)
        log.append(KEY, events(4, 2), expected_seq=3)
        assert log.erase(KEY, at=2.0) == 4  # the old fence is not counted as an event
        assert log.read(KEY) == []

    def test_erasing_again_erases_what_came_after(self, log: EventLog) -> None:
        """A second erase of an emptied session counts nothing; a new session is erased in turn."""
        log.append(KEY, events(1, 2), expected_seq=0)
        assert log.erase(KEY, at=1.0) == 2
        assert log.erase(KEY, at=2.0) == 0
        log.append(KEY, events(1, 2), expected_seq=0)
        assert log.erase(KEY, at=3.0) == 2
        assert seqs(log) == []

    def test_erasing_an_unknown_session_does_nothing(self, log: EventLog) -> None:
        """erase() of a session without events removes nothing and leaves nothing."""
        assert log.erase(KEY, at=1.0) == 0
        assert log.read(KEY) == []
        assert log.last_seq(KEY) == 0

    def test_drop_before_removes_what_a_compaction_replaced(self, open_log: OpenLog) -> None:
        """drop_before() removes the session's messages before its compaction, and only those: the history
        then begins with the compaction, the last seq and other sessions stay, writes go on."""
        log, other_handle = open_log(), open_log()
        other = MemoryKey("acme", "alice", "s2")
        log.append(KEY, events(1, 3), expected_seq=0)
        log.append(other, events(1, 2), expected_seq=0)
        log.append(KEY, [compacted(4)], expected_seq=3)
        log.append(KEY, events(5), expected_seq=4)
        assert other_handle.drop_before(KEY, seq=4) == 3
        assert seqs(log) == [4, 5]
        assert isinstance(decode_event(log.read(KEY)[0].data), HistoryCompacted)
        assert log.last_seq(KEY) == other_handle.last_seq(KEY) == 5
        assert seqs(log, other) == [1, 2]
        assert [r.seq for r in log.read_all() if r.key == KEY] == [4, 5]
        assert log.append(KEY, events(6), expected_seq=5) == 6
        assert seqs(log, after=4) == [5, 6]
        assert log.drop_before(KEY, seq=4) == 0  # again: nothing left to drop

    def test_drop_before_an_erasure_fence_keeps_a_session_begun_again_over_it(self, log: EventLog) -> None:
        """What came before a fence is not the session's: dropping it keeps the fence and what followed."""
        log.append(KEY, events(1, 2), expected_seq=0)
        log.append(KEY, [SessionErased(seq=3, event_id=f"erased/{uuid.uuid4().hex}", at=1.0)], expected_seq=2)
        log.append(KEY, events(4, 2), expected_seq=3)
        assert log.drop_before(KEY, seq=3) == 2
        assert seqs(log) == [3, 4, 5]
        assert log.last_seq(KEY) == 5

    def test_drop_before_refuses_anything_but_a_compaction(self, log: EventLog) -> None:
        """Only a stored compaction or fence may open a history: another seq is refused, nothing removed."""
        log.append(KEY, events(1, 3), expected_seq=0)
        for seq in (2, 3, 9):
            with pytest.raises(InvalidInput, match="no stored compaction or erasure fence"):
                log.drop_before(KEY, seq=seq)
        assert seqs(log) == [1, 2, 3]

    def test_erase_user_erases_every_session_of_that_user_only(self, log: EventLog) -> None:
        """erase_user() erases each of one user's sessions and nobody else's."""
        fill(log, TENANTS)
        assert log.erase_user("t1", "u2", at=7.0) == 4
        for key in TENANTS:
            erased = (key.tenant_id, key.user_id) == ("t1", "u2")
            assert seqs(log, key) == ([] if erased else [1, 2])
        assert len(list(log.read_all())) == 2 * len(TENANTS) - 4

    def test_every_watcher_is_told_of_an_erasure_by_digest(self, open_log: OpenLog) -> None:
        """erase/erase_user tell every watcher of the log, by a notice matching only the erased keys."""
        writer, eraser = open_log(), open_log()
        assert isinstance(writer, ErasureWatch)
        seen: queue.Queue[ErasureNotice | None] = queue.Queue()
        unwatch = writer.watch_erasures(seen.put)
        try:
            fill(writer, TENANTS)
            eraser.erase(TENANTS[0], at=1.0)
            notice = seen.get(timeout=10)
            assert notice is not None
            assert [k for k in TENANTS if notice.matches(k)] == [TENANTS[0]]
            assert TENANTS[0].user_id.encode() not in notice.encode()
            eraser.erase_user("t1", "u2", at=2.0)
            notice = seen.get(timeout=10)
            assert notice is not None
            assert {k for k in TENANTS if notice.matches(k)} == {
                k for k in TENANTS if (k.tenant_id, k.user_id) == ("t1", "u2")
            }
            assert eraser.erase(TENANTS[0], at=3.0) == 0  # nothing there: no notice
            eraser.erase(TENANTS[-1], at=4.0)
            notice = seen.get(timeout=10)
            assert notice is not None
            assert notice.matches(TENANTS[-1])
        finally:
            unwatch()

    def test_ids_that_differ_only_in_punctuation_never_share_a_session(self, log: EventLog) -> None:
        """Dots, wildcards, colons, spaces, escapes and unicode in ids never address another key."""
        written = {key: events(1, tag="h") for key in HOSTILE}
        for key, batch in written.items():
            log.append(key, batch, expected_seq=0)
        for key, batch in written.items():
            assert [r.event_id for r in log.read(key)] == [batch[0].event_id]
            assert [r.key for r in log.read(key)] == [key]
        assert set(log.keys()) == set(HOSTILE)
        for tenant in ("a", "*", ">", "a.b"):
            assert {r.key for r in log.read_all(tenant_id=tenant)} == {
                k for k in HOSTILE if k.tenant_id == tenant
            }
            assert set(log.keys(tenant_id=tenant)) == {k for k in HOSTILE if k.tenant_id == tenant}
        assert {r.key for r in log.read_all(tenant_id="a", user_id="*")} == {MemoryKey("a", "*", "d")}
        assert log.erase_user("a", "b", at=1.0) == 4
        assert all(seqs(log, k) == [1] for k in HOSTILE if (k.tenant_id, k.user_id) != ("a", "b"))

    def test_a_closed_log_raises_session_closed(self, log: EventLog) -> None:
        """After close() every call raises SessionClosed; closing again is harmless."""
        log.append(KEY, events(1), expected_seq=0)
        log.close()
        log.close()
        calls: list[Callable[[], object]] = [
            lambda: log.append(KEY, events(2), expected_seq=1),
            lambda: log.read(KEY),
            lambda: log.last_seq(KEY),
            lambda: list(log.read_all()),
            log.keys,
            lambda: log.erase(KEY, at=1.0),
            lambda: log.erase_user("acme", "alice", at=1.0),
        ]
        for call in calls:
            with pytest.raises(SessionClosed):
                call()

    def test_concurrent_appends_of_one_seq_have_exactly_one_winner(self, open_log: OpenLog) -> None:
        """Writers racing for the same next seq: one is stored, every other one conflicts."""
        handles = [open_log(), open_log()]
        for round_ in range(1, 4):
            won: list[int] = []
            lost: list[int] = []

            def race(index: int, seq: int = round_, won: list[int] = won, lost: list[int] = lost) -> None:
                try:
                    handles[index % 2].append(KEY, events(seq), expected_seq=seq - 1)
                    won.append(index)
                except ConcurrencyConflict as conflict:
                    lost.append(conflict.actual_seq)

            run_threads(8, race)
            assert len(won) == 1
            assert lost == [round_] * 7
        assert seqs(handles[0]) == [1, 2, 3]

    def test_concurrent_writers_to_one_session_lose_nothing(self, open_log: OpenLog) -> None:
        """Writers that reload and retry on conflict all get their events in, gapless."""
        handles = [open_log(), open_log()]
        per_writer = 5
        stored: list[str] = []

        def write(index: int) -> None:
            log = handles[index % 2]
            for _ in range(per_writer):
                while True:
                    last = log.last_seq(KEY)
                    [event] = events(last + 1, tag=f"w{index}-")
                    try:
                        log.append(KEY, [event], expected_seq=last)
                    except ConcurrencyConflict:
                        continue
                    stored.append(event.event_id)
                    break

        run_threads(6, write)
        records = handles[0].read(KEY)
        assert [r.seq for r in records] == list(range(1, 6 * per_writer + 1))
        assert sorted(r.event_id or "" for r in records) == sorted(stored)

    def test_concurrent_appends_to_many_sessions_are_all_stored(self, log: EventLog) -> None:
        """Threads writing their own sessions at once all succeed, every session complete and in order."""
        keys = [MemoryKey("many", f"user{i % 4}", f"session{i}") for i in range(32)]

        def write(index: int) -> None:
            for key in keys[index::8]:
                for seq in range(1, 6):
                    log.append(key, events(seq), expected_seq=seq - 1)

        run_threads(8, write)
        assert set(log.keys(tenant_id="many")) == set(keys)
        for key in keys:
            assert seqs(log, key) == [1, 2, 3, 4, 5]
        assert len(list(log.read_all(tenant_id="many"))) == 32 * 5
