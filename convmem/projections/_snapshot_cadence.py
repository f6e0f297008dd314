"""When a live session saves a snapshot: a pure rule of its key and its version.

A session saves one each time its version (the seq of its last event) passes
``n * snapshot_every + offset``, where ``offset`` (`snapshot_offset`) is a
number in ``[0, snapshot_every)`` drawn from a stable hash (BLAKE2b) of the
session's key. Sessions started together with identical turns therefore save
at different versions instead of all at once (a "snapshot storm" that held
many actors' threads at the same moment), while each session still saves every
``snapshot_every`` events: two saves are never further apart than that, and
the rule depends only on the key and the version, so it is the same in every
process and after every restart (no randomness, no Python ``hash()``).

The runtime carries the decision out (`SessionActor` saves through
`SessionStorage`); the decision itself is here.
"""

from __future__ import annotations

import functools
import hashlib

from convmem.events import MemoryKey

__all__ = ["snapshot_due", "snapshot_offset"]


@functools.lru_cache(maxsize=16384)
def snapshot_offset(key: MemoryKey, every: int) -> int:
    """`key`'s place in ``[0, every)`` on the snapshot cadence: the same in every process and run.

    Remembered for the most recent keys: `snapshot_due` asks on every write, and
    a live session's key does not change (the hash was some 1.5 µs of each write).
    """
    if every <= 1:
        return 0
    digest = hashlib.blake2b(
        "\x00".join((key.tenant_id, key.user_id, key.session_id)).encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big") % every


def snapshot_due(key: MemoryKey, every: int, before: int, after: int) -> bool:
    """Whether a session going from version `before` to `after` passed one of its snapshot points
    (the versions ``n * every + snapshot_offset(key, every)``, n >= 1 when the offset is 0)."""
    offset = snapshot_offset(key, every)
    return (after - offset) // every > (before - offset) // every
