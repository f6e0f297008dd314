"""Configuration: the seed's budget, isolation, health and strategy settings, and ours.

Everything here is plain data that a `SessionStarted` event records, so a
replay uses the configuration the session really ran with. Callables (token
estimators, callbacks, summarizers) are not configuration data: the runtime
takes them as arguments.

Validation happens on construction and on decoding; a bad setting raises
`InvalidConfig` naming the field. Configuration is encoded with every field,
defaults included, so that a later change of a default never changes how an
old session replays.
"""

from __future__ import annotations

import enum
import math
import re
import unicodedata
from typing import Literal, assert_never, get_args

import msgspec

from convmem.errors import InvalidConfig
from convmem.events._checks import storing

__all__ = [
    "MAX_WAIT_SECONDS",
    "AgentsMemoryConfig",
    "AgentsStrategy",
    "ConversationMemoryConfig",
    "HealthPolicy",
    "MemoryBudget",
    "MemoryHealth",
    "MemoryIsolation",
    "OverflowPolicy",
    "ShortTermMemoryConfig",
    "Strategy",
    "strategy_reads_summaries",
    "strategy_summarizes",
]

_ENCODING_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")

Strategy = Literal["none", "truncation", "rolling_summary"]
"""PenguiFlow's strategies: what `llm_context` shows, and whether the session summarizes.

How each one shows, and how it maps to the other two vocabularies (`AgentsStrategy`,
the conversation memories' `MemoryType`), is one table: ``convmem/projections/_strategies.py``.
"""
OverflowPolicy = Literal["truncate_summary", "truncate_oldest", "error"]
AgentsStrategy = Literal["none", "trimming", "summarizing", "compacting"]
"""The OpenAI-Agents session strategies: what `agent_items` shows (see `Strategy`)."""


def strategy_summarizes(strategy: Strategy) -> bool:
    """Whether a session of `strategy` asks a summarizer for summaries (its one stored consequence)."""
    match strategy:
        case "none" | "truncation":
            return False
        case "rolling_summary":
            return True
        case _:
            assert_never(strategy)


def strategy_reads_summaries(strategy: AgentsStrategy) -> bool:
    """Whether the Agents strategy shows the session's summaries (so needs a summarizing `Strategy`)."""
    match strategy:
        case "none" | "trimming" | "compacting":
            return False
        case "summarizing":
            return True
        case _:
            assert_never(strategy)


def _one_of(field: str, value: object, names: tuple[str, ...]) -> None:
    if value not in names:
        listed = ", ".join(names[:-1]) + f" or {names[-1]}"
        raise InvalidConfig(field, f"must be {listed}, got {value!r}")


def _speaker_names(names: object) -> None:
    if not isinstance(names, dict):
        raise InvalidConfig("speaker_names", f"must map 'user'/'assistant' to a name, got {shown(names)}")
    for role, name in names.items():
        if role not in ("user", "assistant"):
            raise InvalidConfig(
                "speaker_names", f"names the speakers 'user' and 'assistant' only, got {shown(role)}"
            )
        if (
            not isinstance(name, str)
            or not name.strip()
            or len(name) > 40
            or ":" in name
            or not name.isprintable()
        ):
            raise InvalidConfig(
                f"speaker_names.{role}",
                f"must be a name of 1 to 40 printable characters with no colon, got {shown(name)}",
            )
        taken = speaker_name_taken(role, name, names.get(_OTHER_ROLE[role]))
        if taken:
            raise InvalidConfig(f"speaker_names.{role}", f"{taken}, got {shown(name)}")


def shown(value: object, limit: int = 60) -> str:
    """`value`'s repr for an error message, cut to about `limit` characters (a hostile value may be
    megabytes long: the message names it, it does not carry it)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f", {len(value)} long" if isinstance(value, str | bytes | dict | list) else ""
    return f"{text[:limit]}... ({type(value).__name__}{size})"


_OTHER_ROLE = {"user": "assistant", "assistant": "user"}
_DEFAULT_LABEL = {"user": "User", "assistant": "Assistant"}


_LOOKALIKES = str.maketrans(
    # Lower-case Cyrillic and Greek letters that look like Latin ones (not Unicode's whole confusables
    # table: the common look-alikes, enough that "Assist\u0430nt", Cyrillic a inside, is "assistant").
    "аеорсухіјѕԁһԛԝӏвкмнтɡαβεζηικμνορτυχγ",
    "aeopcyxijsdhqwlbkmhtgabezhikmvoptuxy",
)


_TITLES = frozenset(
    ("dr", "mr", "mrs", "ms", "mx", "prof", "st", "jr", "sr", "rev", "sgt", "capt", "col", "gen")
)


def _folded(name: str) -> str:
    """`name` as compared with another: case, width, spacing and Cyrillic/Greek look-alikes folded."""
    return " ".join(unicodedata.normalize("NFKC", name).casefold().translate(_LOOKALIKES).split())


def speaker_name_taken(role: str, name: str, other: object) -> str | None:
    """Why `name` cannot label `role`'s lines ("Alice: ...") beside the `other` speaker's name, or None.

    A summary's fact says who said it by its label: a name equal (ignoring case, width, spacing and
    letters that look alike) to the other speaker's label ("Assistant", or its name) or to the tools'
    label ("Tools") would attribute one speaker's words to another; a name that ends a sentence and
    goes on ("Bob. The assistant's name is Eve") would write the summary's prose. A title ("Dr. Osei")
    or an initial ("J. R. Tolkien") is no sentence end.
    """
    words = name.split()
    for word in words[:-1]:
        stem = word.rstrip(".")
        if word[-1] in "!?;…" or (word[-1] == "." and len(stem) > 1 and stem.casefold() not in _TITLES):
            return "must be one name, not a sentence (it would read as the summary's own)"
    folded = _folded(name)
    if folded in ("tools", _folded(_DEFAULT_LABEL[_OTHER_ROLE[role]])):
        return f"must not be a label the summary gives to another speaker ({folded!r})"
    if isinstance(other, str) and folded == _folded(other):
        return "must differ from the other speaker's name"
    return None


class MemoryHealth(enum.Enum):
    """Health of a session's summarization (the RFC's four states)."""

    HEALTHY = "healthy"
    RETRY = "retry"
    DEGRADED = "degraded"
    RECOVERING = "recovering"


_MAX_INT = 2**63 - 1
"""The largest whole number a setting may hold: the largest the event codec stores (a config is in
`SessionStarted`)."""


def _positive_int(field: str, value: int, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidConfig(field, f"must be an integer >= {minimum}, got {value!r}")
    if value > _MAX_INT:
        raise InvalidConfig(field, f"must be an integer <= 2**63 - 1, got a {value.bit_length()}-bit number")


MAX_WAIT_SECONDS = 86_400.0
"""The longest wait a setting may ask for (a day): the health machine's timers and the summarizer's
time limit wait this long at most (past about 9.2e9 seconds a thread's wait overflows time_t, and a
longer wait is a hang, not a setting). A configuration stored before this bound existed still
replays as it was (`as_stored`)."""

MAX_BACKOFF_STEPS = 100
"""The most intervals `HealthPolicy.retry_backoff_seconds` holds (the last repeats; the configuration
is stored with every session, so its size is bounded too)."""


def _positive_seconds(field: str, value: float, *, zero: bool = False) -> None:
    bound = ">= 0" if zero else "> 0"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**300:
        # float() of it would overflow (an OverflowError, not a setting's error)
        raise InvalidConfig(field, f"must be a finite number of seconds {bound}, got a number over 1e300")
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        raise InvalidConfig(field, f"must be a finite number of seconds {bound}, got {value!r}")
    if value > MAX_WAIT_SECONDS and storing():
        raise InvalidConfig(
            field, f"must be at most {MAX_WAIT_SECONDS:g} seconds (a day), got {shown(value)}"
        )


class MemoryBudget(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Token economy (the seed's fields and defaults).

    Zero means what it means in PenguiFlow: ``full_zone_turns=0`` keeps no
    recent turn (every turn goes to the pending zone, or nowhere under
    truncation), ``summary_max_tokens=0`` keeps no summary text (a summary is
    stored empty and still moves its turns out of the pending zone),
    ``total_max_tokens=0`` sets no overall budget.
    """

    full_zone_turns: int = 5
    summary_max_tokens: int = 1000
    total_max_tokens: int = 10000
    overflow_policy: OverflowPolicy = "truncate_oldest"
    recall_max_tokens: int = 0
    """Query-aware recall: with a query (the planner's current message), the context may show up to
    this many tokens of the session's earlier lines most relevant to it (``recalled``), taken from
    the summary's room, never from the turns shown verbatim; the lines fill what the whole view
    leaves within `total_max_tokens`. 0: no recall (a query changes nothing)."""

    def __post_init__(self) -> None:
        _positive_int("budget.full_zone_turns", self.full_zone_turns, minimum=0)
        _positive_int("budget.summary_max_tokens", self.summary_max_tokens, minimum=0)
        _positive_int("budget.total_max_tokens", self.total_max_tokens, minimum=0)
        if self.total_max_tokens and self.summary_max_tokens > self.total_max_tokens:
            raise InvalidConfig(
                "budget.summary_max_tokens",
                f"{self.summary_max_tokens} exceeds total_max_tokens={self.total_max_tokens}",
            )
        _one_of("budget.overflow_policy", self.overflow_policy, get_args(OverflowPolicy))
        _positive_int("budget.recall_max_tokens", self.recall_max_tokens, minimum=0)
        if self.total_max_tokens and self.recall_max_tokens > self.total_max_tokens:
            raise InvalidConfig(
                "budget.recall_max_tokens",
                f"{self.recall_max_tokens} exceeds total_max_tokens={self.total_max_tokens}",
            )


class MemoryIsolation(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Where to find the key's ids in a planner's tool_context (dotted paths)."""

    tenant_key: str = "tenant_id"
    user_key: str = "user_id"
    session_key: str = "session_id"
    require_explicit_key: bool = True

    def __post_init__(self) -> None:
        for field in ("tenant_key", "user_key", "session_key"):
            value = getattr(self, field)
            if not value or any(not part for part in value.split(".")):
                raise InvalidConfig(f"isolation.{field}", f"must be a dotted path, got {value!r}")


class HealthPolicy(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Timing of the health machine, in seconds (the RFC's defaults)."""

    retry_backoff_seconds: tuple[float, ...] = (2.0, 4.0, 8.0)
    """Wait before retry attempt n is `retry_backoff_seconds[n-1]` (the last repeats); 0 retries at once."""

    degraded_retry_seconds: float = 30.0
    """How often a DEGRADED session probes the summarizer again.

    0 means no wait and no timer, as in PenguiFlow: the session probes when a
    new turn arrives (a timer at 0 would probe a failing summarizer without end).
    """

    summarize_timeout_seconds: float = 60.0
    """A summarizer call that takes longer counts as a failure."""

    def __post_init__(self) -> None:
        if not self.retry_backoff_seconds:
            raise InvalidConfig("health.retry_backoff_seconds", "needs at least one interval")
        if len(self.retry_backoff_seconds) > MAX_BACKOFF_STEPS and storing():
            raise InvalidConfig(
                "health.retry_backoff_seconds",
                f"holds at most {MAX_BACKOFF_STEPS} intervals (the last repeats), "
                f"got {len(self.retry_backoff_seconds):,}",
            )
        for i, seconds in enumerate(self.retry_backoff_seconds):
            _positive_seconds(f"health.retry_backoff_seconds[{i}]", seconds, zero=True)
        _positive_seconds("health.degraded_retry_seconds", self.degraded_retry_seconds, zero=True)
        _positive_seconds("health.summarize_timeout_seconds", self.summarize_timeout_seconds)
        # Seconds are floats whatever the caller passed, so equal settings encode equally.
        msgspec.structs.force_setattr(
            self, "retry_backoff_seconds", tuple(float(s) for s in self.retry_backoff_seconds)
        )
        for name in ("degraded_retry_seconds", "summarize_timeout_seconds"):
            msgspec.structs.force_setattr(self, name, float(getattr(self, name)))

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry `attempt` (1-based)."""
        index = min(max(attempt, 1), len(self.retry_backoff_seconds)) - 1
        return self.retry_backoff_seconds[index]


class AgentsMemoryConfig(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The OpenAI-Agents session strategies (turn-based triggers, user-anchored turns)."""

    strategy: AgentsStrategy = "none"
    max_turns: int = 8
    """trimming: once the session holds this many user turns, keep only the last `keep_last_n_turns`."""
    keep_last_n_turns: int = 3
    context_limit: int = 8
    """summarizing: with this many unsummarized user turns, summarize all but the last `keep_last_n_turns`."""
    compact_trigger_turns: int = 4
    """compacting: compact once the session holds more than this many user turns."""
    compact_keep: int = 2
    """compacting: the newest turns left untouched."""
    compact_tool_calls: bool = False
    """compacting: also replace the arguments of older tool calls."""
    cross_session_injection: bool = False
    """Offer the user's latest summary from another session to a new session."""

    def __post_init__(self) -> None:
        _one_of("agents.strategy", self.strategy, get_args(AgentsStrategy))
        _positive_int("agents.max_turns", self.max_turns)
        _positive_int("agents.keep_last_n_turns", self.keep_last_n_turns)
        _positive_int("agents.context_limit", self.context_limit)
        _positive_int("agents.compact_trigger_turns", self.compact_trigger_turns, minimum=0)
        _positive_int("agents.compact_keep", self.compact_keep, minimum=0)
        if self.keep_last_n_turns > self.max_turns:
            raise InvalidConfig(
                "agents.keep_last_n_turns",
                f"{self.keep_last_n_turns} exceeds max_turns={self.max_turns}",
            )
        if self.keep_last_n_turns >= self.context_limit:
            raise InvalidConfig(
                "agents.keep_last_n_turns",
                f"{self.keep_last_n_turns} must be below context_limit={self.context_limit}",
            )


class ConversationMemoryConfig(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Settings of the buffer, window, summary and entity memories."""

    max_messages: int | None = None
    """buffer: keep at most this many non-system messages (None: all)."""
    window_size: int = 10
    """window: the number of recent non-system messages shown."""
    entity_max: int = 50
    """entity: the most entities tracked; the least mentioned is evicted first."""
    entity_recent_messages: int = 10
    """entity: recent messages shown after the entity summary."""

    def __post_init__(self) -> None:
        if self.max_messages is not None:
            _positive_int("memories.max_messages", self.max_messages)
        _positive_int("memories.window_size", self.window_size)
        _positive_int("memories.entity_max", self.entity_max)
        _positive_int("memories.entity_recent_messages", self.entity_recent_messages, minimum=0)


class ShortTermMemoryConfig(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A session's whole configuration (the seed's fields, defaults and ours)."""

    strategy: Strategy = "none"
    budget: MemoryBudget = msgspec.field(default_factory=MemoryBudget)
    isolation: MemoryIsolation = msgspec.field(default_factory=MemoryIsolation)
    summarizer_model: str | None = None
    include_trajectory_digest: bool = True
    recovery_backlog_limit: int = 20
    retry_attempts: int = 3
    health: HealthPolicy = msgspec.field(default_factory=HealthPolicy)
    agents: AgentsMemoryConfig = msgspec.field(default_factory=AgentsMemoryConfig)
    memories: ConversationMemoryConfig = msgspec.field(default_factory=ConversationMemoryConfig)
    include_turn_dates: bool = False
    """Show each turn's UTC date (``"date": "8 May 2023"``) in the context when its ``ts`` is known.
    Off by default: PenguiFlow-shaped contexts stay exactly as PenguiFlow renders them."""
    idempotency_horizon: int = 256
    """How many of its latest writes made with an ``idempotency_key`` the session remembers: a
    retry of any of them stores nothing, however long after the first try (past the log's
    duplicate window too). Measured in keyed writes, not time; 0 leaves retries to the log's
    duplicate window alone. A keyed write scans and copies this many keys (the state holds them
    without the session's prefix)."""
    live_turns: int | None = 100
    """The live session's horizon: the last turns it keeps in memory (and in its snapshots) for
    the views that show every turn (the Agents ``none`` and ``compacting`` items, the buffer
    memory without `memories.max_messages`). It never drops less than any other setting shows
    (the full zone, the Agents and memory windows), nor a turn a summary has yet to cover; older
    turns stay in the log, where export, replay and the timeline read them. None keeps every turn
    live (the state, its snapshots and each write then grow with the history)."""

    token_counter: str | None = None
    """What every budget counts in: None, the default estimate (``len // 4 + 1`` of the rendering, or
    the callable the runtime was given as ``token_counter``); a name, the tiktoken encoding of that
    name (``"cl100k_base"``), loaded by the runtime. The name is recorded with the session, so a
    replay measures with the same tokenizer; a callable is not data and is not recorded."""

    speaker_names: dict[str, str] = msgspec.field(default_factory=dict)
    """Who the speakers are, ``{"user": "Alice", "assistant": "Bob"}`` (either or both): passed to the
    summarizer with every request (``speaker_names`` in its payload, only when set), so that the
    extractive summarizer writes "Alice: ..." rather than "User: ...". Names of 1 to 40 characters,
    one line, no colon. Without it, the extractive summarizer names a speaker from the conversation
    (a self-introduction, the other speaker's greeting)."""

    def __post_init__(self) -> None:
        _one_of("strategy", self.strategy, get_args(Strategy))
        _speaker_names(self.speaker_names)
        if self.token_counter is not None and (
            not isinstance(self.token_counter, str) or _ENCODING_NAME.fullmatch(self.token_counter) is None
        ):
            raise InvalidConfig(
                "token_counter",
                "must be None or the name of a tiktoken encoding such as 'cl100k_base', "
                f"got {self.token_counter!r}",
            )
        _positive_int("recovery_backlog_limit", self.recovery_backlog_limit, minimum=0)
        _positive_int("retry_attempts", self.retry_attempts, minimum=0)
        _positive_int("idempotency_horizon", self.idempotency_horizon, minimum=0)
        if self.live_turns is not None:
            _positive_int("live_turns", self.live_turns)
        if strategy_reads_summaries(self.agents.strategy) and not strategy_summarizes(self.strategy):
            needed = " or ".join(repr(s) for s in get_args(Strategy) if strategy_summarizes(s))
            raise InvalidConfig(
                "agents.strategy",
                f"{self.agents.strategy} needs strategy={needed} (the summaries come from the "
                "session's summarizer)",
            )

    @property
    def summarizes(self) -> bool:
        """Whether this session asks a summarizer for summaries."""
        return strategy_summarizes(self.strategy)
