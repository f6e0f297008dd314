"""Query-aware recall: the session's earlier lines most relevant to the planner's current message.

A planner that passes its current message (`query`) to `llm_context` gets, beside the
summary and the turns shown verbatim, ``conversation_memory.recalled``: short lines, each
``"8 May 2023 · Alice: I went to a support group yesterday."`` (the date when the session
shows turn dates and the turn's time is known; the speaker as the session names them), holding
the sentences of the session's live turns that the view does not already show verbatim
(summarized turns, and pending turns the budget left out), those that score highest against the
query, shown oldest first.

Relevance is lexical and deterministic: BM25 (k1 1.2, b 0.75) over the sentences of the
session's own live turns, each a document, with the inverse document frequency taken over
them; words lowercased, general English stopwords left out, possessives and plurals folded
("Alice's" -> "alice", "agencies" -> "agency"). Ties go to the newer sentence. Only the turns'
texts are read: never a tool call, its output, an artifact or a digest, so recall can never
split a call from its output. Erased or forgotten turns are no longer in the state, so they
are never recalled. Nothing here knows a data set, its questions or its names.

The view never exceeds the budget: the recalled lines take their room from the summary (its
lines cut from the end, as ``truncate_summary`` does, to leave ``recall_max_tokens``), never from
the turns shown verbatim, and as many lines are shown as fit the whole budget, counted as the
session counts (`fit`'s measure). With no query, no match, or recall not configured, the view is
exactly the one without recall.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import lru_cache

import msgspec

from convmem.errors import InvalidInput
from convmem.events import ShortTermMemoryConfig, date_text
from convmem.projections._budget import ContextSelection, TokenEstimator, selection_tokens, trim_summary
from convmem.projections._state import SessionState

__all__ = [
    "MAX_QUERY_CHARS",
    "RECALL_KEY",
    "check_query",
    "query_terms",
    "ranked_lines",
    "with_recall",
]

RECALL_KEY = "recalled"
MAX_QUERY_CHARS = 8000
"""The longest query a read takes (a planner's message; longer is refused, `check_query`)."""
MAX_LINE_CHARS = 400
"""A recalled sentence longer than this is cut (at a word) and ends with an ellipsis."""
K1 = 1.2
B = 0.75

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|(?<=[.!?…][\"'”’)\]])\s+|\n+")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NAMES = re.compile(r"The (user|assistant)'s name is ([^\n:]{1,40})\.")
_STOPWORD_TEXT = """
    a about above after again against all am an and any are aren't as at be because been before
    being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
    don't down during each few for from further had hadn't has hasn't have haven't having he he'd
    he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm i've if in into
    is isn't it it's its itself let's me more most mustn't my myself no nor not of off on once only
    or other ought our ours ourselves out over own same shan't she she'd she'll she's should
    shouldn't so some such than that that's the their theirs them themselves then there there's
    these they they'd they'll they're they've this those through to too under until up very was
    wasn't we we'd we'll we're we've were weren't what what's when when's where where's which while
    who who's whom why why's with won't would wouldn't you you'd you'll you're you've your yours
    yourself yourselves yes yeah oh ok okay just also really will like get got go going know think
    well much many thing things one lot way even still s t d ll m re ve
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def check_query(
    query: object, where: str = "query", error: Callable[[str, str], InvalidInput] = InvalidInput
) -> str | None:
    """`query` if it can be a read's query (None, or a string of at most `MAX_QUERY_CHARS` characters
    with no NUL and no lone surrogate), else the `error` (`InvalidInput`) naming `where`."""
    if query is None or (
        type(query) is str and len(query) <= MAX_QUERY_CHARS and query.isascii() and "\x00" not in query
    ):
        return query
    if not isinstance(query, str):
        raise error(where, f"must be a string or None, got {type(query).__name__}")
    if len(query) > MAX_QUERY_CHARS:
        raise error(where, f"is {len(query)} characters, over the limit of {MAX_QUERY_CHARS}")
    if "\x00" in query:
        raise error(where, "contains a NUL character")
    if _SURROGATE.search(query):
        raise error(where, "contains a lone surrogate")
    return query


def _fold(word: str) -> str:
    """A word as compared: lowercase, a possessive or plural folded ("agencies" -> "agency")."""
    word = word.lower().replace("’", "'")
    if word.endswith("'s"):
        word = word[:-2]
    elif word.endswith("'"):
        word = word[:-1]
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@lru_cache(maxsize=65536)
def _terms_of(sentence: str) -> tuple[str, ...]:
    return tuple(
        folded
        for word in _WORD.findall(sentence)
        if word.lower().replace("’", "'") not in _STOPWORDS and (folded := _fold(word)) not in _STOPWORDS
    )


def query_terms(query: str) -> tuple[str, ...]:
    """The distinct terms of `query` that relevance counts, in their order of first appearance."""
    return tuple(dict.fromkeys(_terms_of(query[:MAX_QUERY_CHARS])))


@lru_cache(maxsize=16384)
def _sentences(text: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The sentences of a turn's text that hold a term, each with its terms (cached: texts recur
    from view to view)."""
    out = []
    for raw in _SENTENCE_END.split(text):
        sentence = " ".join(raw.split())
        if not sentence:
            continue
        terms = _terms_of(sentence)
        if terms:
            out.append((sentence, terms))
    return tuple(out)


def _labels(config: ShortTermMemoryConfig, summary: str) -> dict[str, str]:
    """Who each role is: the configured names, else the names the summary gives, else the role."""
    names = {"user": "User", "assistant": "Assistant"}
    for match in _NAMES.finditer(summary):
        names[match.group(1)] = match.group(2).strip()
    names.update(config.speaker_names)
    return names


def _clip(sentence: str) -> str:
    if len(sentence) <= MAX_LINE_CHARS:
        return sentence
    cut = sentence[:MAX_LINE_CHARS].rsplit(" ", 1)[0]
    return cut.rstrip() + "…"


def ranked_lines(
    state: SessionState, query: str, shown: frozenset[int] = frozenset()
) -> list[tuple[int, str]]:
    """The live turns' sentences (turns numbered in `shown` left out) that share a term with `query`,
    most relevant first: ``(order, line)``, `order` the sentence's place in the session (to show the
    chosen lines oldest first). Deterministic: ties go to the newer sentence."""
    wanted = query_terms(query)
    if not wanted:
        return []
    wanted_set = frozenset(wanted)
    config = state.config
    labels = _labels(config, state.summary)
    dated = config.include_turn_dates
    docs: list[tuple[int, float, str, str, tuple[str, ...]]] = []  # order, turn time, role, sentence, terms
    total_len = 0
    order = 0
    for record in state.turns:
        turn = record.turn
        for role, text in (("user", turn.user_message), ("assistant", turn.assistant_response)):
            if not text:
                continue
            for sentence, terms in _sentences(text):
                order += 1
                total_len += len(terms)
                if record.index in shown:
                    continue
                docs.append((order, turn.ts, role, sentence, terms))
    if not docs:
        return []
    # Document frequencies over every live sentence (shown ones too: the session's own vocabulary).
    df = dict.fromkeys(wanted, 0)
    n_docs = order
    for record in state.turns:
        turn = record.turn
        for text in (turn.user_message, turn.assistant_response):
            if not text:
                continue
            for _, terms in _sentences(text):
                for term in wanted_set.intersection(terms):
                    df[term] += 1
    idf = {t: math.log(1 + (n_docs - f + 0.5) / (f + 0.5)) for t, f in df.items()}
    average = total_len / n_docs
    scored: list[tuple[float, int, str]] = []
    seen: set[str] = set()
    dates: dict[float, str] = {}
    for place, ts, role, sentence, terms in docs:
        if wanted_set.isdisjoint(terms):
            continue
        norm = K1 * (1 - B + B * len(terms) / average)
        score = 0.0
        for term in wanted_set.intersection(terms):
            tf = terms.count(term)
            score += idf[term] * tf * (K1 + 1) / (tf + norm)
        line = f"{labels[role]}: {_clip(sentence)}"
        if dated and ts > 0:
            if ts not in dates:
                dates[ts] = date_text(ts)
            if dates[ts]:
                line = f"{dates[ts]} · {line}"
        scored.append((score, place, line))
    scored.sort(key=lambda s: (-s[0], -s[1]))
    out: list[tuple[int, str]] = []
    for _, place, line in scored:
        if line in seen:
            continue
        seen.add(line)
        out.append((place, line))
    return out


def with_recall(
    selection: ContextSelection,
    state: SessionState,
    query: str,
    estimator: TokenEstimator,
    fits: Callable[[ContextSelection], bool],
) -> ContextSelection:
    """`selection` (already within the budget) with the recalled lines that fit beside it.

    The summary gives up to ``recall_max_tokens`` (its last lines cut, as the view cuts it) and
    the lines most relevant to `query` fill what the whole view leaves, the most relevant first;
    they are shown oldest first. No line chosen: `selection` unchanged.
    """
    config = state.config
    room = config.budget.recall_max_tokens
    shown = frozenset(r.index for r in (*selection.pending, *selection.recent))
    ranked = ranked_lines(state, query, shown)
    if not ranked:
        return selection
    include, dated = config.include_trajectory_digest, config.include_turn_dates
    budget = config.budget.total_max_tokens
    base = selection
    if budget:
        target = budget - room
        if selection.summary and selection_tokens(selection, estimator, include, dated) > target:

            def leaves_room(summary: str) -> bool:
                candidate = msgspec.structs.replace(selection, summary=summary)
                return selection_tokens(candidate, estimator, include, dated) <= target

            base = msgspec.structs.replace(selection, summary=trim_summary(selection.summary, leaves_room))

        def fits_with(k: int) -> bool:
            return fits(_chosen(base, ranked, k))
    else:
        alone = ContextSelection(summary="", pending=(), recent=())
        empty = selection_tokens(alone, estimator, include, dated)

        def fits_with(k: int) -> bool:
            return selection_tokens(_chosen(alone, ranked, k), estimator, include, dated) - empty <= room

    lo, hi = 0, len(ranked)  # the most lines that fit (a prefix of the ranking)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits_with(mid):
            lo = mid
        else:
            hi = mid - 1
    if not lo:
        return selection
    return _chosen(base, ranked, lo)


def _chosen(base: ContextSelection, ranked: list[tuple[int, str]], k: int) -> ContextSelection:
    lines = tuple(line for _, line in sorted(ranked[:k]))
    return msgspec.structs.replace(base, recalled=lines)
