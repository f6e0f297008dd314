"""What tests, and a new back end's tests, need: an in-memory runtime, a manual clock, the contracts.

* `InMemoryEventLog`, `InMemorySnapshotStore`, `InMemoryBackend`: the log,
  snapshot store and backend held in this process (``connect("memory://")``
  opens the same);
* `ManualClock`: a clock that moves only when told (``clock.advance(60)``),
  firing the timers that come due; give it as ``clock=`` to a `MemorySystem`;
* `EventLogContract`, `SnapshotStoreContract`: the promises every event log
  and snapshot store keeps, as pytest suites a back end's tests subclass
  (with an ``open_log`` / ``open_store`` fixture); the in-memory and the
  JetStream back ends pass both.

The names are imported on first use, and the contract suites need pytest
(the ``testing`` extra): ``import convmem`` loads none of this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convmem._lazy import lazy_exports

if TYPE_CHECKING:
    from convmem.actors import ManualClock
    from convmem.adapters import InMemoryBackend, InMemoryEventLog, InMemorySnapshotStore
    from convmem.testing._log_contract import EventLogContract, OpenLog
    from convmem.testing._snapshot_contract import OpenStore, SnapshotStoreContract

_LAZY = {
    "EventLogContract": "convmem.testing._log_contract",
    "InMemoryBackend": "convmem.adapters",
    "InMemoryEventLog": "convmem.adapters",
    "InMemorySnapshotStore": "convmem.adapters",
    "ManualClock": "convmem.actors",
    "OpenLog": "convmem.testing._log_contract",
    "OpenStore": "convmem.testing._snapshot_contract",
    "SnapshotStoreContract": "convmem.testing._snapshot_contract",
}
"""Where each name lives."""

__all__ = [
    "EventLogContract",
    "InMemoryBackend",
    "InMemoryEventLog",
    "InMemorySnapshotStore",
    "ManualClock",
    "OpenLog",
    "OpenStore",
    "SnapshotStoreContract",
]


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
