"""Tenant-fair eviction for the per-process structures every tenant shares: the live set, the idle
cache, the JetStream writer's recent sessions, the keyring's data keys.

Past its bound, a structure shared by tenants gives up the least recently
used entry of the tenant holding the most (sessions, or bytes), not the least
recently used entry of all: a tenant that touches many sessions evicts its
own, and another tenant's few stay. With one tenant, that is plain least
recently used.

`Heaviest` keeps each tenant's weight and finds the heaviest in O(log n) (a
heap of weights, stale entries skipped and the heap rebuilt when they pile
up), so an eviction costs the same with ten thousand tenants as with two.
`TenantLru` is the ordered mapping the live set keeps its entries in: the
`OrderedDict` calls it makes, each tenant's keys in their own order too, and
`oldest_of_heaviest`. `FairCache` is a bounded cache whose hits are one
plain dict lookup (`entries.get`): what it adds is paid when an entry is
stored or dropped. None is thread-safe: their owners call them under their
own lock (or on one thread).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, ItemsView, Iterator, ValuesView
from typing import Generic, TypeVar

from convmem.events import MemoryKey

__all__ = ["FairCache", "Heaviest", "TenantLru"]

K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R")


class Heaviest:
    """Each tenant's weight (above 0; a tenant at 0 is left out), heaviest first on demand."""

    def __init__(self) -> None:
        self.weights: dict[str, int] = {}
        self._heap: list[tuple[int, int, str]] = []
        self._ticks = itertools.count()

    def add(self, tenant: str, delta: int) -> None:
        """Add `delta` (negative: take away) to `tenant`'s weight."""
        weight = self.weights.get(tenant, 0) + delta
        if weight <= 0:
            self.weights.pop(tenant, None)
        else:
            self.weights[tenant] = weight
            heapq.heappush(self._heap, (-weight, next(self._ticks), tenant))
        if len(self._heap) > 2 * len(self.weights) + 64:  # mostly stale entries: start again
            self._heap = [(-w, next(self._ticks), t) for t, w in self.weights.items()]
            heapq.heapify(self._heap)

    def clear(self) -> None:
        self.weights.clear()
        self._heap.clear()

    def first(self, pick: Callable[[str], R | None]) -> R | None:
        """`pick` of the heaviest tenant, else of the next heaviest, and so on: the first not None
        (ties: the tenant that came to its weight first). None when no tenant's pick is."""
        taken: list[tuple[int, int, str]] = []
        seen: set[str] = set()
        try:
            while self._heap:
                entry = heapq.heappop(self._heap)
                weight, _, tenant = entry
                if self.weights.get(tenant) != -weight or tenant in seen:
                    continue  # stale: the tenant's weight changed since (its newer entry stands)
                taken.append(entry)
                seen.add(tenant)
                picked = pick(tenant)
                if picked is not None:
                    return picked
            return None
        finally:
            for entry in taken:
                heapq.heappush(self._heap, entry)


class TenantLru(Generic[V]):
    """Entries by `MemoryKey`, least recently used first, as an `OrderedDict` keeps them; each
    tenant's keys also in their own order, and the tenants weighed by how many entries they hold."""

    def __init__(self) -> None:
        self._entries: OrderedDict[MemoryKey, V] = OrderedDict()
        self._tenants: dict[str, OrderedDict[MemoryKey, None]] = {}
        self.held = Heaviest()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[MemoryKey]:
        return iter(self._entries)

    def __getitem__(self, key: MemoryKey) -> V:
        return self._entries[key]

    def get(self, key: MemoryKey) -> V | None:
        return self._entries.get(key)

    def items(self) -> ItemsView[MemoryKey, V]:
        return self._entries.items()

    def values(self) -> ValuesView[V]:
        return self._entries.values()

    def __setitem__(self, key: MemoryKey, value: V) -> None:
        """Set `key`'s entry, the most recently used now."""
        if key not in self._entries:
            self._tenants.setdefault(key.tenant_id, OrderedDict())[key] = None
            self.held.add(key.tenant_id, 1)
        self._entries[key] = value
        self.move_to_end(key)

    def __delitem__(self, key: MemoryKey) -> None:
        del self._entries[key]
        keys = self._tenants[key.tenant_id]
        del keys[key]
        if not keys:
            del self._tenants[key.tenant_id]
        self.held.add(key.tenant_id, -1)

    def move_to_end(self, key: MemoryKey) -> None:
        """`key` is the most recently used now."""
        self._entries.move_to_end(key)
        self._tenants[key.tenant_id].move_to_end(key)

    def clear(self) -> None:
        self._entries.clear()
        self._tenants.clear()
        self.held.clear()

    def oldest_of_heaviest(self, accept: Callable[[MemoryKey, V], bool]) -> tuple[MemoryKey, V] | None:
        """The least recently used entry that `accept`s, of the tenant holding the most entries that
        has one (see `Heaviest.first`); None when no entry does."""

        def oldest(tenant: str) -> tuple[MemoryKey, V] | None:
            for key in self._tenants[tenant]:
                value = self._entries[key]
                if accept(key, value):
                    return key, value
            return None

        return self.held.first(oldest)


class FairCache(Generic[K, V]):
    """At most `bound` entries; past it, the least recently stored entry of the tenant holding the most
    goes (one tenant: plain least recently stored). Read hits with `entries.get(key)`: one dict lookup,
    nothing reordered (a hit that should count as a use is stored again with `put`)."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.entries: dict[K, V] = {}
        """Every entry by key: read it directly (do not write it: `put` and `pop` do)."""
        self._owner: dict[K, str] = {}
        self._tenants: dict[str, OrderedDict[K, None]] = {}
        self.held = Heaviest()
        self.evicted = 0
        """Entries given up to stay within the bound, all tenants' (for tests and metrics)."""

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def put(self, tenant: str, key: K, value: V) -> None:
        """`key`'s entry, of `tenant`, is `value`: the most recently stored of its tenant now."""
        owner = self._owner.get(key)
        if owner is None:
            self._owner[key] = tenant
            keys = self._tenants.get(tenant)
            if keys is None:
                keys = self._tenants[tenant] = OrderedDict()
            keys[key] = None
            self.held.add(tenant, 1)
            self.entries[key] = value
            if len(self.entries) > self.bound:
                self._evict()
            return
        if owner != tenant:  # the key changed hands (a caller's mistake): count it for the new one
            self.pop(key)
            self.put(tenant, key, value)
            return
        self.entries[key] = value
        self._tenants[owner].move_to_end(key)

    def renew(self, key: K, value: V) -> None:
        """`key`'s entry, which is held (`key in self`), is `value`: the most recently stored of its
        tenant now (`put` without naming the tenant)."""
        self.entries[key] = value
        self._tenants[self._owner[key]].move_to_end(key)

    def pop(self, key: K) -> V | None:
        """Drop `key`'s entry; its value, None when it had none."""
        owner = self._owner.pop(key, None)
        if owner is None:
            return None
        keys = self._tenants[owner]
        del keys[key]
        if not keys:
            del self._tenants[owner]
        self.held.add(owner, -1)
        return self.entries.pop(key)

    def clear(self) -> None:
        self.entries.clear()
        self._owner.clear()
        self._tenants.clear()
        self.held.clear()

    def held_by(self, tenant: str) -> int:
        """How many entries `tenant` holds."""
        return self.held.weights.get(tenant, 0)

    def _evict(self) -> None:
        oldest = self.held.first(lambda tenant: next(iter(self._tenants[tenant])))
        if oldest is not None:
            self.pop(oldest)
            self.evicted += 1
