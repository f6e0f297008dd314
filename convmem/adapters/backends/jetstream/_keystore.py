"""`NatsKeyStore`: the data keys of encryption at rest in a JetStream key-value bucket.

For processes that share a NATS deployment (the embedded default keeps its
keys in a folder instead, `DirKeyStore`). KV keys: ``key.<id>`` (a wrapped
data key), ``subj.<subject>.<id>`` (which keys a user has), ``shredded.<id>``
and ``meta.<name>``. Deleting a key erases its message with
``STREAM.MSG.DELETE``, which overwrites the bytes on the server's disk.

Each ``key.<id>`` names its subject, and those entries are the truth: the
``subj.`` entries are an index, and `shred` reads every ``key.`` entry (in
batches) so an index entry that is gone hides no key; an entry the server
counts but cannot serve, or that does not decode, is named in the error
`shred` raises once it has deleted the rest (see `convmem.adapters.backends.keys`).

The bucket must be kept out of every mirror, source and backup of the events
stream: a copy of it taken with the events keeps the keys that erasure
deletes, and so the erased text readable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import msgspec
import nats.js.errors

from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.backends.jetstream._read import fetch_batch
from convmem.adapters.backends.jetstream._setup import (
    bucket_config,
    check_names,
    create_stream,
    setup_wait,
    stream_config_of,
)
from convmem.adapters.backends.keys import (
    DamagedKey,
    KeyScan,
    WrappedKey,
    check_hex,
    is_hex_id,
    parse_key,
    shred_plan,
    shred_uncertain,
    sorted_keys,
)
from convmem.errors import ConvmemError, EncryptionKeyError

__all__ = ["DEFAULT_KEY_BUCKET", "NatsKeyStore"]

DEFAULT_KEY_BUCKET = "CONVMEM_KEYS"
_NO_MESSAGE = 10057
_T = TypeVar("_T")
_encode = msgspec.msgpack.Encoder().encode


class NatsKeyStore:
    """A `KeyStore` in a JetStream key-value bucket (made when missing)."""

    def __init__(
        self, connection: NatsConnection, *, bucket: str = DEFAULT_KEY_BUCKET, replicas: int = 1
    ) -> None:
        check_names(bucket=bucket)
        connection.lease()
        self._conn = connection
        self._bucket = bucket
        self._stream = f"KV_{bucket}"
        self._closed = False
        self._lock = threading.Lock()
        self._unindexed: dict[str, set[str]] | None = None
        """Per subject, the keys without an index entry when this object read every key."""
        try:
            self._call(
                lambda: self._ensure(replicas), f"checking bucket {bucket!r}", timeout=setup_wait(connection)
            )
        except BaseException:
            connection.release()
            raise

    async def _ensure(self, replicas: int) -> None:
        found = await stream_config_of(self._conn, self._stream)
        if found is None:
            if await create_stream(self._conn, bucket_config(self._bucket, replicas=replicas)):
                return
            found = await stream_config_of(self._conn, self._stream)  # made by another process meanwhile
        if found is None or found.get("deny_delete"):
            raise EncryptionKeyError(
                "the bucket denies message deletes, so no data key could be erased from it: give "
                "convmem a bucket of its own (it makes one when missing)",
                source=self.source,
            )

    @property
    def source(self) -> str:
        return f"key store NATS bucket {self._bucket}"

    def _subject(self, name: str) -> str:
        return f"$KV.{self._bucket}.{name}"

    def where(self, key_id: str) -> str:
        return f"entry key.{key_id} of NATS bucket {self._bucket}"

    def _call(
        self, fn: Callable[[], Coroutine[Any, Any, _T]], what: str, *, timeout: float | None = None
    ) -> _T:
        try:
            return self._conn.call(fn, what=what, timeout=timeout)
        except EncryptionKeyError:
            raise
        except (ConvmemError, nats.js.errors.Error) as exc:
            raise EncryptionKeyError(f"{what} failed ({exc})", source=self.source) from exc

    async def _get(self, name: str) -> bytes | None:
        message = await self._conn.get_message(self._stream, {"last_by_subj": self._subject(name)})
        if message is None or message.headers.get("KV-Operation") in ("DEL", "PURGE"):
            return None
        return message.data

    async def _erase(self, name: str) -> None:
        """Erase the message of `name` (its bytes overwritten by the server)."""
        while True:
            message = await self._conn.get_message(self._stream, {"last_by_subj": self._subject(name)})
            if message is None:
                return
            try:
                await self._conn.api(f"$JS.API.STREAM.MSG.DELETE.{self._stream}", {"seq": message.seq})
            except nats.js.errors.APIError as exc:
                if exc.err_code != _NO_MESSAGE:
                    raise

    async def _put(self, name: str, data: bytes) -> None:
        """`name` holds `data` only: the message it replaces is erased first, not left in a block."""
        await self._erase(name)
        await self._conn.js.publish(self._subject(name), data)

    async def _names(self, pattern: str) -> list[str]:
        names: list[str] = []
        skip = len(self._subject(""))
        while True:
            info = await self._conn.api(
                f"$JS.API.STREAM.INFO.{self._stream}",
                {"subjects_filter": self._subject(pattern), "offset": len(names)},
            )
            page = info["state"].get("subjects") or {}
            names.extend(s[skip:] for s in page)
            if not page or len(names) >= int(info.get("total", 0)):
                return sorted(names)

    def put(self, key: WrappedKey) -> None:
        check_hex(key.key_id, "key id")
        check_hex(key.subject, "subject")

        async def put() -> None:
            await self._put(f"key.{key.key_id}", _encode(key))
            if await self._get(f"subj.{key.subject}.{key.key_id}") is None:
                await self._conn.js.publish(self._subject(f"subj.{key.subject}.{key.key_id}"), b"")

        self._call(put, f"storing data key {key.key_id}")

    def get(self, key_id: str) -> WrappedKey | None:
        name = f"key.{check_hex(key_id, 'key id')}"
        data = self._call(lambda: self._get(name), f"reading data key {key_id}")
        if data is None:
            return None
        key = parse_key(key_id, data)
        if isinstance(key, str):
            raise EncryptionKeyError(f"{self.where(key_id)} is damaged: {key}", source=self.source)
        return key

    def _ids(self, subject: str) -> set[str]:
        pattern = f"subj.{check_hex(subject, 'subject')}.*"
        return {
            n.rsplit(".", 1)[1] for n in self._call(lambda: self._names(pattern), "listing a user's keys")
        }

    def of_subject(self, subject: str) -> list[WrappedKey]:
        found = (self.get(key_id) for key_id in self._ids(subject) | self._unindexed_of(subject))
        return sorted_keys([k for k in found if k is not None and k.subject == subject])

    def _unindexed_of(self, subject: str) -> set[str]:
        """The keys of `subject` without an index entry: every key is read on the first call."""
        with self._lock:
            if self._unindexed is None:
                indexed = set(self._call(lambda: self._names("subj.*.*"), "listing the keys' index"))
                unindexed: dict[str, set[str]] = {}
                for key in self.scan().keys:
                    if f"subj.{key.subject}.{key.key_id}" not in indexed:
                        unindexed.setdefault(key.subject, set()).add(key.key_id)
                self._unindexed = unindexed
            return set(self._unindexed.get(subject, ()))

    def all(self) -> Iterator[WrappedKey]:
        for name in self._call(lambda: self._names("key.*"), "listing data keys"):
            key = self.get(name[len("key.") :])
            if key is not None:
                yield key

    async def _entries(self, pattern: str) -> tuple[dict[str, bytes], list[str]]:
        """The data of every entry matching `pattern` (deleted ones left out), and the names of
        those the server counts but does not serve (damaged on its disk)."""
        served: dict[str, bytes | None] = {}
        skip = len(self._subject(""))
        counted = await self._names(pattern)
        start = 1
        while True:
            batch = await fetch_batch(
                self._conn, self._stream, self._subject(pattern), start=start, batch=1000
            )
            for message in batch.messages:
                deleted = message.headers.get("KV-Operation") in ("DEL", "PURGE")
                served[message.subject[skip:]] = None if deleted else message.data
            if batch.pending == 0 or not batch.messages:
                break
            start = batch.messages[-1].seq + 1
        unserved: list[str] = []
        for name in counted:
            if name not in served and await self._names(name):  # (not erased meanwhile)
                unserved.append(name)
        return {name: data for name, data in served.items() if data is not None}, unserved

    def scan(self) -> KeyScan:
        entries, unserved = self._call(lambda: self._entries("key.*"), "reading every data key")
        keys: list[WrappedKey] = []
        damaged: list[DamagedKey] = []
        for name, data in sorted(entries.items()):
            key_id = name[len("key.") :]
            key = parse_key(key_id, data) if is_hex_id(key_id) else "its name is not a data key id"
            if isinstance(key, str):
                damaged.append(DamagedKey(self.where(key_id), key_id if is_hex_id(key_id) else None, key))
            else:
                keys.append(key)
        for name in unserved:
            key_id = name[len("key.") :]
            damaged.append(
                DamagedKey(
                    self.where(key_id),
                    key_id if is_hex_id(key_id) else None,
                    "the server counts it but cannot serve it (damaged on its disk)",
                )
            )
        return KeyScan(keys, damaged)

    def shred(self, subject: str) -> list[str]:
        ids, uncertain = shred_plan(subject, self._ids(subject), self.scan(), self.where)

        async def shred() -> None:
            for key_id in ids:
                await self._put(f"shredded.{key_id}", b"")
            for key_id in ids:
                await self._erase(f"key.{key_id}")
                await self._erase(f"subj.{subject}.{key_id}")

        self._call(shred, "deleting a user's data keys")
        with self._lock:
            if self._unindexed is not None:
                self._unindexed.pop(subject, None)
        if uncertain:
            raise shred_uncertain(self.source, uncertain, ids)
        return ids

    def shredded(self, key_id: str) -> bool:
        name = f"shredded.{check_hex(key_id, 'key id')}"
        return self._call(lambda: self._get(name), "reading the shredded keys") is not None

    def meta(self, name: str) -> bytes | None:
        return self._call(lambda: self._get(f"meta.{name}"), "reading the key store's check")

    def set_meta(self, name: str, value: bytes) -> None:
        self._call(lambda: self._put(f"meta.{name}", value), "writing the key store's check")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._conn.release()

    def __repr__(self) -> str:
        return f"NatsKeyStore({self._bucket!r})"
