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

A snapshot holds the session's live turns, so its size grows with them while
one event stays one turn: with `recommended()`'s 1,000 live turns a save every
50 events wrote some 12 KB of snapshot a turn (20 times the turn's own event)
and took a quarter of a write's CPU. So the cadence stretches with the live
turns (`snapshot_interval`): a session with ``L`` live turns saves at most about
every ``L / LIVE_TURNS_PER_SAVE_EVENT`` events (`snapshot_every` doubled until it
reaches that), which keeps the snapshot bytes written per event within a few
events' worth; a load then reads fewer events past its snapshot than the
snapshot holds turns. The doubled cadence's points are a subset of the plain
one's (the offset stays in ``[0, snapshot_every)``), so a session whose live
turns grow saves on the same points as before, only fewer of them.

The runtime carries the decision out (`SessionActor` saves through
`SessionStorage`); the decision itself is here.
"""

from __future__ import annotations

import functools
import hashlib

from convmem.events import MemoryKey

__all__ = ["LIVE_TURNS_PER_SAVE_EVENT", "snapshot_due", "snapshot_interval", "snapshot_offset"]

LIVE_TURNS_PER_SAVE_EVENT = 4
"""A session keeps at least this many live turns for each event between two of its saves (see above)."""


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


def snapshot_interval(every: int, live_turns: int = 0) -> int:
    """Events between two saves of a session holding `live_turns` turns: `every`, doubled until a
    save comes at most once per `LIVE_TURNS_PER_SAVE_EVENT` live turns."""
    interval = every
    while interval * LIVE_TURNS_PER_SAVE_EVENT < live_turns:
        interval *= 2
    return interval


def snapshot_due(key: MemoryKey, every: int, before: int, after: int, live_turns: int = 0) -> bool:
    """Whether a session going from version `before` to `after` passed one of its snapshot points
    (the versions ``n * interval + snapshot_offset(key, every)``, n >= 1 when the offset is 0, where
    ``interval`` is `snapshot_interval` of `every` and the `live_turns` the session holds after)."""
    offset = snapshot_offset(key, every)
    interval = snapshot_interval(every, live_turns)
    return (after - offset) // interval > (before - offset) // interval
