"""Key stores: where wrapped data keys live, apart from the events they open.

A data key is stored wrapped by the master key (`WrappedKey`), under a
random 8-byte id that every event it sealed carries. Keys are grouped by
`subject`: a hash of the (tenant, user) they belong to, so the store names
no user. `shred(subject)` deletes every key of a subject and keeps only the
ids it deleted (random numbers, no personal data) in a shredded list, so a
reader tells an erased user's event (shown as erased) from a key store that
lost a key it should have (an error).

Three stores pass one contract (tests/test_key_stores.py):

* `DirKeyStore`: one small file per key in a folder (the embedded default's
  ``<data folder>/keys``); writes are atomic renames, deleted key files are
  overwritten before they are unlinked;
* `NatsKeyStore` (in `convmem.adapters.backends.jetstream`): a JetStream key-value
  bucket (``CONVMEM_KEYS``) for processes sharing a NATS deployment; a
  deleted key's message is erased (its bytes overwritten) by the server. It
  must not be mirrored, sourced or backed up together with the events
  stream, or a copy keeps the keys;
* `MemoryKeyStore`: in this process only (tests, throwaway systems).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec

from convmem.adapters.backends.keys._master import sync_dir
from convmem.errors import EncryptionKeyError

__all__ = [
    "CHECK_META",
    "DirKeyStore",
    "KeyStore",
    "MemoryKeyStore",
    "WrappedKey",
    "check_hex",
    "sorted_keys",
]


CHECK_META = "master-check"
"""The store's record of the master key its keys are wrapped with (`Keyring` writes and checks it)."""


class WrappedKey(msgspec.Struct, frozen=True):
    """A data key as stored: wrapped by master key `master_id`, for the (tenant, user) hashed as `subject`."""

    key_id: str
    """16 hex digits: the random id every event sealed with the key carries."""
    subject: str
    master_id: str
    wrapped: bytes
    created: float
    """Epoch seconds; of a subject's keys the newest seals new events."""


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(WrappedKey).decode


def check_hex(value: str, what: str) -> str:
    if not value or len(value) > 64 or any(c not in "0123456789abcdef" for c in value):
        raise EncryptionKeyError(f"{what} {value[:70]!r} is not a hex id", source="key store")
    return value


@runtime_checkable
class KeyStore(Protocol):
    """Wrapped data keys by id and by subject, and the ids of shredded keys."""

    @property
    def source(self) -> str:
        """Where the keys are, for errors (``key store /data/keys``)."""
        ...

    def put(self, key: WrappedKey) -> None:
        """Store `key` (replacing a key of the same id: a rewrap)."""
        ...

    def get(self, key_id: str) -> WrappedKey | None:
        """The key of that id, or None."""
        ...

    def of_subject(self, subject: str) -> list[WrappedKey]:
        """Every key of `subject`, oldest first."""
        ...

    def all(self) -> Iterator[WrappedKey]:
        """Every key stored (a rotation rewraps them all)."""
        ...

    def shred(self, subject: str) -> list[str]:
        """Delete every key of `subject`, remembering their ids as shredded; returns those ids."""
        ...

    def shredded(self, key_id: str) -> bool:
        """Whether the key of that id was shredded."""
        ...

    def meta(self, name: str) -> bytes | None:
        """A small record of the store's own (the master key check)."""
        ...

    def set_meta(self, name: str, value: bytes) -> None: ...

    def close(self) -> None: ...


def sorted_keys(keys: list[WrappedKey]) -> list[WrappedKey]:
    return sorted(keys, key=lambda k: (k.created, k.key_id))


class MemoryKeyStore:
    """A `KeyStore` in this process's memory."""

    def __init__(self) -> None:
        self._keys: dict[str, WrappedKey] = {}
        self._shredded: set[str] = set()
        self._meta: dict[str, bytes] = {}
        self._lock = threading.Lock()

    @property
    def source(self) -> str:
        return "in-memory key store"

    def put(self, key: WrappedKey) -> None:
        check_hex(key.key_id, "key id")
        check_hex(key.subject, "subject")
        with self._lock:
            self._keys[key.key_id] = key

    def get(self, key_id: str) -> WrappedKey | None:
        return self._keys.get(check_hex(key_id, "key id"))

    def of_subject(self, subject: str) -> list[WrappedKey]:
        with self._lock:
            return sorted_keys([k for k in self._keys.values() if k.subject == subject])

    def all(self) -> Iterator[WrappedKey]:
        with self._lock:
            keys = list(self._keys.values())
        yield from keys

    def shred(self, subject: str) -> list[str]:
        with self._lock:
            ids = [k for k, v in self._keys.items() if v.subject == subject]
            for key_id in ids:
                del self._keys[key_id]
                self._shredded.add(key_id)
        return ids

    def shredded(self, key_id: str) -> bool:
        return check_hex(key_id, "key id") in self._shredded

    def meta(self, name: str) -> bytes | None:
        return self._meta.get(name)

    def set_meta(self, name: str, value: bytes) -> None:
        self._meta[name] = value

    def close(self) -> None:
        pass


class DirKeyStore:
    """A `KeyStore` in a folder: ``keys/<id>``, ``subjects/<subject>/<id>``, ``shredded/<id>``, ``meta/``.

    Each key is its own file written by an atomic rename; a subject's keys are
    marker files in its folder (created, never rewritten), so processes that
    add keys at once never lose one. Reads of the same process are cached.
    """

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True) -> None:
        """The store in `root`, made when missing unless `create` is False (a reader: nothing is written)."""
        self.root = Path(root)
        if not create:
            return
        try:
            for part in ("keys", "subjects", "shredded", "meta"):
                (self.root / part).mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise EncryptionKeyError(f"cannot be created or opened ({exc})", source=self.source) from None

    @property
    def source(self) -> str:
        return f"key store {self.root}"

    def _write(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        sync_dir(path.parent)

    def put(self, key: WrappedKey) -> None:
        check_hex(key.key_id, "key id")
        check_hex(key.subject, "subject")
        try:
            self._write(self.root / "keys" / key.key_id, _encode(key))
            folder = self.root / "subjects" / key.subject
            folder.mkdir(exist_ok=True, mode=0o700)
            marker = folder / key.key_id
            if not marker.exists():
                marker.touch(mode=0o600)
                sync_dir(folder)
        except OSError as exc:
            raise EncryptionKeyError(
                f"cannot store data key {key.key_id} ({exc})", source=self.source
            ) from None

    def get(self, key_id: str) -> WrappedKey | None:
        try:
            data = (self.root / "keys" / check_hex(key_id, "key id")).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise EncryptionKeyError(f"cannot read data key {key_id} ({exc})", source=self.source) from None
        try:
            return _decode(data)
        except msgspec.MsgspecError:
            raise EncryptionKeyError(
                f"the file of data key {key_id} is damaged", source=self.source
            ) from None

    def of_subject(self, subject: str) -> list[WrappedKey]:
        folder = self.root / "subjects" / check_hex(subject, "subject")
        try:
            ids = [p.name for p in folder.iterdir() if not p.name.startswith(".")]
        except FileNotFoundError:
            return []
        found = (self.get(key_id) for key_id in ids)
        return sorted_keys([k for k in found if k is not None])

    def all(self) -> Iterator[WrappedKey]:
        if not (self.root / "keys").is_dir():
            return
        for path in sorted((self.root / "keys").iterdir()):
            if not path.name.startswith("."):
                key = self.get(path.name)
                if key is not None:
                    yield key

    def shred(self, subject: str) -> list[str]:
        folder = self.root / "subjects" / check_hex(subject, "subject")
        try:
            ids = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
        except FileNotFoundError:
            return []
        try:
            for key_id in ids:
                (self.root / "shredded" / key_id).touch(mode=0o600)
            sync_dir(self.root / "shredded")
            for key_id in ids:
                _overwrite_and_unlink(self.root / "keys" / key_id)
            sync_dir(self.root / "keys")
            for key_id in ids:
                with contextlib.suppress(FileNotFoundError):
                    (folder / key_id).unlink()
            with contextlib.suppress(OSError):
                folder.rmdir()
            sync_dir(self.root / "subjects")
        except OSError as exc:
            raise EncryptionKeyError(
                f"cannot delete the data keys of a user ({exc})", source=self.source
            ) from None
        return ids

    def shredded(self, key_id: str) -> bool:
        return (self.root / "shredded" / check_hex(key_id, "key id")).exists()

    def meta(self, name: str) -> bytes | None:
        try:
            return (self.root / "meta" / _meta_name(name)).read_bytes()
        except FileNotFoundError:
            return None

    def set_meta(self, name: str, value: bytes) -> None:
        self._write(self.root / "meta" / _meta_name(name), value)

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"DirKeyStore({str(self.root)!r})"


def _meta_name(name: str) -> str:
    if not name or not all(c.isalnum() or c == "-" for c in name):
        raise EncryptionKeyError(f"{name[:70]!r} is not a record name", source="key store")
    return name


def _overwrite_and_unlink(path: Path) -> None:
    """Overwrite a key file's bytes in place, then unlink it (best effort against undelete)."""
    try:
        size = path.stat().st_size
        with open(path, "r+b") as out:
            out.write(b"\0" * size)
            out.flush()
            os.fsync(out.fileno())
        path.unlink()
    except FileNotFoundError:
        pass
