"""One contract for every key store (folder, NATS bucket, memory), and the keyring on top of each."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from convmem.adapters import EmbeddedNatsServer
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.backends.jetstream._keystore import NatsKeyStore
from convmem.adapters.backends.keys import (
    DirKeyStore,
    Keyring,
    KeyStore,
    LocalMasterKeys,
    MemoryKeyStore,
    WrappedKey,
    _keyring,
    rotate_master,
    subject_of,
)
from convmem.errors import EncryptionKeyError, SealBroken
from convmem.events import MemoryKey

KEY = MemoryKey("acme", "alice", "s1")


@pytest.fixture(params=["dir", "nats", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyStore]:
    if request.param == "dir":
        yield DirKeyStore(tmp_path / "keys")
    elif request.param == "memory":
        yield MemoryKeyStore()
    else:
        server: EmbeddedNatsServer = request.getfixturevalue("nats_server_shared")
        connection = NatsConnection.connect(server.url)
        made = NatsKeyStore(connection, bucket=f"KEYS_{uuid.uuid4().hex[:10]}")
        connection.release()
        try:
            yield made
        finally:
            made.close()


def _key(key_id: str, subject: str, created: float) -> WrappedKey:
    return WrappedKey(
        key_id=key_id, subject=subject, master_id="m1", wrapped=b"w" + key_id.encode(), created=created
    )


def test_key_store_contract(store: KeyStore) -> None:
    alice, bob = subject_of("acme", "alice"), subject_of("acme", "bob")
    assert store.get("00aa00aa00aa00aa") is None
    assert store.of_subject(alice) == []
    first, second, other = _key("a1" * 8, alice, 1.0), _key("a2" * 8, alice, 2.0), _key("b1" * 8, bob, 1.5)
    for key in (second, other, first):
        store.put(key)
    assert store.get(first.key_id) == first
    assert store.of_subject(alice) == [first, second]  # oldest first: the newest seals
    assert sorted(k.key_id for k in store.all()) == sorted([first.key_id, second.key_id, other.key_id])
    rewrapped = WrappedKey(first.key_id, alice, "m2", b"new", 1.0)
    store.put(rewrapped)
    assert store.get(first.key_id) == rewrapped
    assert len(store.of_subject(alice)) == 2

    assert sorted(store.shred(alice)) == sorted([first.key_id, second.key_id])
    assert store.get(first.key_id) is None
    assert store.of_subject(alice) == []
    assert store.shredded(first.key_id)
    assert store.shredded(second.key_id)
    assert not store.shredded(other.key_id)
    assert store.of_subject(bob) == [other]
    assert store.shred(alice) == []

    assert store.meta("master-check") is None
    store.set_meta("master-check", b"one")
    store.set_meta("master-check", b"two")
    assert store.meta("master-check") == b"two"
    with pytest.raises(EncryptionKeyError):
        store.get("../escape")


def test_keyring_seals_opens_shreds_and_rotates_on_each_store(store: KeyStore) -> None:
    old = LocalMasterKeys([b"\x01" * 32], source="test key one")
    keyring = Keyring(old, store)
    context = keyring.context(KEY) + b"1"
    sealed = keyring.seal(KEY, b"hello", context)
    assert sealed[:1] == b"\xc1"
    assert b"hello" not in sealed
    assert keyring.open(sealed, context, where="test") == b"hello"
    assert keyring.open(b"plain", context, where="test") == b"plain"
    with pytest.raises(SealBroken):
        keyring.open(sealed, keyring.context(KEY) + b"2", where="test")  # another seq: refused

    new = LocalMasterKeys([b"\x02" * 32], source="test key two")
    assert rotate_master(old, new, store) == 1
    # A writer still running on the old key makes bob's key after the rotation: running it again fixes it.
    bob = MemoryKey("acme", "bob", "s1")
    late = keyring.seal(bob, b"late", keyring.context(bob) + b"1")
    assert rotate_master(old, new, store) == 1
    assert rotate_master(old, new, store) == 0
    assert Keyring(new, store).open(late, keyring.context(bob) + b"1", where="test") == b"late"
    with pytest.raises(EncryptionKeyError, match="is not the master key") as caught:
        Keyring(old, store)  # the store's keys are now wrapped by the new key only
    assert caught.value.source == "test key one"
    reopened = Keyring(new, store)
    assert reopened.open(sealed, context, where="test") == b"hello"

    assert len(reopened.shred("acme", "alice")) == 1
    assert reopened.open(sealed, context, where="test") is None
    assert Keyring(new, store).open(sealed, context, where="test") is None  # a fresh process too


def test_a_key_missing_without_a_shred_is_an_error_not_an_erasure(tmp_path: Path) -> None:
    master = LocalMasterKeys([b"\x03" * 32], source="test key")
    sealed = Keyring(master, MemoryKeyStore()).seal(KEY, b"hello", b"ctx")
    other = Keyring(master, MemoryKeyStore())
    with pytest.raises(EncryptionKeyError, match="never erased it"):
        other.open(sealed, b"ctx", where="test")


def _lose_index_entry(store: KeyStore, subject: str, key_id: str) -> None:
    """Delete what the store's index keeps of one key (the key itself stays)."""
    if isinstance(store, DirKeyStore):
        (store.root / "subjects" / subject / key_id).unlink()
    else:
        assert isinstance(store, NatsKeyStore)
        store._call(lambda: store._erase(f"subj.{subject}.{key_id}"), "test: drop an index entry")


def _index_under(store: KeyStore, subject: str, key_id: str) -> None:
    """Add an index entry giving the key `key_id` to `subject` (a damaged index)."""
    if isinstance(store, DirKeyStore):
        (store.root / "subjects" / subject).mkdir(exist_ok=True)
        (store.root / "subjects" / subject / key_id).touch()
    else:
        assert isinstance(store, NatsKeyStore)
        store._call(lambda: store._put(f"subj.{subject}.{key_id}", b""), "test: add an index entry")


def _damage(store: KeyStore, key_id: str) -> str:
    """Replace one stored key by bytes that are not a key record; where the store keeps it."""
    if isinstance(store, DirKeyStore):
        path = store.root / "keys" / key_id
        path.write_bytes(path.read_bytes()[:10])
        return str(path)
    assert isinstance(store, NatsKeyStore)
    store._call(lambda: store._put(f"key.{key_id}", b"\x93junk"), "test: damage a key")
    return f"entry key.{key_id} of NATS bucket"


@pytest.fixture(params=["dir", "nats"])
def indexed_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyStore]:
    """A store that keeps an index of each subject's keys beside the keys (folder, NATS bucket)."""
    if request.param == "dir":
        yield DirKeyStore(tmp_path / "keys")
        return
    server: EmbeddedNatsServer = request.getfixturevalue("nats_server_shared")
    connection = NatsConnection.connect(server.url)
    made = NatsKeyStore(connection, bucket=f"KEYS_{uuid.uuid4().hex[:10]}")
    connection.release()
    try:
        yield made
    finally:
        made.close()


def _reopened(store: KeyStore) -> KeyStore:
    """Another store object on the same keys (another process's view: nothing cached)."""
    if isinstance(store, DirKeyStore):
        return DirKeyStore(store.root)
    assert isinstance(store, NatsKeyStore)
    return NatsKeyStore(store._conn, bucket=store._bucket)


def test_a_key_whose_index_entry_is_lost_is_still_found_and_shredded(indexed_store: KeyStore) -> None:
    """The keys name their subject: a lost index entry hides no key from `of_subject` or `shred`."""
    alice, bob = subject_of("acme", "alice"), subject_of("acme", "bob")
    first, second, other = _key("a1" * 8, alice, 1.0), _key("a2" * 8, alice, 2.0), _key("b1" * 8, bob, 1.5)
    for key in (first, second, other):
        indexed_store.put(key)
    _lose_index_entry(indexed_store, alice, second.key_id)

    reopened = _reopened(indexed_store)
    try:
        assert reopened.of_subject(alice) == [first, second]  # the newest, unindexed, still seals
        assert reopened.of_subject(bob) == [other]
    finally:
        reopened.close()
    assert sorted(indexed_store.shred(alice)) == [first.key_id, second.key_id]
    assert indexed_store.get(second.key_id) is None
    assert indexed_store.shredded(second.key_id)
    assert [k.key_id for k in indexed_store.all()] == [other.key_id]
    assert indexed_store.of_subject(alice) == []
    assert indexed_store.shred(alice) == []


def test_a_key_that_does_not_read_stops_a_shred_naming_it_after_the_rest_is_deleted(
    indexed_store: KeyStore,
) -> None:
    """Whose an unreadable key is cannot be told: the shred deletes what it can, then raises naming it."""
    alice, bob, carol = (subject_of("acme", u) for u in ("alice", "bob", "carol"))
    mine, theirs, carols = (
        _key("a1" * 8, alice, 1.0),
        _key("b1" * 8, bob, 1.0),
        _key("c1" * 8, carol, 1.0),
    )
    for key in (mine, theirs, carols):
        indexed_store.put(key)
    where = _damage(indexed_store, theirs.key_id)

    with pytest.raises(EncryptionKeyError, match="cannot tell whether every data key") as caught:
        indexed_store.shred(alice)
    assert where in str(caught.value)
    assert caught.value.source == indexed_store.source
    assert indexed_store.get(mine.key_id) is None  # alice's readable key is gone all the same
    assert indexed_store.shredded(mine.key_id)
    with pytest.raises(EncryptionKeyError, match="cannot tell"):
        indexed_store.shred(alice)  # and it stays unsure while the damage is there
    scan = indexed_store.scan()
    assert [k.key_id for k in scan.keys] == [carols.key_id]
    assert [(d.key_id, d.where) for d in scan.damaged] == [
        (theirs.key_id, indexed_store.where(theirs.key_id))
    ]
    assert [k.key_id for k in indexed_store.of_subject(carol)] == [carols.key_id]

    # A damaged key the index gives the erased user is theirs to delete: no doubt, no error.
    assert indexed_store.shred(bob) == [theirs.key_id]
    assert indexed_store.shred(alice) == []
    assert [k.key_id for k in indexed_store.all()] == [carols.key_id]


def test_keyring_check_names_a_key_that_does_not_unwrap(store: KeyStore) -> None:
    master = LocalMasterKeys([b"\x04" * 32], source="test key")
    keyring = Keyring(master, store)
    keyring.seal(KEY, b"hello", b"ctx")
    keyring.seal(MemoryKey("acme", "bob", "s1"), b"hello", b"ctx")
    assert keyring.check().damaged == []
    record = next(iter(store.all()))
    flipped = bytes([record.wrapped[0] ^ 1]) + record.wrapped[1:]
    store.put(WrappedKey(record.key_id, record.subject, record.master_id, flipped, record.created))

    check = Keyring(master, store).check()
    assert (check.data_keys, check.users, check.of_other_master_keys) == (2, 2, 0)
    assert [(d.where, d.key_id) for d in check.damaged] == [(store.where(record.key_id), record.key_id)]
    assert "does not unwrap" in check.damaged[0].problem


def test_an_index_entry_giving_another_users_key_stops_the_shred_and_deletes_nothing_of_theirs(
    indexed_store: KeyStore,
) -> None:
    """The index and the key disagree on whose it is: neither is trusted, the key stays, the shred says so."""
    alice, bob = subject_of("acme", "alice"), subject_of("acme", "bob")
    mine, theirs = _key("a1" * 8, alice, 1.0), _key("b1" * 8, bob, 1.0)
    indexed_store.put(mine)
    indexed_store.put(theirs)
    _index_under(indexed_store, alice, theirs.key_id)

    assert indexed_store.of_subject(alice) == [mine]
    with pytest.raises(EncryptionKeyError, match="the index gives it to this user") as caught:
        indexed_store.shred(alice)
    assert indexed_store.where(theirs.key_id) in str(caught.value)
    assert indexed_store.get(mine.key_id) is None
    assert indexed_store.get(theirs.key_id) == theirs
    assert not indexed_store.shredded(theirs.key_id)


def test_a_tenant_with_many_users_does_not_make_another_tenants_keys_asked_for_again(
    nats_server_shared: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a keyring that keeps 32 data keys and a tenant (globex) whose user sealed and opened, when
    another tenant (acme) seals for 200 users of its own, then globex's user seals and opens again
    without asking the key store or unwrapping: acme gave up its own keys (a keyring that started
    over when full asked the store and unwrapped again for each of globex's users)."""
    monkeypatch.setattr(_keyring, "_CACHE", 32)
    connection = NatsConnection.connect(nats_server_shared.url)
    store = NatsKeyStore(connection, bucket=f"KEYS_{uuid.uuid4().hex[:10]}")
    connection.release()
    master = LocalMasterKeys([b"\x03" * 32], source="test key")
    keyring = Keyring(master, store)
    asked: list[str] = []
    for name in ("get", "of_subject"):
        method = getattr(store, name)
        monkeypatch.setattr(store, name, lambda *a, _m=method, _n=name: (asked.append(_n), _m(*a))[1])
    unwrap = master.unwrap
    monkeypatch.setattr(master, "unwrap", lambda *a: (asked.append("unwrap"), unwrap(*a))[1])
    try:
        victims = [MemoryKey("globex", f"bob{n}", "s1") for n in range(3)]
        sealed = [keyring.seal(key, b"hello", keyring.context(key)) for key in victims]
        for n in range(200):
            acme = MemoryKey("acme", f"u{n}", "s1")
            keyring.open(keyring.seal(acme, b"x", keyring.context(acme)), keyring.context(acme), where="t")
        asked.clear()
        for key, data in zip(victims, sealed, strict=True):
            assert keyring.seal(key, b"again", keyring.context(key))[:10] == data[:10]  # the same key
            assert keyring.open(data, keyring.context(key), where="test", tenant="globex") == b"hello"
        assert asked == []
        assert keyring._sealer_cache.held_by("globex") == 3
        assert keyring._opener_cache.held_by("globex") == 3
        assert len(keyring._sealer_cache) == len(keyring._opener_cache) == 32
    finally:
        store.close()
