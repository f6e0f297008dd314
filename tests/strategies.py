"""Hypothesis strategies shared by the core's tests, and a small driver that turns
command sequences into valid histories through `decide` and `evolve`.

The generators aim at the corners that break things: ids with dots, wildcards,
separators, spaces, unicode and e-mail addresses; turns with digests, tool
items and entities; configurations with tiny budgets and short health
intervals, so that every overflow and every health transition is reachable
in a few steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from convmem.errors import InvalidInput, MemoryBudgetExceeded
from convmem.events import (
    AgentsMemoryConfig,
    AnyEvent,
    BacklogTrimmed,
    ConversationMemoryConfig,
    ConversationTurn,
    EntityMention,
    EntityTally,
    HealthChanged,
    HealthPolicy,
    HistoryCompacted,
    ItemPopped,
    ItemsAdded,
    KeptTurn,
    MemoryBudget,
    MemoryHealth,
    MemoryKey,
    MessageItem,
    SessionCleared,
    SessionErased,
    SessionRepaired,
    SessionRestored,
    SessionStarted,
    ShortTermMemoryConfig,
    SummaryProduced,
    TrajectoryDigest,
    TurnAdded,
    TurnsAdopted,
)
from convmem.projections import (
    AddItems,
    AddTurn,
    Clear,
    Command,
    PopItem,
    Restore,
    SessionState,
    StartSession,
    SummaryFailed,
    SummaryRequest,
    SummarySucceeded,
    TokenEstimator,
    decide,
    decide_folded,
    default_token_estimator,
    evolve,
    summary_due,
)

# Ids ------------------------------------------------------------------------------

NASTY_IDS = (
    "a.b",
    "*",
    ">",
    "a.*",
    "a.>",
    "a:b",
    "a\\:b",
    "\\",
    ":",
    "a b",
    " ",
    "ü",
    "用户",
    "🙂",
    "alice@example.com",
    "first.last+tag@sub.example.org",
    "=41",
    "=",
    "acme_corp",
    "session-1",
    "a" * 256,
)
"""Ids that break naive subject or composite encodings."""

_id_chars = st.characters(exclude_categories=("Cc", "Cs"))
ids = st.one_of(
    st.sampled_from(NASTY_IDS),
    st.text(_id_chars, min_size=1, max_size=24),
    st.emails().filter(lambda s: len(s) <= 256),
)
keys = st.builds(MemoryKey, ids, ids, ids)

# Text -------------------------------------------------------------------------------

_text_chars = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
texts = st.text(_text_chars, max_size=40)
"""Turn text: unicode, quotes, backslashes, newlines; never NUL or a lone surrogate."""
short_texts = st.text(st.sampled_from('ab c"\\\nü🙂<>/'), max_size=12)
"""Cheap text for long histories (still exercises JSON escaping)."""
names = st.text(st.characters(categories=("L", "N"), include_characters="_-"), min_size=1, max_size=12)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)),
    max_leaves=6,
)

# Turns ------------------------------------------------------------------------------

digests = st.builds(
    TrajectoryDigest,
    tools_invoked=st.lists(names, max_size=3).map(tuple),
    observations_summary=texts,
    reasoning_summary=st.none() | texts,
    artifacts_refs=st.lists(texts, max_size=2).map(tuple),
)


@st.composite
def item_lists(draw: st.DrawFn) -> tuple[MessageItem, ...]:
    """Agent items where every tool call is followed, in the same turn, by its result."""
    items: list[MessageItem] = []
    for n in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["message", "call", "reasoning"]))
        if kind == "message":
            role = draw(st.sampled_from(["user", "assistant", "system", "developer"]))
            items.append(MessageItem(kind="message", role=role, content=draw(texts)))
        elif kind == "reasoning":
            items.append(MessageItem(kind="reasoning", content=draw(texts)))
        else:
            call_id = f"call_{n}_{draw(names)}"
            tool = draw(names)
            items.append(
                MessageItem(
                    kind="function_call", call_id=call_id, name=tool, arguments=draw(st.none() | texts)
                )
            )
            items.append(
                MessageItem(
                    kind="function_call_output",
                    call_id=call_id,
                    name=draw(st.none() | st.just(tool)),
                    output=draw(texts),
                )
            )
    return tuple(items)


sdk_items = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": short_texts}),
    st.fixed_dictionaries(
        {"type": st.just("function_call"), "call_id": names, "name": names, "arguments": st.just("{}")}
    ),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": names, "output": short_texts}),
    st.fixed_dictionaries({"type": st.just("web_search_call"), "id": names}),
).map(MessageItem.from_agents)
"""Items as an OpenAI-Agents session hands them over, kept verbatim in `raw`."""


@st.composite
def item_batches(draw: st.DrawFn) -> tuple[MessageItem, ...]:
    """What one `add_items` call brings: messages, a call with or without its result yet, others."""
    batch: list[dict[str, Any]] = []
    for n in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["user", "assistant", "pair", "call", "other"]))
        call_id = f"call_{draw(st.integers(0, 10**6))}_{n}"
        if kind in ("user", "assistant"):
            batch.append({"role": kind, "content": draw(short_texts)})
        elif kind == "other":
            batch.append({"type": "web_search_call", "id": call_id})
        else:
            batch.append({"type": "function_call", "call_id": call_id, "name": "lookup", "arguments": "{}"})
            if kind == "pair":
                batch.append(
                    {"type": "function_call_output", "call_id": call_id, "output": draw(short_texts)}
                )
    return tuple(MessageItem.from_agents(item) for item in batch)


entities = st.builds(
    EntityMention,
    name=names,
    kind=st.none() | names,
    attributes=st.dictionaries(names, texts, max_size=2),
)

turns = st.builds(
    ConversationTurn,
    user_message=st.text(_text_chars, min_size=1, max_size=40),
    assistant_response=texts,
    trajectory_digest=st.none() | digests,
    artifacts_shown=st.dictionaries(texts, json_values, max_size=2),
    artifacts_hidden_refs=st.lists(texts, max_size=2).map(tuple),
    ts=st.floats(0, 4e9) | st.integers(0, 4_000_000_000),
    items=item_lists(),
    entities=st.lists(entities, max_size=2).map(tuple),
)
"""Every field of a turn, in full."""

light_turns = st.builds(
    ConversationTurn,
    user_message=st.text(st.sampled_from('ab c"\\\nü🙂<>/'), min_size=1, max_size=12),
    assistant_response=short_texts,
    trajectory_digest=st.none() | st.builds(TrajectoryDigest, tools_invoked=st.just(("search",))),
    ts=st.integers(0, 10**6).map(float),
    entities=st.lists(
        st.builds(EntityMention, name=st.sampled_from(["Ada", "Bob", " ada", "Cy"])), max_size=2
    ).map(tuple),
)
"""Turns for long histories: small, but with escapes, an optional digest and a few entities."""

# Summaries --------------------------------------------------------------------------

summary_lines = st.one_of(
    short_texts.map(lambda s: s.replace("\n", " ")),
    st.sampled_from(["<session_summary>", "</session_summary>", "<key_facts>", "</key_facts>", ""]),
)
summaries = st.lists(summary_lines, min_size=1, max_size=8).map("\n".join)
"""Summary text with RFC-style tag lines, blank lines and prose lines."""

tagged_summaries = st.lists(
    short_texts.map(lambda s: s.replace("\n", " ")).filter(lambda s: s.strip() and "<" not in s),
    min_size=1,
    max_size=6,
).map(lambda lines: "<session_summary>\n" + "\n".join(lines) + "\n</session_summary>")

# Configuration ----------------------------------------------------------------------

health_policies = st.builds(
    HealthPolicy,
    retry_backoff_seconds=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]), min_size=1, max_size=3).map(
        tuple
    ),
    degraded_retry_seconds=st.sampled_from([0.0, 1.0, 5.0, 30.0]),
    summarize_timeout_seconds=st.sampled_from([1.0, 60.0]),
)


@st.composite
def budgets(draw: st.DrawFn, policies: tuple[str, ...] | None = None) -> MemoryBudget:
    """Small budgets, so that overflow happens within a handful of turns; zeros mean what
    they mean in PenguiFlow (no recent zone, no summary text, no overall budget)."""
    total = draw(st.one_of(st.integers(1, 60), st.integers(60, 400), st.just(0)))
    summary = draw(st.integers(min(total, 12), total) if total else st.integers(12, 400))
    return MemoryBudget(
        full_zone_turns=draw(st.integers(0, 3)),
        summary_max_tokens=draw(st.just(0) | st.just(summary)),
        total_max_tokens=total,
        overflow_policy=draw(st.sampled_from(policies or ("truncate_oldest", "truncate_summary", "error"))),
    )


@st.composite
def configs(
    draw: st.DrawFn,
    strategies: tuple[str, ...] = ("none", "truncation", "rolling_summary", "rolling_summary"),
    policies: tuple[str, ...] | None = None,
) -> ShortTermMemoryConfig:
    """Configurations with small budgets, short health intervals, small backlogs and, mostly,
    a live horizon of a few turns (so that turns leave the live state within a history)."""
    strategy = draw(st.sampled_from(strategies))
    max_turns = draw(st.integers(1, 4))
    keep = draw(st.integers(1, max_turns))
    agents_strategies = ["none", "trimming", "compacting"]
    if strategy == "rolling_summary":
        agents_strategies.append("summarizing")
    agents = AgentsMemoryConfig(
        strategy=draw(st.sampled_from(agents_strategies)),
        max_turns=max_turns,
        keep_last_n_turns=keep,
        context_limit=draw(st.integers(keep + 1, keep + 3)),
        compact_trigger_turns=draw(st.integers(0, 3)),
        compact_keep=draw(st.integers(0, 2)),
    )
    memories = ConversationMemoryConfig(
        window_size=draw(st.integers(1, 4)),
        entity_max=draw(st.integers(1, 3)),
        entity_recent_messages=draw(st.integers(0, 3)),
    )
    return ShortTermMemoryConfig(
        strategy=strategy,
        agents=agents,
        memories=memories,
        live_turns=draw(st.none() | st.integers(1, 5)),
        budget=draw(budgets(policies)),
        include_trajectory_digest=draw(st.booleans()),
        include_turn_dates=draw(st.booleans()),
        recovery_backlog_limit=draw(st.integers(0, 4)),
        retry_attempts=draw(st.integers(0, 3)),
        health=draw(health_policies),
    )


full_configs = st.builds(
    ShortTermMemoryConfig,
    strategy=st.sampled_from(["none", "truncation", "rolling_summary"]),
    budget=budgets(),
    summarizer_model=st.none() | names,
    include_trajectory_digest=st.booleans(),
    include_turn_dates=st.booleans(),
    recovery_backlog_limit=st.integers(1, 100),
    retry_attempts=st.integers(0, 5),
    health=health_policies,
    agents=st.builds(AgentsMemoryConfig, strategy=st.sampled_from(["none", "trimming", "compacting"])),
)
"""Every section of a configuration (for the codec)."""

# Events -----------------------------------------------------------------------------

seqs = st.integers(1, 2**40)
times = st.floats(0, 4e9) | st.integers(0, 4_000_000_000)
event_ids = st.text(_id_chars, min_size=1, max_size=20)
healths = st.sampled_from(list(MemoryHealth))


def _event(cls: type, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.builds(cls, seq=seqs, event_id=event_ids, at=times, **fields)


kept_turns = st.builds(KeptTurn, index=st.integers(1, 2**40), at=times, turn=turns)

events_by_type: dict[type, st.SearchStrategy[Any]] = {
    SessionStarted: _event(
        SessionStarted,
        key=keys,
        config=full_configs,
        injected_summary=st.none() | texts,
        injected_from=st.none() | keys,
    ),
    TurnAdded: _event(TurnAdded, index=st.integers(1, 2**40), turn=turns),
    SummaryProduced: _event(
        SummaryProduced,
        summary=texts,
        covers_from=st.integers(1, 100),
        covers_through=st.integers(100, 200),
    ),
    HealthChanged: _event(HealthChanged, old=healths, new=healths, reason=texts, attempt=st.integers(0, 9)),
    BacklogTrimmed: _event(BacklogTrimmed, dropped_through=st.integers(1, 2**40), reason=texts),
    SessionCleared: _event(
        SessionCleared, cleared_through=st.integers(0, 2**40), reason=texts, moved_to=st.none() | keys
    ),
    SessionRestored: _event(
        SessionRestored,
        summary=texts,
        turns=st.lists(turns, max_size=3).map(tuple),
        first_index=st.integers(1, 2**40),
        origin=texts,
    ),
    TurnsAdopted: _event(
        TurnsAdopted,
        source=keys,
        source_seq=st.integers(1, 2**40),
        turns=st.lists(turns, max_size=3).map(tuple),
        first_index=st.integers(1, 2**40),
    ),
    SessionErased: _event(SessionErased, reason=texts),
    SessionRepaired: _event(
        SessionRepaired,
        state=st.binary(max_size=64),
        method=st.sampled_from(["snapshot", "cut"]),
        restored_seq=st.integers(min_value=0, max_value=10_000),
        damage=st.lists(texts, max_size=2).map(tuple),
        unreadable=st.integers(min_value=0, max_value=5),
        reason=texts,
    ),
    ItemsAdded: _event(
        ItemsAdded,
        items=st.lists(sdk_items, min_size=1, max_size=3).map(tuple),
        first_index=st.integers(1, 2**40),
    ),
    ItemPopped: _event(ItemPopped, item=sdk_items),
    HistoryCompacted: _event(
        HistoryCompacted,
        key=keys,
        config=full_configs,
        turns=st.lists(
            st.builds(KeptTurn, index=st.integers(1, 2**40), at=times, turn=turns), max_size=3
        ).map(tuple),
        next_index=st.integers(1, 2**40),
        summary=texts,
        summary_through=st.integers(0, 2**40),
        dropped_through=st.integers(0, 2**40),
        health=healths,
        attempt=st.integers(0, 9),
        health_since=times,
        injected_summary=st.none() | texts,
        injected_from=st.none() | keys,
        last_at=times,
        idempotency_keys=st.lists(texts, max_size=3).map(tuple),
        retired_through=st.integers(0, 2**40),
        entities=st.lists(
            st.builds(
                EntityTally,
                name=texts.filter(str.strip),
                kind=st.none() | texts,
                attributes=st.dictionaries(texts, texts, max_size=2),
                mentions=st.integers(0, 99),
                last_mention=st.integers(0, 99),
            ),
            max_size=2,
        ).map(tuple),
        entity_mentions=st.integers(0, 999),
        dropped_events=st.integers(0, 2**40),
        dropped_turns=st.integers(0, 2**40),
        reason=texts,
        history=st.lists(kept_turns, max_size=2).map(tuple),
    ),
}
"""One strategy per event type, covering every field (not a valid history)."""

any_event = st.one_of(*events_by_type.values())

# Histories --------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """Command: a planner adds a turn."""

    turn: ConversationTurn


@dataclass(frozen=True)
class Begin:
    """Command: the runtime starts the summary that is due now (if any, and none is in flight)."""


@dataclass(frozen=True)
class Finish:
    """Command: the in-flight summary returns `summary` (None: the summarizer failed)."""

    summary: str | None


@dataclass(frozen=True)
class Summarize:
    """Command: the summary due now (or the one in flight) is made and returns at once."""

    summary: str | None


@dataclass(frozen=True)
class Advance:
    """Command: the clock moves forward."""

    seconds: float


@dataclass(frozen=True)
class Items:
    """Command: an OpenAI-Agents session adds items."""

    items: tuple[MessageItem, ...]


@dataclass(frozen=True)
class Pop:
    """Command: an OpenAI-Agents session pops its last item."""


@dataclass(frozen=True)
class Wipe:
    """Command: the caller clears the session."""


@dataclass(frozen=True)
class Reload:
    """Command: the caller restores an export."""

    summary: str
    turns: tuple[ConversationTurn, ...]


@dataclass(frozen=True)
class Erase:
    """Command: the operator erases the session (a tombstone), and it starts again."""


HistoryCommand = Turn | Items | Pop | Begin | Finish | Summarize | Advance | Wipe | Reload | Erase


@dataclass
class History:
    """A valid history made by driving `decide` with commands, and the states along it."""

    key: MemoryKey
    config: ShortTermMemoryConfig
    events: list[AnyEvent] = field(default_factory=list)
    states: list[SessionState] = field(default_factory=list)
    """`states[i]` is the state after `events[:i+1]`."""
    refused: int = 0
    """Commands refused (MemoryBudgetExceeded under the ``error`` policy, or invalid items)."""
    settled: set[int] = field(default_factory=set)
    """Indexes into `states` where a whole decision had been applied (rules that hold between
    decisions, such as the backlog bound, need not hold inside one)."""
    folds: list[tuple[SessionState, SessionState]] = field(default_factory=list)
    """For each decision: the state its events reached folded one by one, and the state the
    decision reported it folds them into (`decide_folded`): the write protocol takes the latter."""

    @property
    def state(self) -> SessionState:
        return self.states[-1] if self.states else SessionState()

    def __repr__(self) -> str:
        """One short line per event, so that a failing example reads as a story."""
        lines = [f"History(config={self.config!r}, refused={self.refused}, events=["]
        lines += [f"    {brief(event)}," for event in self.events]
        return "\n".join([*lines, "])"])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def brief(event: AnyEvent) -> str:
    """An event without its bulky fields (configuration, full turns)."""
    skip = {"seq", "event_id", "key", "config", "turn", "turns", "items", "item"}
    fields = {name: getattr(event, name) for name in event.__struct_fields__ if name not in skip}
    if isinstance(event, TurnAdded):
        fields["user"] = event.turn.user_message
    if isinstance(event, SessionRestored):
        fields["turns"] = len(event.turns)
    if isinstance(event, ItemsAdded):
        fields["items"] = [item.kind for item in event.items]
    text = ", ".join(f"{name}={value!r}" for name, value in fields.items())
    return f"{event.seq}: {type(event).__name__}({text})"


def run_commands(
    key: MemoryKey,
    config: ShortTermMemoryConfig,
    commands: list[HistoryCommand],
    *,
    estimator: TokenEstimator = default_token_estimator,
    start: float = 1000.0,
) -> History:
    """Drive `decide`/`evolve` like the runtime does: one summary in flight at most."""
    history = History(key=key, config=config)
    state = SessionState()
    now = start
    in_flight: SummaryRequest | None = None

    def apply(events: list[AnyEvent]) -> None:
        nonlocal state
        for event in events:
            state = evolve(state, event)
            history.events.append(event)
            history.states.append(state)
        if history.states:
            history.settled.add(len(history.states) - 1)

    def run(command: Any) -> None:
        try:
            decision = decide_folded(
                state,
                command,
                now=now,
                command_id=f"c{len(history.events)}",
                key=key,
                config=config,
                estimator=estimator,
            )
        except (MemoryBudgetExceeded, InvalidInput):
            history.refused += 1
            return
        apply(decision.events)
        history.folds.append((state, decision.state))

    run(StartSession(key=key, config=config))
    for command in commands:
        match command:
            case Turn(turn=turn):
                run(AddTurn(turn=turn))
            case Items(items=items):
                run(AddItems(items=items))
            case Pop():
                run(PopItem())
            case Begin():
                if in_flight is None:
                    in_flight = summary_due(state, now)
            case Finish(summary=text) | Summarize(summary=text):
                if in_flight is None and isinstance(command, Summarize):
                    in_flight = summary_due(state, now)
                if in_flight is not None:
                    if text is None:
                        run(SummaryFailed(request=in_flight, reason="summarizer failed"))
                    else:
                        run(SummarySucceeded(request=in_flight, summary=text))
                    in_flight = None
            case Advance(seconds=seconds):
                now += seconds
            case Wipe():
                run(Clear())
            case Reload(summary=summary, turns=restored):
                run(Restore(summary=summary, turns=restored))
            case Erase():
                erased = SessionErased(
                    seq=state.version + 1, event_id=f"erase{state.version}", at=now, reason="erasure"
                )
                apply([erased])
                run(StartSession(key=key, config=config))
    return history


def commands(
    turn_strategy: st.SearchStrategy[ConversationTurn] = light_turns,
    summary_strategy: st.SearchStrategy[str] = summaries,
    *,
    resets: bool = True,
    items: bool = True,
    max_size: int = 40,
) -> st.SearchStrategy[list[HistoryCommand]]:
    """Command sequences: turns, summaries begun and finished (well, badly, failing), time, resets."""
    # Mostly good summaries; then failures; then output that must be refused.
    outcomes = st.sampled_from(["good"] * 3 + ["fail", "bad"]).flatmap(
        lambda kind: {
            "good": summary_strategy,
            "fail": st.none(),
            "bad": st.sampled_from(["", "   ", "bad\x00summary", "x" * 2000]),
        }[kind]
    )
    builders: dict[str, st.SearchStrategy[Any]] = {
        "turn": st.builds(Turn, turn_strategy),
        "items": st.builds(Items, item_batches()),
        "pop": st.just(Pop()),
        "begin": st.just(Begin()),
        "finish": st.builds(Finish, outcomes),
        "summarize": st.builds(Summarize, outcomes),
        "advance": st.builds(Advance, st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0, 30.0])),
        "reset": st.one_of(
            st.just(Wipe()),
            st.builds(Reload, summary_strategy, st.lists(turn_strategy, max_size=3).map(tuple)),
            st.just(Erase()),
        ),
    }
    # Turns and summaries dominate, so that zones fill and the health machine moves.
    kinds = ["turn"] * 6 + ["summarize"] * 4 + ["begin", "finish"] * 2 + ["advance"] * 3
    if items:
        kinds += ["items", "pop"]
    if resets:
        kinds.append("reset")
    command = st.sampled_from(kinds).flatmap(builders.__getitem__)
    return st.lists(command, min_size=min(15, max_size), max_size=max_size)


@st.composite
def histories(
    draw: st.DrawFn,
    *,
    config_strategy: st.SearchStrategy[ShortTermMemoryConfig] | None = None,
    estimator: TokenEstimator = default_token_estimator,
    resets: bool = True,
    items: bool = True,
    turn_strategy: st.SearchStrategy[ConversationTurn] = light_turns,
    max_size: int = 40,
) -> History:
    """A valid history of one session, made through `decide` from random commands."""
    config = draw(config_strategy if config_strategy is not None else configs())
    key = draw(keys)
    cmds = draw(commands(turn_strategy, resets=resets, items=items, max_size=max_size))
    return run_commands(key, config, cmds, estimator=estimator)


def words(text: str) -> int:
    """A custom token estimator: whitespace-separated words, plus one."""
    return len(text.split()) + 1


ESTIMATORS: dict[str, Callable[[str], int]] = {"default": default_token_estimator, "words": words}


# Hand-written histories ---------------------------------------------------------------


def turn(n: int | str, *, answer: str | None = None) -> ConversationTurn:
    """A small turn whose text says which one it is."""
    return ConversationTurn(user_message=f"question {n}", assistant_response=answer or f"answer {n}")


class Script:
    """Builds events with consecutive seqs, ids and times, for given/when/then tests."""

    def __init__(self, *, at: float = 1000.0) -> None:
        self.events: list[AnyEvent] = []
        self.seq = 0
        self.at = at
        self.next_index = 1

    def emit(self, cls: type, **fields: Any) -> Any:
        self.seq += 1
        event = cls(seq=self.seq, event_id=f"e{self.seq}", at=self.at, **fields)
        self.events.append(event)
        return event

    def start(self, key: MemoryKey, config: ShortTermMemoryConfig) -> SessionStarted:
        return self.emit(SessionStarted, key=key, config=config)

    def turns(self, *numbers: int) -> list[TurnAdded]:
        added = []
        for n in numbers:
            added.append(self.emit(TurnAdded, index=self.next_index, turn=turn(n)))
            self.next_index += 1
        return added


SESSION_KEY = MemoryKey("acme.corp", "alice@example.com", "chat 1")


def rolling(**settings: object) -> ShortTermMemoryConfig:
    """A rolling-summary config with a full zone of two turns unless told otherwise."""
    budget = settings.pop("budget", MemoryBudget(full_zone_turns=2))
    return ShortTermMemoryConfig(strategy="rolling_summary", budget=budget, **settings)  # type: ignore[arg-type]


class Session:
    """Given/when/then driver: decide, then fold what was decided, like the runtime after an ack."""

    def __init__(
        self,
        config: ShortTermMemoryConfig | None = None,
        *,
        now: float = 1000.0,
        estimator: TokenEstimator = default_token_estimator,
        key: MemoryKey = SESSION_KEY,
    ) -> None:
        self.key = key
        self.config = config or rolling()
        self.state = SessionState()
        self.now = now
        self.estimator = estimator
        self.commands = 0
        self.log: list[AnyEvent] = []

    def do(self, command: Command) -> list[AnyEvent]:
        self.commands += 1
        events = decide(
            self.state,
            command,
            now=self.now,
            command_id=f"cmd{self.commands}",
            key=self.key,
            config=self.config,
            estimator=self.estimator,
        )
        for event in events:
            self.state = evolve(self.state, event)
        self.log.extend(events)
        return events

    def add(self, *numbers: int | str) -> list[AnyEvent]:
        events: list[AnyEvent] = []
        for n in numbers:
            events += self.do(AddTurn(turn=turn(n)))
        return events

    def due(self) -> SummaryRequest | None:
        return summary_due(self.state, self.now)

    def request(self) -> SummaryRequest:
        request = self.due()
        assert request is not None, "a summary should be due"
        return request

    def succeed(self, request: SummaryRequest, summary: str = "summary") -> list[AnyEvent]:
        return self.do(SummarySucceeded(request=request, summary=summary))

    def fail(self, request: SummaryRequest, reason: str = "boom") -> list[AnyEvent]:
        return self.do(SummaryFailed(request=request, reason=reason))

    @property
    def health(self) -> tuple[MemoryHealth, int]:
        return self.state.health, self.state.attempt

    def pending(self) -> list[int]:
        return [r.index for r in self.state.pending()]

    def recent(self) -> list[int]:
        return [r.index for r in self.state.recent()]


def degraded(**settings: object) -> Session:
    """A session whose summarizer failed 1 + retry_attempts times: DEGRADED."""
    session = Session(rolling(retry_attempts=1, **settings))
    session.add(1, 2, 3)
    session.fail(session.request())
    session.now += session.config.health.backoff(1)
    session.fail(session.request())
    assert session.health == (MemoryHealth.DEGRADED, 1)
    return session
