"""Tool calls and their results are never split (issue 25, item 5): every strategy's view, with every
limit, keeps a call and its result together or leaves both out."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from convmem.actors import MemorySystem
from convmem.adapters import ConvmemSession, ExtractiveSummarizer, InMemoryEventLog
from convmem.adapters._views import last_items
from convmem.events import AgentsMemoryConfig, MemoryBudget, MemoryKey, ShortTermMemoryConfig
from convmem.projections import without_orphan_results

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
