"""LoCoMo dialogues as convmem turns, and what "visible in the context" means.

Research data: read from ``$CONVMEM_LOCOMO`` or ``../shared/data/locomo``
beside the repository, never copied into it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convmem.events import ConversationTurn

__all__ = [
    "DIA",
    "VISIBLE_SHARE",
    "Context",
    "LocomoSession",
    "Utterance",
    "content_words",
    "fold",
    "locomo_dir",
    "sessions",
    "turns",
]

_STOPWORD_TEXT = """
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she
should so some such than that the their theirs them themselves then there these they this those
through to too under until up very was we were what when where which while who whom why will with
would you your yours yourself yourselves i'm you're it's that's i've i'd i'll we're they're don't
can't didn't isn't wasn't yeah yes oh hey hi wow really so much also get got just like know think
thanks thank sure well one lot things thing going gonna it'd let let's
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
DIA = re.compile(r"D(\d+):(\d+)")
_SESSION = re.compile(r"session_(\d+)")
VISIBLE_SHARE = 0.6


def locomo_dir() -> Path | None:
    """``$CONVMEM_LOCOMO``, else ``../shared/data/locomo`` beside the repository (None: not there)."""
    configured = os.environ.get("CONVMEM_LOCOMO")
    candidates = [Path(configured)] if configured else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo")
    return next((c for c in candidates if c.is_dir() and any(c.glob("*.json"))), None)


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in _STOPWORDS}


def fold(text: str) -> str:
    return " ".join(text.lower().split())


@dataclass(frozen=True)
class Utterance:
    dia_id: str
    speaker: str
    text: str


@dataclass(frozen=True)
class LocomoSession:
    number: int
    utterances: tuple[Utterance, ...]


def _utterance(raw: dict[str, Any]) -> Utterance:
    text = str(raw.get("text") or "")
    caption = raw.get("blip_caption")
    if caption:
        text = f"{text} [image: {caption}]"
    return Utterance(str(raw.get("dia_id", "")), str(raw.get("speaker", "")), text)


def sessions(dialogue: dict[str, Any]) -> list[LocomoSession]:
    numbers = sorted(int(m.group(1)) for k in dialogue if (m := _SESSION.fullmatch(k)))
    return [LocomoSession(n, tuple(_utterance(u) for u in dialogue[f"session_{n}"])) for n in numbers]


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
            out.append(ConversationTurn(user_message="\n".join(texts), assistant_response="\n".join(answer)))
            i += 2
        else:
            out.append(ConversationTurn(user_message="", assistant_response="\n".join(texts)))
            i += 1
    return out


def _context_units(context: dict[str, Any]) -> list[str]:
    """The context's text in units: each summary line, each turn's user and assistant text."""
    memory = context.get("conversation_memory", {})
    units = [line for line in str(memory.get("summary", "")).split("\n") if line.strip()]
    for zone in ("pending_turns", "recent_turns"):
        for turn in memory.get(zone, []):
            units.extend(text for text in (turn.get("user", ""), turn.get("assistant", "")) if text)
    return units


class Context:
    """What `visible` checks an utterance against: the folded text and each unit's content words."""

    def __init__(self, context: dict[str, Any]) -> None:
        units = _context_units(context)
        self.folded = fold("\n".join(units))
        self.unit_words = [content_words(unit) for unit in units]

    def shows(self, utterance: str) -> bool:
        """Verbatim (folded), or at least `VISIBLE_SHARE` of its content words within one unit."""
        folded = fold(utterance)
        if folded and folded in self.folded:
            return True
        words = content_words(utterance)
        if not words:
            return False
        need = VISIBLE_SHARE * len(words)
        return any(len(words & unit) >= need for unit in self.unit_words)
