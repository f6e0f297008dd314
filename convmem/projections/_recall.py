"""Query-aware recall: the session's earlier lines most relevant to the planner's current message.

A planner that passes its current message (`query`) to `llm_context` gets, beside the
summary and the turns shown verbatim, ``conversation_memory.recalled``: short lines, each
``"8 May 2023 · Alice: I went to a support group yesterday."`` (the date when the session
shows turn dates and the turn's time is known; the speaker as the session names them: its
``speaker_names``, else the names its summary gives, else ``User`` / ``Assistant``), holding the
sentences of the session's live turns that the view does not already show verbatim (summarized
turns, and pending turns the budget left out), those that score highest against the query,
shown oldest first. A sentence that a line of the summary shown beside already holds (every
term of it) is not repeated.

Relevance is lexical and deterministic: BM25 (k1 1.2, b 0.75) over the sentences of the
session's own live turns, each a document, with the inverse document frequency taken over
them; words lowercased, general English stopwords left out, possessives, plurals and a few
common suffixes folded ("Alice's" -> "alice", "agencies" -> "agency", "painting" -> "paint").
A sentence is read with its speaker's name, so a query naming a speaker favours their lines,
though the name alone makes no line relevant. Ties go to the newer sentence. Only the turns'
texts are read: never a tool call, its output, an artifact or a digest, so recall can never
split a call from its output. Erased or forgotten turns are no longer in the state, so they are
never recalled. Nothing here knows a data set, its questions or its names.

The view never exceeds the budget: the recalled lines take their room from the summary (up to
``recall_max_tokens``: its lines least relevant to the query leave first, `trim_by_relevance`),
never from the turns shown verbatim, and as many lines are shown as fit the whole budget,
counted as the session counts (`fit`'s measure). With no query, no match, or recall not
configured, the view is exactly the one without recall.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

import msgspec

from convmem.errors import InvalidInput
from convmem.events import ShortTermMemoryConfig, date_text
from convmem.projections._budget import (
    ContextSelection,
    TokenEstimator,
    fewest,
    selection_tokens,
    summary_left,
    tag_line,
)
from convmem.projections._state import SessionState

__all__ = [
    "MAX_QUERY_CHARS",
    "RECALL_KEY",
    "Relevance",
    "check_query",
    "query_terms",
    "ranked_lines",
    "trim_by_relevance",
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
        word = word[:-3] + "y"
    elif len(word) > 4 and word.endswith(("sses", "shes", "ches", "xes")):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    return _stem(word)


_SUFFIXES = ("ation", "ment", "ness", "ion", "ing", "ed", "er", "ly", "e")


def _stem(word: str) -> str:
    """A light suffix stripping: "painting", "painted", "painter" -> "paint"; "running" -> "run"."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz":
                word = word[:-1]
            break
    return word


T = TypeVar("T")


class _Kept(Generic[T]):
    """One tenant's texts in a `TextMemo`: two generations and the characters of each."""

    __slots__ = ("old", "old_chars", "young", "young_chars")

    def __init__(self) -> None:
        self.young: dict[str, T] = {}
        self.old: dict[str, T] = {}
        self.young_chars = 0
        self.old_chars = 0


class TextMemo(Generic[T]):
    """`function`'s results for the texts it was called with lately, kept up to `chars` characters
    of those texts in all; a text longer than `longest` is never kept.

    Texts are every tenant's turns and queries, in one process: an lru_cache of so many texts
    held them whatever their length (16,384 texts of 100,000 characters and what was read of
    them: about 28 GB, from 1.7 MB a text measured), kept a turn's text after its session was
    erased until enough others came, and let a tenant reading many texts push out every other
    tenant's (a session of 1,000 live turns then read them all again: 0.25 s of CPU or more). Bounded
    in characters, these hold some 200 MB at most, and each tenant's texts are kept apart: past
    the bound, the tenant holding the most characters gives up its older texts, so a tenant
    reading many texts pushes out its own. With one tenant it is one cache.

    Each tenant's texts are in two generations: a text is kept in the young one; when that holds
    half of `chars`, it becomes the old one (the old one dropped) and a text found there moves
    back to the young one. A hit is two dict lookups. Threads may race on the counts (no lock:
    the projections run no threads of their own); a lost update keeps a few texts more or less.
    """

    def __init__(self, function: Callable[[str], T], *, chars: int, longest: int) -> None:
        self.function = function
        self.chars = chars
        self.longest = longest
        self._half = chars // 2
        self._tenants: dict[str, _Kept[T]] = {}
        self._held = 0

    def __call__(self, text: str, tenant: str = "") -> T:
        """`function(text)`, kept for `tenant` (the tenant whose text it is; "": none named)."""
        kept = self._tenants.get(tenant)
        if kept is not None:
            found = kept.young.get(text)
            if found is not None:
                return found
        size = len(text)
        if size > self.longest:
            return self.function(text)
        if kept is None:
            kept = self._tenants.setdefault(tenant, _Kept())
        found = kept.old.get(text)
        if found is None:
            found = self.function(text)
        if kept.young_chars + size > self._half:
            self._held -= kept.old_chars
            kept.old, kept.old_chars = kept.young, kept.young_chars
            kept.young, kept.young_chars = {}, 0
        kept.young[text] = found
        kept.young_chars += size
        self._held += size
        if self._held > self.chars:
            self._shed()
        return found

    def _shed(self) -> None:
        """Within `chars` again: the tenant holding the most gives up its old texts (then its young)."""
        while self._held > self.chars:
            tenants = list(self._tenants.items())
            if not tenants:
                self._held = 0
                return
            name, heaviest = max(tenants, key=lambda item: item[1].young_chars + item[1].old_chars)
            if heaviest.old_chars:
                self._held -= heaviest.old_chars
                heaviest.old, heaviest.old_chars = {}, 0
            elif heaviest.young_chars:
                heaviest.old, heaviest.old_chars = heaviest.young, heaviest.young_chars
                heaviest.young, heaviest.young_chars = {}, 0
            else:  # every tenant's counts at 0: a race left the total behind
                self._held = sum(k.young_chars + k.old_chars for _, k in tenants)
                return
            if not heaviest.young and not heaviest.old:
                self._tenants.pop(name, None)

    def held_chars(self, tenant: str | None = None) -> int:
        """The characters of the texts kept (of `tenant`'s, or all)."""
        kept = list(self._tenants.values()) if tenant is None else [self._tenants.get(tenant, _Kept())]
        return sum(sum(map(len, k.young)) + sum(map(len, k.old)) for k in kept)

    def clear(self) -> None:
        self._tenants, self._held = {}, 0


def _terms(sentence: str) -> tuple[str, ...]:
    return tuple(
        folded
        for word in _WORD.findall(sentence)
        if word.lower().replace("’", "'") not in _STOPWORDS and (folded := _fold(word)) not in _STOPWORDS
    )


_terms_of = TextMemo(_terms, chars=4_000_000, longest=2_000)
"""A sentence's terms, for the sentences (and labels, queries' texts) read lately."""


def query_terms(query: str) -> tuple[str, ...]:
    """The distinct terms of `query` that relevance counts, in their order of first appearance."""
    return tuple(dict.fromkeys(_terms_of(query[:MAX_QUERY_CHARS])))


class _Text(NamedTuple):
    """A turn's text read for relevance: its sentences that hold a term, each with its terms."""

    sentences: tuple[tuple[str, tuple[str, ...]], ...]
    terms: frozenset[str]
    """Every term of the text (a query sharing none skips it whole)."""
    length: int
    """Terms in all (for the mean sentence length)."""
    df: dict[str, int]
    """For each term, the sentences holding it."""


def _read_text(text: str) -> _Text:
    """`text` read into sentences and terms."""
    out = []
    for raw in _SENTENCE_END.split(text):
        sentence = " ".join(raw.split())
        if not sentence:
            continue
        terms = _terms_of(sentence)
        if terms:
            out.append((sentence, terms))
    df: dict[str, int] = {}
    for _, terms in out:
        for term in set(terms):
            df[term] = df.get(term, 0) + 1
    return _Text(tuple(out), frozenset(df), sum(len(terms) for _, terms in out), df)


_read = TextMemo(_read_text, chars=8_000_000, longest=50_000)
"""`text` read into sentences and terms (kept: texts recur from view to view; 8,000,000 characters
hold 16,000 turns' texts of 500 characters)."""


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


class Relevance:
    """BM25 of texts against a query, the inverse document frequencies taken over the sentences of
    the session's live turns."""

    def __init__(self, state: SessionState, query: str) -> None:
        self.wanted = frozenset(query_terms(query))
        self.labels = _labels(state.config, state.summary)
        # A sentence is read with its speaker's name: "what did Alice say about..." favours Alice's lines.
        self.speaker = {role: _terms_of(label) for role, label in self.labels.items()}
        wanted = self.wanted
        df = dict.fromkeys(wanted, 0)
        n_docs = total_len = 0
        tenant = state.key.tenant_id if state.key is not None else ""
        for record in state.turns:
            turn = record.turn
            for role, text in (("user", turn.user_message), ("assistant", turn.assistant_response)):
                if not text:
                    continue
                read = _read(text, tenant)
                n_docs += len(read.sentences)
                total_len += read.length
                named = wanted.intersection(self.speaker[role])
                if named:
                    for term in named:
                        df[term] += len(read.sentences)
                for term in wanted.intersection(read.terms).difference(named):
                    df[term] += read.df[term]
        self.idf = {t: math.log(1 + (n_docs - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        self.average = total_len / n_docs if n_docs else 1.0

    def score(self, terms: tuple[str, ...], role: str | None = None) -> float:
        """The relevance of a text of these terms, said by `role` when given (0: it shares none with
        the query)."""
        if role is not None and self.speaker[role]:
            terms = terms + self.speaker[role]
        common = self.wanted.intersection(terms)
        if not common:
            return 0.0
        norm = K1 * (1 - B + B * len(terms) / self.average)
        score = 0.0
        for term in common:
            tf = terms.count(term)
            score += self.idf[term] * tf * (K1 + 1) / (tf + norm)
        return score


def ranked_lines(
    state: SessionState,
    query: str,
    shown: frozenset[int] = frozenset(),
    relevance: Relevance | None = None,
    known: str = "",
    limit: int | None = None,
) -> list[tuple[int, str]]:
    """The live turns' sentences (turns numbered in `shown` left out) that share a term with `query`,
    most relevant first (at most `limit`): ``(order, line)``, `order` the sentence's place in the
    session (to show the chosen lines oldest first). Deterministic: ties go to the newer sentence.
    A sentence that a line of `known` (the summary shown beside) already holds, every term of it,
    is left out, and a line equal to one ranked before it."""
    relevance = relevance if relevance is not None else Relevance(state, query)
    if not relevance.wanted:
        return []
    scored: list[tuple[float, int, str, str, float, tuple[str, ...]]] = []
    order = 0
    wanted = relevance.wanted
    tenant = state.key.tenant_id if state.key is not None else ""
    for record in state.turns:
        turn = record.turn
        skip = record.index in shown
        for role, text in (("user", turn.user_message), ("assistant", turn.assistant_response)):
            if not text:
                continue
            read = _read(text, tenant)
            if skip or wanted.isdisjoint(read.terms):
                order += len(read.sentences)
                continue
            for sentence, terms in read.sentences:
                order += 1
                if not wanted.isdisjoint(terms):  # the speaker's name alone makes no line relevant
                    scored.append((-relevance.score(terms, role), -order, role, sentence, turn.ts, terms))
    scored.sort(key=lambda s: (s[0], s[1]))
    covered = _coverage(known)
    labels = relevance.labels
    dated = state.config.include_turn_dates
    dates: dict[float, str] = {}
    out: list[tuple[int, str]] = []
    seen: set[str] = set()
    for _, place, role, sentence, ts, terms in scored:
        if covered(terms):
            continue
        line = f"{labels[role]}: {_clip(sentence)}"
        if dated and ts > 0:
            if ts not in dates:
                dates[ts] = date_text(ts)
            if dates[ts]:
                line = f"{dates[ts]} · {line}"
        if line in seen:
            continue
        seen.add(line)
        out.append((-place, line))
        if limit is not None and len(out) >= limit:
            break
    return out


def _coverage(known: str) -> Callable[[tuple[str, ...]], bool]:
    """Whether a sentence of these terms is held by a line of `known` (all its terms in that line)."""
    by_term: dict[str, list[frozenset[str]]] = {}
    for line in known.split("\n"):
        terms = frozenset(_terms_of(line))
        for term in terms:
            by_term.setdefault(term, []).append(terms)

    def covered(terms: tuple[str, ...]) -> bool:
        lines = by_term.get(terms[0])
        return lines is not None and any(line.issuperset(terms) for line in lines)

    return covered


_HEADING = re.compile(r"^\S.{0,120}:$")


def trim_by_relevance(summary: str, relevance: Relevance, fits: Callable[[str], bool]) -> str:
    """`summary` with the fewest of its lines removed so that it `fits`, the lines least relevant to
    the query first (equals: the later line first, as the view cuts), never a ``<tag>`` line; a
    heading (a short line ending in ``:``) goes with the last line under it. '' when none fits."""
    lines = summary.split("\n")
    kinds: list[int] = []  # 0 blank, 1 tag, 2 heading, 3 content
    content: list[tuple[float, int, int]] = []  # score, -position, position
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped:
            kinds.append(0)
        elif tag_line(stripped):
            kinds.append(1)
        elif _HEADING.match(stripped):
            kinds.append(2)
        else:
            kinds.append(3)
            content.append((relevance.score(_terms_of(stripped)), -i, i))
    content.sort()
    order = [i for _, _, i in content]

    def without(k: int) -> str:
        removed = set(order[:k])
        keep = [False] * len(lines)
        below = True  # what follows a heading (scanning upwards): True while nothing or a tag/heading
        for i in range(len(lines) - 1, -1, -1):
            kind = kinds[i]
            if i in removed:
                continue
            if kind == 3:
                keep[i], below = True, False
            elif kind == 2:
                keep[i] = not below  # a heading over nothing now goes; one over a kept heading stays
                below = not keep[i]
            elif kind == 1:
                keep[i], below = True, True
            else:
                keep[i] = True
        return "\n".join(line for i, line in enumerate(lines) if keep[i])

    k = fewest(len(order), lambda k: fits(without(k)))
    return "" if k > len(order) else summary_left(without(k))


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
    relevance = Relevance(state, query)
    if not relevance.wanted:
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

            trimmed = trim_by_relevance(selection.summary, relevance, leaves_room)
            base = msgspec.structs.replace(selection, summary=trimmed)
    # A line costs at least 2 tokens (its quotes, label and comma): no view shows more than this many.
    limit = max(budget, room) // 2 + 1
    ranked = ranked_lines(state, query, shown, relevance, base.summary, limit)
    if not ranked:
        return selection
    if budget:

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
