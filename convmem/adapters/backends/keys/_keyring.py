"""`Keyring`: seals and opens stored bytes with the data key of their (tenant, user).

Sealed bytes are ``C1 01 <key id: 8 bytes> <nonce: 12 bytes> <AES-256-GCM ciphertext and tag>``.
``C1`` is the one byte msgpack never uses, so a sealed event is never
mistaken for a plain one: logs written before encryption (or with it off)
stay readable beside sealed events. The associated data binds the header and
a context the caller gives (the session and its seq for an event, the
session and seq for a snapshot), so sealed bytes moved to another session or
position fail authentication (`SealBroken`) instead of opening there.

Data keys are made on first use (32 random bytes), wrapped by the master key
(`KeyProvider`) and stored in a `KeyStore`; unwrapped keys are cached here,
one AES-GCM object per key, so sealing an event costs one nonce and one
encryption. `shred(tenant, user)` deletes the user's keys: from then on
their sealed bytes, in any copy, open as None (erased), which readers show
as erased events.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from typing import Final

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from convmem.actors._fair import FairCache
from convmem.adapters.backends.keys._master import KeyProvider
from convmem.adapters.backends.keys._stores import CHECK_META, DamagedKey, KeyStore, WrappedKey
from convmem.errors import EncryptionKeyError, SealBroken
from convmem.events import MemoryKey

__all__ = ["SEAL_MAGIC", "KeyCheck", "Keyring", "is_sealed", "subject_of"]

SEAL_MAGIC: Final = 0xC1
_VERSION: Final = 1
_PREFIX: Final = bytes([SEAL_MAGIC, _VERSION])
_HEAD: Final = 10  # magic, version, key id
_NONCE: Final = 12
_MIN: Final = _HEAD + _NONCE + 16
_CACHE: Final = 65_536
"""Data keys kept unwrapped, and users' sealers: past it, the least recently stored of the tenant
holding the most goes (a miss asks the key store, and the master key to unwrap)."""
_CONTEXTS: Final = 65_536
"""Sessions whose associated data is kept (a miss builds one short string again: no request)."""
_CHECK: Final = CHECK_META
_CHECK_TEXT: Final = b"convmem master key check"


class _Check(msgspec.Struct, frozen=True):
    master_id: str
    wrapped: bytes


class KeyCheck(msgspec.Struct, frozen=True, kw_only=True):
    """What `Keyring.check` found in the key store."""

    data_keys: int
    """Every data key stored, damaged ones included."""
    users: int
    """The (tenant, user)s the readable keys belong to."""
    of_other_master_keys: int
    """Keys wrapped by a master key this keyring does not hold (a writer that ran on an old one)."""
    damaged: list[DamagedKey]


def is_sealed(data: bytes) -> bool:
    """Whether `data` is sealed bytes (else plain: written without encryption)."""
    return data[:1] == b"\xc1"


def subject_of(tenant_id: str, user_id: str) -> str:
    """The key store's name for a (tenant, user): a hash, so the store names no user."""
    digest = hashlib.sha256(b"convmem-data-subject\0" + tenant_id.encode() + b"\0" + user_id.encode())
    return digest.hexdigest()[:32]


_Sealer = tuple[bytes, AESGCM]


class Keyring:
    """Data keys per (tenant, user): made, wrapped, cached, used, rotated and shredded."""

    def __init__(
        self,
        provider: KeyProvider,
        store: KeyStore,
        *,
        clock: Callable[[], float] = time.time,
        read_only: bool = False,
    ) -> None:
        """Checks at once that `provider`'s master key is the one `store` was written with.

        `read_only` (a reader's): nothing is written to the store, and no data key is made.
        """
        self.provider = provider
        self.store = store
        self.read_only = read_only
        self._clock = clock
        self._lock = threading.Lock()
        self._sealer_cache: FairCache[tuple[str, str], _Sealer] = FairCache(_CACHE)
        self._opener_cache: FairCache[bytes, AESGCM | None] = FairCache(_CACHE)
        """Data keys by id (None: shredded), shared fairly by tenants: a tenant with many users
        gives up its own keys, and another tenant's reads and writes ask the key store no more."""
        self._sealers = self._sealer_cache.entries  # read without the lock: one dict get
        self._openers = self._opener_cache.entries
        self._contexts: dict[MemoryKey, bytes] = {}
        self._check_master()

    @property
    def source(self) -> str:
        return self.provider.source

    # The master key -----------------------------------------------------------------------

    def _check_master(self) -> None:
        stored = self.store.meta(_CHECK)
        if stored is None:
            if not self.read_only:
                self._write_check()
            return
        try:
            check = msgspec.msgpack.decode(stored, type=_Check)
        except msgspec.MsgspecError:
            raise EncryptionKeyError("its master key check is damaged", source=self.store.source) from None
        if not self.provider.knows(check.master_id):
            raise EncryptionKeyError(
                f"is not the master key this store's keys were wrapped with: they need master key "
                f"{check.master_id}, this one is {self.provider.master_id} ({self.store.source})",
                source=self.provider.source,
            )
        if self.provider.unwrap(check.master_id, check.wrapped, b"check") != _CHECK_TEXT:
            raise EncryptionKeyError("the master key check does not match", source=self.provider.source)

    def _write_check(self) -> None:
        check = _Check(self.provider.master_id, self.provider.wrap(_CHECK_TEXT, b"check"))
        self.store.set_meta(_CHECK, msgspec.msgpack.encode(check))

    # Data keys ----------------------------------------------------------------------------

    @staticmethod
    def _wrap_context(key_id: str, subject: str) -> bytes:
        return f"{key_id}.{subject}".encode()

    def _unwrap(self, record: WrappedKey) -> bytes:
        return self.provider.unwrap(
            record.master_id, record.wrapped, self._wrap_context(record.key_id, record.subject)
        )

    def _make(self, tenant_id: str, subject: str) -> WrappedKey:
        if self.read_only:
            raise EncryptionKeyError("was opened to read: no data key is made", source=self.store.source)
        key_id = os.urandom(8).hex()
        data_key = AESGCM.generate_key(bit_length=256)
        record = WrappedKey(
            key_id=key_id,
            subject=subject,
            master_id=self.provider.master_id,
            wrapped=self.provider.wrap(data_key, self._wrap_context(key_id, subject)),
            created=self._clock(),
        )
        self.store.put(record)
        self._opener_cache.put(tenant_id, bytes.fromhex(key_id), AESGCM(data_key))
        return record

    def _sealer(self, tenant_id: str, user_id: str) -> _Sealer:
        with self._lock:
            known = self._sealers.get((tenant_id, user_id))
            if known is not None:
                return known
            subject = subject_of(tenant_id, user_id)
            keys = self.store.of_subject(subject)
            record = keys[-1] if keys else self._make(tenant_id, subject)
            key_id = bytes.fromhex(record.key_id)
            aead = self._openers.get(key_id)
            if aead is None:
                aead = AESGCM(self._unwrap(record))
            self._opener_cache.put(tenant_id, key_id, aead)
            sealer = (_PREFIX + key_id, aead)
            self._sealer_cache.put(tenant_id, (tenant_id, user_id), sealer)
            return sealer

    def new_data_key(self, tenant_id: str, user_id: str) -> str:
        """Make a new data key for the user: new bytes are sealed with it, older ones still open. Its id."""
        with self._lock:
            record = self._make(tenant_id, subject_of(tenant_id, user_id))
            self._sealer_cache.pop((tenant_id, user_id))
        return record.key_id

    def context(self, key: MemoryKey) -> bytes:
        """The session part of the associated data (cached per key)."""
        found = self._contexts.get(key)
        if found is None:
            if len(self._contexts) >= _CONTEXTS:
                self._contexts.clear()
            found = self._contexts[key] = f"{key.tenant_id}\0{key.user_id}\0{key.session_id}\0".encode()
        return found

    def seal(self, key: MemoryKey, data: bytes, context: bytes) -> bytes:
        """`data` sealed with the data key of `key`'s user, bound to `context`."""
        sealer = self._sealers.get((key.tenant_id, key.user_id))
        if sealer is None:
            sealer = self._sealer(key.tenant_id, key.user_id)
        head, aead = sealer
        nonce = os.urandom(_NONCE)
        return head + nonce + aead.encrypt(nonce, data, head + context)

    def open(
        self, data: bytes, context: bytes, *, where: str, position: int | None = None, tenant: str = ""
    ) -> bytes | None:
        """The plain bytes of sealed `data` (plain `data` as it is); None when its key was shredded.

        `tenant` (the id of the tenant whose bytes these are) is whom a data key read from the store
        for them is cached for.

        `SealBroken` (naming `where`) when the bytes fail authentication;
        `EncryptionKeyError` when the key store lacks a key it never shredded.
        """
        if data[:1] != b"\xc1":
            return data
        # The hot path (a cached key, a well-formed header) in literals: it runs for every event read.
        aead = self._openers.get(data[2:10], False)
        if aead is False or len(data) < 38 or data[1] != 1:
            if len(data) < _MIN or data[1] != _VERSION:
                raise SealBroken(where, seq=position)
            aead = self._opener(data[2:_HEAD], tenant)
        if aead is None:
            return None
        try:
            return aead.decrypt(data[10:22], data[22:], data[:10] + context)  # type: ignore[union-attr]
        except InvalidTag:
            raise SealBroken(where, seq=position) from None

    def _opener(self, key_id: bytes, tenant: str) -> AESGCM | None:
        name = key_id.hex()
        record = self.store.get(name)
        if record is None:
            if not self.store.shredded(name):
                raise EncryptionKeyError(
                    f"has no data key {name}, which sealed stored bytes, and never erased it: this is not "
                    "the key store the data was written with, or keys were lost from it",
                    source=self.store.source,
                )
            aead = None
        else:
            aead = AESGCM(self._unwrap(record))
        with self._lock:
            self._opener_cache.put(tenant, key_id, aead)
        return aead

    # Erasure ------------------------------------------------------------------------------

    def shred(self, tenant_id: str, user_id: str) -> list[str]:
        """Delete every data key of the user: their sealed bytes, in every copy, read as erased.

        `EncryptionKeyError` when the store cannot tell that every key of the user is gone (a
        stored key that does not read, see `KeyStore.shred`): the keys it could tell are deleted.
        """
        with self._lock:
            self._sealer_cache.pop((tenant_id, user_id))
            try:
                ids = self.store.shred(subject_of(tenant_id, user_id))
            except BaseException:
                self._opener_cache.clear()  # some of the user's keys may be gone: ask the store again
                raise
            for key_id in ids:
                self._opener_cache.put(tenant_id, bytes.fromhex(key_id), None)
        return ids

    def forget(self, tenant_id: str | None = None, user_id: str | None = None) -> None:
        """Drop cached keys (all, or of one user) so the key store is asked again: another process erased."""
        with self._lock:
            if tenant_id is None or user_id is None:
                self._sealer_cache.clear()
                self._opener_cache.clear()
                return
            sealer = self._sealer_cache.pop((tenant_id, user_id))
            if sealer is not None:
                self._opener_cache.pop(sealer[0][2:])
            for record in self.store.of_subject(subject_of(tenant_id, user_id)):
                self._opener_cache.pop(bytes.fromhex(record.key_id))

    # Checking -----------------------------------------------------------------------------

    def check(self) -> KeyCheck:
        """Every stored data key read, and unwrapped when this master key holds its wrapper.

        A key that does not read, or does not unwrap (its wrapped bytes, id or subject
        damaged), is listed in `KeyCheck.damaged`, named by where the store keeps it.
        """
        scan = self.store.scan()
        damaged = list(scan.damaged)
        other = 0
        for record in scan.keys:
            if not self.provider.knows(record.master_id):
                other += 1
                continue
            try:
                self._unwrap(record)
            except EncryptionKeyError:
                damaged.append(
                    DamagedKey(
                        self.store.where(record.key_id),
                        record.key_id,
                        f"does not unwrap with master key {record.master_id} (its stored bytes "
                        "were damaged or tampered with)",
                    )
                )
        return KeyCheck(
            data_keys=len(scan.keys) + len(scan.damaged),
            users=len({k.subject for k in scan.keys}),
            of_other_master_keys=other,
            damaged=damaged,
        )

    # Rotation -----------------------------------------------------------------------------

    def rotate_master(self, new: KeyProvider) -> int:
        """Rewrap every data key with `new`'s master key (stored bytes are not touched); how many.

        Keys already wrapped by `new` are skipped, so an interrupted rotation
        is finished by running it again. `new` must still unwrap the old keys
        or this keyring's provider must.
        """
        rewrapped = 0
        for record in list(self.store.all()):
            if record.master_id == new.master_id:
                continue
            source = new if new.knows(record.master_id) else self.provider
            data_key = source.unwrap(
                record.master_id, record.wrapped, self._wrap_context(record.key_id, record.subject)
            )
            wrapped = new.wrap(data_key, self._wrap_context(record.key_id, record.subject))
            self.store.put(msgspec.structs.replace(record, master_id=new.master_id, wrapped=wrapped))
            rewrapped += 1
        self.provider = new
        self._write_check()
        return rewrapped

    def rotate_data_keys(self) -> int:
        """Give every user with a data key a new one for new bytes (old ones still open); how many."""
        subjects = {record.subject for record in self.store.all()}
        with self._lock:
            for subject in sorted(subjects):
                self._make("", subject)  # (whose, the store does not say: cached apart from every tenant)
            self._sealer_cache.clear()
        return len(subjects)

    def close(self) -> None:
        self.store.close()

    def __repr__(self) -> str:
        return f"Keyring({self.provider!r}, {self.store!r})"
