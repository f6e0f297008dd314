"""Text for the extractive summarizer: clean lines, sentences, filler, and weighted content terms.

A sentence's *terms* are its content words, stemmed (Snowball's English
stemmer, so "painted", "painting" and "paints" are one term), each with an
integer weight: 0 for function words, small talk and fillers (not kept at
all), 1 for the very common words of everyday talk, 4 for every other word.
Words outside everyday vocabulary (names, places, objects, numbers) are the
rare ones a later question asks about, so they weigh most. Weights are
integers so that sums kept incrementally equal sums computed afresh: the
summary must come out the same to the byte however it was reached.
"""

from __future__ import annotations

import re
import threading

import snowballstemmer  # type: ignore[import-untyped]  # no type hints shipped

__all__ = [
    "FULL_WEIGHT",
    "Terms",
    "clean",
    "clip",
    "fact_key",
    "is_question",
    "sentences",
    "strip_filler",
    "terms",
]

FULL_WEIGHT = 4
_COMMON_WEIGHT = 1
_STEM_CACHE_LIMIT = 50_000

Terms = tuple[tuple[str, int], ...]
"""(stem, weight) pairs, one per distinct stem, in order of first appearance."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")  # and lone surrogates: UTF-8 cannot carry them
_TAG = re.compile(r"</?[A-Za-z_][\w.-]*>")
_SPACES = re.compile(r"\s+")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|(?<=[.!?…][\"'”’)])\s+|\s*\n\s*")
_LIST_MARKER = re.compile(r"^(?:[-*•]|\d{1,2}[.)])\s+")
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_LABEL = re.compile(r"^(?:User|Assistant|Tools): ")
_KEY_DROP = re.compile(r"[^\w\s]+")
_INTERJECTION = (
    r"(?:hey|hi|hello|hiya|yo|wow|whoa|woah|oh|ooh|ah|aw+|aww+|haha+|hah|lol|omg|yeah|yep|yup|yes|no|nope"
    r"|ok|okay|sure|well|so|um+|uh+|hmm+|cool|great|awesome|nice|thanks|thank you|sorry|congrats"
    r"|congratulations|absolutely|definitely|totally|exactly|indeed|right|true|agreed|good|perfect"
    r"|amazing|wonderful|fantastic|oh my god|oh my gosh|oh wow|oh no|oh yeah|yay|ugh|phew|man|dude)"
)
_LEADING_FILLER = re.compile(
    rf"^(?:{_INTERJECTION}(?:[ ,]+[A-Z][\w'’-]*)?\s*[,!.…~-]+\s*|{_INTERJECTION},?\s+(?=[A-Za-z]))+",
    re.IGNORECASE,
)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_STOPWORDS = _words(
    """
    a about above after again against ago all almost along also although always am among an and another any
    anybody anyone anything anyway anyways are aren't around as at be became because become been before
    being below beside besides between both but by can can't cannot could couldn't did didn't do does
    doesn't doing don't done down during each either else enough etc even ever every everybody everyone
    everything few for from further had hadn't has hasn't have haven't having he he'd he'll he's her here
    here's hers herself him himself his how how's however i i'd i'll i'm i've if in into is isn't it it'd
    it'll it's its itself just least less let let's lot lots many may maybe me might mine more most much
    must mustn't my myself neither never no nor not nothing now of off often on once one ones only onto or
    other others otherwise ought our ours ourselves out over own per perhaps quite rather really same shall
    shan't she she'd she'll she's should shouldn't since so some somebody someone something sometimes
    somewhat soon still such than that that'd that'll that's the their theirs them themselves then there
    there'd there'll there's these they they'd they'll they're they've thing things this those though
    through thus till to too toward towards under unless until up upon us very via was wasn't we we'd we'll
    we're we've were weren't what what'd what'll what's whatever when when's whenever where where's
    whereas wherever whether which while who who'd who'll who's whoever whole whom whose why why's will
    with within without won't would wouldn't yet you you'd you'll you're you've your yours yourself
    yourselves
    hey hi hello hiya yo wow whoa woah oh ooh ah aw aww haha hahaha lol omg yeah yep yup yes nope ok okay
    um uh hmm yay ugh phew gonna wanna gotta kinda sorta dunno btw tho cuz cause 'cause
    thanks thank thx pls please sorry congrats congratulations bye goodbye cheers welcome
    great awesome amazing cool nice good glad wonderful fantastic incredible lovely super totally
    definitely absolutely exactly actually basically literally seriously honestly truly certainly
    probably pretty kind sort stuff lots bit
    """
)
"""Function words, greetings, thanks, fillers and bare enthusiasm: never a fact by themselves."""

_COMMON = _words(
    """
    able add agree ask asked asking back bad best better big bring brings brought call came can't care
    change chance check come comes coming day days did do does doing done end enjoy enjoyed enjoying
    everyday excited exciting experience far feel feeling feelings feels felt find first found fun gave
    get gets getting give given gives giving go goes going gone got gotten guess guys happen happened
    happens happy hard hear heard help helped helps hope hoping idea important interesting keep keeps
    kept know knew known last later learn learned least left let life like liked likes little live long
    look looked looking looks lot love loved loves made make makes making mean means meant mind moment
    moments much need needed needs new next night old part people place point proud put real reason
    remember right said say saying says see seeing seem seems seen share shared show showed sounds
    special start started starting stay stop sure take taken takes taking talk talked talking tell
    thought things think thinking time times today told tonight took tried try trying turn turned use
    used want wanted wants watch way ways week weeks went work worked working world year years
    """
)
"""Everyday words: kept, but worth a quarter of a rarer word."""

_stemmer = snowballstemmer.stemmer("english")
_stem_cache: dict[str, str] = {}
_stem_lock = threading.Lock()


def _stem(word: str) -> str:
    """The Snowball stem of an ASCII word (others are their own stem), cached (the stemmer is not
    thread-safe, so misses are stemmed under a lock)."""
    cached = _stem_cache.get(word)
    if cached is not None:
        return cached
    if not word.isascii() or not word.isalpha() or len(word) <= 3:
        stem = word
    else:
        with _stem_lock:
            stem = _stemmer.stemWord(word)
    if len(_stem_cache) >= _STEM_CACHE_LIMIT:
        _stem_cache.clear()
    _stem_cache[word] = stem
    return stem


def clean(text: str) -> str:
    """One line with no control characters and no tag that could break the summary's shape.

    Idempotent: ``clean(clean(x)) == clean(x)``.
    """
    if "<" in text:
        text = _TAG.sub(lambda m: m.group().replace("<", "‹").replace(">", "›"), text)
    return _SPACES.sub(" ", _CONTROL.sub(" ", text)).strip()


def sentences(text: str) -> list[str]:
    """The cleaned sentences of `text` (a line break always ends one), list markers removed."""
    out = []
    for raw in _SENTENCE_END.split(text):
        sentence = clean(_LIST_MARKER.sub("", raw.strip()))
        if sentence:
            out.append(sentence)
    return out


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters at a word boundary, marked with an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:") + "…"


def strip_filler(sentence: str) -> str:
    """The sentence without its leading interjections ("Wow, Jon! ...", "Yeah, ...").

    What is left keeps its meaning; its first letter is capitalised when something was cut before it.
    A trailing name is kept: ", Mel!" may be a vocative, but ", Sweden." is a fact.
    """
    stripped = _LEADING_FILLER.sub("", sentence).strip(" ,;:-")
    if stripped and stripped != sentence and stripped[0].islower():
        stripped = stripped[0].upper() + stripped[1:]
    return stripped


def is_question(sentence: str) -> bool:
    return sentence.rstrip("\"'”’) ").endswith("?")


def terms(text: str) -> Terms:
    """The weighted content terms of a fact's text (its speaker label left out)."""
    seen: dict[str, int] = {}
    if text.startswith(("User: ", "Assistant: ", "Tools: ")):
        text = text[text.index(" ") + 1 :]
    for found in _WORD.findall(text.lower().replace("’", "'")):
        word = found[:-2] if found.endswith("'s") else found
        if word in _STOPWORDS or (len(word) < 2 and not word.isdigit()):
            continue
        weight = _COMMON_WEIGHT if word in _COMMON else FULL_WEIGHT
        stem = _stem(word)
        if seen.get(stem, 0) < weight:
            seen[stem] = weight
    return tuple(seen.items())


def fact_key(text: str) -> str:
    """What makes two facts the same: their words, case and punctuation aside, speaker left out."""
    return _SPACES.sub(" ", _KEY_DROP.sub(" ", _LABEL.sub("", text, count=1).casefold())).strip()
