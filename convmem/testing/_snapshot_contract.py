"""The `SnapshotStore` contract: the promises every snapshot store keeps, as a suite a back end runs.

A back end's tests subclass `SnapshotStoreContract` and give an
``open_store`` fixture: a factory of handles on one fresh store, each
closed in the fixture's teardown (as `EventLogContract`'s ``open_log``).
This module needs pytest (the ``testing`` extra); ``import convmem`` never loads it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from convmem.actors import Snapshot, SnapshotStore
from convmem.events import MemoryKey

__all__ = ["KEY", "OpenStore", "SnapshotStoreContract", "snap"]

OpenStore = Callable[[], SnapshotStore]
"""A factory of handles on one store (the fixture ``open_store`` a back end's test class gives)."""

KEY = MemoryKey("acme", "alice", "s1")


def snap(seq: int, key: MemoryKey = KEY, data: bytes = b"state") -> Snapshot:
    """A snapshot of `key` at `seq` whose bytes differ by seq."""
    return Snapshot(key=key, seq=seq, state_hash=f"hash-{seq}", data=data + bytes([seq % 256]))


class SnapshotStoreContract:
    """Every promise of `SnapshotStore`, one test each; subclass it with an ``open_store`` fixture."""

    @pytest.fixture
    def store(self, open_store: OpenStore) -> SnapshotStore:
        """One handle on the fresh store."""
        return open_store()

    def test_a_missing_snapshot_loads_as_none(self, store: SnapshotStore) -> None:
        """A session never snapshotted has no snapshot."""
        assert store.load(KEY) is None

    def test_a_saved_snapshot_loads_back_equal(self, store: SnapshotStore) -> None:
        """save then load returns the same snapshot, bytes and hash included."""
        saved = snap(7, data=b"\x00\xff" * 1000)
        store.save(saved)
        assert store.load(KEY) == saved

    def test_a_newer_snapshot_replaces_an_older_one(self, store: SnapshotStore) -> None:
        """A snapshot with a higher seq replaces the stored one."""
        store.save(snap(3))
        store.save(snap(9))
        assert store.load(KEY) == snap(9)

    @pytest.mark.parametrize("older", [4, 9])
    def test_an_older_snapshot_never_overwrites_a_newer_one(self, store: SnapshotStore, older: int) -> None:
        """Saving a snapshot with a lower (or equal) seq keeps the stored one."""
        store.save(snap(9))
        store.save(snap(older, data=b"other"))
        assert store.load(KEY) == snap(9)

    def test_delete_forgets_the_snapshot_and_a_later_save_works(self, store: SnapshotStore) -> None:
        """delete() leaves no snapshot; the session may be snapshotted again, from any seq."""
        store.save(snap(9))
        store.delete(KEY)
        assert store.load(KEY) is None
        store.delete(KEY)
        store.save(snap(2))
        assert store.load(KEY) == snap(2)

    def test_snapshots_of_hostile_ids_stay_apart(self, store: SnapshotStore) -> None:
        """Keys that differ only in dots, wildcards, colons or unicode never share a snapshot."""
        keys = [
            MemoryKey("a.b", "c", "d"),
            MemoryKey("a", "b.c", "d"),
            MemoryKey("a", "*", "d"),
            MemoryKey("a", ">", "d"),
            MemoryKey("a:b", "c", "d"),
            MemoryKey("=41", "c", "d"),
            MemoryKey("A", "c", "d"),
            MemoryKey("用户", "🙂", "a b"),
        ]
        for seq, key in enumerate(keys, start=1):
            store.save(snap(seq, key))
        for seq, key in enumerate(keys, start=1):
            assert store.load(key) == snap(seq, key)
        store.delete(keys[0])
        assert store.load(keys[0]) is None
        assert store.load(keys[1]) == snap(2, keys[1])

    def test_racing_savers_leave_the_newest_snapshot(self, open_store: OpenStore) -> None:
        """Concurrent saves of many seqs through several handles end with the highest one stored."""
        handles = [open_store() for _ in range(3)]
        barrier = threading.Barrier(6)
        failures: list[BaseException] = []

        def save(index: int) -> None:
            try:
                barrier.wait(timeout=30)
                for seq in range(index, 60, 6):
                    handles[index % 3].save(snap(seq + 1))
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=save, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not failures
        assert handles[0].load(KEY) == snap(60)

    def test_keys_lists_each_session_with_a_snapshot_in_scope(self, store: SnapshotStore) -> None:
        """keys() lists the sessions with a snapshot, of a tenant or a user; a deleted one leaves the list."""
        other_user, other_tenant = MemoryKey("acme", "bob", "s1"), MemoryKey("globex", "alice", "s1")
        for key in (KEY, MemoryKey("acme", "alice", "s2"), other_user, other_tenant):
            store.save(snap(1, key=key))
        assert store.keys(tenant_id="acme", user_id="alice") == [KEY, MemoryKey("acme", "alice", "s2")]
        assert set(store.keys(tenant_id="acme")) == {KEY, MemoryKey("acme", "alice", "s2"), other_user}
        assert len(store.keys()) == 4
        store.delete(KEY)
        assert store.keys(tenant_id="acme", user_id="alice") == [MemoryKey("acme", "alice", "s2")]
