"""Key stores: where wrapped data keys live, apart from the events they open.

A data key is stored wrapped by the master key (`WrappedKey`), under a
random 8-byte id that every event it sealed carries. Keys are grouped by
`subject`: a hash of the (tenant, user) they belong to, so the store names
no user. `shred(subject)` deletes every key of a subject and keeps only the
ids it deleted (random numbers, no personal data) in a shredded list, so a
reader tells an erased user's event (shown as erased) from a key store that
lost a key it should have (an error).

Each stored key names its own subject, and those records are the truth: the
folder and bucket stores also keep an index (which keys a subject has), but
an index entry can be lost or damaged, so `shred` reads every stored key
(`scan`) and deletes each one that names the subject as well as each one the
index gives it. A stored key that cannot be read (so whose it is cannot be
told), or that the index gives to a subject other than the one it names,
makes `shred` delete what it can and then raise `EncryptionKeyError` naming
it (`shred_uncertain`): an erasure is never reported done while a key of the
user may be left. `of_subject` reads every key once per store object too, so
a key whose index entry is missing is still found.

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec

from convmem.adapters.backends.keys._master import sync_dir
from convmem.errors import EncryptionKeyError

__all__ = [
    "CHECK_META",
    "DamagedKey",
    "DirKeyStore",
    "KeyScan",
    "KeyStore",
    "MemoryKeyStore",
    "WrappedKey",
    "check_hex",
    "is_hex_id",
    "parse_key",
    "shred_plan",
    "shred_uncertain",
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


class DamagedKey(msgspec.Struct, frozen=True):
    """A stored data key that cannot be used: `where` it is, its id when known, and the `problem`."""

    where: str
    """The file or bucket entry (``data key file /data/keys/keys/0a1b...``)."""
    key_id: str | None
    problem: str


class KeyScan(msgspec.Struct, frozen=True):
    """Every data key a store holds: those that read (`keys`) and those that do not (`damaged`)."""

    keys: list[WrappedKey]
    damaged: list[DamagedKey]


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(WrappedKey).decode


def parse_key(name: str, data: bytes) -> WrappedKey | str:
    """The key stored as `data` under id `name`, or what is wrong with it."""
    try:
        key = _decode(data)
    except msgspec.MsgspecError as exc:
        return f"not a data key record ({exc})"
    if key.key_id != name:
        return f"it holds data key {key.key_id[:70]!r}, not {name}"
    try:
        check_hex(key.subject, "subject")
    except EncryptionKeyError:
        return f"its subject {key.subject[:70]!r} is not a hex id"
    return key


def shred_plan(
    subject: str, indexed: set[str], scan: KeyScan, where: Callable[[str], str]
) -> tuple[list[str], list[DamagedKey]]:
    """What `shred(subject)` deletes (sorted ids) and the damaged keys that may be the subject's.

    `indexed`: the ids the store's index gives `subject`; `where`: the store's `KeyStore.where`.

    Deleted: every key that names `subject`, and every id the index gives it whose key does
    not read (damaged or already gone). Uncertain: a key that does not read and that the index
    does not give `subject` (whose it is cannot be told), and a key the index gives `subject`
    while it names another.
    """
    named = {k.key_id: k.subject for k in scan.keys}
    ids = {k.key_id for k in scan.keys if k.subject == subject}
    uncertain: list[DamagedKey] = []
    for key_id in sorted(indexed):
        owner = named.get(key_id)
        if owner is None:
            ids.add(key_id)
        elif owner != subject:
            uncertain.append(
                DamagedKey(
                    where=where(key_id),
                    key_id=key_id,
                    problem="the index gives it to this user but the key names another (either is damaged)",
                )
            )
    uncertain.extend(d for d in scan.damaged if d.key_id is None or d.key_id not in indexed)
    return sorted(ids), uncertain


def shred_uncertain(source: str, uncertain: list[DamagedKey], deleted: list[str]) -> EncryptionKeyError:
    """The error of a `shred` that deleted `deleted` but cannot tell whether `uncertain` are the user's."""
    named = "; ".join(f"{d.where}: {d.problem}" for d in uncertain[:5])
    if len(uncertain) > 5:
        named += f"; and {len(uncertain) - 5} more"
    return EncryptionKeyError(
        f"cannot tell whether every data key of the user was deleted ({len(deleted)} deleted), as "
        f"{len(uncertain)} stored key(s) cannot be read or disagree with the index: {named}. Restore "
        "each from a backup of the key store (or delete it, which leaves the events it sealed "
        "unreadable) and try again",
        source=source,
    )


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
        """Every key stored (a rotation rewraps them all); `EncryptionKeyError` at a damaged one."""
        ...

    def scan(self) -> KeyScan:
        """Every key stored, those that cannot be read listed apart (`DamagedKey`) rather than raised."""
        ...

    def where(self, key_id: str) -> str:
        """Where the key of that id is stored, for messages (``data key file /data/keys/keys/<id>``)."""
        ...

    def shred(self, subject: str) -> list[str]:
        """Delete every key of `subject`, remembering their ids as shredded; returns those ids.

        Every key that names `subject` is deleted, whatever an index says; a stored key
        that cannot be read is deleted when the index gives it to `subject`, and otherwise
        makes `shred` raise `EncryptionKeyError` naming it (`shred_uncertain`) once it
        has deleted the rest.
        """
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

    def scan(self) -> KeyScan:
        return KeyScan(list(self.all()), [])

    def where(self, key_id: str) -> str:
        return f"data key {key_id} (in memory)"

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

    Each key is its own file written by an atomic rename, and names its
    subject; ``subjects/`` is an index of them: a subject's keys are marker
    files in its folder (created, never rewritten), so processes that add
    keys at once never lose one. The key files are the truth: `shred` reads
    them all, and `of_subject` reads them once per store object, so a lost
    marker hides no key.
    """

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True) -> None:
        """The store in `root`, made when missing unless `create` is False (a reader: nothing is written)."""
        self.root = Path(root)
        self._lock = threading.Lock()
        self._unindexed: dict[str, set[str]] | None = None
        """Per subject, the keys whose marker was missing when this object read every key file."""
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

    def where(self, key_id: str) -> str:
        return f"data key file {self.root / 'keys' / key_id}"

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
        path = self.root / "keys" / check_hex(key_id, "key id")
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise EncryptionKeyError(
                f"cannot read {self.where(key_id)} ({exc.strerror or exc})", source=self.source
            ) from None
        key = parse_key(key_id, data)
        if isinstance(key, str):
            raise EncryptionKeyError(f"{self.where(key_id)} is damaged: {key}", source=self.source)
        return key

    def _indexed(self, subject: str) -> set[str]:
        """The ids the index gives `subject` (marker names that are not ids are not keys of convmem's)."""
        folder = self.root / "subjects" / check_hex(subject, "subject")
        try:
            names = [p.name for p in folder.iterdir()]
        except FileNotFoundError:
            return set()
        except OSError as exc:
            raise EncryptionKeyError(
                f"cannot list {folder} ({exc.strerror or exc})", source=self.source
            ) from None
        return {n for n in names if is_hex_id(n)}

    def of_subject(self, subject: str) -> list[WrappedKey]:
        ids = self._indexed(subject) | self._unindexed_of(subject)
        found = (self.get(key_id) for key_id in ids)
        return sorted_keys([k for k in found if k is not None and k.subject == subject])

    def _unindexed_of(self, subject: str) -> set[str]:
        """The keys of `subject` without a marker: every key file is read on the first call."""
        with self._lock:
            if self._unindexed is None:
                unindexed: dict[str, set[str]] = {}
                for key in self.scan().keys:
                    if not (self.root / "subjects" / key.subject / key.key_id).exists():
                        unindexed.setdefault(key.subject, set()).add(key.key_id)
                self._unindexed = unindexed
            return set(self._unindexed.get(subject, ()))

    def all(self) -> Iterator[WrappedKey]:
        if not (self.root / "keys").is_dir():
            return
        for path in sorted((self.root / "keys").iterdir()):
            if not path.name.startswith("."):
                key = self.get(path.name)
                if key is not None:
                    yield key

    def scan(self) -> KeyScan:
        folder = self.root / "keys"
        try:
            names = sorted(name for name in os.listdir(folder) if not name.startswith("."))
        except FileNotFoundError:
            return KeyScan([], [])
        except OSError as exc:
            raise EncryptionKeyError(
                f"cannot list {folder} ({exc.strerror or exc})", source=self.source
            ) from None
        keys: list[WrappedKey] = []
        damaged: list[DamagedKey] = []
        for name in names:
            where = f"data key file {folder / name}"
            key_id = name if is_hex_id(name) else None
            if key_id is None:
                damaged.append(DamagedKey(where, None, "its name is not a data key id"))
                continue
            try:
                data = (folder / name).read_bytes()
            except FileNotFoundError:
                continue  # shredded meanwhile
            except OSError as exc:
                damaged.append(DamagedKey(where, key_id, f"cannot be read ({exc.strerror or exc})"))
                continue
            key = parse_key(key_id, data)
            if isinstance(key, str):
                damaged.append(DamagedKey(where, key_id, key))
            else:
                keys.append(key)
        return KeyScan(keys, damaged)

    def shred(self, subject: str) -> list[str]:
        folder = self.root / "subjects" / check_hex(subject, "subject")
        ids, uncertain = shred_plan(subject, self._indexed(subject), self.scan(), self.where)
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
        with self._lock:
            if self._unindexed is not None:
                self._unindexed.pop(subject, None)
        if uncertain:
            raise shred_uncertain(self.source, uncertain, ids)
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


def is_hex_id(name: str) -> bool:
    """Whether `name` is a hex id as `check_hex` takes it (a key id, a subject)."""
    return 0 < len(name) <= 64 and all(c in "0123456789abcdef" for c in name)


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
