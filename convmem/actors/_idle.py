"""`IdleCache`: the sessions whose actor left, kept as their state and served view, bounded in bytes.

A session past the live bound (or idle for `idle_seconds`) loses its actor,
not its memory: its `StateCell` (the latest acknowledged state, immutable, and
the context view built from it) moves here. A read of a cached session is
served from the cell with no actor; a write starts an actor from the cell
with no read of the log. Optimistic concurrency stays the safety net: the
write appends after the cached state's seq, and if another process wrote
meanwhile the log refuses it, the session rereads the log and decides again.

The cache is bounded by an estimate of the memory its entries hold
(`idle_bytes`); past the bound the least recently used entries of the tenant
whose entries hold the most bytes go (`convmem.actors._fair`: one tenant
filling the cache evicts its own cells, not another tenant's), and their
sessions come back from their snapshot and the log's tail. The estimate is an
encode of the whole state (about 200 µs for 1,000 live turns), so a session
evicted past the live bound is counted after the live set's lock is let go
(`measure`, then `counted`); its last count stands in meanwhile. Everything that
makes a cached state wrong drops its entry: erasure (here or in another
process), an explicit passivation, a fork into the key, closing the system.

Not thread-safe on its own: `LiveSessions` calls it under its lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from convmem.actors._fair import Heaviest
from convmem.actors._session import StateCell
from convmem.events import MemoryKey
from convmem.projections import SessionState, encode_state

__all__ = [
    "DEFAULT_IDLE_CACHE_BYTES",
    "IdleCache",
    "Measured",
    "idle_bytes",
    "measure",
    "state_bytes",
    "view_bytes",
]

DEFAULT_IDLE_CACHE_BYTES = 512 * 1024 * 1024
"""512 MiB: about 25,000 idle sessions of 20 turns of 150 + 380 characters (about 21 KB each)."""

_CELL_BYTES = 1024
"""The cell, the cache's entry and its key, with the dict and list slots that hold them."""
_VIEW_BYTES = 512
"""A context view's outer dicts."""
_VIEW_ITEM_BYTES = 320
"""Each turn a view shows: its dict (the texts themselves are the state's strings, shared)."""


def state_bytes(state: SessionState) -> int:
    """An upper estimate of the memory `state` holds: 1.5 times its encoded size.

    Python keeps an ASCII text in about its encoded length plus a 49-byte
    header, and the structs, floats and tuples around each turn take about half
    as much again as the turn's encoding; non-ASCII text takes 2 or 4 bytes a
    character where UTF-8 takes 2 to 4, so the estimate is high there
    (`tests/test_idle_cache.py` holds it between the measured size and twice it).
    """
    return len(encode_state(state)) * 3 // 2


def view_bytes(view: dict[str, Any] | None) -> int:
    """An estimate of the memory a context view holds beyond the state it shows."""
    if not view:
        return 0
    memory = view.get("conversation_memory", {})
    items = sum(len(v) for v in memory.values() if isinstance(v, list)) if isinstance(memory, dict) else 0
    return _VIEW_BYTES + _VIEW_ITEM_BYTES * items


def idle_bytes(cell: StateCell) -> int:
    """What keeping `cell` in the cache costs, as `IdleCache` counts it."""
    return measure(cell).size


class Measured:
    """`idle_bytes` of a cell's state and view as they were when it was counted."""

    __slots__ = ("size", "state", "view")

    def __init__(
        self, state: SessionState, view: tuple[SessionState, dict[str, Any]] | None, size: int
    ) -> None:
        self.state = state
        self.view = view
        self.size = size


def measure(cell: StateCell) -> Measured:
    """Count what keeping `cell` costs (an encode of its state: call it outside the live set's lock)."""
    state, view = cell.state, cell.view
    size = _CELL_BYTES + state_bytes(state) + (view_bytes(view[1]) if view is not None else 0)
    return Measured(state, view, size)


class _Entry:
    __slots__ = ("cell", "size", "state", "view")

    def __init__(self, cell: StateCell, measured: Measured | None) -> None:
        self.cell = cell
        if measured is None:  # counted later (`IdleCache.counted`); its last count stands in till then
            self.state: SessionState | None = None
            self.view: tuple[SessionState, dict[str, Any]] | None = None
            self.size = cell.counted_bytes
        else:
            self.size = 0
            self.count(measured)

    def count(self, measured: Measured) -> int:
        """Take `measured` as the entry's count (and its cell's last); returns how much the count grew."""
        grew = measured.size - self.size
        self.state, self.view, self.size = measured.state, measured.view, measured.size
        self.cell.counted_bytes = measured.size
        return grew


class IdleCache:
    """Cells of sessions without an actor, least recently used first, at most `max_bytes` of them."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        """The estimated memory the entries hold now (`idle_bytes` of each)."""
        self._entries: OrderedDict[MemoryKey, _Entry] = OrderedDict()
        self._tenants: dict[str, OrderedDict[MemoryKey, None]] = {}
        """Each tenant's keys, least recently used first (what `_trim` gives up first)."""
        self._weights = Heaviest()
        """What each tenant's entries hold (the sum of their `idle_bytes`), heaviest first on demand."""

    def tenant_bytes(self, tenant_id: str) -> int:
        """The estimated memory `tenant_id`'s entries hold now."""
        return self._weights.weights.get(tenant_id, 0)

    def _grow(self, key: MemoryKey, grew: int) -> None:
        self.bytes += grew
        self._weights.add(key.tenant_id, grew)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: MemoryKey) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[MemoryKey]:
        return iter(list(self._entries))

    def put(self, key: MemoryKey, cell: StateCell, measured: Measured | None = None) -> list[MemoryKey]:
        """Keep `cell` as `key`'s (the most recently used); returns the keys evicted to stay in bounds.

        `measured` is `measure(cell)`, taken outside the live set's lock; None when the caller counts
        it after letting the lock go (`counted`): the cell's last count stands in meanwhile.
        """
        self.pop(key)
        entry = _Entry(cell, measured)
        if entry.size > self.max_bytes:
            return [key]
        self._entries[key] = entry
        self._tenants.setdefault(key.tenant_id, OrderedDict())[key] = None
        self._grow(key, entry.size)
        return self._trim()

    def counted(self, key: MemoryKey, cell: StateCell, measured: Measured) -> list[MemoryKey]:
        """`key`'s entry put without a count gets `measured` (`measure(cell)`), if it still holds `cell`
        uncounted; returns the keys evicted to stay in bounds."""
        entry = self._entries.get(key)
        if entry is None or entry.cell is not cell or entry.state is not None:
            return []
        if measured.size > self.max_bytes:
            self.pop(key)
            return [key]
        self._grow(key, entry.count(measured))
        return self._trim(keep=key)

    def get(self, key: MemoryKey) -> StateCell | None:
        """`key`'s cell, now the most recently used; None when it is not cached.

        A cell whose state or view changed since it was measured (a stopping
        actor's last write landed, a read built its view) is measured again.
        """
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        self._tenants[key.tenant_id].move_to_end(key)
        cell = entry.cell
        if entry.state is not cell.state or entry.view is not cell.view:
            self._grow(key, entry.count(measure(cell)))
            self._trim(keep=key)
        return cell

    def pop(self, key: MemoryKey) -> StateCell | None:
        """Take `key`'s cell out of the cache (to start an actor with it, or to forget it)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._grow(key, -entry.size)
        keys = self._tenants[key.tenant_id]
        del keys[key]
        if not keys:
            del self._tenants[key.tenant_id]
        return entry.cell

    def drop(self, matches: Callable[[MemoryKey], bool]) -> list[MemoryKey]:
        """Forget every entry whose key `matches`; returns their keys."""
        gone = [key for key in self._entries if matches(key)]
        for key in gone:
            self.pop(key)
        return gone

    def clear(self) -> None:
        self._entries.clear()
        self._tenants.clear()
        self._weights.clear()
        self.bytes = 0

    def _trim(self, keep: MemoryKey | None = None) -> list[MemoryKey]:
        """Give up entries until the cache is within its bound, never `keep`: each the least recently
        used of the tenant whose entries hold the most bytes then (ties: the tenant cached first), so
        a tenant filling the cache with many sessions evicts its own, not another tenant's few. With
        one tenant, that is plain least recently used."""
        evicted: list[MemoryKey] = []
        while self.bytes > self.max_bytes:
            key = self._heaviest_oldest(keep)
            if key is None:
                break
            self.pop(key)
            evicted.append(key)
        return evicted

    def _heaviest_oldest(self, keep: MemoryKey | None) -> MemoryKey | None:
        """The least recently used key, other than `keep`, of the tenant holding the most bytes."""

        def oldest(tenant: str) -> MemoryKey | None:
            return next((key for key in self._tenants.get(tenant, ()) if key != keep), None)

        return self._weights.first(oldest)
