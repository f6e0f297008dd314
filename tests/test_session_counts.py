"""`sessions` (the CLI's and the service's) shows the true turn count, found without replaying whole sessions.

A session past its `live_turns` keeps only its last turns live; the count
shown is the turns its log numbered (what `verify` counts), with the live ones
apart. The state comes from the snapshot plus the events after it, and a
reader never deletes or saves a snapshot.
"""

from __future__ import annotations

from typing import Any

import convmem
from convmem.actors import MemorySystem, list_sessions, verify
from convmem.adapters import EmbeddedNatsServer, InMemoryEventLog, InMemorySnapshotStore, MemoryService
from convmem.events import ConversationTurn, MemoryBudget, MemoryKey, ShortTermMemoryConfig

CONFIG = ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=2), live_turns=4)
LONG, SHORT = MemoryKey("acme", "alice", "long"), MemoryKey("acme", "alice", "short")


class ReadsSeen(InMemoryEventLog):
    """The in-memory log, noting from where each session read started (0: the whole session)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[MemoryKey, int]] = []

    def read(self, key: MemoryKey, *args: Any, **kwargs: Any) -> Any:
        self.reads.append((key, kwargs.get("after_seq", 0)))
        return super().read(key, *args, **kwargs)


class NoWrites(InMemorySnapshotStore):
    """Snapshots that fail the test if a reader saves or deletes one."""

    def save(self, snapshot: Any) -> None:
        raise AssertionError("a reader saved a snapshot")

    def delete(self, key: MemoryKey) -> None:
        raise AssertionError("a reader deleted a snapshot")


def write(memory: MemorySystem, key: MemoryKey, turns: int) -> None:
    for n in range(turns):
        memory.session(key).add_turn(ConversationTurn(user_message=f"m{n}", assistant_response="ok"))


def test_sessions_count_every_turn_from_the_snapshot_and_its_tail() -> None:
    """30 turns, a few live: 30 shown (as verify counts), the live apart; read from the snapshot on."""
    log, snapshots = ReadsSeen(), InMemorySnapshotStore()
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, snapshot_every=8) as memory:
        write(memory, LONG, 30)
        live = len(memory.session(LONG).snapshot_state().turns)
        write(memory, SHORT, 2)
        memory.session(SHORT).clear()
    reader = NoWrites()
    for key in (LONG, SHORT):
        snapshot = snapshots.load(key)
        if snapshot is not None:
            InMemorySnapshotStore.save(reader, snapshot)
    log.reads.clear()
    rows = {row.key: row for row in list_sessions(log, reader, tenant_id="acme")}
    assert (rows[LONG].turns, rows[LONG].live_turns, rows[LONG].events) == (30, live, 31)
    assert live < 30
    assert (rows[SHORT].turns, rows[SHORT].live_turns) == (2, 0)  # cleared: written, none live
    assert all(after > 0 for key, after in log.reads if key == LONG), log.reads
    [check] = verify(log, None, key=LONG)
    assert check.turns == rows[LONG].turns


def test_the_service_sessions_op_shows_the_true_count(nats_server: EmbeddedNatsServer) -> None:
    """The service's `sessions` op: turns written and live apart, as the CLI shows them."""
    with convmem.connect(nats_server.url, config=CONFIG, snapshot_every=8) as memory:
        write(memory, LONG, 30)
        with MemoryService(memory, nats_server.url), convmem.connect_remote(nats_server.url) as remote:
            [row] = remote.sessions("acme", "alice")
    assert (row["session_id"], row["turns"], row["events"]) == ("long", 30, 31)
    assert row["live_turns"] < 30
