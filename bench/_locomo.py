"""LoCoMo dialogues as convmem turns, their QA items, and what "an answer is in the context" means.

Research data: read from ``$CONVMEM_LOCOMO`` or ``../shared/data/locomo``
beside the repository, never copied into it.

A dialogue is played as one conversation: ``speaker_a`` is the user,
``speaker_b`` the assistant, consecutive utterances of one speaker are joined
(a user run and the assistant run after it make one turn; a run of the
assistant with no user run before it is an assistant-only turn), a shared
photo's caption is appended to its utterance as ``[image: <caption>]``, and
every turn's ``ts`` is its session's ``session_N_date_time`` read as UTC.

An answer is *recalled* by a text when every content word of the answer is
among the text's content words. Content words: lowercase alphanumeric words
(``[a-z0-9]+``) of three or more characters, less the stop words below.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from convmem.events import ConversationTurn

__all__ = [
    "CATEGORIES",
    "CATEGORY_NAMES",
    "TEMPORAL",
    "LocomoSession",
    "QAItem",
    "content_words",
    "context_words",
    "history_words",
    "locomo_dir",
    "qa_items",
    "sessions",
    "turns",
    "words_of",
    "written_summary",
]

TEMPORAL = 2
"""The category of "when" questions."""
CATEGORIES = (1, 2, 3, 4)
"""The categories asked (5, adversarial, has no answer to find); see `CATEGORY_NAMES`."""
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
"""LoCoMo's categories as its data has them: 1's answers gather several sessions' evidence
("pottery, camping, painting, swimming"), 2 asks when, 3 asks for inferences, 4 for one fact."""

_STOPWORD_TEXT = """
about above after again against all also and any are aren't because been before being below
between both but can cannot could couldn't did didn't does doesn't doing don't down during each
few for from further had hadn't has hasn't have haven't having her here hers herself him himself
his how i'd i'll i'm i've into isn't it's its itself let's more most mustn't myself nor not off
once only other ought our ours ourselves out over own same shan't she she'd she'll she's should
shouldn't some such than that that's the their theirs them themselves then there there's these
they they'd they'll they're they've this those through too under until very was wasn't we'd
we'll we're we've were weren't what what's when when's where where's which while who who's whom
why why's with won't would wouldn't you you'd you'll you're you've your yours yourself
yourselves the yes yeah
"""
_STOPWORDS = frozenset(w for word in _STOPWORD_TEXT.split() for w in re.findall(r"[a-z0-9]+", word))
_WORD = re.compile(r"[a-z0-9]+")
_DIA = re.compile(r"D(\d+):(\d+)")
_SESSION = re.compile(r"session_(\d+)")
_DATE_TIME = "%I:%M %p on %d %B, %Y"


def locomo_dir() -> Path | None:
    """``$CONVMEM_LOCOMO``, else ``../shared/data/locomo`` beside the repository (None: not there)."""
    configured = os.environ.get("CONVMEM_LOCOMO")
    candidates = [Path(configured)] if configured else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo")
    return next((c for c in candidates if c.is_dir() and any(c.glob("*.json"))), None)


def content_words(text: str) -> set[str]:
    """Lowercase alphanumeric words of 3+ characters that are not stop words."""
    return {w for w in _WORD.findall(text.lower()) if len(w) >= 3 and w not in _STOPWORDS}


def words_of(text: str) -> list[str]:
    """The content words of `text` in order, repeats kept (`content_words` as a sequence)."""
    return [w for w in _WORD.findall(text.lower()) if len(w) >= 3 and w not in _STOPWORDS]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield str(key)
            yield from _strings(inner)
    elif isinstance(value, list | tuple):
        for inner in value:
            yield from _strings(inner)
    elif value is not None:
        yield str(value)


def context_words(context: dict[str, Any]) -> set[str]:
    """The content words of ``json.dumps(context)``: its keys and values, JSON escapes undone.

    (Read off the JSON text itself, ``"...\\nMay"`` would give the word ``nmay``.)
    """
    words: set[str] = set()
    for text in _strings(context):
        words |= content_words(text)
    return words


def history_words(turns: list[ConversationTurn]) -> set[str]:
    """The content words of the plain history ``user: ...\\nassistant: ...`` (the ceiling's text)."""
    words = {"user", "assistant"} if turns else set()
    for turn in turns:
        words |= content_words(turn.user_message)
        words |= content_words(turn.assistant_response)
    return words


@dataclass(frozen=True)
class Utterance:
    speaker: str
    text: str


@dataclass(frozen=True)
class LocomoSession:
    number: int
    ts: float
    utterances: tuple[Utterance, ...]


@dataclass(frozen=True)
class QAItem:
    """A question whose answer is `words`, answerable once session `needs` has been played."""

    words: frozenset[str]
    needs: int
    category: int
    question: str = ""
    answer: str = ""


def _utterance(raw: dict[str, Any]) -> Utterance:
    text = str(raw.get("text") or "")
    caption = raw.get("blip_caption")
    if caption:
        text = f"{text} [image: {caption}]"
    return Utterance(str(raw.get("speaker", "")), text)


def session_ts(dialogue: dict[str, Any], number: int) -> float:
    """The session's ``session_N_date_time`` (``1:56 pm on 8 May, 2023``) as a UTC epoch."""
    raw = str(dialogue.get(f"session_{number}_date_time", ""))
    try:
        return datetime.strptime(raw, _DATE_TIME).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise ValueError(f"session_{number}_date_time: cannot read {raw!r} as {_DATE_TIME!r}") from None


def sessions(dialogue: dict[str, Any]) -> list[LocomoSession]:
    numbers = sorted(
        int(m.group(1)) for k, v in dialogue.items() if (m := _SESSION.fullmatch(k)) and isinstance(v, list)
    )
    return [
        LocomoSession(n, session_ts(dialogue, n), tuple(_utterance(u) for u in dialogue[f"session_{n}"]))
        for n in numbers
    ]


def turns(session: LocomoSession, user_speaker: str) -> list[ConversationTurn]:
    """User run + following assistant run = one turn; consecutive utterances of a speaker joined."""
    runs: list[tuple[bool, list[str]]] = []
    for utterance in session.utterances:
        is_user = utterance.speaker == user_speaker
        if runs and runs[-1][0] == is_user:
            runs[-1][1].append(utterance.text)
        else:
            runs.append((is_user, [utterance.text]))
    out: list[ConversationTurn] = []
    i = 0
    while i < len(runs):
        is_user, texts = runs[i]
        if is_user:
            answer = runs[i + 1][1] if i + 1 < len(runs) else []
            user, assistant = "\n".join(texts), "\n".join(answer)
            i += 2
        else:
            user, assistant = "", "\n".join(texts)
            i += 1
        out.append(ConversationTurn(user_message=user, assistant_response=assistant, ts=session.ts))
    return out


def qa_items(dialogue: dict[str, Any]) -> tuple[list[QAItem], dict[str, int]]:
    """The QA items of categories 1-4, and how many were left out and why."""
    items: list[QAItem] = []
    left_out = {"category 5": 0, "no evidence id": 0, "no content word in the answer": 0}
    for qa in dialogue.get("qa", []):
        category = qa.get("category")
        if category not in CATEGORIES:
            left_out["category 5"] += 1
            continue
        needs = [int(m.group(1)) for e in qa.get("evidence", []) for m in _DIA.finditer(str(e))]
        if not needs:
            left_out["no evidence id"] += 1
            continue
        words = frozenset(content_words(str(qa.get("answer", ""))))
        if not words:
            left_out["no content word in the answer"] += 1
            continue
        items.append(
            QAItem(words, max(needs), category, str(qa.get("question", "")), str(qa.get("answer", "")))
        )
    return items, left_out


def written_summary(dialogue: dict[str, Any], number: int) -> str:
    """LoCoMo's own ``session_N_summary`` ("" when the dialogue has none for that session)."""
    return str(dialogue.get(f"session_{number}_summary") or "")


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data
