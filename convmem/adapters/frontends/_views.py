"""What an integration's session and the service compute alike, from a `MemorySystem`.

`items_view` (the items a strategy shows, the last `limit` of them),
`start_session` (opening a session with its cross-session summary) and
`check_limit` are used by the in-process integrations and by the service's
``agents_items`` and ``agents_start`` operations, so a session reads the same
in process and through the service.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

from convmem.actors import EventLog, LoadReport, MemorySystem, SessionHandle, decode_logged
from convmem.errors import ConvmemError, InvalidInput
from convmem.events import MemoryKey
from convmem.projections import (
    AGENTS_STRATEGIES,
    SessionState,
    agent_items,
    cross_session_instructions,
    latest_summary_for_user,
    replay,
    without_horizon,
    without_orphan_results,
)

__all__ = [
    "MAX_INJECTION_SOURCES",
    "as_configured",
    "check_limit",
    "items_view",
    "last_items",
    "reaches_past_live",
    "start_session",
    "whole_history",
]

_log = logging.getLogger("convmem.integrations")

MAX_INJECTION_SOURCES = 1_000
"""The most other sessions a start with `agents.cross_session_injection` loads for the user's latest
summary: those written most recently. Each is loaded (snapshot and tail, folded), so without a bound a
user with N sessions would cost N loads a start, N^2 over them all."""


def check_limit(limit: object) -> int | None:
    """`limit` when it is None or an integer >= 0; `InvalidInput` (field ``limit``) otherwise."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise InvalidInput("limit", f"must be None or an integer >= 0, got {limit!r}")
    return limit


def items_view(
    state: SessionState, limit: int | None, whole: Callable[[], SessionState] | None = None
) -> list[dict[str, Any]]:
    """The session's items as its strategy shows them; with `limit`, the last `limit` of them.

    When the items asked for reach past the turns the live state keeps (its
    horizon: `live_turns`), they come from `whole()`, the session's state with
    every turn, folded from the log (`whole_history`): the Agents SDK's
    `get_items()` returns the whole history, as `SQLiteSession` does.
    """
    view = agent_items(state)
    if whole is not None and reaches_past_live(state, view, limit):
        view = agent_items(whole())
    return last_items(view, limit)


def reaches_past_live(state: SessionState, view: list[dict[str, Any]], limit: int | None) -> bool:
    """Whether the last `limit` (all for None) of `view`, the live state's items, reach past its turns."""
    if not state.retired_through or not AGENTS_STRATEGIES[state.config.agents.strategy].shows_whole_history:
        return False
    return limit is None or limit > len(view)


def last_items(view: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """The last `limit` items of `view` (all of them for None), never a tool result without its call.

    A limit that falls between a tool call and its result leaves both out
    (the result would be an orphan a provider refuses), so the answer may
    hold fewer than `limit` items; it never holds more.
    """
    return view if limit is None else without_orphan_results(view[max(len(view) - limit, 0) :])


def whole_history(system: MemorySystem, key: MemoryKey) -> SessionState:
    """`key`'s state with every turn since its last clear, folded from the log without a horizon.

    Blocking: it reads the session's whole subject. Poison is skipped (and
    reported by `verify`), as activation skips it.
    """
    events = decode_logged(system.log.read(key), on_poison="skip", report=LoadReport())
    return replay(without_horizon(events))


def start_session(system: MemorySystem, key: MemoryKey, *, timeout: float | None) -> str | None:
    """Open `key` with its cross-session summary when its configuration asks; its instructions.

    A session that has started, or whose configuration has no
    `agents.cross_session_injection`, is left as it is (its first write opens
    it, as for any convmem session). Otherwise the latest summary among the
    user's other sessions (same tenant and user, never another's; at most
    `MAX_INJECTION_SOURCES` of them, those written most recently) is recorded
    in its `SessionStarted` event, once: a replay shows what was injected.
    Blocking: it may read the log.
    """
    handle = system.session(key)
    state = handle.snapshot_state()
    config = state.config if state.started else handle.starting_config
    if not state.started and config.agents.cross_session_injection:
        found = _latest_other_summary(system, key)
        summary, source = (found[1], found[0]) if found is not None else (None, None)
        handle.start(injected_summary=summary, injected_from=source, timeout=timeout)
        state = handle.snapshot_state()
    return cross_session_instructions(as_configured(handle, state))


def as_configured(handle: SessionHandle, state: SessionState) -> SessionState:
    """A session with nothing stored reads with the configuration it will start with."""
    if state.started:
        return state
    return msgspec.structs.replace(state, config=handle.starting_config)


def _latest_other_summary(system: MemorySystem, key: MemoryKey) -> tuple[MemoryKey, str] | None:
    """The latest summary among at most `MAX_INJECTION_SOURCES` other sessions of `key`'s user: all of
    them when they are no more (the log's key listing reads no message), else those written most
    recently (`_recent_others`); each one considered is loaded."""
    others = [k for k in system.log.keys(tenant_id=key.tenant_id, user_id=key.user_id) if k != key]
    if len(others) > MAX_INJECTION_SOURCES:
        others = _recent_others(system.log, others)
    states: list[SessionState] = []
    for other in others:
        try:
            states.append(system.load(other)[0])
        except ConvmemError as exc:  # one unreadable session must not block a new one
            _log.warning("session %s: skipped %s for cross-session memory: %s", key, other, exc)
    return latest_summary_for_user(states, key)


def _recent_others(log: EventLog, others: list[MemoryKey]) -> list[MemoryKey]:
    """The `MAX_INJECTION_SOURCES` of `others` written most recently, newest first: from the log's
    `newest_keys` when it has one (JetStream: the stream positions of their last messages), else
    from the order of the user's events (`read_all`)."""
    newest_keys = getattr(log, "newest_keys", None)
    if newest_keys is not None:
        return list(newest_keys(others, limit=MAX_INJECTION_SOURCES))
    wanted = set(others)
    last: dict[MemoryKey, None] = {}
    for logged in log.read_all(tenant_id=others[0].tenant_id, user_id=others[0].user_id):
        if logged.key in wanted:
            last.pop(logged.key, None)  # (a dict keeps its order of insertion: the newest last)
            last[logged.key] = None
    return list(reversed(last))[:MAX_INJECTION_SOURCES]
