"""The health machine's timing, and the questions a session asks its summarizer.

Pure queries on a state: when the session next wants a summary
(`next_due_at`), what it asks for (`summary_due`), whether an answer still
applies (`is_stale`) and whether a summary can be stored (`summary_problem`).
`Summarizer` is what answers: convmem's one summarizer protocol, which the
runtime's pool calls. The transitions themselves are decisions, in `_transitions`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol, assert_never, runtime_checkable

import msgspec

from convmem.events import ConversationTurn, MemoryHealth, MemoryKey, ShortTermMemoryConfig
from convmem.projections._budget import (
    ContextSelection,
    TokenEstimator,
    default_token_estimator,
    render,
    selection_tokens,
)
from convmem.projections._state import SessionState, TurnRecord
from convmem.projections._strategies import AGENTS_STRATEGIES

__all__ = [
    "SURROGATE",
    "Summarizer",
    "SummaryRequest",
    "is_stale",
    "next_due_at",
    "summarizable",
    "summary_due",
    "summary_plan",
    "summary_problem",
    "summary_room",
    "summary_zone",
]

SURROGATE = re.compile("[\ud800-\udfff]")
"""A lone surrogate cannot be encoded as UTF-8, so no event may carry one."""


class SummaryRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What a session asks its summarizer: fold `turns` into `previous_summary`."""

    key: MemoryKey
    previous_summary: str
    covers_from: int
    covers_through: int
    turns: tuple[ConversationTurn, ...]
    health: MemoryHealth
    attempt: int
    include_digest: bool = True
    speaker_names: dict[str, str] = msgspec.field(default_factory=dict)
    max_tokens: int = 0
    """The tokens the summary may take: the room it will really have in the view (`summary_room`),
    at most ``summary_max_tokens``; 0: not known."""

    def payload(self) -> dict[str, Any]:
        """The PenguiFlow summarizer payload: previous summary and turns as the LLM sees them.

        A turn whose time is known also carries ``ts`` (epoch seconds, UTC), so that a
        summarizer can date what was said and resolve "yesterday" or "last week". The
        session's ``speaker_names`` ride along when it sets them, and ``max_tokens``
        (the room the summary will have beside the turns the view shows with it, as the
        summary's JSON string counts, at most ``summary_max_tokens``) when the session has
        an overall budget.
        """
        turns = []
        for turn in self.turns:
            shown = turn.to_llm(include_digest=self.include_digest)
            if turn.ts > 0:
                shown["ts"] = turn.ts
            turns.append(shown)
        out: dict[str, Any] = {"previous_summary": self.previous_summary, "turns": turns}
        if self.speaker_names:
            out["speaker_names"] = dict(self.speaker_names)
        if self.max_tokens:
            out["max_tokens"] = self.max_tokens
        return out


@runtime_checkable
class Summarizer(Protocol):
    """The RFC's summarizer: `SummaryRequest.payload()` in, ``{"summary": str}`` (or the text) out.

    Any callable of that shape, a plain function or a coroutine function
    (the runtime's pool runs either, with a timeout). Its answer is checked
    by `summary_problem` before it is stored. The conversation-memory
    spec's standalone `SummaryMemory` folds messages instead, with a
    `MessageSummarizer`.
    """

    def __call__(self, request: Mapping[str, Any], /) -> Any: ...


def summary_zone(config: ShortTermMemoryConfig) -> tuple[int, int]:
    """(turns kept verbatim, unsummarized evicted turns that trigger a summary).

    The Agents strategy's own zone when it sets one, else the budget's full zone.
    """
    zone = AGENTS_STRATEGIES[config.agents.strategy].summary_zone
    return zone(config.agents) if zone is not None else (config.budget.full_zone_turns, 1)


def summarizable(state: SessionState) -> tuple[TurnRecord, ...]:
    keep, _ = summary_zone(state.config)
    unsummarized = state.unsummarized()
    if len(unsummarized) <= keep:
        return ()
    return unsummarized[: len(unsummarized) - keep] if keep else unsummarized


def next_due_at(state: SessionState) -> float | None:
    """When the session next wants its summarizer (None: not until something changes).

    HEALTHY and RECOVERING sessions want it as soon as enough turns are pending
    (returns the last health change time, i.e. "now or earlier"); RETRY waits
    its back-off; DEGRADED probes every `degraded_retry_seconds`, or, when that
    is 0, only when a turn arrives (see `summary_due`).
    """
    if not state.started or not state.config.summarizes:
        return None
    return _due_at(state, summarizable(state))


def _due_at(state: SessionState, turns: tuple[TurnRecord, ...]) -> float | None:
    """`next_due_at` of a started, summarizing `state` whose summarizable turns are `turns`."""
    _, trigger = summary_zone(state.config)
    policy = state.config.health
    match state.health:
        case MemoryHealth.HEALTHY | MemoryHealth.RECOVERING:
            return state.health_since if len(turns) >= trigger else None
        case MemoryHealth.RETRY:
            return state.health_since + policy.backoff(state.attempt) if turns else None
        case MemoryHealth.DEGRADED:
            if not turns or not policy.degraded_retry_seconds:
                return None
            return state.health_since + policy.degraded_retry_seconds
        case _:
            assert_never(state.health)


def summary_room(state: SessionState, through: int, estimator: TokenEstimator) -> int:
    """The tokens a summary covering turns through `through` will have in the view: 0 when unbounded.

    The overall budget less what the view shows beside the summary once it lands
    (the turns it does not cover), so that the summary is written to the room it
    will really have rather than cut by the view to make room for those turns (the
    view cuts whole lines from its end: the newest facts). Counted as the view
    counts, with the summary as a JSON string: for the default estimator exactly
    (a summary whose escaped JSON string is within the room keeps the view within
    the budget), for another counter up to how its tokens join at the boundary
    (the view still trims as a guard). At least 1; it may exceed ``summary_max_tokens``,
    which a summary must keep as well.
    """
    config = state.config
    budget, allowance = config.budget.total_max_tokens, config.budget.summary_max_tokens
    if not budget or not allowance or config.strategy != "rolling_summary":
        return 0
    rest = ContextSelection(
        summary="",
        pending=tuple(r for r in state.pending() if r.index > through),
        recent=state.recent(),
    )
    include, dated = config.include_trajectory_digest, config.include_turn_dates
    if estimator is default_token_estimator:
        # The view is (rest + len(', "summary": ') + S) // 4 + 1 <= budget tokens, i.e.
        # rest + 13 + S <= 4 * budget - 1, and the summarizer keeps S // 4 + 1 <= room, i.e.
        # S <= 4 * room - 1.
        rest_len = 4 * (selection_tokens(rest, estimator, include, dated) - 1) + 3  # the most it can be
        room = (4 * budget - rest_len - 13) // 4
    else:
        shown = rest.payload(include_digest=include, include_date=dated)
        shown["summary"] = ""
        room = budget - estimator(render(shown))
    return max(1, room)


def summary_due(
    state: SessionState,
    now: float,
    *,
    turn_added: bool = False,
    estimator: TokenEstimator = default_token_estimator,
) -> SummaryRequest | None:
    """The summary the session should ask for at `now`, if any (no call in flight assumed).

    `turn_added` says a turn was just stored: a DEGRADED session whose
    `degraded_retry_seconds` is 0 probes then (PenguiFlow's trigger), and only then.
    `estimator` counts the room the summary will have (`summary_room`).
    """
    return summary_plan(state, now, turn_added=turn_added, estimator=estimator)[0]


def summary_plan(
    state: SessionState,
    now: float,
    *,
    turn_added: bool = False,
    estimator: TokenEstimator = default_token_estimator,
) -> tuple[SummaryRequest | None, float | None]:
    """(`summary_due`, and when none is due, `next_due_at`) from one pass over the session's turns:
    what a write's end asks after every write of a summarizing session."""
    if not state.started or not state.config.summarizes:
        return None, None
    turns = summarizable(state)
    due = _due_at(state, turns)
    asked = due
    if (
        asked is None
        and turn_added
        and state.health is MemoryHealth.DEGRADED
        and not state.config.health.degraded_retry_seconds
        and turns
    ):
        asked = now
    if asked is None or asked > now or state.key is None:
        return None, due
    request = SummaryRequest(
        key=state.key,
        previous_summary=state.summary,
        covers_from=turns[0].index,
        covers_through=turns[-1].index,
        turns=tuple(r.turn for r in turns),
        health=state.health,
        attempt=state.attempt,
        include_digest=state.config.include_trajectory_digest,
        speaker_names=state.config.speaker_names,
        max_tokens=_summary_bound(state, turns[-1].index, estimator),
    )
    return request, None


def _summary_bound(state: SessionState, through: int, estimator: TokenEstimator) -> int:
    """The one bound a summarizer is told to keep (``max_tokens``): the room the summary will have in
    the view (`summary_room`), never above ``summary_max_tokens`` (which a summary must keep too, and
    a summarizer that honours ``max_tokens`` alone would otherwise overrun). 0: not known."""
    room = summary_room(state, through, estimator)
    return min(room, state.config.budget.summary_max_tokens) if room else 0


def is_stale(state: SessionState, request: SummaryRequest) -> bool:
    """The session moved on since the request (cleared, restored, or another summary landed),
    or the request was never this session's to make."""
    return (
        not state.config.summarizes
        or request.key != state.key
        or request.previous_summary != state.summary
        or request.covers_through <= state.summary_through
        or not state.turns
        or request.covers_from < state.turns[0].index
        or request.covers_through > state.turns[-1].index
    )


def summary_problem(summary: object, config: ShortTermMemoryConfig, estimator: TokenEstimator) -> str | None:
    """Why a summarizer's output cannot be stored, or None when it can."""
    if not isinstance(summary, str):
        return f"summary is {type(summary).__name__}, not a string"
    if not config.budget.summary_max_tokens:
        return None  # no summary text is kept (stored empty): any string will do
    if not summary.strip():
        return "summary is empty"
    if "\x00" in summary:
        return "summary contains a NUL character"
    if SURROGATE.search(summary):
        return "summary contains a lone surrogate"
    tokens = estimator(summary)
    if tokens > config.budget.summary_max_tokens:
        return f"summary is {tokens} tokens, over summary_max_tokens={config.budget.summary_max_tokens}"
    return None
