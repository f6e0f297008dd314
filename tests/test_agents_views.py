"""The OpenAI-Agents strategies (seed 002) as views over folded session state."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from convmem.events import (
    AgentsMemoryConfig,
    ConversationTurn,
    MemoryKey,
    MessageItem,
    SessionStarted,
    ShortTermMemoryConfig,
    SummaryProduced,
    TurnAdded,
)
from convmem.projections import (
    CROSS_SESSION_HEADER,
    SUMMARY_REQUEST_LINE,
    AddTurn,
    Clear,
    Command,
    SessionState,
    StartSession,
    SummaryFailed,
    SummarySucceeded,
    agent_items,
    agent_items_tokens,
    cross_session_instructions,
    decide,
    evolve,
    latest_summary_for_user,
    replay,
    summary_due,
)

KEY = MemoryKey("acme", "alice", "s1")


def tool_turn(n: int, *, tools: int = 0, user: bool = True) -> ConversationTurn:
    """Turn `n` with `tools` get_weather calls, each followed by its result."""
    items: list[MessageItem] = []
    for t in range(tools):
        call_id = f"call_{n}_{t}"
        items.append(
            MessageItem(
                kind="function_call", call_id=call_id, name="get_weather", arguments='{"city": "Oslo"}'
            )
        )
        items.append(MessageItem(kind="function_call_output", call_id=call_id, output=f"rain {n}.{t}"))
    return ConversationTurn(
        user_message=f"u{n}" if user else "", assistant_response=f"a{n}", items=tuple(items)
    )


def config(strategy: str = "none", **agents: Any) -> ShortTermMemoryConfig:
    summarizes = strategy == "summarizing"
    return ShortTermMemoryConfig(
        strategy="rolling_summary" if summarizes else "none",
        agents=AgentsMemoryConfig(strategy=strategy, **agents),  # type: ignore[arg-type]
    )


def apply(state: SessionState, command: Command, cfg: ShortTermMemoryConfig, now: float) -> SessionState:
    for event in decide(state, command, now=now, command_id=f"cmd-{state.version}", key=KEY, config=cfg):
        state = evolve(state, event)
    return state


def session(cfg: ShortTermMemoryConfig, turns: list[ConversationTurn]) -> SessionState:
    state = SessionState()
    for i, turn in enumerate(turns):
        state = apply(state, AddTurn(turn=turn), cfg, now=float(i))
    return state


def summarize(state: SessionState, text: str, now: float = 100.0) -> SessionState:
    request = summary_due(state, now)
    assert request is not None, "a summary should be due"
    return apply(state, SummarySucceeded(request=request, summary=text), state.config, now)


def users(items: list[dict[str, Any]]) -> list[str]:
    return [i["content"] for i in items if i.get("role") == "user"]


# none and trimming ----------------------------------------------------------------------


def test_none_shows_every_live_turns_items_in_order() -> None:
    """Strategy none: every item of every live turn, tool calls and results included."""
    turns = [tool_turn(1, tools=1), tool_turn(2)]
    state = session(config("none"), turns)
    assert agent_items(state) == [*turns[0].agent_items(), *turns[1].agent_items()]


def test_none_shows_only_turns_after_a_clear() -> None:
    """Live turns are those since the last clear."""
    cfg = config("none")
    state = apply(session(cfg, [tool_turn(1)]), Clear(), cfg, now=5.0)
    state = apply(state, AddTurn(turn=tool_turn(2)), cfg, now=6.0)
    assert users(agent_items(state)) == ["u2"]


def test_trimming_keeps_everything_below_max_turns() -> None:
    """Trimming: fewer than max_turns user turns are shown whole."""
    state = session(config("trimming", max_turns=4, keep_last_n_turns=2), [tool_turn(n) for n in range(1, 4)])
    assert users(agent_items(state)) == ["u1", "u2", "u3"]


def test_trimming_at_max_turns_keeps_last_n_user_turns_with_their_tool_items() -> None:
    """Trimming: at max_turns user turns, only the last keep_last_n_turns remain, tool items included."""
    turns = [tool_turn(n, tools=1) for n in range(1, 5)]
    state = session(config("trimming", max_turns=4, keep_last_n_turns=2), turns)
    assert agent_items(state) == [*turns[2].agent_items(), *turns[3].agent_items()]


def test_trimming_keeps_a_turn_without_user_message_with_its_user_turn() -> None:
    """Trimming counts user turns; a turn without a user message belongs to the user turn before it."""
    turns = [tool_turn(1), tool_turn(2), tool_turn(22, user=False), tool_turn(3)]
    state = session(config("trimming", max_turns=3, keep_last_n_turns=2), turns)
    contents = [i["content"] for i in agent_items(state)]
    assert contents == ["u2", "a2", "a22", "u3", "a3"]


def test_trimming_never_destroys_the_stored_history() -> None:
    """Strategies are read-time views: the state keeps every turn, another strategy sees them all."""
    state = session(config("trimming", max_turns=2, keep_last_n_turns=1), [tool_turn(n) for n in range(1, 6)])
    assert users(agent_items(state)) == ["u5"]
    assert state.turn_count() == 5
    as_none = msgspec.structs.replace(state, config=config("none"))
    assert users(agent_items(as_none)) == ["u1", "u2", "u3", "u4", "u5"]


# summarizing ---------------------------------------------------------------------------


def summarizing(**agents: Any) -> ShortTermMemoryConfig:
    return config("summarizing", **{"max_turns": 4, "keep_last_n_turns": 2, "context_limit": 4, **agents})


def test_summarizing_shows_summary_turn_then_unsummarized_tail() -> None:
    """Summarizing: a synthetic user line and the summary as assistant, then the turns after the summary."""
    state = summarize(session(summarizing(), [tool_turn(n, tools=1) for n in range(1, 5)]), "S: rain talk")
    assert state.summary_through == 2
    items = agent_items(state)
    assert items[:2] == [
        {"role": "user", "content": SUMMARY_REQUEST_LINE},
        {"role": "assistant", "content": "S: rain talk"},
    ]
    assert items[2:] == [*tool_turn(3, tools=1).agent_items(), *tool_turn(4, tools=1).agent_items()]


def test_summarizing_keeps_turns_added_while_the_summary_was_made() -> None:
    """A turn added after the summary request stays in the tail when the summary lands."""
    cfg = summarizing()
    state = session(cfg, [tool_turn(n) for n in range(1, 5)])
    request = summary_due(state, 10.0)
    assert request is not None
    state = apply(state, AddTurn(turn=tool_turn(5)), cfg, now=11.0)
    state = apply(state, SummarySucceeded(request=request, summary="S"), cfg, now=12.0)
    assert users(agent_items(state)) == [SUMMARY_REQUEST_LINE, "u3", "u4", "u5"]


def test_summarizing_trims_below_context_limit_before_any_summary() -> None:
    """Summarizing below context_limit behaves like trimming (keep last N turns)."""
    state = session(summarizing(max_turns=3, context_limit=6), [tool_turn(n) for n in range(1, 4)])
    assert users(agent_items(state)) == ["u2", "u3"]


def test_summarizing_hides_nothing_while_the_due_summary_is_missing() -> None:
    """At context_limit with no summary yet (slow or failing summarizer), every unsummarized turn shows."""
    cfg = summarizing()
    state = session(cfg, [tool_turn(n) for n in range(1, 5)])
    request = summary_due(state, 10.0)
    assert request is not None
    state = apply(state, SummaryFailed(request=request, reason="timeout"), cfg, now=10.0)
    assert users(agent_items(state)) == ["u1", "u2", "u3", "u4"]


# compacting ----------------------------------------------------------------------------


def compacting(**agents: Any) -> ShortTermMemoryConfig:
    return config("compacting", **{"compact_trigger_turns": 2, "compact_keep": 1, **agents})


def test_compacting_changes_nothing_up_to_the_trigger() -> None:
    """Compacting starts only once user turns exceed compact_trigger_turns."""
    turns = [tool_turn(1, tools=1), tool_turn(2, tools=1)]
    assert agent_items(session(compacting(), turns)) == agent_items(session(config("none"), turns))


def test_compacting_replaces_old_results_keeping_tool_name_and_call_id() -> None:
    """Older tool results become placeholders naming the tool and call id; the newest turns stay."""
    turns = [tool_turn(n, tools=1) for n in range(1, 4)]
    items = agent_items(session(compacting(compact_keep=1), turns))
    outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
    assert outputs == [
        "⟦removed: result of get_weather (call call_1_0)⟧",
        "⟦removed: result of get_weather (call call_2_0)⟧",
        "rain 3.0",
    ]
    calls = [i for i in items if i.get("type") == "function_call"]
    assert all(c["arguments"] == '{"city": "Oslo"}' for c in calls)


def test_compacting_tool_calls_replaces_old_arguments_too() -> None:
    """With compact_tool_calls, older call arguments become placeholders; name and call id stay."""
    turns = [tool_turn(n, tools=1) for n in range(1, 4)]
    items = agent_items(session(compacting(compact_tool_calls=True), turns))
    calls = [i for i in items if i.get("type") == "function_call"]
    assert calls[0] == {
        "type": "function_call",
        "call_id": "call_1_0",
        "name": "get_weather",
        "arguments": '{"removed": "arguments of get_weather (call call_1_0)"}',
    }
    assert calls[2]["arguments"] == '{"city": "Oslo"}'


def test_compacted_arguments_stay_a_json_object() -> None:
    """Every function_call in a compacted view carries arguments that parse as a JSON object."""
    turns = [tool_turn(n, tools=2) for n in range(1, 5)]
    items = agent_items(session(compacting(compact_tool_calls=True, compact_keep=0), turns))
    calls = [i for i in items if i.get("type") == "function_call"]
    assert len(calls) == 8
    assert all(isinstance(json.loads(c["arguments"]), dict) for c in calls)
    assert all(json.loads(c["arguments"])["removed"].startswith("arguments of get_weather") for c in calls)


def test_compacting_with_keep_zero_compacts_every_turn() -> None:
    """compact_keep=0 protects no turn once the trigger is exceeded."""
    turns = [tool_turn(n, tools=1) for n in range(1, 4)]
    items = agent_items(session(compacting(compact_keep=0), turns))
    outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
    assert all(o.startswith("⟦removed: result of get_weather") for o in outputs)


def test_compacting_leaves_messages_untouched() -> None:
    """Compacting only touches tool payloads: user and assistant text stays verbatim."""
    turns = [tool_turn(n, tools=2) for n in range(1, 5)]
    compacted = agent_items(session(compacting(compact_tool_calls=True), turns))
    plain = agent_items(session(config("none"), turns))
    assert [i for i in compacted if "role" in i] == [i for i in plain if "role" in i]


# cross-session -------------------------------------------------------------------------


def started(key: MemoryKey, cfg: ShortTermMemoryConfig, injected: str | None) -> SessionState:
    command = StartSession(key=key, config=cfg, injected_summary=injected, injected_from=None)
    return apply(SessionState(), command, cfg, now=1.0)


def test_cross_session_instructions_carry_the_injected_summary() -> None:
    """With injection on, the injected summary comes back as instructions marked as context."""
    state = started(KEY, config("none", cross_session_injection=True), "Alice owns a Pixel 8.")
    assert cross_session_instructions(state) == f"{CROSS_SESSION_HEADER}\nAlice owns a Pixel 8."
    assert "not ground truth" in CROSS_SESSION_HEADER


def test_cross_session_instructions_need_the_setting_and_a_summary() -> None:
    """No instructions when injection is off or nothing (or only blanks) was injected."""
    assert cross_session_instructions(started(KEY, config("none"), "old summary")) is None
    on = config("none", cross_session_injection=True)
    assert cross_session_instructions(started(KEY, on, None)) is None
    assert cross_session_instructions(started(KEY, on, "  \n")) is None


def summarized_state(key: MemoryKey, summary: str, at: float) -> SessionState:
    """A session whose last event (a summary) happened at `at`."""
    events = [
        SessionStarted(seq=1, event_id="e1", at=0.0, key=key, config=ShortTermMemoryConfig()),
        TurnAdded(seq=2, event_id="e2", at=0.0, index=1, turn=tool_turn(1)),
        SummaryProduced(seq=3, event_id="e3", at=at, summary=summary, covers_from=1, covers_through=1),
    ]
    return replay(events)


def test_latest_summary_picks_the_users_most_recent_other_session() -> None:
    """Cross-session: the same user's other session updated last wins."""
    states = [
        summarized_state(MemoryKey("acme", "alice", "old"), "old news", at=10.0),
        summarized_state(MemoryKey("acme", "alice", "new"), "new news", at=20.0),
        summarized_state(KEY, "this session", at=30.0),
    ]
    assert latest_summary_for_user(states, KEY) == (MemoryKey("acme", "alice", "new"), "new news")


def test_latest_summary_never_crosses_users_or_tenants() -> None:
    """Another user's or another tenant's summary is never offered, however recent."""
    states = [
        summarized_state(MemoryKey("acme", "bob", "s9"), "bob's", at=50.0),
        summarized_state(MemoryKey("globex", "alice", "s9"), "other tenant's alice", at=60.0),
        summarized_state(MemoryKey("acme", "alice", "s2"), "alice's", at=1.0),
    ]
    assert latest_summary_for_user(states, KEY) == (MemoryKey("acme", "alice", "s2"), "alice's")
    assert latest_summary_for_user(states[:2], KEY) is None


def test_latest_summary_skips_sessions_without_summary_and_breaks_ties_by_key() -> None:
    """Blank summaries never qualify; equal times go to the greatest composite, whatever the order."""
    a = summarized_state(MemoryKey("acme", "alice", "a"), "from a", at=5.0)
    b = summarized_state(MemoryKey("acme", "alice", "b"), "from b", at=5.0)
    empty = started(MemoryKey("acme", "alice", "c"), ShortTermMemoryConfig(), None)
    expected = (MemoryKey("acme", "alice", "b"), "from b")
    assert latest_summary_for_user([a, b, empty], KEY) == expected
    assert latest_summary_for_user([b, a, empty], KEY) == expected


# tokens --------------------------------------------------------------------------------


def test_agent_items_tokens_sum_the_estimate_of_each_item() -> None:
    """Token estimates add up per item (seed: chars/4 estimates for telemetry)."""
    items = tool_turn(1, tools=1).agent_items()
    expected = sum(len(json.dumps(i, ensure_ascii=False, sort_keys=True)) // 4 + 1 for i in items)
    assert agent_items_tokens(items) == expected
    assert agent_items_tokens([]) == 0
    assert agent_items_tokens(items, estimator=lambda text: 1) == len(items)


def test_trimming_frees_tokens() -> None:
    """A trimmed view costs fewer tokens than the full history."""
    turns = [tool_turn(n, tools=2) for n in range(1, 7)]
    trimmed = agent_items(session(config("trimming", max_turns=3, keep_last_n_turns=1), turns))
    full = agent_items(session(config("none"), turns))
    assert agent_items_tokens(trimmed) < agent_items_tokens(full)


# properties ----------------------------------------------------------------------------

turn_specs = st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=10)


@st.composite
def agents_configs(draw: st.DrawFn) -> ShortTermMemoryConfig:
    strategy = draw(st.sampled_from(["none", "trimming", "compacting"]))
    keep = draw(st.integers(1, 4))
    return config(
        strategy,
        max_turns=draw(st.integers(keep, 6)),
        keep_last_n_turns=keep,
        context_limit=keep + 1,
        compact_trigger_turns=draw(st.integers(0, 5)),
        compact_keep=draw(st.integers(0, 4)),
        compact_tool_calls=draw(st.booleans()),
    )


def build(specs: list[tuple[int, bool]], cfg: ShortTermMemoryConfig) -> SessionState:
    return session(cfg, [tool_turn(n, tools=tools, user=user) for n, (tools, user) in enumerate(specs)])


def pairs_intact(items: list[dict[str, Any]]) -> bool:
    open_calls: set[str] = set()
    for item in items:
        if item.get("type") == "function_call":
            open_calls.add(item["call_id"])
        elif item.get("type") == "function_call_output":
            if item["call_id"] not in open_calls:
                return False
            open_calls.remove(item["call_id"])
    return not open_calls


@given(turn_specs, agents_configs())
def test_no_strategy_separates_a_call_from_its_result(
    specs: list[tuple[int, bool]], cfg: ShortTermMemoryConfig
) -> None:
    """Every strategy shows each function_call with its function_call_output after it, or neither."""
    assert pairs_intact(agent_items(build(specs, cfg)))


@given(turn_specs, agents_configs())
def test_trimming_shows_a_suffix_of_whole_turns(
    specs: list[tuple[int, bool]], cfg: ShortTermMemoryConfig
) -> None:
    """Trimming cuts at turn boundaries: the view is the items of the last k turns, for some k."""
    state = build(
        specs, msgspec.structs.replace(cfg, agents=msgspec.structs.replace(cfg.agents, strategy="trimming"))
    )
    shown = agent_items(state)
    suffixes = [
        [i for r in state.turns[k:] for i in r.turn.agent_items()] for k in range(len(state.turns) + 1)
    ]
    assert shown in suffixes


@given(turn_specs, agents_configs())
def test_compacting_keeps_item_count_order_and_ids(
    specs: list[tuple[int, bool]], cfg: ShortTermMemoryConfig
) -> None:
    """Compacting keeps the structure: same items, same order, same kinds, names and call ids."""
    agents = msgspec.structs.replace(cfg.agents, strategy="compacting")
    state = build(specs, msgspec.structs.replace(cfg, agents=agents))
    compacted = agent_items(state)
    plain = agent_items(msgspec.structs.replace(state, config=config("none")))

    def shape(item: dict[str, Any]) -> tuple[Any, ...]:
        return (
            item.get("type"),
            item.get("role"),
            item.get("call_id"),
            item.get("name"),
            item.get("content"),
        )

    assert [shape(i) for i in compacted] == [shape(i) for i in plain]


ids = st.sampled_from(["t1", "t2"]), st.sampled_from(["u1", "u2"]), st.sampled_from(["s1", "s2", "s3"])


@given(
    st.lists(
        st.tuples(st.builds(MemoryKey, *ids), st.sampled_from(["", "summary"]), st.integers(0, 3)),
        max_size=12,
        unique_by=lambda entry: entry[0],
    ),
    st.builds(MemoryKey, *ids),
)
def test_cross_session_offers_only_the_same_users_other_sessions(
    population: list[tuple[MemoryKey, str, int]], key: MemoryKey
) -> None:
    """The chosen summary always comes from the same tenant and user, another session, the latest one."""
    states = [
        summarized_state(k, f"{text} of {k.composite()}", at=float(at))
        if text
        else started(k, ShortTermMemoryConfig(), None)
        for k, text, at in population
    ]
    eligible = [
        s
        for s in states
        if s.key is not None
        and (s.key.tenant_id, s.key.user_id) == (key.tenant_id, key.user_id)
        and s.key != key
        and s.summary
    ]
    chosen = latest_summary_for_user(states, key)
    if not eligible:
        assert chosen is None
        return
    assert chosen is not None
    chosen_key, summary = chosen
    assert (chosen_key.tenant_id, chosen_key.user_id) == (key.tenant_id, key.user_id)
    assert chosen_key != key
    assert summary == f"summary of {chosen_key.composite()}"
    assert max(s.last_at for s in eligible) == next(s.last_at for s in eligible if s.key == chosen_key)
