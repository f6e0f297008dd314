"""Text for the extractive summarizer: clean lines, sentences, filler, and weighted content terms.

A sentence's *terms* are its content words, stemmed (Snowball's English
stemmer, so "painted", "painting" and "paints" are one term), each with an
integer weight: 0 for function words, small talk and fillers (not kept at
all), 1 for the very common words of everyday talk, 4 for every other word,
8 for such a word written as a name (capitalised inside a sentence) or a
number of two digits or more. Words outside everyday vocabulary (names, places, objects,
numbers, dates) are the rare ones a later question asks about, so they weigh
most, and the specifics among them (who, where, which title, how many, when)
twice that. Weights are
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
    "addressed_name",
    "body_key",
    "body_terms",
    "clean",
    "clip",
    "fact_key",
    "intro_name",
    "is_dependent",
    "is_identity",
    "is_pleasantry",
    "is_question",
    "label_of",
    "sentences",
    "speaker_label",
    "specifics",
    "split_label",
    "split_media",
    "strip_filler",
    "terms",
    "unlabelled",
]

FULL_WEIGHT = 4
SPECIFIC_WEIGHT = 8
"""A rare word written as a name (capitalised inside a sentence: "Sweden", "Becoming Nicole") or a
number ("2023", "18th"): the specifics a later question asks after, twice a rare word (`_SPECIFIC`)."""
_COMMON_WEIGHT = 1
_STEM_CACHE_LIMIT = 50_000

Terms = tuple[tuple[str, int], ...]
"""(stem, weight) pairs, one per distinct stem, in order of first appearance."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")  # and lone surrogates: UTF-8 cannot carry them
_TAG = re.compile(r"</?[A-Za-z_][\w.-]*>")
_ABBREVIATIONS = "".join(
    rf"(?<!\b{re.escape(a)})"
    for a in ("Dr.", "Mr.", "Mrs.", "Ms.", "Mx.", "Prof.", "St.", "Jr.", "Sr.", "vs.", "e.g.", "i.e.")
)
_SENTENCE_END = re.compile(rf"(?<=[.!?…]){_ABBREVIATIONS}\s+|(?<=[.!?…][\"'”’)])\s+")
"""Within a line, a sentence ends at . ! ? or … and a space (not after a title such as "Dr." or "e.g.")."""
_LIST_MARKER = re.compile(r"^(?:[-*•]|\d{1,2}[.)])\s+")
_MARKER_STARTS = frozenset("-*•")
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_KEY_DROP = re.compile(r"[^\w\s]+")
_SPECIFIC = re.compile(r" ([A-Z](?:[a-z][^\W_]*(?:['’][^\W_]+)*|[A-Z]{1,4}\b))|\d\d+(?:st|nd|rd|th|s)?\b")
"""A specific: a word capitalised inside a sentence (after a word or a comma and a space, so not
the sentence's first word): a name or title ("Sweden", "Becoming Nicole") or an acronym of 2 to 5
capitals ("LGBTQ"), ASCII capitals only; or a number of two digits or more ("2023", "18th",
"1990s"). Written to start
with a space or a digit, so the scan skips the rest; `specifics` checks what stands before."""
_BEFORE_NAME = frozenset(",;:)]'’\"-_")
"""Besides a letter or a digit, what may stand before the space before a name (not . ! ? …)."""
_INTERJECTION = (
    r"(?:hey|hi|hello|hiya|yo|wow|whoa|woah|oh|ooh|ah|aw+|aww+|haha+|hah|lol|omg|yeah|yep|yup|yes|no|nope"
    r"|ok|okay|sure|well|so|um+|uh+|hmm+|cool|great|awesome|nice|thanks|thank you|sorry|congrats"
    r"|congratulations|absolutely|definitely|totally|exactly|indeed|right|true|agreed|good|perfect"
    r"|amazing|wonderful|fantastic|oh my god|oh my gosh|oh wow|oh no|oh yeah|yay|ugh|phew|man|dude"
    r"|woo+|woohoo|hooray|whew|gosh|geez|jeez|heh|hehe|aha|yikes|bravo|hurray)"
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
    woo woohoo hooray whew gosh geez jeez heh hehe yikes bravo ya
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
    # str.split() and the regex ``\s`` agree on what is white space: this is
    # ``re.sub(r"\s+", " ", ...).strip()`` with one regex pass fewer.
    return " ".join(_CONTROL.sub(" ", text).split())


def sentences(text: str) -> list[str]:
    """The cleaned sentences of `text` (a line break always ends one), list markers removed."""
    out = []
    for line in text.splitlines():
        for raw in _SENTENCE_END.split(line):
            part = raw.strip()
            if part[:1] in _MARKER_STARTS or part[:1].isdecimal():  # else the marker pattern cannot match
                part = _LIST_MARKER.sub("", part)
            sentence = clean(part)
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


def split_label(text: str) -> tuple[str, str]:
    """A fact's speaker label and the rest ("Alice: I paint." -> ("Alice", "I paint.")); ("", text) when
    it has none. The label is 1 to 40 characters, no colon or line break, not opening with a blank."""
    cut = text.find(": ", 1, 42)
    if cut < 0 or text[0].isspace() or ":" in text[:cut] or "\n" in text[:cut]:
        return "", text
    return text[:cut], text[cut + 2 :]


def terms(text: str) -> Terms:
    """The weighted content terms of a fact's text (its speaker label left out)."""
    return body_terms(split_label(text)[1])


def body_terms(body: str) -> Terms:
    """The weighted content terms of a text with no label."""
    seen: dict[str, int] = {}
    cache = _term_cache
    for found in _WORD.findall(body.lower().replace("’", "'")):
        term = cache.get(found, _UNSEEN)
        if term is _UNSEEN:
            term = _term(found)
        if term is None:
            continue
        stem, weight = term
        if seen.get(stem, 0) < weight:
            seen[stem] = weight
    for found in specifics(body):
        word = found.lower().replace("’", "'")
        term = cache.get(word, _UNSEEN)
        if term is _UNSEEN:
            term = _term(word)
        if term is not None and seen.get(term[0]) == FULL_WEIGHT:
            seen[term[0]] = SPECIFIC_WEIGHT
    return tuple(seen.items())


def specifics(body: str) -> list[str]:
    """The names, titles, acronyms and numbers of a text (`_SPECIFIC`), as written, in order."""
    found: list[str] = []
    for match in _SPECIFIC.finditer(body):
        start = match.start()
        before = body[start - 1] if start else ""
        name = match.group(1)
        if name is not None:
            if before and (before.isalnum() or before in _BEFORE_NAME):
                found.append(name)
        elif not (before.isalnum() or before == "_"):
            found.append(match.group())
    return found


_UNSEEN = ("", 0)
_term_cache: dict[str, tuple[str, int] | None] = {}


def _term(found: str) -> tuple[str, int] | None:
    """A lower-case word's (stem, weight), None for a word that is no term; cached (a pure function)."""
    word = found[:-2] if found.endswith("'s") else found
    term: tuple[str, int] | None = None
    if word not in _STOPWORDS and (len(word) >= 2 or word.isdigit()):
        term = (_stem(word), _COMMON_WEIGHT if word in _COMMON else FULL_WEIGHT)
    if len(_term_cache) >= _STEM_CACHE_LIMIT:
        _term_cache.clear()
    _term_cache[found] = term
    return term


def fact_key(text: str) -> str:
    """What makes two facts the same: their words, case and punctuation aside, speaker left out."""
    return body_key(split_label(text)[1])


def body_key(body: str) -> str:
    """`fact_key` of a text with no label."""
    return " ".join(_KEY_DROP.sub(" ", body.casefold()).split())


_SPEAKER_LABEL = re.compile(r"[A-Z][\w.'’-]*(?: [A-Z][\w.'’-]*){0,3}")


def speaker_label(label: str) -> str:
    """`label` when it is a speaker's (capitalised words: "Alice", "Dr. Osei"), else "" ("Selected
    plan: Pro tier" is a free-text fact, not a line of someone's)."""
    known = _label_cache.get(label)
    if known is None:
        known = label if label and _SPEAKER_LABEL.fullmatch(label) is not None else ""
        if len(_label_cache) >= _STEM_CACHE_LIMIT:
            _label_cache.clear()
        _label_cache[label] = known
    return known


_label_cache: dict[str, str] = {}


def label_of(text: str) -> str:
    """A fact's speaker label ("Alice" of "Alice: I paint."), or "" when it has none."""
    return speaker_label(split_label(text)[0])


def unlabelled(text: str) -> str:
    """A fact's text without its speaker label."""
    return split_label(text)[1]


# Who people are: self-introductions, roles, relationships. These are facts however few words they
# have ("I'm Alice.", "My sister Maria."), and a summary keeps them before other facts of equal value.
_TITLE = r"(?:(?:Dr|Mr|Mrs|Ms|Mx|Prof|Professor|Sir|Dame|Rev)\.?\s+)?"
_NAME = r"[A-Z][\w'’-]*(?:\s+[A-Z][\w'’-]*){0,2}"
_INTRO = re.compile(
    rf"(?:\bI(?:'m|’m| am)|\b[Mm]y name(?: is|'s|’s)|\b[Cc]all me)\s+({_TITLE}{_NAME})"
    r"(?=\s*(?:[,.!?;…)]|$|\s(?:and|from|here|by|speaking|but)\b))"
)
_KIN = (
    r"sister|brother|sibling|mom|mum|mother|dad|father|parents?|son|daughter|kids?|child|children|baby"
    r"|wife|husband|partner|spouse|boyfriend|girlfriend|fianc[eé]e?|friend|best friend|roommate|flatmate"
    r"|boss|manager|colleague|coworker|co-worker|cousin|aunt|uncle|niece|nephew|grandma|grandmother"
    r"|grandpa|grandfather|grandparents?|grandson|granddaughter|neighbou?r|mentor|teacher|doctor|therapist"
    r"|dog|cat|pet|puppy|kitten"
)
_IDENTITY = re.compile(
    r"\b(?:[Mm]y (?:(?:older|younger|little|big|eldest|oldest|youngest|new|late|step|twin)\s*)?"
    rf"(?:{_KIN})s?\b"
    r"|I (?:work|worked|am working|'m working|’m working) (?:as|at|for|in)\b"
    r"|I(?:'m|’m| am) (?:an?|the) (?!(?:bit|little|lot|kind|sort|huge fan|big fan)\b)\w"
    r"|I(?:'m|’m| am) (?:from|married|engaged|divorced|single|retired|pregnant)\b"
    r"|I(?:'m|’m| am) \d{1,3}(?: years old)?\b"
    r"|(?:I have|I've got) (?:a|an|two|three|\d) (?:\w+ )?(?:" + _KIN + r")s?\b)"
)


_TITLES = frozenset(["dr", "mr", "mrs", "ms", "mx", "prof", "professor", "sir", "dame", "rev"])
_DEMONYM_ENDINGS = ("ish", "ese", "ian", "can", "ean")


def intro_name(sentence: str) -> str | None:
    """The name a self-introduction gives ("Hi, I'm Alice." -> "Alice"), or None."""
    if "I" not in sentence and "y name" not in sentence and "all me" not in sentence:
        return None  # every introduction has one of these: most sentences are done here
    found = _INTRO.search(sentence)
    if found is None:
        return None
    name = found.group(1)
    first = name.split()[0].rstrip(".").lower()
    if first in _TITLES and " " not in name:
        return None  # "I am Dr. Osei's patient": the title alone is no name
    if first in _STOPWORDS or first in _COMMON or (len(name) > 6 and name.endswith(_DEMONYM_ENDINGS)):
        return None  # "I'm Sure", "I am Happy", "I'm Canadian": not a name
    return name


def is_identity(text: str) -> bool:
    """Whether a fact says who someone is: a name, a role, a relationship, an origin, an age."""
    if "I" not in text and "my " not in text and "My " not in text and "all me " not in text:
        return False  # every pattern needs one of these: most sentences are done here
    return _IDENTITY.search(text) is not None or intro_name(text) is not None


_VOCATIVE = re.compile(
    r"^(?i:hey|hi|hello|hiya|heya|howdy|yo|dear|thanks|thank you|congrats|congratulations|wow|oh|aw+"
    r"|good morning|good afternoon|good evening|morning|welcome back|bye|goodbye|sorry)[ ,]+(?i:there[ ,]+)?"
    r"([A-Z][a-z][\w'’-]*)(?=\s*[!,.?…]|\s*$)"
)


def addressed_name(text: str) -> str | None:
    """The name a message opens by greeting ("Hey Mel! ..." -> "Mel"): the other speaker's, or None."""
    found = _VOCATIVE.match(text)
    if found is None:
        return None
    name = found.group(1)
    return None if name.lower() in _STOPWORDS or name.lower() in _COMMON else name


_PLEASANTRY = re.compile(
    r"(?i:(?:(?:ok(?:ay)?|alright|well|anyway|anyways|so)[, ]+)?(?:"
    r"(?:see|catch|talk to|speak to|chat with|hear from|chat to) (?:you|ya|u|y'all|you all)"
    r"(?: (?:later|soon|then|around|tomorrow|next time|again|guys))?"
    r"|take care(?: of yourself)?|bye(?: for now| now)?|good ?night|good ?bye|later|ttyl|cheers"
    r"|have (?:a|an) (?:good|great|nice|lovely|wonderful|awesome|fun|amazing)"
    r" (?:one|day|night|evening|weekend|time)"
    r"|you too|same (?:here|to you)|me too|no problem|no worries|my pleasure|any ?time|sounds (?:good|great)"
    r"|will do|of course|for sure|good luck|best of luck|keep (?:it )?up|keep in touch|stay safe|enjoy"
    r"|you got this|you've got this|go for it|glad to hear(?: that| it)?|happy to help|nice to meet you"
    r"|good to see you|great to see you|great to hear(?: that| it)?|talk soon|miss you|love you"
    r"|(?:that|this|it)(?:'s|’s| is| was| sounds| looks) (?:so |really |very |just )?"
    r"(?:great|awesome|amazing|cool"
    r"|nice|good|wonderful|fantastic|lovely|beautiful|incredible|fun|exciting|sweet|perfect)"
    r"))(?:[ ,]+(?:[A-Z][\w'’-]*|too|again|so much|a lot))?\s*[!.…~]*"
)


def is_pleasantry(sentence: str) -> bool:
    """A greeting, thanks, compliment or sign-off with nothing else in it ("Catch ya later!")."""
    return _PLEASANTRY.fullmatch(sentence) is not None


_DEPENDENT = re.compile(
    r"(?:It|Its|It's|It’s|They|They're|They’re|Them|Their|He|He's|He’s|His|She|She's|She’s|Her"
    r"|There|Both|Such)\b"
    r"|(?:That|This|These|Those)(?:'s|’s|\s+(?:is|was|are|were|will|would|can|could|has|had|have|must|might"
    r"|should|does|did|sounds|looks|seems|means|made|makes|one|ones|too|also|really|just|so)\b|\s*[,!.?…]|$)"
)


def is_dependent(sentence: str) -> bool:
    """Whether a sentence opens by pointing back ("It was...", "That's why...", "She said..."), so that
    it means nothing without the sentence before it. "This necklace is..." points at its own noun."""
    return _DEPENDENT.match(sentence) is not None


_MEDIA = re.compile(
    r"\[(?:(?i:image|img|photo|picture|pic|video|gif|sticker|audio|voice note|attachment|file)"
    r"(?::\s*([^\]]*))?"
    r"|(?i:shar(?:ed|es|ing) (?:an? |the )?(?:photo|image|picture|pic|video|gif|link|file)s?)"
    r"(?:\s+of\s+|:\s*)?([^\]]*))\]"
)


def split_media(text: str) -> tuple[str, list[str]]:
    """The text without its media annotations ("[image: a photo of ...]", "[shared a photo of ...]"),
    and their captions."""
    if "[" not in text:
        return text, []
    captions: list[str] = []

    def take(found: re.Match[str]) -> str:
        caption = clean(found.group(1) or found.group(2) or "")
        if caption:
            captions.append(caption)
        return " "

    return _MEDIA.sub(take, text), captions
