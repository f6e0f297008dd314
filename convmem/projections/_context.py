"""The PenguiFlow-shaped context view and its token estimate.

``{"conversation_memory": {"summary", "pending_turns", "recent_turns"}}`` with
PenguiFlow's presence rules: `recent_turns` always, `pending_turns` and
`summary` only when non-empty; strategy ``none`` gives ``{}``.

Which turns show is the session's `Strategy`'s, read from its entry in
``_strategies`` (for ``rolling_summary``, the seed's table: HEALTHY, RETRY and
RECOVERING show the last good summary, the pending turns and the recent
turns; DEGRADED shows the recent turns only). The budget's overflow policy is
applied last (`fit`), so the view never exceeds `total_max_tokens`.

With a `query` (the planner's current message) and ``budget.recall_max_tokens`` set, the
view also shows ``recalled``: the session's earlier lines most relevant to the query
(``_recall``), within the same budget. Without either, the view is the one it always was.
"""

from __future__ import annotations

from typing import Any

from convmem.projections._budget import (
    ContextSelection,
    TokenEstimator,
    default_token_estimator,
    fit,
    selection_tokens,
)
from convmem.projections._recall import check_query, with_recall
from convmem.projections._state import SessionState
from convmem.projections._strategies import CONTEXT_STRATEGIES

__all__ = [
    "estimate_tokens",
    "full_tokens",
    "llm_context",
    "over_budget",
    "select_context",
    "view_tokens",
]

_NOTHING = ContextSelection(summary="", pending=(), recent=())


def select_context(
    state: SessionState, estimator: TokenEstimator = default_token_estimator, *, query: str | None = None
) -> ContextSelection:
    """The view after the overflow policy: never over `total_max_tokens` unless nothing is shown.

    With a `query` and ``budget.recall_max_tokens`` set, it also holds the lines recalled for it.
    """
    view = CONTEXT_STRATEGIES[state.config.strategy].view
    if view is None:
        return _NOTHING
    config = state.config
    selection = fit(view(state), config, estimator)
    if check_query(query) is None or not config.budget.recall_max_tokens:
        return selection
    budget = config.budget.total_max_tokens
    include, dated = config.include_trajectory_digest, config.include_turn_dates

    def fits(candidate: ContextSelection) -> bool:
        return not budget or selection_tokens(candidate, estimator, include, dated) <= budget

    if not fits(selection):  # nothing fits (not even the newest turn alone): nothing to add to
        return selection
    return with_recall(selection, state, query or "", estimator, fits)


def llm_context(
    state: SessionState, estimator: TokenEstimator = default_token_estimator, *, query: str | None = None
) -> dict[str, Any]:
    """The patch a planner merges into its `llm_context`.

    `query`: the planner's current message; with ``budget.recall_max_tokens`` set, the view adds
    ``recalled``, the session's earlier lines most relevant to it. None: the view without recall.
    """
    view = CONTEXT_STRATEGIES[state.config.strategy].view
    if view is None:
        check_query(query)
        return {}
    config = state.config
    return {
        "conversation_memory": select_context(state, estimator, query=query).payload(
            include_digest=config.include_trajectory_digest, include_date=config.include_turn_dates
        )
    }


def estimate_tokens(
    state: SessionState, estimator: TokenEstimator = default_token_estimator, *, query: str | None = None
) -> int:
    """Tokens of the ``conversation_memory`` object the view shows (0 for strategy none)."""
    view = CONTEXT_STRATEGIES[state.config.strategy].view
    if view is None:
        check_query(query)
        return 0
    return _tokens(select_context(state, estimator, query=query), state, estimator)


def view_tokens(state: SessionState, estimator: TokenEstimator = default_token_estimator) -> int:
    """Tokens of the view as it shows now, before budgets."""
    view = CONTEXT_STRATEGIES[state.config.strategy].view
    return 0 if view is None else _tokens(view(state), state, estimator)


def full_tokens(state: SessionState, estimator: TokenEstimator = default_token_estimator) -> int:
    """Tokens of everything the strategy may show, whatever the health (the ``error`` policy's measure)."""
    content = CONTEXT_STRATEGIES[state.config.strategy].content
    return 0 if content is None else _tokens(content(state), state, estimator)


def over_budget(state: SessionState, estimator: TokenEstimator) -> int | None:
    """Tokens of the state's full content when the ``error`` policy refuses it, else None.

    A `total_max_tokens` of 0 sets no budget, so nothing is refused.
    """
    budget = state.config.budget
    if budget.overflow_policy != "error" or not budget.total_max_tokens:
        return None
    tokens = full_tokens(state, estimator)
    return tokens if tokens > budget.total_max_tokens else None


def _tokens(selection: ContextSelection, state: SessionState, estimator: TokenEstimator) -> int:
    config = state.config
    return selection_tokens(selection, estimator, config.include_trajectory_digest, config.include_turn_dates)
