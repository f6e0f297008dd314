"""Keys, saved memory states and moves: what `hydrate`/`persist` do beyond naming the key.

Saved states (what a state store's ``load_memory_state`` returns):

* written by convmem (it carries a ``"convmem"`` entry naming the session
  and log position): the log is the source of truth, so nothing is imported,
  unless the log holds no event at all for the key (a new, empty log), where
  the saved state is the only copy and is imported once;
* written by PenguiFlow: imported as one `SessionRestored` whose ``origin`` is
  ``penguiflow-state:sha256:<digest>``, and never twice: the import's event id
  comes from the digest, so a repeat (another process, a retry) is recognised
  in the log and stored once. The store is then written back as convmem's.

A move (turns kept privately before the key was known) is one `TurnsAdopted`
on the key, then a `SessionCleared` with ``moved_to`` on the private session,
refused if turns arrived there meanwhile (they are moved in the next round).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from convmem.actors import AsyncSessionHandle, MemorySystem, SessionServices
from convmem.adapters.frontends.integrations.penguiflow._values import (
    CONVMEM_MARK,
    digest_of,
    key_from_composite,
)
from convmem.errors import InvalidInput
from convmem.events import MemoryKey, ShortTermMemoryConfig
from convmem.projections import SessionState

__all__ = [
    "NEW_GENERATION",
    "already_in_log",
    "catch_up",
    "import_saved",
    "move",
    "new_generation",
    "origin_of",
    "target_key",
]

_MOVE_ROUNDS = 8
"""Rounds a move makes while turns keep arriving on the private session."""


def target_key(composite: str) -> MemoryKey:
    """The convmem key of the composite PenguiFlow named (see `key_from_composite`)."""
    return key_from_composite(composite)


def _mark(state: Mapping[str, Any]) -> tuple[str, int] | None:
    mark = state.get(CONVMEM_MARK)
    if not isinstance(mark, Mapping):
        return None
    key, seq = mark.get("key"), mark.get("seq")
    if not isinstance(key, str) or isinstance(seq, bool) or not isinstance(seq, int):
        return None
    return key, seq


def origin_of(state: Mapping[str, Any]) -> str:
    """What a `SessionRestored` of `state` records as its origin."""
    if not isinstance(state, Mapping):
        raise InvalidInput("state", f"must be a mapping, got {type(state).__name__}")
    mark = _mark(state)
    if mark is not None:
        return f"convmem-state:{mark[0]}@{mark[1]}"
    return f"penguiflow-state:sha256:{digest_of(state)}"


def already_in_log(state: Mapping[str, Any], session: MemoryKey | None, current: SessionState) -> bool:
    """Whether `state` is convmem's own export of `session` at or before the log's position."""
    if not isinstance(state, Mapping) or session is None:
        return False
    mark = _mark(state)
    return mark is not None and mark[0] == session.composite() and mark[1] <= current.version


def _imported_before(system: MemorySystem, key: MemoryKey, idempotency_key: str) -> bool:
    event_id = f"{'.'.join(key.tokens())}/{idempotency_key}/session.restored/1"
    return any(record.event_id == event_id for record in system.log.read(key))


async def import_saved(
    system: MemorySystem, imported: set[str], handle: AsyncSessionHandle, key: MemoryKey, saved: object
) -> bool:
    """Import a saved state into session `key` when the rules above say so.

    `imported` holds the digests of the states this memory imported already
    (a new one is added). True when the store holds a state PenguiFlow wrote
    (imported now or before): the caller writes convmem's state back over it.
    """
    if saved is None:
        return False
    if not isinstance(saved, Mapping):
        raise InvalidInput("state", f"load_memory_state returned {type(saved).__name__}, not a mapping")
    ours = _mark(saved) is not None
    if ours and await asyncio.to_thread(system.log.last_seq, key) > 0:
        return False  # convmem's own: the log holds it (or more)
    digest = digest_of(saved)
    if digest not in imported:
        idempotency_key = f"import/{digest}"
        if not await asyncio.to_thread(_imported_before, system, key, idempotency_key):
            await handle.restore(saved, origin=origin_of(saved), idempotency_key=idempotency_key)
        imported.add(digest)
    return not ours


NEW_GENERATION = "new generation: the state store holds no memory for this key"
"""The reason recorded by the `SessionCleared` that starts a generation (see `new_generation`)."""


async def new_generation(handle: AsyncSessionHandle, config: ShortTermMemoryConfig) -> int | None:
    """Start a new generation of the session: clear what it shows, keeping the log.

    The new generation runs with `config` (the memory's), whatever the old one ran with.
    Returns the log position of the clear that starts it (None when nothing was cleared).

    A session that shows nothing (never started, or cleared already) with this config is
    left as it is, so a store that is empty on every hydrate writes nothing more.
    """
    state = await _state(handle)
    if not state.started or (not state.turns and not state.summary and state.config == config):
        return None
    await handle.clear(reason=NEW_GENERATION, config=config)
    return (await _state(handle)).version


async def catch_up(system: MemorySystem, handle: AsyncSessionHandle, key: MemoryKey) -> None:
    """Reload a live session whose log moved on (another process wrote): PenguiFlow reloads on hydrate."""
    state = handle.state_if_live()
    if state is None:
        return  # not live: its next read activates it from the log
    if await asyncio.to_thread(system.log.last_seq, key) != state.version:
        await handle.refresh()


async def _state(handle: AsyncSessionHandle) -> SessionState:
    state = handle.state_if_live()
    if state is None:  # activating reads the log: not on the event loop
        state = await asyncio.to_thread(handle.snapshot_state)
    return state


async def move(
    system: MemorySystem, services: SessionServices, private: MemoryKey, target: MemoryKey
) -> None:
    """Move the private session's live turns to `target` (see the module docstring)."""
    source = system.async_session(private, services=services)
    destination = system.async_session(target, services=services)
    moved_through = 0
    for _ in range(_MOVE_ROUNDS):
        state = await _state(source)
        if not state.started:
            return
        fresh = [r for r in state.turns if r.index > max(moved_through, state.dropped_through)]
        if fresh:
            await destination.adopt(
                private,
                state.version,
                [r.turn for r in fresh],
                idempotency_key=f"adopt/{private.session_id}/{state.version}",
            )
            moved_through = fresh[-1].index
        try:
            await source.clear(
                moved_to=target,
                through=max(moved_through, state.next_index - 1),
                reason="turns moved to the session's key",
            )
        except InvalidInput:
            continue  # turns arrived meanwhile: move them too
        return
    raise InvalidInput("key", f"turns kept arriving while they were moved to {target.composite()!r}")
