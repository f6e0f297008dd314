"""The context a replayed state served: what `get_llm_context()` gave the model, rebuilt by an auditor.

A session's view is measured by the token counter its configuration records (``token_counter``,
an encoding name, stored in its `SessionStarted` and in each `SessionCleared` that changes it), so a
replay measures with the same counter the live session did, whatever the auditor's own runtime
counts with. A counter given to the runtime as a callable is not recorded: the auditor passes the
same one as `estimator` (the default estimate otherwise). With `query`, the lines recalled for it.
"""

from __future__ import annotations

from typing import Any

from convmem.actors._tokens import encoding_counter
from convmem.projections import (
    SessionState,
    TokenEstimator,
    check_query,
    default_token_estimator,
    llm_context,
)

__all__ = ["replayed_context", "replayed_estimator"]


def replayed_estimator(state: SessionState, estimator: TokenEstimator | None = None) -> TokenEstimator:
    """The counter that measured `state` live: the encoding its configuration names, else
    `estimator` (the runtime's callable, not recorded), else the default estimate."""
    if state.config.token_counter is not None:
        return encoding_counter(state.config.token_counter)
    return estimator if estimator is not None else default_token_estimator


def replayed_context(
    state: SessionState, *, query: str | None = None, estimator: TokenEstimator | None = None
) -> dict[str, Any]:
    """`get_llm_context(query)` as the session served it in `state` (a replay's, or a fork's)."""
    check_query(query)
    return llm_context(state, replayed_estimator(state, estimator), query=query)
