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
