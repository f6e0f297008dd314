"""The extractive summarizer: deterministic, no model, the offline default.

Each call folds new turns into the previous summary. Every sentence of the
new turns is cleaned of fillers ("Wow, Jon!"), dated (relative words such as
"yesterday" get their absolute date), and offered to the summary's `Pool`: it
joins when it covers enough content the summary does not hold yet, and while
the summary is over `max_tokens` the facts whose loss uncovers the least per
character leave. The result is the RFC's tagged summary with the key facts
grouped by day (`_summary`), always within `max_tokens` by the estimator.

The summarizer keeps no state between calls that its output depends on: it
keeps a small cache of the pools behind the summaries it wrote, keyed by their
exact text, so that a rolling call (whose previous summary is the last one it
wrote) need not read that text again. A pool rebuilt from the text chooses
exactly as the cached one (`tests/test_extractive.py` checks both ways give
the same bytes).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from convmem.actors import token_counter_of
from convmem.adapters.summarizers._dates import day_of, resolve
from convmem.adapters.summarizers._pool import Pool
from convmem.adapters.summarizers._summary import (
    CLOSE,
    FACTS,
    MINIMAL,
    OPEN,
    make_fact,
    parse,
    prose,
    render,
)
from convmem.adapters.summarizers._text import (
    FULL_WEIGHT,
    clean,
    clip,
    is_question,
    sentences,
    strip_filler,
)
from convmem.errors import InvalidConfig, SummarizerError
from convmem.projections import TokenEstimator, default_token_estimator

__all__ = ["ExtractiveSummarizer"]

MAX_FACT_CHARS = 240
MIN_GAIN = FULL_WEIGHT
"""A sentence joins only when it adds at least one rare word's weight the summary lacks."""
MIN_TERMS = 2
"""A sentence with fewer content terms says too little to be a fact ("Mel.", "Confirmed.")."""
_SPEAKERS = (("User", "user"), ("Assistant", "assistant"))


class _Rolled:
    """A pool and the coverage line of the summary it wrote."""

    __slots__ = ("first_day", "last_day", "pool", "turns")

    def __init__(self, pool: Pool, turns: int, first_day: int | None, last_day: int | None) -> None:
        self.pool = pool
        self.turns = turns
        self.first_day = first_day
        self.last_day = last_day


class ExtractiveSummarizer:
    """Summarize by extraction: the RFC's summarizer signature, no model, same input same bytes.

    ``summarizer({"previous_summary": ..., "turns": [...]}) -> {"summary": ...}``.
    Set `max_tokens` to the session's ``summary_max_tokens`` (or below) and
    pass the same `estimator` as the memory system (its `token_counter`: a
    callable, or a tiktoken encoding name), so that every summary it makes
    is accepted. `cache_size` bounds the pools kept for rolling calls (one
    per session summarized recently is ideal; a miss only costs a parse).
    """

    def __init__(
        self,
        max_tokens: int = 1000,
        estimator: TokenEstimator | str = default_token_estimator,
        *,
        cache_size: int = 256,
    ) -> None:
        estimator = token_counter_of(estimator, "estimator") or default_token_estimator
        floor = estimator(MINIMAL)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < floor:
            raise InvalidConfig(
                "max_tokens", f"must be an int of at least {floor} (the smallest summary), got {max_tokens!r}"
            )
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise InvalidConfig("cache_size", f"must be an int >= 0, got {cache_size!r}")
        self.max_tokens = max_tokens
        self._estimator = estimator
        self._cache_size = cache_size
        self._cache: OrderedDict[str, _Rolled] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ExtractiveSummarizer(max_tokens={self.max_tokens})"

    def __call__(self, request: Mapping[str, Any], /) -> dict[str, str]:
        previous, turns = _read_request(request)
        return {"summary": self.summarize(previous, turns)}

    def summarize(self, previous_summary: str, turns: Sequence[Mapping[str, Any]]) -> str:
        """The merged summary text of `previous_summary` and `turns`."""
        rolled = self._take(previous_summary)
        pool = rolled.pool
        first, last = rolled.first_day, rolled.last_day
        for turn in turns:
            day = day_of(turn.get("ts"))
            if day is not None:
                first = day if first is None else min(first, day)
                last = day if last is None else max(last, day)
            for speaker, field in _SPEAKERS:
                for sentence in sentences(_text(turn, field)):
                    _offer(pool, speaker, sentence, day)
            _offer_tools(pool, turn.get("trajectory_digest"), day)
        count = rolled.turns + len(turns)
        line = prose(count, first, last)
        text = self._fit(pool, line)
        if text is None:
            return self._smallest(count)
        self._keep(text, _Rolled(pool, count, first, last))
        return text

    def _fit(self, pool: Pool, line: str) -> str | None:
        """The pool's summary within `max_tokens`, evicting the cheapest facts (None: not even empty)."""
        estimator, budget = self._estimator, self.max_tokens
        if estimator is default_token_estimator:
            frame = len(OPEN) + len(line) + len(CLOSE) + 2
            limit = 4 * budget - 1  # len // 4 + 1 <= budget
            while pool.chars + frame > limit and len(pool):
                pool.remove(pool.cheapest())  # type: ignore[arg-type]
        text = pool.render(line)
        while estimator(text) > budget:
            cheapest = pool.cheapest()
            if cheapest is None:
                return None
            pool.remove(cheapest)
            text = pool.render(line)
        return text

    def _smallest(self, count: int) -> str:
        """Without facts, the prose alone if it fits, else the minimal summary."""
        bare = render(prose(count, None, None), ())
        return bare if self._estimator(bare) <= self.max_tokens else MINIMAL

    def _take(self, previous: str) -> _Rolled:
        """The pool behind `previous`: taken from the cache (each entry serves one call), or parsed."""
        with self._lock:
            rolled = self._cache.pop(previous, None)
        if rolled is not None:
            return rolled
        parsed = parse(previous)
        return _Rolled(Pool(parsed.facts), parsed.turns, parsed.first_day, parsed.last_day)

    def _keep(self, text: str, rolled: _Rolled) -> None:
        if not self._cache_size:
            return
        with self._lock:
            self._cache[text] = rolled
            self._cache.move_to_end(text)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)


def _offer(pool: Pool, speaker: str, sentence: str, day: int | None) -> None:
    """Add the sentence as a fact if it covers enough that the pool does not."""
    kept = strip_filler(sentence)
    if not kept:
        return
    if day is not None:
        kept = resolve(kept, day)
    fact = make_fact(FACTS, clip(f"{speaker}: {kept}", MAX_FACT_CHARS), day)
    if fact.key in pool.facts or len(fact.terms) < MIN_TERMS:
        return
    gain = pool.gain(fact)
    if is_question(kept):
        gain //= 2  # a question asks more often than it tells
    if gain >= MIN_GAIN:
        pool.add(fact)


def _offer_tools(pool: Pool, digest: object, day: int | None) -> None:
    """A tool bullet per invoked tool (a newer result replaces the older); a shared result as a fact."""
    if not isinstance(digest, Mapping):
        return
    tools = digest.get("tools_invoked")
    observations = digest.get("observations_summary")
    if isinstance(tools, str) or not isinstance(tools, Sequence):
        tools = ()
    names = [n for n in (clean(str(t)).replace(":", " ").strip() for t in tools) if n]
    note = ""
    if isinstance(observations, str):
        note = clip(next(iter(sentences(observations)), ""), MAX_FACT_CHARS)
    if note and len(names) != 1:  # a turn's result belongs to no single tool: keep it as a fact
        _offer(pool, "Tools", note, day)
    for name in names:
        text = clip(f"{name}: {note}" if note and len(names) == 1 else f"{name}: invoked", MAX_FACT_CHARS)
        fact = make_fact("tools_used", text, None)
        old = pool.facts.get(fact.key)
        if old is not None:
            if old.text == text:
                continue
            pool.remove(old.key)
        pool.add(fact)


def _read_request(request: Mapping[str, Any]) -> tuple[str, Sequence[Mapping[str, Any]]]:
    if not isinstance(request, Mapping):
        raise SummarizerError(f"request must be a mapping, got {type(request).__name__}")
    previous = request.get("previous_summary") or ""
    turns = request.get("turns") or []
    if not isinstance(previous, str):
        raise SummarizerError(f"request.previous_summary must be a string, got {type(previous).__name__}")
    if isinstance(turns, str | bytes) or not isinstance(turns, Sequence):
        raise SummarizerError(f"request.turns must be a list, got {type(turns).__name__}")
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping):
            raise SummarizerError(f"request.turns[{i}] must be a mapping, got {type(turn).__name__}")
        ts = turn.get("ts")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int | float)):
            raise SummarizerError(f"request.turns[{i}].ts must be epoch seconds, got {type(ts).__name__}")
    return previous, turns


def _text(turn: Mapping[str, Any], field: str) -> str:
    value = turn.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SummarizerError(f"request turn field {field!r} must be a string, got {type(value).__name__}")
    return value
