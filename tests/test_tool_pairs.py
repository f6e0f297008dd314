"""Tool calls and their results are never split (issue 25, item 5): every strategy's view, with every
limit, keeps a call and its result together or leaves both out.

The last property stores random item sequences (user and assistant messages, function calls,
their outputs in any order, outputs whose call was never stored: refused) through the pure core
(`decide` / `evolve`) with pops, summaries and compactions between them, under a small live
horizon so old turns leave the live state. At every step, and for a fork at every earlier
point (the state of a prefix of the events, which is what a fork copies), every strategy's
view (`none`, `trimming`, `summarizing` with its summary boundary, `compacting`) and every
limit of it (`get_items(n)`) shows each tool result after its call, and shows a call with its
result whenever that result is stored in the session.

`pop_item` removes exactly the last stored item, as the SDK's `Session` protocol says (the SDK
rewinds a run by popping its items one by one and checking each against what it wrote, so a
pop may not take two): popping a result leaves its call as a call whose result has not come,
the state a running tool is in; results follow their calls, so popping from the end never
strands a result without its call. Retention's compaction (the summary and the newest turns)
and the whole history that `get_items` reads past the live horizon are checked the same way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from convmem.actors import MemorySystem
from convmem.adapters import ConvmemSession, ExtractiveSummarizer, InMemoryEventLog
from convmem.adapters.frontends._views import last_items
from convmem.errors import InvalidTurn
from convmem.events import (
    AgentsMemoryConfig,
    ConversationMemoryConfig,
    MemoryBudget,
    MemoryKey,
    MessageItem,
    ShortTermMemoryConfig,
)
from convmem.projections import (
    AddItems,
    Command,
    PopItem,
    SessionState,
    SummarySucceeded,
    agent_items,
    compaction,
    decide,
    evolve,
    summary_due,
    without_horizon,
    without_orphan_results,
)

KEY = MemoryKey("acme", "alice", "tools")
STRATEGIES = ("none", "trimming", "summarizing", "compacting")


def _user(n: int) -> dict[str, Any]:
    return {"role": "user", "content": f"question {n}"}


def _assistant(n: int) -> dict[str, Any]:
    return {"role": "assistant", "content": f"answer {n}"}


def _call(call_id: str, kind: str) -> dict[str, Any]:
    if kind == "function":
        return {"type": "function_call", "call_id": call_id, "name": "lookup", "arguments": "{}"}
    return {"type": "custom_tool_call", "call_id": call_id, "name": "shell", "input": "ls"}


def _result(call_id: str, kind: str) -> dict[str, Any]:
    if kind == "function":
        return {"type": "function_call_output", "call_id": call_id, "output": f"result of {call_id}"}
    return {"type": "custom_tool_call_output", "call_id": call_id, "output": f"result of {call_id}"}


@st.composite
def conversations(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    """Batches of items as a runner adds them: user turns with 0-3 tool calls, each call's result
    right after it or after the other calls (parallel calls), then an answer."""
    batches: list[list[dict[str, Any]]] = []
    for n in range(draw(st.integers(1, 9))):
        items = [_user(n)]
        calls = [
            (f"c{n}_{t}", draw(st.sampled_from(["function", "custom"])))
            for t in range(draw(st.integers(0, 3)))
        ]
        if draw(st.booleans()):
            for call_id, kind in calls:
                items += [_call(call_id, kind), _result(call_id, kind)]
        else:
            items += [_call(call_id, kind) for call_id, kind in calls]
            items += [_result(call_id, kind) for call_id, kind in calls]
        items.append(_assistant(n))
        batches.append(items)
    return batches


def _split(view: list[dict[str, Any]]) -> list[str]:
    """Call ids whose call and result are not both in `view` (a call still running is no split)."""
    calls = {i["call_id"] for i in view if i.get("type", "").endswith("_call")}
    results = {i["call_id"] for i in view if i.get("type", "").endswith("_call_output")}
    return sorted(results - calls)


def _config(strategy: str) -> ShortTermMemoryConfig:
    return ShortTermMemoryConfig(
        strategy="rolling_summary" if strategy == "summarizing" else "none",
        budget=MemoryBudget(full_zone_turns=2),
        agents=AgentsMemoryConfig(
            strategy=strategy,  # type: ignore[arg-type]
            max_turns=3,
            keep_last_n_turns=2,
            context_limit=3,
            compact_trigger_turns=2,
            compact_keep=1,
        ),
    )


@settings(max_examples=30)
@given(batches=conversations())
def test_no_strategy_and_no_limit_splits_a_call_from_its_result(batches: list[list[dict[str, Any]]]) -> None:
    """Through the Agents session: each strategy's `get_items(n)` for every n, and after `pop_item`."""

    async def scenario() -> None:
        for strategy in STRATEGIES:
            with MemorySystem(
                _config(strategy), log=InMemoryEventLog(), summarizer=ExtractiveSummarizer()
            ) as system:
                session = ConvmemSession.for_key(system, KEY)
                for batch in batches:
                    await session.add_items(batch)  # type: ignore[arg-type]
                await session.handle.flush(timeout=10)
                whole = await session.get_items()
                assert _split(whole) == [], strategy
                for n in range(len(whole) + 2):
                    limited = await session.get_items(limit=n)
                    assert _split(limited) == [], (strategy, n)
                    assert len(limited) <= n
                    assert limited == [i for i in whole if i in limited][-len(limited) :] if limited else True

    asyncio.run(scenario())


@given(
    items=conversations().map(lambda batches: [i for b in batches for i in b]),
    limit=st.integers(0, 40),
)
def test_a_cut_from_the_front_drops_only_orphaned_results(items: list[dict[str, Any]], limit: int) -> None:
    """`last_items`: at most `limit` items, the newest ones, less only results whose call was cut off."""
    tail = items[max(len(items) - limit, 0) :]
    kept = last_items(items, limit)
    assert _split(kept) == []
    assert len(kept) <= limit
    dropped = [i for i in tail if i not in kept]
    assert all(i.get("type", "").endswith("_output") for i in dropped)
    assert without_orphan_results(kept) is kept  # nothing left to drop
    assert last_items(items, None) == items


def test_the_session_takes_the_run_context_the_newest_protocol_offers() -> None:
    """openai-agents passes its run context (`wrapper=`) to a session whose four methods accept it."""
    from agents.memory.session import _session_accepts_wrapper  # noqa: PLC0415 - the SDK's own check

    async def scenario() -> list[Any]:
        with MemorySystem(log=InMemoryEventLog()) as system:
            session = ConvmemSession.for_key(system, KEY)
            assert _session_accepts_wrapper(session)
            await session.add_items([_user(1), _assistant(1)], wrapper=object())  # type: ignore[list-item]
            popped = await session.pop_item(wrapper=object())
            items = await session.get_items(limit=5, wrapper=object())
            await session.clear_session(wrapper=object())
            return [popped, items, await session.get_items()]

    assert asyncio.run(scenario()) == [_assistant(1), [_user(1)], []]


# The pure core over random item sequences: pops, summaries, compaction, the live horizon, forks ----

CORE_KEY = MemoryKey("t", "u", "pairs")
CORE_STRATEGIES = ("none", "trimming", "summarizing", "compacting")


def _core_config(strategy: str, live_turns: int) -> ShortTermMemoryConfig:
    return ShortTermMemoryConfig(
        strategy="rolling_summary",
        budget=MemoryBudget(full_zone_turns=1, summary_max_tokens=400, total_max_tokens=2000),
        agents=AgentsMemoryConfig(
            strategy=strategy,  # type: ignore[arg-type]
            max_turns=3,
            keep_last_n_turns=1,
            context_limit=2,
            compact_trigger_turns=1,
            compact_keep=1,
        ),
        memories=ConversationMemoryConfig(window_size=1, entity_recent_messages=1),
        live_turns=live_turns,  # with the views' own windows this small, the live horizon
    )


def _kind(item: dict[str, Any]) -> str:
    return str(item.get("type") or "message")


def _stored_results(state: SessionState) -> set[str]:
    return {
        item.call_id
        for record in state.turns
        for item in record.turn.items
        if item.kind == "function_call_output" and item.call_id
    }


def _check(items: list[dict[str, Any]], stored: set[str], where: str) -> None:
    seen: set[str] = set()
    answered: set[str] = set()
    for item in items:
        if _kind(item) == "function_call":
            seen.add(item["call_id"])
        elif _kind(item) == "function_call_output":
            assert item["call_id"] in seen, (where, "a result without its call", items)
            answered.add(item["call_id"])
    missing = (seen & stored) - answered
    assert not missing, (where, "a call shown without its stored result", missing, items)


def _check_views(state: SessionState, base: ShortTermMemoryConfig, where: str) -> None:
    stored = _stored_results(state)
    for strategy in CORE_STRATEGIES:
        config = msgspec.structs.replace(base, agents=msgspec.structs.replace(base.agents, strategy=strategy))
        view = agent_items(msgspec.structs.replace(state, config=config))
        _check(view, stored, f"{where}, {strategy}")
        for limit in range(len(view) + 2):
            _check(last_items(view, limit), stored, f"{where}, {strategy}, get_items({limit})")


user_op = st.tuples(st.just("user"))
summary_op = st.tuples(st.just("summary"))
ops = st.lists(
    st.one_of(
        user_op,
        user_op,  # listed twice: user turns are what summaries and the live horizon act on
        st.tuples(st.just("assistant")),
        st.tuples(st.just("calls"), st.integers(1, 3)),
        st.tuples(st.just("results"), st.randoms(use_true_random=False)),
        st.tuples(st.just("pop")),
        summary_op,
        summary_op,
        st.tuples(st.just("stray result")),
        st.tuples(st.just("compact"), st.integers(0, 3)),
    ),
    min_size=8,
    max_size=40,
)


@given(ops, st.integers(2, 6))
def test_no_view_limit_pop_fork_or_summary_splits_a_call_from_its_result(
    script: list[tuple[Any, ...]], live_turns: int
) -> None:
    config = _core_config("none", live_turns)
    state, events = SessionState(), []
    calls, answered = 0, set[str]()
    open_calls: list[str] = []

    def run(command: Command, n: int) -> bool:
        """Apply `command`; False when it is refused (nothing stored)."""
        nonlocal state
        try:
            decided = decide(state, command, now=float(n), command_id=f"c{n}", key=CORE_KEY, config=config)
        except InvalidTurn:
            return False
        for event in decided:
            state = evolve(state, event)
            events.append(event)
        return True

    for n, op in enumerate(script):
        match op:
            case ("user",):
                run(AddItems(items=(MessageItem(role="user", content=f"u{n}"),)), n)
            case ("assistant",):
                run(AddItems(items=(MessageItem(role="assistant", content=f"a{n}"),)), n)
            case ("calls", k):
                made = tuple(
                    MessageItem(kind="function_call", call_id=f"call{calls + i}", name="tool", arguments="{}")
                    for i in range(k)
                )
                calls += k
                open_calls.extend(item.call_id or "" for item in made)
                run(AddItems(items=made), n)
            case ("results", rng):
                if open_calls:
                    chosen = rng.sample(open_calls, rng.randint(1, len(open_calls)))
                    for call_id in chosen:
                        open_calls.remove(call_id)
                        answered.add(call_id)
                    results = tuple(
                        MessageItem(kind="function_call_output", call_id=c, output="ok") for c in chosen
                    )
                    run(AddItems(items=results), n)
            case ("stray result",):  # a result whose call was never stored: refused, nothing stored
                stray = MessageItem(kind="function_call_output", call_id="nowhere", output="?")
                assert not run(AddItems(items=(stray,)), n)
            case ("pop",):
                run(PopItem(), n)
            case ("compact", keep):  # retention's compaction: the summary and the newest turns
                if state.started and state.turns:
                    kept = state.turns[max(len(state.turns) - keep, 0) :]
                    event = compaction(state, kept, event_id=f"k{n}", at=float(n))
                    state = evolve(state, event)
                    events.append(event)
            case ("summary",):
                request = summary_due(state, float(n))
                if request is not None:
                    run(SummarySucceeded(request=request, summary=f"summary {n}"), n)
        _check_views(state, config, f"after step {n} {op[0]}")
    _check_forks_and_whole(events, config)


def _check_forks_and_whole(events: list[Any], config: ShortTermMemoryConfig) -> None:
    """A fork at every point (the fold of a prefix), and the whole history without the horizon."""
    for cut in range(1, len(events)):
        forked = SessionState()
        for event in events[:cut]:
            forked = evolve(forked, event)
        _check_views(forked, config, f"fork after event {cut}")
    whole = SessionState()  # what get_items reads past the live horizon: every turn since the last clear
    for event in without_horizon(events):
        whole = evolve(whole, event)
    _check_views(whole, config, "the whole history")
