"""The PenguiFlow-shaped context view and its token estimate.

``{"conversation_memory": {"summary", "pending_turns", "recent_turns"}}`` with
PenguiFlow's presence rules: `recent_turns` always, `pending_turns` and
`summary` only when non-empty; strategy ``none`` gives ``{}``.

What shows in each health state (the seed's table): HEALTHY, RETRY and
RECOVERING show the last good summary, the pending turns and the recent
turns; DEGRADED shows the recent turns only. The budget's overflow policy is
applied last, so the view never exceeds `total_max_tokens`.
"""

from __future__ import annotations

from typing import Any

from convmem.projections._budget import (
    TokenEstimator,
    default_token_estimator,
    select_context,
    selection_tokens,
)
from convmem.projections._state import SessionState

__all__ = ["estimate_tokens", "llm_context"]


def llm_context(state: SessionState, estimator: TokenEstimator = default_token_estimator) -> dict[str, Any]:
    """The patch a planner merges into its `llm_context`."""
    if state.config.strategy == "none":
        return {}
    selection = select_context(state, estimator)
    config = state.config
    return {
        "conversation_memory": selection.payload(
            include_digest=config.include_trajectory_digest, include_date=config.include_turn_dates
        )
    }


def estimate_tokens(state: SessionState, estimator: TokenEstimator = default_token_estimator) -> int:
    """Tokens of the ``conversation_memory`` object the view shows (0 for strategy none)."""
    if state.config.strategy == "none":
        return 0
    config = state.config
    return selection_tokens(
        select_context(state, estimator),
        estimator,
        config.include_trajectory_digest,
        config.include_turn_dates,
    )
