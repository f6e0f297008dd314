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

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from convmem.actors import token_counter_of
from convmem.actors._bounds import MAX_LIVE_SESSIONS, check_count
from convmem.adapters.backends.summarizers._dates import day_of, resolve
from convmem.adapters.backends.summarizers._selection import Pool
from convmem.adapters.backends.summarizers._summary import (
    CLOSE,
    FACTS,
    IDENTITY,
    MINIMAL,
    OPEN,
    ROLES,
    WEAK,
    Fact,
    caption_text,
    make_fact,
    parse,
    prose,
    render,
)
from convmem.adapters.backends.summarizers._text import (
    FULL_WEIGHT,
    addressed_name,
    clean,
    clip,
    intro_name,
    is_dependent,
    is_pleasantry,
    sentences,
    split_media,
    strip_filler,
    unlabelled,
)
from convmem.errors import InvalidConfig, SummarizerError
from convmem.events._config import shown, speaker_name_taken
from convmem.projections import TokenEstimator, default_token_estimator

__all__ = ["ExtractiveSummarizer"]

_MAX_TOKENS = 2**63 - 1
"""The largest budget a summary takes: the largest a configuration's ``summary_max_tokens`` holds."""

MAX_FACT_CHARS = 240
MIN_GAIN = FULL_WEIGHT
"""A sentence joins only when it adds at least one rare word's weight the summary lacks."""
MIN_TERMS = 2
"""A sentence with fewer content terms says too little to be a fact ("Mel.", "Confirmed.")."""
MAX_UNIT_CHARS = 360
"""A sentence kept with the ones that lean on it ("I adopted a puppy. She is a corgi.") may run longer."""
MAX_NAME_CHARS = 40
MAX_OFFERED = 500
"""Most statements one call offers the pool: those of its newest turns, in order (a turn with more
offers its first ones). A summary holds a few hundred facts at most, and each statement offered is
valued against the facts that share its terms: a call of a restored history or of a message of
thousands of short sentences took minutes of CPU unbounded (issue: a hostile tenant's summaries)."""
TRIM_CHARS_PER_TOKEN = 8
"""A pool over this many characters per token of `max_tokens` (twice a default-estimator summary's
characters) first keeps only its best facts within that (`Pool.keep_best`), then evicts exactly."""
_DEFAULT_LABELS = {"user": "User", "assistant": "Assistant"}
_OTHER = {"user": "assistant", "assistant": "user"}
_CAPTION_LEAD = re.compile(r"^(?:an? |the )?(?:photo|picture|image|screenshot|pic) of ", re.IGNORECASE)
_REACTION = re.compile(
    r"^(?:that|this|it)(?:'s|’s| is| was| sounds| looks| seems)\s+"
    r"(?:(?:so|really|very|just|pretty|such|a|an)\s+)*"
    r"[\w'’-]+(?:\s+[\w'’-]+)?\s*[,;!…—–-]+\s*(?=\S)",
    re.IGNORECASE,
)


class _Rolled:
    """A pool and the coverage lines of the summary it wrote."""

    __slots__ = ("first_day", "last_day", "names", "pool", "turns")

    def __init__(
        self, pool: Pool, turns: int, first_day: int | None, last_day: int | None, names: dict[str, str]
    ) -> None:
        self.pool = pool
        self.turns = turns
        self.first_day = first_day
        self.last_day = last_day
        self.names = names


class ExtractiveSummarizer:
    """Summarize by extraction: the RFC's summarizer signature, no model, same input same bytes.

    ``summarizer({"previous_summary": ..., "turns": [...]}) -> {"summary": ...}``.
    Set `max_tokens` to the session's ``summary_max_tokens`` (or below) and
    pass the same `estimator` as the memory system (its `token_counter`: a
    callable, or a tiktoken encoding name), so that every summary it makes
    is accepted. `cache_size` bounds the pools kept for rolling calls (one
    per session summarized recently is ideal; a miss only costs a parse).

    `speaker_names` (``{"user": "Alice", "assistant": "Bob"}``, either role
    or both) names the speakers of every conversation it summarizes; a
    request's own ``speaker_names`` (the session's configuration) wins over
    it. Without a name, a speaker is named by what the conversation says: a
    self-introduction ("I'm Alice.") or a greeting from the other speaker
    ("Hey Alice!"). A named speaker's facts are written "Alice: ...", and the
    summary says "The user's name is Alice." so a reader knows who the turns' user is.
    """

    def __init__(
        self,
        max_tokens: int = 1000,
        estimator: TokenEstimator | str = default_token_estimator,
        *,
        cache_size: int = 256,
        speaker_names: Mapping[str, str] | None = None,
    ) -> None:
        estimator = token_counter_of(estimator, "estimator") or default_token_estimator
        floor = estimator(MINIMAL)
        if (
            isinstance(max_tokens, bool)
            or not isinstance(max_tokens, int)
            or not floor <= max_tokens <= _MAX_TOKENS
        ):
            raise InvalidConfig(
                "max_tokens",
                f"must be an int from {floor} (the smallest summary) to 2**63 - 1, got {shown(max_tokens)}",
            )
        # A pool kept per rolling session, each in memory: at most as many as a system keeps live.
        check_count("cache_size", cache_size, least=0, most=MAX_LIVE_SESSIONS)
        self.max_tokens = max_tokens
        self.speaker_names = speaker_names_of(speaker_names, InvalidConfig, "speaker_names")
        self._estimator = estimator
        self._cache_size = cache_size
        self._cache: OrderedDict[str, _Rolled] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ExtractiveSummarizer(max_tokens={self.max_tokens})"

    def __call__(self, request: Mapping[str, Any], /) -> dict[str, str]:
        previous, turns, names, room = _read_request(request)
        return {"summary": self.summarize(previous, turns, speaker_names=names, room=room)}

    def summarize(
        self,
        previous_summary: str,
        turns: Sequence[Mapping[str, Any]],
        *,
        speaker_names: Mapping[str, str] | None = None,
        room: int = 0,
    ) -> str:
        """The merged summary text of `previous_summary` and `turns` (`speaker_names`: as the setting).

        `room` (a request's ``max_tokens``: the tokens the summary will have in the
        session's view beside the turns shown with it) bounds the summary's JSON
        string as well as `max_tokens` bounds its text, so that the view need not
        cut its newest lines: the facts that leave are the cheapest, as always.
        """
        rolled = self._take(previous_summary)
        pool = rolled.pool
        first, last = rolled.first_day, rolled.last_day
        texts = [{role: _text(turn, role) for role in ROLES} for turn in turns]
        given = dict(self.speaker_names)
        if speaker_names:
            asked = speaker_names_of(speaker_names, _request_error, "speaker_names")
            for role in ROLES:  # the request's (the session's) names win over the summarizer's own
                if (
                    role in given
                    and role not in asked
                    and speaker_name_taken(role, given[role], asked.get(_OTHER[role]))
                ):
                    del given[role]
            given.update(asked)
        names = _learn(rolled.names, texts, given)
        labels = {role: names.get(role) or _DEFAULT_LABELS[role] for role in ROLES}
        _relabel(pool, {rolled.names.get(role) or _DEFAULT_LABELS[role]: labels[role] for role in ROLES})
        statements = [{role: _statements(said[role]) for role in ROLES} for said in texts]
        allowed = _allowance(statements)
        for turn, stated, allowance in zip(turns, statements, allowed, strict=True):
            room_left = allowance
            day = day_of(turn.get("ts"))
            if day is not None:
                first = day if first is None else min(first, day)
                last = day if last is None else max(last, day)
            for role in ROLES:
                units, captions = stated[role]
                offered = min(room_left, len(units) + len(captions))
                room_left -= offered
                if offered:
                    _offer_statements(pool, labels[role], units, captions, offered, day)
            _offer_tools(pool, turn.get("trajectory_digest"), day)
        count = rolled.turns + len(turns)
        line = prose(count, first, last, names)
        text = self._fit(pool, line, room)
        if text is None:
            return self._smallest(count)
        self._keep(text, _Rolled(pool, count, first, last, names))
        return text

    def _fit(self, pool: Pool, line: str, room: int) -> str | None:
        """The pool's summary within `max_tokens` (and its JSON string within `room`, when given),
        evicting the cheapest facts (None: not even empty)."""
        estimator, budget = self._estimator, self.max_tokens
        pool.keep_best(TRIM_CHARS_PER_TOKEN * budget)  # far over: keep the best at once, then evict exactly
        if estimator is default_token_estimator:
            frame = len(OPEN) + len(line) + len(CLOSE) + 2
            limit = 4 * budget - 1  # len // 4 + 1 <= budget
            if room:  # the JSON string is at least the text and its two quotes
                limit = min(limit, 4 * room - 3)
            while pool.chars + frame > limit and len(pool):
                pool.remove(pool.cheapest())  # type: ignore[arg-type]
        text = pool.render(line)
        while estimator(text) > budget or (room and estimator(_json(text)) > room):
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
        return _Rolled(Pool(parsed.facts), parsed.turns, parsed.first_day, parsed.last_day, parsed.names)

    def _keep(self, text: str, rolled: _Rolled) -> None:
        if not self._cache_size:
            return
        with self._lock:
            self._cache[text] = rolled
            self._cache.move_to_end(text)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)


def speaker_names_of(value: object, error: Callable[[str, str], Exception], where: str) -> dict[str, str]:
    """``{"user": name, "assistant": name}`` (either or both) checked, each name one clean line without
    a colon (it becomes a fact's label), at most 40 characters."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise error(where, f"must map 'user'/'assistant' to a name, got {type(value).__name__}")
    names: dict[str, str] = {}
    for role, name in value.items():
        if role not in ROLES:
            raise error(where, f"names the speakers 'user' and 'assistant' only, got {shown(role)}")
        if not isinstance(name, str):
            raise error(f"{where}.{role}", f"must be a string, got {type(name).__name__}")
        cleaned = clean(name.replace(":", " "))
        if not cleaned or len(cleaned) > MAX_NAME_CHARS:
            raise error(
                f"{where}.{role}", f"must be a name of 1 to {MAX_NAME_CHARS} characters, got {shown(name)}"
            )
        names[role] = cleaned
    for role, name in names.items():
        taken = speaker_name_taken(role, name, names.get(_OTHER[role]))
        if taken:
            raise error(f"{where}.{role}", f"{taken}, got {shown(name)}")
    return names


def _learn(known: dict[str, str], texts: list[dict[str, str]], given: dict[str, str]) -> dict[str, str]:
    """The speakers' names after `texts`, the `given` (configured) names fixed: a self-introduction
    names its speaker (the latest wins); a greeting ("Hey Mel!") names the other speaker when nothing
    named them yet, or gives the full form of the name known ("Melanie" after "Mel"). A name that
    would label a speaker's lines as another's ("I'm Assistant.", the other speaker's own name, or
    "Tools") is not learned: a turn cannot put words in someone else's mouth."""
    names = dict(given)

    def learn(role: str, name: str) -> None:
        name = name[:MAX_NAME_CHARS]
        if role not in given and not speaker_name_taken(role, name, names.get(_OTHER[role])):
            names[role] = name

    for role in ROLES:  # a previous summary's names (another summarizer may have written them)
        if role in known:
            learn(role, known[role])

    for said in texts:
        for role in ROLES:
            text = said[role]
            if not text:
                continue
            introduced = intro_name(text)
            if introduced is not None:
                learn(role, introduced)
            addressed = addressed_name(text)
            other = _OTHER[role]
            if addressed is None or addressed == names.get(role):
                continue
            now = names.get(other)
            if now is None or (len(addressed) > len(now) and addressed.startswith(now)):
                learn(other, addressed)
    return names


def _relabel(pool: Pool, renamed: dict[str, str]) -> None:
    """Facts written under a speaker's old label ("User") take the name now known ("Alice")."""
    renamed = {old: new for old, new in renamed.items() if old != new}
    if not renamed:
        return
    moving = [
        (old, fact)
        for fact in pool.facts.values()
        if fact.section == FACTS and (old := fact.text.split(": ", 1)[0]) in renamed
    ]
    # One old label after another (as the text lists them), so that two labels becoming one name
    # come out in the same order from a cached pool and from one read back from the text.
    for old, fact in sorted(moving, key=lambda moved: moved[0]):
        pool.remove(fact.key)
        pool.add(make_fact(FACTS, f"{renamed[old]}: {unlabelled(fact.text)}", fact.day))


def _units(text: str) -> list[str]:
    """The statements of a message: each sentence with the ones after it that lean on it ("It was...",
    "She said..."); a leaning sentence with nothing before it to lean on is dropped. Fillers,
    pleasantries and sign-offs are left out and lean on nothing."""
    units: list[list[str]] = []
    for sentence in sentences(text):
        kept = strip_filler(sentence)
        if not kept or is_pleasantry(kept):
            continue
        if is_dependent(kept):
            reaction = _REACTION.match(kept)
            if reaction is not None and not is_dependent(rest := kept[reaction.end() :]):
                kept = rest[0].upper() + rest[1:]  # "That's great, I won!" -> "I won!"
            elif units:
                units[-1].append(kept)
                continue
            else:
                continue
        units.append([kept])
    return [" ".join(unit) for unit in units]


def _statements(text: str) -> tuple[list[str], list[str]]:
    """A speaker's message as (its statements, the captions of the photos it shared)."""
    if not text:
        return [], []
    body, captions = split_media(text)
    return _units(body), list(captions)


def _allowance(statements: list[dict[str, tuple[list[str], list[str]]]]) -> list[int]:
    """How many statements each turn may offer: all of them, unless the call brings more than
    `MAX_OFFERED`; then the newest turns' (a turn over what is left offers its first ones)."""
    counts = [sum(len(units) + len(captions) for units, captions in turn.values()) for turn in statements]
    if sum(counts) <= MAX_OFFERED:
        return counts
    allowed, left = [0] * len(counts), MAX_OFFERED
    for i in range(len(counts) - 1, -1, -1):
        allowed[i] = min(counts[i], left)
        left -= allowed[i]
    return allowed


def _offer_statements(
    pool: Pool, label: str, units: list[str], captions: list[str], count: int, day: int | None
) -> None:
    """Offer the first `count` of a speaker's statements, then of the captions of its photos."""
    for unit in units[:count]:
        _offer(pool, label, unit, day)
    for caption in captions[: max(0, count - len(units))]:
        shown = _CAPTION_LEAD.sub("", caption)
        if shown:
            _offer_fact(pool, make_fact(FACTS, clip(caption_text(label, shown), MAX_FACT_CHARS), day))


def _offer(pool: Pool, speaker: str, sentence: str, day: int | None) -> None:
    """Add the statement as a fact if it covers enough that the pool does not."""
    if day is not None:
        sentence = resolve(sentence, day)
    _offer_fact(pool, make_fact(FACTS, clip(f"{speaker}: {sentence}", MAX_UNIT_CHARS), day))


def _offer_fact(pool: Pool, fact: Fact) -> None:
    if fact.key in pool.facts or not fact.terms:
        return
    gain = pool.gain(fact)
    if fact.kind == IDENTITY:
        if gain > 0:  # who someone is: a fact however short ("I'm Alice.")
            pool.add(fact)
        return
    if len(fact.terms) < MIN_TERMS:
        return
    if fact.kind == WEAK:
        gain //= 2  # a question asks more often than it tells; a caption shows, the talk tells
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
    names = [n for n in (clean(str(t).replace(":", " ")) for t in tools) if n]
    note = ""
    if isinstance(observations, str):
        note = clip(next(iter(sentences(observations)), ""), MAX_FACT_CHARS)
    if note and len(names) != 1:  # a turn's result belongs to no single tool: keep it as a fact
        _offer_fact(
            pool,
            make_fact(
                FACTS, clip(f"Tools: {resolve(note, day) if day is not None else note}", MAX_FACT_CHARS), day
            ),
        )
    for name in names:
        text = clip(f"{name}: {note}" if note and len(names) == 1 else f"{name}: invoked", MAX_FACT_CHARS)
        fact = make_fact("tools_used", text, None)
        old = pool.facts.get(fact.key)
        if old is not None:
            if old.text == text:
                continue
            pool.remove(old.key)
        pool.add(fact)


def _json(text: str) -> str:
    """The summary as the view's rendering writes it: a JSON string."""
    return json.dumps(text, ensure_ascii=False)


def _read_request(
    request: Mapping[str, Any],
) -> tuple[str, Sequence[Mapping[str, Any]], dict[str, str], int]:
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
    names = speaker_names_of(request.get("speaker_names"), _request_error, "request.speaker_names")
    room = request.get("max_tokens")
    room = 0 if room is None else room
    if isinstance(room, bool) or not isinstance(room, int) or room < 0:
        raise SummarizerError(f"request.max_tokens must be an int >= 0, got {room!r}")
    return previous, turns, names, room


def _request_error(where: str, why: str) -> SummarizerError:
    return SummarizerError(f"{where} {why}")


def _text(turn: Mapping[str, Any], field: str) -> str:
    value = turn.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SummarizerError(f"request turn field {field!r} must be a string, got {type(value).__name__}")
    return value
