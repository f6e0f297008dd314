"""The summarizer of a rolling summary when PenguiFlow hands a memory none."""

from __future__ import annotations

from convmem.actors import Summarizer
from convmem.adapters.backends.summarizers import ExtractiveSummarizer
from convmem.errors import InvalidConfig
from convmem.events import ShortTermMemoryConfig
from convmem.projections import TokenEstimator, default_token_estimator

__all__ = ["offline_summarizer"]


def offline_summarizer(config: ShortTermMemoryConfig, estimator: TokenEstimator | None = None) -> Summarizer:
    """convmem's offline extractive summarizer sized to the session's summary allowance.

    A `summary_max_tokens` of 0 keeps no summary text (any summary is stored
    empty), and one below the smallest summary the extractive summarizer
    makes cannot be met (its summaries then fail into the health machine):
    both get the summarizer's default size.
    """
    measure = estimator or default_token_estimator
    try:
        return ExtractiveSummarizer(max_tokens=config.budget.summary_max_tokens, estimator=measure)
    except InvalidConfig:
        return ExtractiveSummarizer(estimator=measure)
