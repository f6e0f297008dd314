"""`WriteSession`: the session as a `Write` sees it, what a write may ask of the session it works on.

`SessionActor` is the one implementation; a write reads and replaces the
session's state only through these methods, so the write path's rules live in
`convmem.actors._write` and the session's bookkeeping in `_session`.
"""

from __future__ import annotations

from typing import Any, Protocol

from convmem.actors._metrics import Metrics
from convmem.actors._ports import Settle
from convmem.events import AnyEvent, MemoryKey
from convmem.projections import Command, SessionState, StartSession

__all__ = ["WriteSession"]


class WriteSession(Protocol):
    """The session a write works on, as the write sees it (`SessionActor` is one)."""

    key: MemoryKey
    uncertain: bool
    """An append failed without an answer: the log may hold more than the state shows."""
    on_loop: bool
    """The write runs on an event loop that claimed the actor: it must not read the log there."""

    @property
    def state(self) -> SessionState: ...

    @property
    def metrics(self) -> Metrics: ...

    def decide(self, state: SessionState, command: Command, command_id: str) -> list[AnyEvent]: ...

    def opening(self) -> StartSession:
        """The command that starts this session (with its configuration)."""
        ...

    def start_append(self, events: list[AnyEvent], expected_seq: int, settle: Settle[int]) -> None:
        """Begin the append; `settle` may be settled before this returns (a plain log)."""
        ...

    def reload(self) -> None:
        """Replace the state by the log's (blocking)."""
        ...

    def load(self) -> SessionState:
        """The log's state of the session, leaving the session's as it is (blocking)."""
        ...

    def already_stored(self, events: list[AnyEvent]) -> bool:
        """Whether the log holds one of these events' ids (blocking)."""
        ...

    def log_moved_on(self) -> bool:
        """Whether the log holds events past the state's version: another writer wrote (blocking)."""
        ...

    def in_doubt(self, command_id: str) -> bool: ...

    def doubt(self, command_id: str) -> None: ...

    def settle_doubt(self, command_id: str) -> None: ...

    def adopt(self, state: SessionState) -> None:
        """Take the log's state as it is (nothing to tell anyone)."""
        ...

    def publish(self, state: SessionState, events: list[AnyEvent], old: SessionState) -> None: ...

    def written(self, *, grew: bool) -> None:
        """A write ended (stored, refused or failed): schedule what follows it."""
        ...

    def hold(self) -> None: ...

    def let_go(self) -> None: ...

    def requeue(self, message: Any) -> None: ...
