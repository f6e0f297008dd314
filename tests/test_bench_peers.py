"""The peers measure's own rules: every store holds what was written, and a store that does not fails.

These drive the real stores (the peers' own classes, SQLite files, convmem on
its embedded server) at a few sessions; the figures themselves are the
benchmark's, not a test's.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import _peer_runs, _peer_stores, peers
from bench._common import sample_turn, session_keys
from bench._peer_stores import (
    AgentsSession,
    ConvmemTasks,
    ConvmemThreads,
    LangGraphSaver,
    LoopThread,
    PenguiFlowMemory,
    Store,
)

TURNS = [sample_turn(n) for n in range(7)]
USERS = [t.user_message for t in TURNS]


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    running = LoopThread()
    try:
        yield running
    finally:
        running.close()


def opened(store: Store, sessions: int, loop: LoopThread) -> Store:
    store.open(session_keys(sessions, tenant="peers-test"), TURNS, loop)
    return store


def write_all(store: Store, loop: LoopThread, sessions: int, turns: range, callers: int = 2) -> None:
    owned = [list(range(c, sessions, callers)) for c in range(callers)]
    assert _peer_runs.rate(store, loop, _peer_runs.write_plan(owned, turns.start, turns.stop)) > 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: ConvmemThreads(all_live=True),
        lambda: ConvmemThreads(all_live=False),
        ConvmemTasks,
        lambda: AgentsSession(on_file=True),
        lambda: AgentsSession(on_file=False),
        lambda: LangGraphSaver(on_file=True),
        lambda: LangGraphSaver(on_file=False),
        PenguiFlowMemory,
    ],
    ids=[
        "convmem-live",
        "convmem-bound",
        "convmem-tasks",
        "agents-file",
        "agents-memory",
        "sqlite-saver",
        "memory-saver",
        "penguiflow",
    ],
)
def test_every_store_shows_the_turns_written_in_order(make: object, loop: LoopThread) -> None:
    """Each store, written round its sessions by two callers, reads back its window of the turns, in order."""
    store = opened(make(), 4, loop)  # type: ignore[operator]
    try:
        write_all(store, loop, 4, range(len(TURNS)))
        shown = _peer_runs.check(store, loop, 4, USERS)
        assert shown == (len(USERS) if store.window is None else 5)
        assert _peer_runs.rate(store, loop, _peer_runs.read_plan([[0, 1], [2, 3]]), reads_for=0.01) > 0
    finally:
        store.close(loop)


@pytest.mark.parametrize(
    "make", [PenguiFlowMemory, lambda: LangGraphSaver(on_file=False)], ids=["penguiflow", "memory-saver"]
)
def test_a_store_missing_a_turn_fails_the_check(make: object, loop: LoopThread) -> None:
    """A session that lacks one of the turns written to the others fails the measure, naming the store."""
    store = opened(make(), 3, loop)  # type: ignore[operator]
    try:
        write_all(store, loop, 3, range(len(TURNS) - 1))
        write_all(store, loop, 1, range(len(TURNS) - 1, len(TURNS)), callers=1)  # session 0 only
        with pytest.raises(AssertionError, match=store.label.split(" (")[0]):
            _peer_runs.check(store, loop, 3, USERS)
    finally:
        store.close(loop)


def test_agents_on_a_file_keeps_a_bounded_number_of_sessions_open(
    loop: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the bound the least recently used session object is closed, and its history is read back whole."""
    monkeypatch.setattr(_peer_stores, "AGENTS_OPEN_SESSIONS", 3)
    store = opened(AgentsSession(on_file=True), 8, loop)
    try:
        write_all(store, loop, 8, range(len(TURNS)))
        assert isinstance(store, AgentsSession)
        assert len(store.sessions) <= 3
        assert _peer_runs.check(store, loop, 8, USERS) == len(USERS)
    finally:
        store.close(loop)


def test_agents_never_closes_a_session_object_a_call_still_uses(
    loop: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Making room past the bound skips objects in use: a call whose thread has not started yet still works.

    A task takes its session's object, then yields while its SQLite work waits for a
    worker thread; another task opening a session meanwhile must not close that object.
    """
    monkeypatch.setattr(_peer_stores, "AGENTS_OPEN_SESSIONS", 1)
    store = opened(AgentsSession(on_file=True), 3, loop)
    assert isinstance(store, AgentsSession)
    try:
        first = store._acquire(0)
        second = store._acquire(1)  # over the bound, and the least recently used is in use
        loop.run(first.add_items([{"role": "user", "content": "still open"}]), 30)
        store._release(first)
        store._release(second)
        assert list(store.sessions) == [1]  # back at the bound once nothing is in use
        assert [i["content"] for i in loop.run(store.read(0), 30)] == ["still open"]
    finally:
        store.close(loop)
    assert not store.sessions


def test_a_failed_caller_stops_every_other_caller_before_the_phase_fails(loop: LoopThread) -> None:
    """When one asyncio caller fails, the others are cancelled and finished before the error is raised.

    Otherwise closing the store after the failure races callers still using it.
    """
    finished: list[int] = []
    forever = asyncio.Event()

    async def call(session: int) -> None:
        try:
            if session == 0:
                raise ValueError("caller 0 fails")
            await forever.wait()
        finally:
            finished.append(session)

    class Failing(Store):
        calls = "tasks"

        def read(self, session: int) -> object:
            return call(session)

    with pytest.raises(ValueError, match="caller 0 fails"):
        _peer_runs.rate(Failing(), loop, [[(0,)], [(1,)]], reads_for=60.0)
    assert sorted(finished) == [0, 1]


def test_a_store_whose_own_close_fails_still_removes_its_folder(loop: LoopThread) -> None:
    """The temporary folder goes even when closing the store's database fails (no leaked folder warning)."""
    store = opened(LangGraphSaver(on_file=True), 1, loop)
    assert isinstance(store, LangGraphSaver)
    folder = Path(store._folder.name)
    real = store.conn

    class Unclosable:
        def close(self) -> None:
            real.close()
            raise sqlite3.OperationalError("cannot close")

    store.conn = Unclosable()  # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError, match="cannot close"):
        store.close(loop)
    assert not folder.exists()


def test_a_sqlite_file_without_fsync_per_commit_is_refused(tmp_path: Path) -> None:
    """The figures' names say WAL with synchronous FULL: a database set otherwise is not measured."""
    conn = sqlite3.connect(tmp_path / "normal.db")
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        pragmas = {
            "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
            "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
        }
    finally:
        conn.close()
    with pytest.raises(RuntimeError, match="synchronous=1"):
        _peer_stores._require_fsync(pragmas, "a peer")
    _peer_stores._require_fsync({"journal_mode": "wal", "synchronous": 2}, "a peer")


def test_each_round_starts_with_the_next_store() -> None:
    """Rounds alternate: over as many rounds as stores, each store goes first once and all run every round."""
    stores = ["a", "b", "c"]
    orders = [peers._turn_order(stores, r) for r in range(3)]
    assert [order[0] for order in orders] == stores
    assert all(sorted(order) == stores for order in orders)


def test_a_timed_read_round_ends_for_every_caller_at_one_deadline() -> None:
    """Reads go round a caller's sessions until the round's deadline; a past deadline makes none."""
    assert list(_peer_runs._ops([(1,), (2,)], None)) == [(1,), (2,)]
    assert list(_peer_runs._ops([(1,), (2,)], 0.0)) == []


def test_a_store_in_its_own_process_reports_its_failure_by_name() -> None:
    """A store driven in a child process answers each phase; a failed check comes back naming the store."""
    store = _peer_runs.StoreProcess("penguiflow", turns=3, callers=2)
    try:
        assert store.open(4) == {}
        assert store.writes(0, 2) > 0
        with pytest.raises(RuntimeError, match=r"PenguiFlow DefaultShortTermMemory.*check failed"):
            store.check()  # two of the three turns written
        assert store.writes(2, 3) > 0
        assert store.check() == 3
        store.close()
    finally:
        store.exit()


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] for r in requirements}


@pytest.mark.parametrize("extra", ["bench", "dev"])
def test_the_bench_and_dev_extras_install_every_peer(extra: str) -> None:
    """`.[bench]` brings the measure's peers (README), `.[dev]` too (CI's smoke run); the core none."""
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())[
        "project"
    ]
    peers_packages = {"openai-agents", "langgraph", "langgraph-checkpoint-sqlite", "penguiflow"}
    assert peers_packages <= names(project["optional-dependencies"][extra])
    assert not peers_packages & names(project["dependencies"])
