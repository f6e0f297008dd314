"""The OpenAI-Agents session strategies, as read-time views over a session's state.

Each strategy's view is one function here; the table in ``_strategies`` maps
each `AgentsStrategy` name to it (`agent_items` reads through that table).

A strategy never destroys stored history: each view is computed from the
live turns every time it is read, so switching strategy, or replaying the
log, shows the same conversation differently but never loses it. Turns are
the unit of every cut, so a tool call is never separated from its result
(`ConversationTurn` already requires each result to follow its call inside
one turn).

A *user turn* is a turn whose items hold a user message. Triggers count user
turns, as the seed's demo does; a turn without a user message belongs to the
user turn before it.

* ``none``: every live turn's items.
* ``trimming``: once there are `max_turns` user turns or more, only the last
  `keep_last_n_turns` user turns (with their assistant and tool items).
* ``summarizing``: with a summary, a synthetic user line and an assistant
  line holding the summary, then every unsummarized turn (the tail after the
  session's watermark). Before the first summary, trimming while the tail
  holds fewer than `context_limit` user turns; from there until the summary
  lands, the whole tail, so a slow summarizer never hides a turn.
* ``compacting``: once there are more than `compact_trigger_turns` user
  turns, the tool results (and, with `compact_tool_calls`, the call
  arguments) of every turn before the newest `compact_keep` user turns are
  replaced by readable placeholders that keep the tool name and call id. A
  call's placeholder arguments stay a JSON object (``{"removed": "arguments
  of <tool> (call <id>)"}``), so a provider that parses arguments still can.

Cross-session injection is a prompt-level mechanism, not a view of items: the
summary offered to a new session is recorded in its `SessionStarted` event and
comes back here as instructions text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from convmem.events import AgentsMemoryConfig, ConversationTurn, MemoryKey
from convmem.projections._budget import TokenEstimator, default_token_estimator, render
from convmem.projections._state import SessionState, TurnRecord

__all__ = [
    "CROSS_SESSION_HEADER",
    "SUMMARY_REQUEST_LINE",
    "agent_items_tokens",
    "compact_turn_items",
    "compacted_items",
    "cross_session_instructions",
    "every_item",
    "latest_summary_for_user",
    "summarized_items",
    "summarizing_zone",
    "trimmed_items",
    "without_orphan_results",
]

SUMMARY_REQUEST_LINE = "Summarize the conversation we had so far."
"""The synthetic user line that precedes the summary in the ``summarizing`` view."""

CROSS_SESSION_HEADER = (
    "Cross-session memory (from your previous conversation; treat as context, not ground truth):"
)
"""The first line of the instructions that carry an injected summary."""


def _is_user_turn(turn: ConversationTurn) -> bool:
    if turn.user_message:
        return True
    return any(item.kind == "message" and item.role == "user" for item in turn.items)


def _last_user_turns(records: Sequence[TurnRecord], n: int) -> tuple[TurnRecord, ...]:
    """The records from the n-th last user turn on (all of them when there are fewer)."""
    starts = [i for i, record in enumerate(records) if _is_user_turn(record.turn)]
    if n <= 0:
        return ()
    if len(starts) < n:
        return tuple(records)
    return tuple(records[starts[-n] :])


def _user_turn_count(records: Sequence[TurnRecord]) -> int:
    return sum(1 for record in records if _is_user_turn(record.turn))


def _items(records: Iterable[TurnRecord]) -> list[dict[str, Any]]:
    return [item for record in records for item in record.turn.agent_items()]


def _trimmed(records: Sequence[TurnRecord], max_turns: int, keep: int) -> tuple[TurnRecord, ...]:
    if _user_turn_count(records) >= max_turns:
        return _last_user_turns(records, keep)
    return tuple(records)


def compact_turn_items(turn: ConversationTurn, *, tool_calls: bool) -> list[dict[str, Any]]:
    """The turn's agent items with tool results (and, if `tool_calls`, call arguments) replaced.

    Each placeholder names the tool and the call id, so the model still sees
    that the tool ran; the items keep their number and order, and each item
    its keys in their order. Replaced arguments are a JSON object saying what
    was removed, because providers parse a call's arguments as JSON.
    """
    names = {item.call_id: item.name for item in turn.items if item.kind == "function_call"}
    out: list[dict[str, Any]] = []
    for item in turn.agent_items():
        kind, call_id = item.get("type"), item.get("call_id")
        if kind == "function_call_output":
            name = names.get(call_id) or item.get("name") or "tool"
            out.append({**item, "output": f"⟦removed: result of {name} (call {call_id})⟧"})
        elif kind == "function_call" and tool_calls:
            name = item["name"]
            removed = {"removed": f"arguments of {name} (call {call_id})"}
            out.append({**item, "arguments": json.dumps(removed, ensure_ascii=False)})
        else:
            out.append(item)
    return out


def _call_id(item: dict[str, Any]) -> str | None:
    call_id = item.get("call_id")
    return call_id if isinstance(call_id, str) and call_id else None


def _is_result(item: dict[str, Any]) -> bool:
    """A tool result: ``function_call_output`` and the other ``*_call_output`` types, by call id."""
    kind = item.get("type")
    return isinstance(kind, str) and kind.endswith("_output") and _call_id(item) is not None


def without_orphan_results(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`items` less every tool result whose call is not among them (a cut fell between the two).

    Calls always precede their results, so a cut from the front (a limit, a
    trim) can only orphan results; a call whose result has not arrived yet is
    kept (the tool is still running).
    """
    calls = {_call_id(item) for item in items if not _is_result(item)} - {None}
    if all(not _is_result(item) or _call_id(item) in calls for item in items):
        return items
    return [item for item in items if not _is_result(item) or _call_id(item) in calls]


def every_item(state: SessionState) -> list[dict[str, Any]]:
    """``none``: every live turn's items."""
    return _items(state.turns)


def trimmed_items(state: SessionState) -> list[dict[str, Any]]:
    """``trimming``: from `max_turns` user turns on, only the last `keep_last_n_turns`."""
    agents = state.config.agents
    return _items(_trimmed(state.turns, agents.max_turns, agents.keep_last_n_turns))


def summarized_items(state: SessionState) -> list[dict[str, Any]]:
    """``summarizing``: the summary as a user line and an assistant line, then the turns it does not cover."""
    agents = state.config.agents
    tail = state.unsummarized()
    if state.summary:
        return [
            {"role": "user", "content": SUMMARY_REQUEST_LINE},
            {"role": "assistant", "content": state.summary},
            *_items(tail),
        ]
    if _user_turn_count(tail) < agents.context_limit:
        return _items(_trimmed(tail, agents.max_turns, agents.keep_last_n_turns))
    # A summary is due but not made yet: a slow summarizer never hides a turn.
    return _items(tail)


def summarizing_zone(agents: AgentsMemoryConfig) -> tuple[int, int]:
    """``summarizing``'s summary zone: (turns kept verbatim, unsummarized turns that trigger a summary)."""
    return agents.keep_last_n_turns, agents.context_limit - agents.keep_last_n_turns


def compacted_items(state: SessionState) -> list[dict[str, Any]]:
    """``compacting``: past `compact_trigger_turns` user turns, older tool results as placeholders."""
    agents = state.config.agents
    records = state.turns
    if _user_turn_count(records) <= agents.compact_trigger_turns:
        return _items(records)
    protected = _last_user_turns(records, agents.compact_keep)
    cut = len(records) - len(protected)
    out: list[dict[str, Any]] = []
    for record in records[:cut]:
        out.extend(compact_turn_items(record.turn, tool_calls=agents.compact_tool_calls))
    out.extend(_items(protected))
    return out


def agent_items_tokens(
    items: Iterable[dict[str, Any]], estimator: TokenEstimator = default_token_estimator
) -> int:
    """Estimated tokens of `items`: the sum of each item's canonical JSON rendering.

    Per-item sums make deltas ("context freed this turn") add up; as in the
    seed, estimates are for telemetry and never drive a trigger.
    """
    return sum(estimator(render(item)) for item in items)


def cross_session_instructions(state: SessionState) -> str | None:
    """Instructions text carrying the summary injected into this session, or None.

    None unless `agents.cross_session_injection` is on and the session was
    started with a non-blank injected summary.
    """
    summary = state.injected_summary
    if not state.config.agents.cross_session_injection or not summary or not summary.strip():
        return None
    return f"{CROSS_SESSION_HEADER}\n{summary}"


def latest_summary_for_user(states: Iterable[SessionState], key: MemoryKey) -> tuple[MemoryKey, str] | None:
    """The summary to inject into session `key`: the user's most recently active other session's.

    Only sessions of the same tenant *and* user, other than `key` itself, with
    a non-blank summary qualify; the latest `last_at` wins, ties going to the
    greatest key composite so the choice never depends on iteration order.
    """
    best: tuple[float, str, MemoryKey, str] | None = None
    for state in states:
        other = state.key
        if (
            other is None
            or other.tenant_id != key.tenant_id
            or other.user_id != key.user_id
            or other == key
            or not state.summary.strip()
        ):
            continue
        candidate = (state.last_at, other.composite(), other, state.summary)
        if best is None or candidate[:2] > best[:2]:
            best = candidate
    return None if best is None else (best[2], best[3])
