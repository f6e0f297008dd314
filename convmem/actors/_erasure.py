"""Erasure notices: how every process holding a session learns that it was erased, naming nobody.

An erasure removes a session's events and snapshot from the store; a process
that has the session live still holds its state in memory. The log that
erased it tells every process watching it (`ErasureWatch`) with an
`ErasureNotice`, and each `MemorySystem` drops the live sessions it matches.

A notice carries no id in clear: only keyed BLAKE2b digests of the erased
keys (or of the erased user's tenant and user ids), keyed with a random salt
drawn for that notice. A process checks its own live keys against them; a
reader of the notice learns nothing it could not confirm by guessing the
ids themselves.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import msgspec

from convmem.events import MemoryKey

__all__ = ["ErasureNotice", "ErasureWatch", "KeyShredder", "Unwatch"]

_SALT_BYTES = 16
_DIGEST_BYTES = 16
_encode_parts = msgspec.msgpack.Encoder().encode


def _digest(salt: bytes, *parts: str) -> bytes:
    # The parts are length-prefixed (msgpack), so no two id tuples hash alike by concatenation.
    return hashlib.blake2b(_encode_parts(parts), key=salt, digest_size=_DIGEST_BYTES).digest()


class ErasureNotice(msgspec.Struct, frozen=True, kw_only=True):
    """Which sessions were erased, as digests keyed with `salt`; `users`: every session of a user;
    `tenants`: the tenants they belong to (empty in a notice of an earlier convmem: any tenant);
    `tallied`: the eraser took the bytes it erased off the tenants' shared byte tallies itself, or
    erased none (False, as in a notice of an earlier convmem: their byte counts are out of date)."""

    salt: bytes
    sessions: tuple[bytes, ...] = ()
    users: tuple[bytes, ...] = ()
    tenants: tuple[bytes, ...] = ()
    tallied: bool = False

    @classmethod
    def of_sessions(cls, keys: Iterable[MemoryKey], *, tallied: bool = False) -> ErasureNotice:
        """A notice for these sessions, under a fresh random salt."""
        salt, keys = os.urandom(_SALT_BYTES), tuple(keys)
        return cls(
            salt=salt,
            sessions=tuple(_digest(salt, k.tenant_id, k.user_id, k.session_id) for k in keys),
            tenants=tuple({_digest(salt, k.tenant_id) for k in keys}),
            tallied=tallied,
        )

    @classmethod
    def of_user(cls, tenant_id: str, user_id: str, *, tallied: bool = False) -> ErasureNotice:
        """A notice for every session of one user, under a fresh random salt."""
        salt = os.urandom(_SALT_BYTES)
        return cls(
            salt=salt,
            users=(_digest(salt, tenant_id, user_id),),
            tenants=(_digest(salt, tenant_id),),
            tallied=tallied,
        )

    def may_be_of(self, tenant_id: str) -> bool:
        """Whether the erased sessions may belong to `tenant_id` (always, when the notice names none)."""
        return not self.tenants or _digest(self.salt, tenant_id) in self.tenants

    def matches(self, key: MemoryKey) -> bool:
        """Whether `key` is one of the erased sessions."""
        if self.sessions and _digest(self.salt, key.tenant_id, key.user_id, key.session_id) in self.sessions:
            return True
        return bool(self.users) and _digest(self.salt, key.tenant_id, key.user_id) in self.users

    def encode(self) -> bytes:
        """The notice as bytes (msgpack), for a log that sends it to other processes."""
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> ErasureNotice:
        """A notice from `encode`'s bytes; `msgspec.DecodeError` when they are not one."""
        return msgspec.msgpack.decode(data, type=cls)


Unwatch = Callable[[], None]


@runtime_checkable
class KeyShredder(Protocol):
    """An `EventLog` that encrypts each user's events with keys of their own (optional capability).

    `shred_user(tenant_id, user_id)` deletes the user's keys: from then on
    every copy of their encrypted events and snapshots, wherever it is, reads
    as erased. An erasure of a user calls it first. Returns the ids of the
    keys deleted (none when the user had none).
    """

    def shred_user(self, tenant_id: str, user_id: str) -> list[str]: ...


@runtime_checkable
class ErasureWatch(Protocol):
    """An `EventLog` that tells every process using it of erasures (optional capability).

    `watch_erasures(on_notice)` calls `on_notice` with each `ErasureNotice`
    of an erasure made through any handle on the same log, this process's
    included, soon after that erasure returned. It calls ``on_notice(None)``
    when notices may have been missed (a reconnection): the watcher must then
    treat every session it holds as possibly erased. `on_notice` must be
    quick and must not block (it may run on the log's event loop). Returns a
    function that stops the watch.

    `announce(notice)` tells every watcher of an erasure made outside the
    log's own `erase` (the erasure steps repeat it, so a process killed
    before the log told anyone is made up for when the erasure is finished).
    """

    def watch_erasures(self, on_notice: Callable[[ErasureNotice | None], None]) -> Unwatch: ...

    def announce(self, notice: ErasureNotice) -> None: ...
