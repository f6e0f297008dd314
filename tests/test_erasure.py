"""Erasure: no byte of an erased session stays on disk, and no process keeps serving it."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from store_scan import markers, scan

import convmem
from convmem.actors import MemorySystem, Snapshot
from convmem.adapters import (
    EmbeddedNatsServer,
    InMemoryErasureJournal,
    InMemoryEventLog,
    InMemorySnapshotStore,
    JetStreamBackend,
)
from convmem.events import ConversationTurn, MemoryBudget, MemoryKey, ShortTermMemoryConfig
from convmem.projections import encode_state, state_hash

WAIT = 10.0
EMPTY = {"conversation_memory": {"recent_turns": []}}
CONFIG = ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=3))

# Markers that appear nowhere but in what this test writes, and the ids as they travel in subjects.
ERASED = MemoryKey("acme", "alice.erasure@example.com", "chat-ZQXJ7-erase")
KEPT = MemoryKey("acme", "bob.kept@example.com", "chat-ZQXJ7-kept")
SECRET = "card 4111-1111-ZQXJ7-1111 of alice"
KEPT_TEXT = "bob's note ZQXJ7-KEPT-MARK"


def write(memory: MemorySystem, key: MemoryKey, text: str, turns: int = 6) -> None:
    session = memory.session(key)
    for n in range(turns):
        session.add_turn(ConversationTurn(user_message=f"{text} #{n}", assistant_response=f"noted {text}"))


class Told:
    """A metrics sink that tells a waiting test what its system counted: a fact announced, not polled.

    A system counts ``erasures_seen`` once it has dropped the sessions an erasure made elsewhere.
    """

    def __init__(self) -> None:
        self._counted = threading.Condition()
        self._counts: Counter[str] = Counter()

    def count(self, name: str, n: int) -> None:
        with self._counted:
            self._counts[name] += n
            self._counted.notify_all()

    def observe_append(self, seconds: float) -> None:
        pass

    def watch(self, system: object) -> None:
        pass

    def wait(self, name: str, at_least: int, what: str, timeout: float = WAIT) -> float:
        """Seconds until `at_least` of `name` are counted (failing after `timeout`)."""
        started = time.monotonic()
        with self._counted:
            counted = self._counted.wait_for(lambda: self._counts[name] >= at_least, timeout)
        assert counted, f"not within {timeout}s: {what} ({self._counts[name]} of {at_least} {name})"
        return time.monotonic() - started


@pytest.mark.parametrize("scope", ["session", "user"])
def test_no_byte_of_an_erased_session_stays_in_the_store(tmp_path: Path, scope: str) -> None:
    """Markers written, erased, the server stopped: no file of its store holds them; the kept ones stay."""
    store = tmp_path / "nats"
    with (
        EmbeddedNatsServer(store) as server,
        convmem.connect(server.url, config=CONFIG, snapshot_every=2) as memory,
    ):
        write(memory, ERASED, SECRET)
        write(memory, KEPT, KEPT_TEXT)
        assert memory.snapshots is not None
        assert memory.snapshots.load(ERASED) is not None
        erased = memory.erase(ERASED) if scope == "session" else memory.erase_user("acme", ERASED.user_id)
        assert (erased.sessions, erased.events_purged) == (1, 7)
        assert memory.session(ERASED).get_llm_context() == EMPTY
        assert memory.log.keys(tenant_id="acme") == [KEPT]
    # The server is stopped: its store is on disk as it will stay.
    assert scan(store, markers(ERASED, SECRET)) == {}
    kept = scan(store, markers(KEPT, KEPT_TEXT))
    assert set(kept) == set(markers(KEPT, KEPT_TEXT)), "the scan must see what was not erased"


def test_snapshots_replaced_over_time_leave_no_old_bytes(tmp_path: Path) -> None:
    """A snapshot replaced by a newer one is erased, not just forgotten: its text is gone from the store."""
    store = tmp_path / "nats"
    with EmbeddedNatsServer(store) as server, JetStreamBackend.connect(server.url) as backend:
        key = MemoryKey("acme", "carol", "s")
        # Another key's snapshot first: NATS drops a block's leading deleted bytes by itself.
        other = MemoryKey("acme", "dave", "s")
        backend.snapshots.save(Snapshot(key=other, seq=1, state_hash="h", data=b"x", event_id="e"))
        for n, text in enumerate(["first ZQXJ7-SNAP-OLD", "second ZQXJ7-SNAP-NEW"], start=1):
            backend.snapshots.save(
                Snapshot(key=key, seq=n, state_hash="h", data=text.encode(), event_id=f"e{n}")
            )
    hits = scan(store, [b"ZQXJ7-SNAP-OLD", b"ZQXJ7-SNAP-NEW"])
    assert hits.keys() == {b"ZQXJ7-SNAP-NEW"}


@pytest.fixture
def told() -> Told:
    return Told()


@pytest.fixture
def two_processes(nats_server: EmbeddedNatsServer, told: Told) -> Iterator[tuple[MemorySystem, MemorySystem]]:
    """Two memory systems on one server, each with its own connection (two processes, in effect).

    The holder (the second) counts into `told`."""
    with (
        convmem.connect(nats_server.url, config=CONFIG) as eraser,
        convmem.connect(nats_server.url, config=CONFIG, metrics=told) as holder,
    ):
        yield eraser, holder


def test_another_process_drops_its_live_copy_of_an_erased_session(
    two_processes: tuple[MemorySystem, MemorySystem],
    told: Told,
) -> None:
    """The holder serves the session live; once the eraser's erase returns it drops it within a second."""
    eraser, holder = two_processes
    write(holder, ERASED, SECRET)
    write(holder, KEPT, KEPT_TEXT)
    assert SECRET in str(holder.session(ERASED).get_llm_context())
    eraser.erase(ERASED)
    took = told.wait("erasures_seen", 1, "the holder drops the erased session")
    assert not holder.is_live(ERASED)
    assert took < 1.0
    assert holder.session(ERASED).get_llm_context() == EMPTY
    assert holder.session(ERASED).to_dict()["turns"] == []
    assert holder.is_live(KEPT)
    assert KEPT_TEXT in str(holder.session(KEPT).get_llm_context())


def test_another_process_drops_every_session_of_an_erased_user(
    two_processes: tuple[MemorySystem, MemorySystem],
    told: Told,
) -> None:
    """erase_user reaches every live session of that user in the other process, and no other."""
    eraser, holder = two_processes
    other_session = MemoryKey(ERASED.tenant_id, ERASED.user_id, "chat-2")
    for key in (ERASED, other_session, KEPT):
        write(holder, key, SECRET if key != KEPT else KEPT_TEXT, turns=2)
    eraser.erase_user(ERASED.tenant_id, ERASED.user_id)
    told.wait("erasures_seen", 2, "both dropped")
    assert not holder.is_live(ERASED)
    assert not holder.is_live(other_session)
    assert holder.is_live(KEPT)
    assert holder.session(other_session).get_llm_context() == EMPTY


def test_a_stale_writer_starts_afresh_instead_of_writing_erased_turns_back(
    two_processes: tuple[MemorySystem, MemorySystem],
) -> None:
    """A write through a process that still held the erased state stores a new session, nothing old."""
    eraser, holder = two_processes
    write(holder, ERASED, SECRET, turns=3)
    holder.session(ERASED)  # live, state at seq 4
    eraser.log.erase(ERASED, at=1.0)  # the log alone: the holder hears of it only by its notice
    holder.session(ERASED).add_turn(ConversationTurn(user_message="after", assistant_response="ok"))
    context = holder.session(ERASED).get_llm_context()
    assert [t["user"] for t in context["conversation_memory"]["recent_turns"]] == ["after"]
    stored, _ = eraser.load(ERASED)
    assert [r.turn.user_message for r in stored.turns] == ["after"]


def test_a_snapshot_saved_by_a_stale_process_after_erasure_is_deleted_not_used() -> None:
    """A snapshot of the erased history that lands after the erasure is refused and deleted on load."""
    log, snapshots = InMemoryEventLog(), InMemorySnapshotStore()
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, journal=InMemoryErasureJournal()) as memory:
        write(memory, ERASED, SECRET, turns=3)
        stale = memory.session(ERASED).snapshot_state()
        memory.erase(ERASED)
        write(memory, ERASED, "new life", turns=3)  # a new session that reaches the same seq
        memory.passivate(ERASED)
        last = log.read(ERASED)[-1]
        assert last.seq == stale.version
        snapshots.save(
            Snapshot(
                key=ERASED,
                seq=stale.version,
                state_hash=state_hash(stale),
                data=encode_state(stale),
                event_id="an event of the erased history",
            )
        )
        state, report = memory.load(ERASED)
        assert report.snapshot_rejected is not None
        assert [r.turn.user_message for r in state.turns][-1] == "new life #2"
        assert snapshots.load(ERASED) is None


def test_in_memory_systems_sharing_a_log_drop_erased_sessions_too() -> None:
    """The in-memory log tells every system on it, as the JetStream log tells every process."""
    log, journal = InMemoryEventLog(), InMemoryErasureJournal()
    with (
        MemorySystem(CONFIG, log=log, journal=journal) as eraser,
        MemorySystem(CONFIG, log=log, journal=journal, metrics=(told := Told())) as holder,
    ):
        write(holder, ERASED, SECRET)
        eraser.erase(ERASED)
        told.wait("erasures_seen", 1, "the other system drops the session")
        assert not holder.is_live(ERASED)
        assert holder.session(ERASED).get_llm_context() == EMPTY
