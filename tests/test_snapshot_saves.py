"""A JetStream snapshot save over the store's own last one (issue 28): two requests, same outcome."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from convmem.adapters import EmbeddedNatsServer, JetStreamSnapshotStore
from convmem.events import MemoryKey
from convmem.testing._snapshot_contract import KEY, snap


@pytest.fixture
def stores(
    nats_server: EmbeddedNatsServer,
) -> Iterator[tuple[JetStreamSnapshotStore, JetStreamSnapshotStore]]:
    one = JetStreamSnapshotStore.connect(nats_server.url, timeout=10.0)
    two = JetStreamSnapshotStore.connect(nats_server.url, timeout=10.0)
    yield one, two
    one.close()
    two.close()


def _held(store: JetStreamSnapshotStore, key: MemoryKey = KEY) -> dict[str, int]:
    """Messages per subject of the session's key (its head and any parts)."""
    subject = store.subject(key)
    return store._conn.call(lambda: store._subjects(subject + ".>"), what="list") | store._conn.call(
        lambda: store._subjects(subject), what="list"
    )


def _requests(store: JetStreamSnapshotStore) -> list[str]:
    """Record the JetStream API requests the store makes from now on (``MSG.GET``, ``MSG.DELETE``)."""
    seen: list[str] = []
    conn = store._conn
    api = conn.api

    async def counted(subject: str, *args: object, **kwargs: object) -> object:
        seen.append(".".join(subject.split(".")[3:5]))
        return await api(subject, *args, **kwargs)  # type: ignore[arg-type]

    conn.api = counted  # type: ignore[method-assign]
    return seen


def test_a_save_over_its_own_last_one_erases_it_and_writes_without_reading(stores: tuple) -> None:
    one, _ = stores
    one.save(snap(5))
    seen = _requests(one)
    one.save(snap(7))
    assert seen == ["MSG.DELETE"]  # the old one erased; nothing read (the write is a plain publish)
    loaded = one.load(KEY)
    assert loaded is not None
    assert (loaded.seq, loaded.data) == (7, snap(7).data)
    assert _held(one) == {one.subject(KEY): 1}  # the superseded snapshot is gone from the bucket
    assert one.check(KEY) is None


def test_another_savers_newer_snapshot_is_never_replaced_by_an_older_one(stores: tuple) -> None:
    one, two = stores
    one.save(snap(5))
    two.save(snap(9))  # another process saved a newer one meanwhile
    one.save(snap(7))  # its quick save finds the key taken: the full way sees 9 and keeps it
    for store in stores:
        loaded = store.load(KEY)
        assert loaded is not None
        assert loaded.seq == 9
    one.save(snap(11))
    loaded = two.load(KEY)
    assert loaded is not None
    assert loaded.seq == 11
    assert _held(one) == {one.subject(KEY): 1}


def test_a_deleted_snapshot_is_saved_again_the_full_way(stores: tuple) -> None:
    one, two = stores
    one.save(snap(5))
    two.delete(KEY)  # erased by another handle
    one.save(snap(3))  # a lower seq than this store last saved: it reads the key, finds it empty
    loaded = one.load(KEY)
    assert loaded is not None
    assert loaded.seq == 3
    one.delete(KEY)
    one.save(snap(2))
    loaded = two.load(KEY)
    assert loaded is not None
    assert loaded.seq == 2


def test_a_first_save_writes_on_the_empty_key_without_reading_it_first(stores: tuple) -> None:
    one, two = stores
    fresh = MemoryKey("acme", "alice", "never-saved")
    seen = _requests(one)
    one.save(snap(4, fresh))
    assert seen == ["MSG.GET"]  # only the probe for a crashed save's parts, after the write
    two.save(snap(6, fresh))  # a store that saved none there: its try on the empty key fails, the full way
    loaded = one.load(fresh)
    assert loaded is not None
    assert loaded.seq == 6
    assert _held(one, fresh) == {one.subject(fresh): 1}
