"""The recommended offline memory for a token budget: one call, a config and a summarizer to match."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from convmem.actors import TokenCounter, encoding_counter, token_counter_of
from convmem.adapters.backends.summarizers._extractive import ExtractiveSummarizer
from convmem.adapters.backends.summarizers._process import ProcessSummarizer
from convmem.errors import InvalidConfig
from convmem.events import MemoryBudget, ShortTermMemoryConfig
from convmem.projections import TokenEstimator, default_token_estimator

__all__ = ["MemorySetup", "recommended"]

FULL_ZONE_TURNS = 2
"""Recent turns shown verbatim: the last two exchanges, enough for a planner to follow the thread (a
third verbatim turn costs as much as several summary facts: on LoCoMo, 2 turns and a reserve of 100
tokens held more answers than 3 and 200 at every budget, `bench/RESULTS.md`)."""
RESERVE_TOKENS = 100
"""The budget the summary leaves free at least; recent turns get more by trimming its view."""
SMALLEST_BUDGET = 200
RECALL_SHARE = 0.35
"""The share of the budget that the lines recalled for a planner's query may take from the summary
(`MemoryBudget.recall_max_tokens`). On LoCoMo's tuned dialogues at 2,000 tokens, grounded recall /
ceiling with a query: 0.853 at 0.15, 0.875 at 0.25, 0.881 at 0.35 (`bench/RESULTS.md`)."""
LIVE_TURNS = 1000
"""How far back recall reaches: the live turns a session keeps (`live_turns`; the default keeps 100).
Measured costs at 1,000 against 100 (`python -m bench._recall_cost`, `bench/RESULTS.md`): a write's
`decide` + `evolve` 33 µs against 18, a snapshot about 340 KB against 45 KB, a view with a query
7-11 ms against 1.2-1.5; a view with no query is served from the cache either way. On LoCoMo,
recall with 100 live turns grounds 0.792 of the ceiling at 2,000 tokens against 0.881 with 1,000."""
EXTRACTIVE = "convmem.adapters.backends.summarizers:ExtractiveSummarizer"
"""The import path a worker process builds the extractive summarizer from."""


class MemorySetup(Mapping[str, Any]):
    """A session configuration and the summarizer sized to it.

    A mapping of ``config`` and ``summarizer``, so it spreads into the calls
    that take both: ``convmem.connect(**setup)``, ``MemorySystem(**setup, log=...)``.
    """

    __slots__ = ("config", "summarizer")

    def __init__(
        self, config: ShortTermMemoryConfig, summarizer: ExtractiveSummarizer | ProcessSummarizer
    ) -> None:
        self.config = config
        self.summarizer = summarizer

    def __getitem__(self, name: str) -> Any:
        if name == "config":
            return self.config
        if name == "summarizer":
            return self.summarizer
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(("config", "summarizer"))

    def __len__(self) -> int:
        return 2

    def __repr__(self) -> str:
        budget = self.config.budget
        return (
            f"MemorySetup(total_max_tokens={budget.total_max_tokens}, "
            f"summary_max_tokens={budget.summary_max_tokens}, full_zone_turns={budget.full_zone_turns})"
        )


def recommended(
    total_tokens: int = 4000,
    *,
    estimator: TokenEstimator = default_token_estimator,
    token_counter: TokenCounter | None = None,
    worker_process: bool | None = None,
    speaker_names: dict[str, str] | None = None,
    recall: bool = True,
) -> MemorySetup:
    """The offline configuration convmem recommends for a context of `total_tokens`.

    `rolling_summary` with the `ExtractiveSummarizer`: the last few turns
    verbatim, and a summary allowed to grow into the rest of the budget; turns
    carry their dates. Pass the same `estimator` as the memory system's.

    The summarizer runs in a worker process of its own (`ProcessSummarizer`,
    started on the first summary), so its pure-Python work does not compete
    with the writes for this process's interpreter; `worker_process=False`
    runs it here. A custom `estimator` cannot travel to another process, so
    with one the summarizer runs here unless `worker_process=True` asks
    otherwise, which is refused.

    `token_counter` counts every budget in the planner's tokens: the name of
    a tiktoken encoding (``"cl100k_base"``; recorded in the config, and the
    worker process loads it too) or a callable ``str -> int`` (the same as
    `estimator`; pass it to the memory system as well). With it the context
    never exceeds `total_tokens` as that counter counts.

    `speaker_names` (``{"user": "Alice", "assistant": "Bob"}``) goes into the
    config (`ShortTermMemoryConfig.speaker_names`): the summary then says who
    said or did what by name.

    `recall` (on by default): a planner that passes its current message
    (``get_llm_context(query=...)``) also gets the session's earlier lines
    most relevant to it, which may take `RECALL_SHARE` of the budget from the
    summary; the session keeps `LIVE_TURNS` turns live, so recall reaches that
    far back. With no query the view is the same as with `recall=False`.
    """
    name: str | None = None
    if isinstance(token_counter, str):
        encoding_counter(token_counter)  # InvalidConfig now if it cannot be loaded
        name = token_counter
        estimator = encoding_counter(token_counter)
    elif token_counter is not None:
        if estimator is not default_token_estimator:
            raise InvalidConfig("token_counter", "give token_counter or estimator, not both")
        estimator = token_counter_of(token_counter) or default_token_estimator
    custom = estimator is not default_token_estimator and name is None
    if worker_process is None:
        worker_process = not custom
    if worker_process and custom:
        raise InvalidConfig(
            "worker_process",
            "a worker process can only measure with the default token estimator; "
            "pass worker_process=False to run the summarizer here with yours",
        )
    if isinstance(total_tokens, bool) or not isinstance(total_tokens, int) or total_tokens < SMALLEST_BUDGET:
        raise InvalidConfig(
            "total_tokens", f"must be an int of at least {SMALLEST_BUDGET}, got {total_tokens!r}"
        )
    if total_tokens > 2**63 - 1:  # the largest a config holds (and a float of it would overflow)
        raise InvalidConfig(
            "total_tokens", f"must be at most 2**63 - 1, got a {total_tokens.bit_length()}-bit number"
        )
    summary_tokens = total_tokens - RESERVE_TOKENS
    config = ShortTermMemoryConfig(
        strategy="rolling_summary",
        budget=MemoryBudget(
            full_zone_turns=FULL_ZONE_TURNS,
            summary_max_tokens=summary_tokens,
            total_max_tokens=total_tokens,
            overflow_policy="truncate_summary",
            recall_max_tokens=int(total_tokens * RECALL_SHARE) if recall else 0,
        ),
        live_turns=LIVE_TURNS if recall else 100,
        include_turn_dates=True,
        token_counter=name,
        # A mapping is copied (the config keeps its own); anything else goes as given, so that the
        # config's check names it (`dict("x")` would raise a bare ValueError).
        speaker_names=dict(speaker_names) if isinstance(speaker_names, Mapping) else speaker_names or {},
    )
    if worker_process:
        measure: dict[str, Any] = {"estimator": name} if name is not None else {}
        return MemorySetup(
            config, ProcessSummarizer(EXTRACTIVE, start=False, max_tokens=summary_tokens, **measure)
        )
    return MemorySetup(config, ExtractiveSummarizer(max_tokens=summary_tokens, estimator=estimator))
