"""Exactly-once for an idempotency key, for as long as the session's events exist.

The log's duplicate window (``Nats-Msg-Id``) catches a retry only while it
remembers the id (two minutes by default). The session remembers longer: its
fold keeps the idempotency keys of its last
`ShortTermMemoryConfig.idempotency_horizon` writes made with one, and
`decide` answers a repeat of any of them with no events, however long after
the first try, in whichever process replays the session.

The key travels inside the event ids: a write made with the caller's key
``K`` on session ``(t, u, s)`` has the command id ``{t}.{u}.{s}/K`` (the key's
subject tokens, see `command_id_for`), and its events the ids
``{command id}/{tag}/{n}`` (`EventIds`). So nothing is added to the events:
the fold reads the key back from the id of each event whose id starts with
the session's own prefix. Writes without a key (random command ids) and
events copied from another session (a fork) are not remembered; the state
holds only the keys, without their prefix, oldest first.
"""

from __future__ import annotations

import functools

from convmem.events import MemoryKey

__all__ = ["already_applied", "command_id_for", "key_prefix", "remember_key", "remember_keys"]


@functools.lru_cache(maxsize=4096)
def key_prefix(key: MemoryKey | None) -> str:
    """What every keyed command id of `key`'s session starts with ("" before the session has a key)."""
    if key is None:
        return ""
    return ".".join(key.tokens()) + "/"


def command_id_for(key: MemoryKey, idempotency_key: str) -> str:
    """The command id of a write made on `key`'s session with the caller's `idempotency_key`."""
    return key_prefix(key) + idempotency_key


def idempotency_key_of(event_id: str, prefix: str) -> str | None:
    """The caller's idempotency key inside an event id of the session with `prefix`, if it has one."""
    if not prefix or not event_id.startswith(prefix):
        return None
    command = event_id.rpartition("/")[0].rpartition("/")[0]
    if len(command) <= len(prefix):
        return None  # not an id of the ``{command id}/{tag}/{n}`` shape
    return command[len(prefix) :]


def remember_key(keys: tuple[str, ...], event_id: str, prefix: str, horizon: int) -> tuple[str, ...]:
    """`keys` after an event with `event_id`: its idempotency key appended (once per write), the oldest
    dropped past `horizon`; the same tuple when the event carries no key."""
    key = idempotency_key_of(event_id, prefix)
    if key is None or (keys and keys[-1] == key):
        return keys  # no key, or the next event of the same write
    if horizon <= 0:
        return ()
    kept = (*keys, key)
    return kept[len(kept) - horizon :] if len(kept) > horizon else kept


def remember_keys(keys: tuple[str, ...], event_ids: list[str], prefix: str, horizon: int) -> tuple[str, ...]:
    """`remember_key` over several events at once: one copy of the tuple, and only the events
    within the horizon read (from the newest back), however long the run."""
    if horizon <= 0:
        return ()
    newest_first: list[str] = []
    newer = None
    for event_id in reversed(event_ids):
        key = idempotency_key_of(event_id, prefix)
        if key is None or key == newer:
            continue  # no key, or another event of the same write
        newest_first.append(key)
        newer = key
        if len(newest_first) == horizon:
            return tuple(reversed(newest_first))
    if newest_first and keys and newest_first[-1] == keys[-1]:
        newest_first.pop()  # the run goes on with the write the state remembers last
    if not newest_first:
        return keys
    kept = (*keys, *reversed(newest_first))
    return kept[len(kept) - horizon :] if len(kept) > horizon else kept


def already_applied(keys: tuple[str, ...], key: MemoryKey | None, command_id: str) -> bool:
    """Whether `command_id` is a keyed write the session remembers having stored."""
    if not keys:
        return False
    prefix = key_prefix(key)
    return bool(prefix) and command_id.startswith(prefix) and command_id[len(prefix) :] in keys
