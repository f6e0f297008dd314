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

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'convmem.testing' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
