"""The extractive summarizer: deterministic, no model, the offline default.

It keeps the sentences a later turn is likely to need (names, numbers and
amounts, dates, e-mail addresses, decisions and commitments) and the tools the
assistant used, in the RFC's tagged shape. Each call folds the new turns into
the previous summary's bullets, so the summary rolls. Whatever the input, the
result fits `max_tokens` by the estimator: whole bullets are dropped, lowest
scoring and oldest first, never half a bullet or a tag.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from convmem.errors import InvalidConfig, SummarizerError
from convmem.projections import TokenEstimator, default_token_estimator

__all__ = ["ExtractiveSummarizer"]

_MINIMAL = "<session_summary>\nNo facts yet.\n</session_summary>"
_MAX_FACT_CHARS = 240
_MAX_QUOTE_CHARS = 120
_MAX_TOPICS = 4
_SECTIONS = ("key_facts", "tools_used", "pending")


def _word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_MONTHS = (
    r"jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?"
)
_DAYS = r"monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_NUMERIC_DATE = re.compile(  # only tried on sentences with a digit
    r"\b\d{4}-\d{2}-\d{2}\b"
    r"|\b\d{1,2}/\d{1,2}(?:/\d{2,4})?\b"
    rf"|\b(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\b"
    r"|\b\d{1,2}(?::\d{2})?\s?(?:am|pm)\b|\b\d{1,2}:\d{2}\b"
    r"|\bin\s+\d+\s+(?:days?|weeks?|months?|years?)\b"
    r"|\b(?:19|20)\d{2}\b",
    re.IGNORECASE,
)
_RELATIVE_DATE = re.compile(
    rf"\b(?:next|last|this|coming)\s+(?:week|month|year|weekend|{_DAYS})\b", re.IGNORECASE
)
_DATE_WORDS = _word_set(
    "monday tuesday wednesday thursday friday saturday sunday today tonight tomorrow yesterday weekend"
)
_MONTH_NAMES = _word_set("January February March April June July August September October November December")
_RELATIVE_WORDS = _word_set("next last this coming")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_AMOUNT = re.compile(
    r"[$€£¥]\s?\d|\d(?:[\d,.]*\d)?\s?(?:%|percent\b|(?:usd|eur|gbp|dollars?|euros?|pounds?|bucks)\b)",
    re.IGNORECASE,
)
_DIGIT = re.compile(r"\d")
_DECISION = re.compile(
    r"\b(?:I['’]ll (?:take|have|go|pay|book|buy|use)|decided?|decision|chose|choose|chosen|going with"
    r"|go with|opt(?:ed)? for|agreed?|prefer(?:s|red)?|commit(?:ted)?|booked|ordered|signed up"
    r"|selected|confirm(?:ed)?|deal)\b"
    r"|\bmy\s+(?:[\w'’-]+\s+){0,3}(?:is|are|was|were)\b",
    re.IGNORECASE,
)
_INTENT = re.compile(
    r"\b(?:I['’]ll|I will|I['’]d like|I would like|I want|I need|let['’]s|we['’]ll|we will|will|won['’]t"
    r"|plan(?:ning)? to|need to|have to|remind)\b",
    re.IGNORECASE,
)
_DECISION_WORDS = _word_set(
    "i'll i’ll decided decide decision chose choose chosen going go opt opted agree agreed prefer prefers"
    " preferred commit committed booked ordered signed selected confirm confirmed deal my"
)
_INTENT_WORDS = _word_set(
    "i'll i’ll will i'd i’d would want need let's let’s we'll we’ll won't won’t plan planning have remind"
)
_VOCATIVE = re.compile(
    r",\s*[^\W\d_][\w'’-]*\s*[!?.]*\s*$"
    r"|^(?:hey|hi|hello|thanks|thank you|wow|oh|sorry|congrats|yes|no|yeah)[\s,]+"
    r"[^\W\d_][\w'’-]*(?=\s*[,!.?])",
    re.IGNORECASE,
)
_WORD = re.compile(r"[^\W\d_][\w'’-]*")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|(?<=[.!?…][\"'”’)])\s+|\s*\n\s*")
_LIST_MARKER = re.compile(r"^(?:[-*•]|\d{1,2}[.)])\s+")
_SPACES = re.compile(r"\s+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")  # and lone surrogates: UTF-8 cannot carry them
_TAG = re.compile(r"</?[A-Za-z_][\w.-]*>")
_SECTION = re.compile(r"<(key_facts|tools_used|pending)>(.*?)</\1>", re.DOTALL)
_SPEAKER = re.compile(r"^(?:User|Assistant|Tools):\s*")
_OWN_GIST = re.compile(r"^The conversation so far \((\d+) turns?\)")


_NOT_NAMES = _word_set(
    "I I'm I’m I'll I’ll I've I’ve I'd I’d OK Okay Ok Yes No Hi Hey Hello Thanks Thank Oh Wow"
)
_FUNCTION = _word_set(
    "a an and are as at be but by did do for from had has he her him his if in is it me my no nor "
    "not of oh on or our she so the to too up us was we who why yes yet you"
)
"""Short function words: capitalised mid-sentence in run-together chat, never a name."""
_STOPWORDS = _word_set(
    """
    about above after again against also although always another anything around because been
    before being below between both but can't cannot could couldn't does doesn't doing done don't
    down during each either else even ever every from further gonna gotta great have haven't
    having hello here hers herself himself into it's its itself just know like little made make
    many maybe might more most much must myself need never nice only other ought ours ourselves
    over really right same sounds should shouldn't since some something still such sure than
    thank thanks that that's their theirs them themselves then there there's these they they're
    thing things think this those though through together totally under until upon very want
    wanna well were what what's when where which while who whom whose will with within without
    would wouldn't yeah your you're yours yourself yourselves awesome cool glad good hope love
    feel going getting told tell said says user assistant tools okay lots kind sort invoked
    today tonight tomorrow yesterday week weeks month months year years days hours minutes
    lost starting started start take took taken went come came give gave keep kept looking look
    """
)


class _Bullet(NamedTuple):
    section: str
    text: str
    key: str
    score: int
    order: int


class ExtractiveSummarizer:
    """Summarize by extraction: the RFC's summarizer signature, no model, same input same bytes.

    ``summarizer({"previous_summary": ..., "turns": [...]}) -> {"summary": ...}``.
    Set `max_tokens` to the session's ``summary_max_tokens`` (or below) and
    pass the same `estimator` as the memory system, so that every summary it
    makes is accepted.
    """

    def __init__(self, max_tokens: int = 1000, estimator: TokenEstimator = default_token_estimator) -> None:
        floor = estimator(_MINIMAL)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < floor:
            raise InvalidConfig(
                "max_tokens", f"must be an int of at least {floor} (the smallest summary), got {max_tokens!r}"
            )
        self.max_tokens = max_tokens
        self._estimator = estimator

    def __repr__(self) -> str:
        return f"ExtractiveSummarizer(max_tokens={self.max_tokens})"

    def __call__(self, request: Mapping[str, Any], /) -> dict[str, str]:
        previous, turns = _read_request(request)
        return {"summary": self.summarize(previous, turns)}

    def summarize(self, previous_summary: str, turns: Sequence[Mapping[str, Any]]) -> str:
        """The merged summary text of `previous_summary` and `turns`."""
        count, bullets = _parse_previous(previous_summary)
        pool = _Pool(bullets)
        last_user = last_assistant = ""
        for turn in turns:
            user = _text(turn, "user")
            assistant = _text(turn, "assistant")
            pool.add_sentences("User", user)
            pool.add_sentences("Assistant", assistant)
            pool.add_tools(turn.get("trajectory_digest"))
            last_user = user if user.strip() else last_user
            last_assistant = assistant if assistant.strip() else last_assistant
        count += len(turns)
        gist = _gist(count, pool)
        quote = _latest(last_user, last_assistant)
        return self._fit(pool.bullets(), [gist, quote] if quote else [gist])

    def _fit(self, bullets: list[_Bullet], prose: list[str]) -> str:
        """The fullest rendering within `max_tokens`: shorter prose, then fewer bullets."""
        budget = self.max_tokens
        estimator = self._estimator
        full = _render(" ".join(prose), bullets)
        if estimator(full) <= budget:
            return full
        gist = prose[0]
        ranked = sorted(bullets, key=lambda b: (b.score, b.order))
        rank = {b.order: i for i, b in enumerate(ranked)}

        def keeping(dropped: int) -> str:
            return _render(gist, [b for b in bullets if rank[b.order] >= dropped])

        lo, hi = 0, len(bullets)
        while lo < hi:  # the fewest dropped bullets that fit (dropping more never grows the text)
            mid = (lo + hi) // 2
            if estimator(keeping(mid)) <= budget:
                hi = mid
            else:
                lo = mid + 1
        for dropped in range(lo, len(bullets) + 1):  # guards an estimator that is not monotone
            text = keeping(dropped)
            if estimator(text) <= budget:
                return text
        return _MINIMAL


class _Pool:
    """Bullets by key in first-to-last order; a repeated fact moves to the end."""

    def __init__(self, bullets: Iterable[_Bullet]) -> None:
        self._by_key: dict[str, _Bullet] = {}
        self._order = 0
        for bullet in bullets:
            self._put(bullet.section, bullet.text, bullet.key, bullet.score)

    def _put(self, section: str, text: str, key: str, score: int) -> None:
        self._by_key.pop(key, None)
        self._by_key[key] = _Bullet(section, text, key, score, self._order)
        self._order += 1

    def add_sentences(self, speaker: str, text: str) -> None:
        for sentence in _sentences(text):
            score = _score(sentence)
            if score >= 2:
                self._put(
                    "key_facts", f"{speaker}: {_clip(sentence, _MAX_FACT_CHARS)}", _key(sentence), score
                )

    def add_tools(self, digest: object) -> None:
        if not isinstance(digest, Mapping):
            return
        tools = digest.get("tools_invoked")
        observations = digest.get("observations_summary")
        if isinstance(tools, str) or not isinstance(tools, Sequence):
            tools = ()
        names = [n for n in (_clean(str(t)).replace(":", " ").strip() for t in tools) if n]
        note = ""
        if isinstance(observations, str):
            note = _clip(next(iter(_sentences(observations)), ""), _MAX_FACT_CHARS)
        if note and len(names) != 1:  # a turn's result belongs to no single tool: keep it as a fact
            self.add_sentences("Tools", note)
        for name in names:
            text = f"{name}: {note}" if note and len(names) == 1 else f"{name}: invoked"
            self._put("tools_used", text, "tool:" + name, 2)

    def bullets(self) -> list[_Bullet]:
        return list(self._by_key.values())


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
    return previous, turns


def _text(turn: Mapping[str, Any], field: str) -> str:
    value = turn.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SummarizerError(f"request turn field {field!r} must be a string, got {type(value).__name__}")
    return value


def _clean(text: str) -> str:
    """One line with no control characters and no tag that could break the summary's shape."""
    text = _TAG.sub(lambda m: m.group().replace("<", "‹").replace(">", "›"), text)
    return _SPACES.sub(" ", _CONTROL.sub(" ", text)).strip()


def _sentences(text: str) -> list[str]:
    out = []
    for raw in _SENTENCE_END.split(text):
        sentence = _clean(_LIST_MARKER.sub("", raw.strip()))
        if sentence:
            out.append(sentence)
    return out


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:") + "…"


def _key(text: str) -> str:
    return _SPACES.sub(" ", _SPEAKER.sub("", text)).strip(" .!?…").casefold()


def _score(sentence: str) -> int:
    """How likely a later turn needs this sentence: 0 for small talk, more per kind of fact.

    Word-set checks run first so that most sentences skip most regexes.
    """
    words = _WORD.findall(sentence)
    folded = {w.casefold() for w in words}
    score = 0
    if "@" in sentence and _EMAIL.search(sentence):
        score += 3
    if _DIGIT.search(sentence):
        score += 3 if _AMOUNT.search(sentence) else 2
        if _NUMERIC_DATE.search(sentence):
            score += 3
    if (
        not folded.isdisjoint(_DATE_WORDS)
        or not _MONTH_NAMES.isdisjoint(words)
        or (not folded.isdisjoint(_RELATIVE_WORDS) and _RELATIVE_DATE.search(sentence))
    ):
        score += 3
    if not folded.isdisjoint(_DECISION_WORDS) and _DECISION.search(sentence):
        score += 3
    elif not folded.isdisjoint(_INTENT_WORDS) and _INTENT.search(sentence):
        score += 2
    has_names = bool(_names(sentence))
    if has_names:
        score += 2
    if not score or (len(words) < 5 and not has_names and score < 3):
        return 0  # "Will do.", "Gonna be awesome!": a promise without its object
    if sentence.endswith("?"):
        score -= 1
    return score


def _names(sentence: str) -> list[str]:
    """Runs of capitalised words after the first word ("Door Dash"), vocatives left out."""
    if not sentence:
        return []
    if "," in sentence or sentence[-1] in "!?.":
        sentence = _VOCATIVE.sub("", sentence)  # "Sounds great, Jon!" names no fact
    names: list[str] = []
    end = -2
    for i, match in enumerate(_WORD.finditer(sentence)):
        word = match.group()
        folded = word.casefold()
        if (
            i == 0
            or not word[0].isupper()
            or word in _NOT_NAMES
            or folded in _STOPWORDS
            or folded in _FUNCTION
        ):
            continue  # chat often runs sentences together: "... too Also yeah ..." names nothing
        if match.start() == end + 1 and sentence[end] == " ":
            names[-1] += " " + word
        else:
            names.append(word)
        end = match.end()
    return names


def _parse_previous(summary: str) -> tuple[int, list[_Bullet]]:
    """The turn count and the bullets of a previous summary, tagged or plain prose."""
    count = 0
    bullets: list[_Bullet] = []

    def keep(section: str, line: str) -> None:
        text = _clean(_LIST_MARKER.sub("", line.strip()))
        if not text:
            return
        if section == "tools_used":
            name = text.split(":", 1)[0].strip()
            bullets.append(_Bullet(section, text, "tool:" + name, 2, 0))
        elif section == "pending":
            bullets.append(_Bullet(section, text, "pending:" + _key(text), 1, 0))
        else:
            score = _score(_SPEAKER.sub("", text))
            bullets.append(_Bullet(section, text, _key(text), max(score, 1), 0))

    def prose(text: str) -> None:
        nonlocal count
        for line in text.splitlines():
            own = _OWN_GIST.match(line.strip())
            if own:
                count += int(own.group(1))
                continue
            for sentence in _sentences(line):  # someone else's prose is kept as facts
                keep("key_facts", sentence)

    rest = 0
    for match in _SECTION.finditer(summary):
        prose(_TAG.sub("\n", summary[rest : match.start()]))
        for line in match.group(2).splitlines():
            keep(match.group(1), line)
        rest = match.end()
    prose(_TAG.sub("\n", summary[rest:]))
    return count, bullets


def _gist(count: int, pool: _Pool) -> str:
    """One sentence: how many turns are summarized and their most frequent topics."""
    counts: dict[str, int] = {}
    shown: dict[str, str] = {}
    for bullet in pool.bullets():
        if bullet.section != "key_facts":
            continue
        text = _SPEAKER.sub("", bullet.text)
        for name in _names(text):  # a name counts double and keeps its capitals
            folded = name.casefold()
            if len(folded) <= 30:
                counts[folded] = counts.get(folded, 0) + 2
                shown.setdefault(folded, name)
        for i, word in enumerate(_WORD.findall(text)):
            if i and word[0].isupper():
                continue  # part of a name, counted above
            folded = word.casefold()
            if 4 <= len(folded) <= 30 and folded not in _STOPWORDS:
                counts[folded] = counts.get(folded, 0) + 1
    ranked = sorted(counts, key=lambda w: -counts[w])[:_MAX_TOPICS]  # stable: ties keep first seen
    topics = [shown.get(w, w) for w in ranked]
    turns = f"The conversation so far ({count} turn{'' if count == 1 else 's'})"
    if not topics:
        return f"{turns} has no notable facts yet."
    listed = topics[0] if len(topics) == 1 else ", ".join(topics[:-1]) + " and " + topics[-1]
    return f"{turns} covered {listed}."


def _latest(user: str, assistant: str) -> str:
    for who, text in (("user", user), ("assistant", assistant)):
        first = next(iter(_sentences(text)), "")
        if first:
            return f'Most recently the {who} said: "{_clip(first, _MAX_QUOTE_CHARS)}"'
    return ""


def _render(prose: str, bullets: Sequence[_Bullet]) -> str:
    lines = ["<session_summary>", prose]
    for section in _SECTIONS:
        chosen = [b.text for b in bullets if b.section == section]
        if chosen:
            lines.append(f"<{section}>")
            lines.extend("- " + text for text in chosen)
            lines.append(f"</{section}>")
    lines.append("</session_summary>")
    return "\n".join(lines)
