"""Token budgets: what a PenguiFlow-shaped view costs, and what of it fits.

Tokens are measured on the canonical rendering of the ``conversation_memory``
object, ``json.dumps(obj, ensure_ascii=False, sort_keys=True)`` (the one
PenguiFlow's `estimate_tokens` uses). With the default estimator the length of
that rendering is computed from per-turn lengths stored at fold time, so
neither budget checks nor views serialise the whole payload. A custom
estimator is called on the real rendering.

Which turns a view offers is its strategy's (``_strategies``); `fit` then
applies the overflow policy (to views; the stored state is never touched):

* ``truncate_oldest``: drop pending turns oldest first, then recent turns
  oldest first, then the summary;
* ``truncate_summary``: shorten the summary by whole lines from its end,
  keeping its tags, then drop it, then drop turns as above;
* ``error``: refuse, before storing, a turn or summary that would go over the
  budget (`MemoryBudgetExceeded`); views apply ``truncate_oldest`` as a guard.

Every policy terminates: each step removes one element of a finite view.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import msgspec

from convmem.events import ShortTermMemoryConfig
from convmem.projections._state import TurnRecord

__all__ = [
    "ContextSelection",
    "TokenEstimator",
    "default_token_estimator",
    "fewest",
    "fit",
    "render",
    "selection_tokens",
    "summary_left",
    "tag_line",
    "trim_summary",
]

TokenEstimator = Callable[[str], int]

_KEY_LEN = {
    "pending_turns": len('"pending_turns"'),
    "recalled": len('"recalled"'),
    "recent_turns": len('"recent_turns"'),
    "summary": len('"summary"'),
}
_TAG = re.compile(r"</?[A-Za-z_][\w.-]*>")


def default_token_estimator(text: str) -> int:
    """The seed's heuristic: ``len(text) // 4 + 1``."""
    return len(text) // 4 + 1


def render(obj: Any) -> str:
    """The canonical rendering that tokens are measured on."""
    return json.dumps(obj, ensure_ascii=False, sort_keys=True)


class ContextSelection(msgspec.Struct, frozen=True, kw_only=True):
    """What a view shows: a summary text, the pending and recent turns, and the lines recalled for
    the planner's current message (``_recall``; none without a query)."""

    summary: str
    pending: tuple[TurnRecord, ...]
    recent: tuple[TurnRecord, ...]
    recalled: tuple[str, ...] = ()

    def payload(self, *, include_digest: bool, include_date: bool = False) -> dict[str, Any]:
        """The ``conversation_memory`` object (PenguiFlow's keys and presence rules)."""
        out: dict[str, Any] = {
            "recent_turns": [
                r.turn.to_llm(include_digest=include_digest, include_date=include_date) for r in self.recent
            ]
        }
        if self.pending:
            out["pending_turns"] = [
                r.turn.to_llm(include_digest=include_digest, include_date=include_date) for r in self.pending
            ]
        if self.summary:
            out["summary"] = self.summary
        if self.recalled:
            out["recalled"] = list(self.recalled)
        return out


def _list_len(total: int, count: int) -> int:
    return 2 + total + 2 * (count - 1) if count else 2


def _payload_len(
    summary_len: int,
    pending_len: int,
    n_pending: int,
    recent_len: int,
    n_recent: int,
    recalled_len: int = 0,
    n_recalled: int = 0,
) -> int:
    """Exact length of the rendering, from its parts' rendered lengths."""
    parts = [_KEY_LEN["recent_turns"] + 2 + _list_len(recent_len, n_recent)]
    if n_pending:
        parts.append(_KEY_LEN["pending_turns"] + 2 + _list_len(pending_len, n_pending))
    if summary_len:
        parts.append(_KEY_LEN["summary"] + 2 + summary_len)
    if n_recalled:
        parts.append(_KEY_LEN["recalled"] + 2 + _list_len(recalled_len, n_recalled))
    return 2 + sum(parts) + 2 * (len(parts) - 1)


def _string_len(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False)) if text else 0


@lru_cache(maxsize=16384)
def _line_len(line: str) -> int:
    """`_string_len` of a recalled line (cached: a view measures its lines at every fitting step)."""
    return len(json.dumps(line, ensure_ascii=False))


def selection_tokens(
    selection: ContextSelection, estimator: TokenEstimator, include_digest: bool, include_date: bool = False
) -> int:
    if estimator is default_token_estimator:
        length = _payload_len(
            _string_len(selection.summary),
            sum(r.rendered_len for r in selection.pending),
            len(selection.pending),
            sum(r.rendered_len for r in selection.recent),
            len(selection.recent),
            sum(_line_len(line) for line in selection.recalled),
            len(selection.recalled),
        )
        return length // 4 + 1
    return estimator(render(selection.payload(include_digest=include_digest, include_date=include_date)))


def fit(
    selection: ContextSelection,
    config: ShortTermMemoryConfig,
    estimator: TokenEstimator = default_token_estimator,
) -> ContextSelection:
    """`selection` after the overflow policy: never over `total_max_tokens` unless nothing is shown.

    A `total_max_tokens` of 0 sets no budget (PenguiFlow's meaning): the view is shown whole.
    """
    budget = config.budget.total_max_tokens
    include, dated = config.include_trajectory_digest, config.include_turn_dates

    def fits(candidate: ContextSelection) -> bool:
        return selection_tokens(candidate, estimator, include, dated) <= budget

    if not budget or fits(selection):  # 0: no overall budget
        return selection
    full = selection
    if config.budget.overflow_policy == "truncate_summary" and selection.summary:
        selection = msgspec.structs.replace(
            selection,
            summary=trim_summary(
                selection.summary, lambda s: fits(msgspec.structs.replace(selection, summary=s))
            ),
        )
        if fits(selection):
            return selection
    selection = _drop_oldest(selection, fits)
    if fits(selection):
        return selection
    # Not even the summary alone fits: drop it, and show the newest turns that fit without it.
    return _drop_oldest(msgspec.structs.replace(full, summary=""), fits)


def _drop_oldest(selection: ContextSelection, fits: Callable[[ContextSelection], bool]) -> ContextSelection:
    """Drop the fewest oldest turns (pending first, then recent) so the view fits."""
    turns: Sequence[TurnRecord] = (*selection.pending, *selection.recent)
    n_pending = len(selection.pending)

    def dropped(k: int) -> ContextSelection:
        return msgspec.structs.replace(
            selection,
            pending=selection.pending[min(k, n_pending) :],
            recent=selection.recent[max(0, k - n_pending) :],
        )

    # Dropping every turn is the fallback, left unchecked: the caller checks what it returns.
    return dropped(fewest(len(turns) - 1, lambda k: fits(dropped(k))))


def fewest(most: int, fits_without: Callable[[int], bool], *, least: int = 0) -> int:
    """The smallest k from `least` to `most` for which `fits_without(k)` holds (it holds for every k
    above one where it holds), by bisection; `most` + 1 when none does."""
    lo, hi = least, most + 1  # hi: no k fits
    while lo < hi:
        mid = (lo + hi) // 2
        if fits_without(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def tag_line(line: str) -> bool:
    """Whether a summary line holds a ``<tag>`` / ``</tag>`` marker (its structure, never cut)."""
    return _TAG.search(line) is not None


def summary_left(trimmed: str) -> str:
    """A trimmed summary, or '' when only its ``<tag>`` lines are left (no summary worth showing)."""
    return trimmed if _TAG.sub("", trimmed).strip() else ""


def trim_summary(summary: str, fits: Callable[[str], bool]) -> str:
    """Remove whole content lines from the end, never a line holding a tag, until `fits`; else ''.

    A summary's structure (its ``<tag>`` / ``</tag>`` markers) is never cut:
    the result is the original with its last k tag-free content lines
    removed, for the smallest k that fits, or empty when no k does or when
    only tags would remain.
    """
    lines = summary.split("\n")
    content = [i for i, line in enumerate(lines) if line.strip() and not tag_line(line)]

    def without_last(k: int) -> str:
        removed = set(content[len(content) - k :])
        return "\n".join(line for i, line in enumerate(lines) if i not in removed)

    k = fewest(len(content), lambda k: fits(without_last(k)), least=1)
    return "" if k > len(content) else summary_left(without_last(k))
