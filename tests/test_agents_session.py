"""`ConvmemSession`: the OpenAI Agents SDK session protocol over convmem's log.

Every test drives the real runtime (`MemorySystem` on the in-memory log) from
`asyncio.run`; the end-to-end tests drive the SDK's real `Runner` with a
scripted model, with tracing off so nothing reaches the network.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.memory import Session, SessionSettings
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
)
from runtime_helpers import Harness, events_of, replay_log

from convmem.actors import MemorySystem
from convmem.adapters import ConvmemSession, ExtractiveSummarizer
from convmem.adapters.frontends.integrations.agents import _sdk_session as agents_session_module
from convmem.errors import InvalidInput
from convmem.events import (
    AgentsMemoryConfig,
    ItemPopped,
    ItemsAdded,
    MemoryKey,
    SessionCleared,
    SessionStarted,
    ShortTermMemoryConfig,
)
from convmem.projections import CROSS_SESSION_HEADER, SUMMARY_REQUEST_LINE

T = TypeVar("T")

ALICE = MemoryKey("acme", "alice@example.com", "chat-1")
NO_TRACING = RunConfig(tracing_disabled=True)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def system(harness: Harness) -> MemorySystem:
    """A system that can summarize (the summarizing strategy needs its pool)."""
    return harness.system(summarizer=ExtractiveSummarizer())


def agents_config(strategy: str = "none", **agents: Any) -> ShortTermMemoryConfig:
    return ShortTermMemoryConfig(
        strategy="rolling_summary" if strategy == "summarizing" else "none",
        agents=AgentsMemoryConfig(strategy=strategy, **agents),  # type: ignore[arg-type]
    )


# Items --------------------------------------------------------------------------------


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{abs(hash(text)) % 10_000}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call(call_id: str, name: str = "get_weather", city: str = "Oslo") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": json.dumps({"city": city}),
        "status": "completed",
    }


def result(call_id: str, output: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def tool_turn(n: int) -> list[dict[str, Any]]:
    """User turn `n`: a question, a tool call with its result, an answer."""
    return [
        user(f"question {n}"),
        call(f"call_{n}"),
        result(f"call_{n}", f"rain {n}"),
        assistant(f"answer {n}"),
    ]


def stored_items(harness: Harness, key: MemoryKey) -> list[dict[str, Any]]:
    """Every item the log ever received for `key` (what an auditor sees), oldest first."""
    return [item.to_agents() for event in events_of(harness.log, key, ItemsAdded) for item in event.items]


def live_items(session: ConvmemSession) -> list[dict[str, Any]]:
    """Every item the session's state holds, strategy aside."""
    state = session.handle.snapshot_state()
    return [item for record in state.turns for item in record.turn.agent_items()]


def calls_paired(view: list[dict[str, Any]]) -> bool:
    """Each tool result follows its call, and each call has its result, within the view."""
    seen: set[str] = set()
    answered: set[str] = set()
    for item in view:
        if item.get("type") == "function_call":
            seen.add(item["call_id"])
        elif item.get("type") == "function_call_output":
            if item["call_id"] not in seen:
                return False
            answered.add(item["call_id"])
    return seen == answered


# The protocol ---------------------------------------------------------------------------


def test_session_for_a_key_is_named_by_its_session_id(system: MemorySystem) -> None:
    """for_key builds the session of a MemoryKey: its session_id is the key's session id."""
    session = ConvmemSession.for_key(system, ALICE)
    assert isinstance(session, Session)
    assert session.session_id == ALICE.session_id
    assert session.key == ALICE
    assert session.session_settings == SessionSettings()
    assert session.handle.key == ALICE


def test_items_round_trip_verbatim(system: MemorySystem, harness: Harness) -> None:
    """Messages with content parts, reasoning, a call and its result come back exactly as given."""
    items: list[Any] = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Plan my day in Oslo ☂"},
                {"type": "input_image", "image_url": "https://example.com/map.png", "detail": "auto"},
            ],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need weather."}]},
        call("call_1"),
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": [{"type": "input_text", "text": "7°C"}],
        },
        assistant("Take an umbrella."),
    ]

    async def scenario() -> list[Any]:
        session = ConvmemSession.for_key(system, ALICE)
        await session.add_items(items[:2])
        await session.add_items(items[2:])
        return await session.get_items()

    assert run(scenario()) == items
    assert stored_items(harness, ALICE) == items


def test_limit_returns_the_last_items_of_the_view(system: MemorySystem) -> None:
    """get_items(limit=n) is the view's last n items, never a tool result without its call (issue 25);
    the session's settings give the default."""
    items = tool_turn(1) + tool_turn(2)

    async def scenario() -> tuple[list[Any], ...]:
        session = ConvmemSession.for_key(system, ALICE)
        await session.add_items(items)
        limited = ConvmemSession.for_key(system, ALICE, session_settings=SessionSettings(limit=3))
        return (
            await session.get_items(limit=2),
            await session.get_items(limit=0),
            await session.get_items(limit=100),
            await limited.get_items(),
            await limited.get_items(limit=1),
        )

    two, none, everything, settled, one = run(scenario())
    assert two == items[-1:]  # the last 2 would split call_2 from its result: the result stays out too
    assert none == []
    assert everything == items
    assert settled == items[-3:]
    assert one == items[-1:]


def test_a_negative_limit_is_refused(system: MemorySystem) -> None:
    """A limit below zero is a caller error, named as such."""
    with pytest.raises(InvalidInput, match="limit"):
        run(ConvmemSession.for_key(system, ALICE).get_items(limit=-1))


def test_pop_item_removes_and_returns_the_last_stored_item(system: MemorySystem, harness: Harness) -> None:
    """pop_item returns the newest item as stored; the log keeps it with an ItemPopped record."""
    items = tool_turn(1)

    async def scenario() -> tuple[Any, ...]:
        session = ConvmemSession.for_key(system, ALICE)
        empty = await session.pop_item()
        await session.add_items(items)
        popped = await session.pop_item()
        return empty, popped, await session.get_items()

    empty, popped, view = run(scenario())
    assert empty is None
    assert popped == items[-1]
    assert view == items[:-1]
    assert [e.item.to_agents() for e in events_of(harness.log, ALICE, ItemPopped)] == [items[-1]]
    assert stored_items(harness, ALICE) == items


def test_popping_every_item_empties_the_session(system: MemorySystem) -> None:
    """Items pop newest first, across turns, until None."""
    items = tool_turn(1) + tool_turn(2)

    async def scenario() -> list[Any]:
        session = ConvmemSession.for_key(system, ALICE)
        await session.add_items(items)
        popped = [await session.pop_item() for _ in range(len(items) + 1)]
        assert await session.get_items() == []
        return popped

    assert run(scenario()) == [*reversed(items), None]


def test_clear_session_empties_the_view_and_keeps_the_log(system: MemorySystem, harness: Harness) -> None:
    """After clear_session the model sees nothing old; the log still holds every item."""

    async def scenario() -> list[Any]:
        session = ConvmemSession.for_key(system, ALICE)
        await session.add_items(tool_turn(1))
        await session.clear_session()
        assert await session.get_items() == []
        await session.add_items([user("fresh start")])
        return await session.get_items()

    assert run(scenario()) == [user("fresh start")]
    assert len(events_of(harness.log, ALICE, SessionCleared)) == 1
    assert stored_items(harness, ALICE) == [*tool_turn(1), user("fresh start")]


def test_adding_no_items_stores_nothing(system: MemorySystem, harness: Harness) -> None:
    """add_items([]) is a no-op, as in the SDK's own sessions."""
    run(ConvmemSession.for_key(system, ALICE).add_items([]))
    assert harness.log.keys() == []


def test_a_passivated_session_reads_back_from_the_log(system: MemorySystem) -> None:
    """Reading a passivated session activates it off the event loop and shows the same items."""

    async def scenario() -> list[Any]:
        session = ConvmemSession.for_key(system, ALICE)
        await session.add_items(tool_turn(1))
        assert system.passivate(ALICE)
        assert not system.is_live(ALICE)
        return await session.get_items()

    assert run(scenario()) == tool_turn(1)


def test_two_keys_never_see_each_others_items(system: MemorySystem) -> None:
    """Sessions of the same user, or of another tenant with the same ids, are isolated."""
    keys = [
        ALICE,
        MemoryKey("acme", "alice@example.com", "chat-2"),
        MemoryKey("globex", "alice@example.com", "chat-1"),
    ]

    async def scenario() -> list[list[Any]]:
        sessions = [ConvmemSession.for_key(system, key) for key in keys]
        await asyncio.gather(*(s.add_items([user(f"hello from {s.key.composite()}")]) for s in sessions))
        return [await s.get_items() for s in sessions]

    views = run(scenario())
    assert views == [[user(f"hello from {key.composite()}")] for key in keys]


# Strategies: views that never destroy the stored history ---------------------------------------


def test_trimming_keeps_the_last_user_turns_with_their_tool_items(
    system: MemorySystem, harness: Harness
) -> None:
    """Over max_turns user turns, the view holds the last keep_last_n_turns turns, tools included."""
    turns = [tool_turn(n) for n in range(1, 5)]
    config = agents_config("trimming", max_turns=3, keep_last_n_turns=2)

    async def scenario() -> ConvmemSession:
        session = ConvmemSession.for_key(system, ALICE, config=config)
        for items in turns:
            await session.add_items(items)
        assert await session.get_items() == turns[2] + turns[3]
        return session

    session = run(scenario())
    everything = [item for items in turns for item in items]
    assert live_items(session) == everything
    assert stored_items(harness, ALICE) == everything
    assert replay_log(harness.log, ALICE) == session.handle.snapshot_state()


def test_compacting_replaces_old_tool_results_with_named_placeholders(
    system: MemorySystem, harness: Harness
) -> None:
    """Older tool results become placeholders naming the tool and call id; newer turns stay whole."""
    turns = [tool_turn(n) for n in range(1, 4)]
    config = agents_config("compacting", compact_trigger_turns=2, compact_keep=1)

    async def scenario() -> tuple[ConvmemSession, list[Any]]:
        session = ConvmemSession.for_key(system, ALICE, config=config)
        for items in turns:
            await session.add_items(items)
        return session, await session.get_items()

    session, view = run(scenario())
    assert len(view) == 12
    for n, offset in ((1, 0), (2, 4)):
        placeholder = view[offset + 2]
        assert placeholder["call_id"] == f"call_{n}"
        assert placeholder["output"] == f"⟦removed: result of get_weather (call call_{n})⟧"
        assert view[offset + 1] == call(f"call_{n}")  # the call itself is kept
    assert view[8:] == turns[2]
    everything = [item for items in turns for item in items]
    assert live_items(session) == everything
    assert stored_items(harness, ALICE) == everything
    assert replay_log(harness.log, ALICE) == session.handle.snapshot_state()


def test_summarizing_shows_the_summary_turn_then_the_tail(system: MemorySystem, harness: Harness) -> None:
    """Once the pool's summary lands: a synthetic user line, the summary, then the unsummarized turns."""
    turns = [tool_turn(n) for n in range(1, 4)]
    config = agents_config("summarizing", context_limit=3, keep_last_n_turns=1)

    async def scenario() -> tuple[ConvmemSession, list[Any], list[Any]]:
        session = ConvmemSession.for_key(system, ALICE, config=config)
        await session.add_items(turns[0])
        await session.add_items(turns[1])
        before = await session.get_items()
        await session.add_items(turns[2])
        await session.handle.flush()
        return session, before, await session.get_items()

    session, before, after = run(scenario())
    assert before == turns[0] + turns[1]  # no summary is due yet: everything is shown
    summary = session.handle.snapshot_state().summary
    assert "question 1" in summary or "question 2" in summary
    assert after == [
        {"role": "user", "content": SUMMARY_REQUEST_LINE},
        {"role": "assistant", "content": summary},
        *turns[2],
    ]
    everything = [item for items in turns for item in items]
    assert live_items(session) == everything
    assert stored_items(harness, ALICE) == everything


@pytest.mark.parametrize(
    "config",
    [
        agents_config("none"),
        agents_config("trimming", max_turns=2, keep_last_n_turns=1),
        agents_config("compacting", compact_trigger_turns=1, compact_keep=1, compact_tool_calls=True),
        agents_config("summarizing", context_limit=2, keep_last_n_turns=1),
    ],
    ids=["none", "trimming", "compacting", "summarizing"],
)
def test_no_view_separates_a_call_from_its_result(
    system: MemorySystem, config: ShortTermMemoryConfig
) -> None:
    """Every strategy cuts at turn boundaries: each call in the view keeps its result and vice versa."""

    async def scenario() -> list[list[Any]]:
        session = ConvmemSession.for_key(system, ALICE, config=config)
        views = []
        for n in range(1, 7):
            items = [
                user(f"q{n}"),
                *[x for t in range(n % 3 + 1) for x in (call(f"c{n}_{t}"), result(f"c{n}_{t}", "ok"))],
            ]
            await session.add_items(items)
            await session.add_items([assistant(f"a{n}")])
            await session.handle.flush()
            views.append(await session.get_items())
        return views

    views = run(scenario())
    assert all(calls_paired(view) for view in views)
    assert any(item.get("type") == "function_call" for item in views[-1])


# Cross-session injection -------------------------------------------------------------------------


def _summarized_session(system: MemorySystem, key: MemoryKey) -> str:
    """Give `key` a rolling summary (three user turns, summarizing) and return it."""

    async def scenario() -> str:
        session = ConvmemSession.for_key(
            system, key, config=agents_config("summarizing", context_limit=3, keep_last_n_turns=1)
        )
        await session.add_items([user("My printer is an HP LaserJet 4000."), assistant("Noted.")])
        await session.add_items([user("It jams on page 2."), assistant("Try the rear tray.")])
        await session.add_items([user("Thanks!"), assistant("You're welcome.")])
        await session.handle.flush()
        return session.handle.snapshot_state().summary

    summary = run(scenario())
    assert summary
    return summary


INJECTING = agents_config(cross_session_injection=True)


def test_a_new_session_of_the_same_user_gets_the_latest_summary(
    system: MemorySystem, harness: Harness
) -> None:
    """The new session's instructions carry the other session's summary, recorded in SessionStarted."""
    summary = _summarized_session(system, ALICE)
    fresh = MemoryKey(ALICE.tenant_id, ALICE.user_id, "chat-2")

    async def scenario() -> tuple[str | None, str]:
        session = ConvmemSession.for_key(system, fresh, config=INJECTING)
        instructions = await session.instructions()
        dynamic = await session.agent_instructions("You are a support agent.")(None, None)
        return instructions, dynamic

    instructions, dynamic = run(scenario())
    assert instructions == f"{CROSS_SESSION_HEADER}\n{summary}"
    assert dynamic == f"You are a support agent.\n\n{instructions}"
    (started,) = events_of(harness.log, fresh, SessionStarted)
    assert started.injected_summary == summary
    assert started.injected_from == ALICE


@pytest.mark.parametrize(
    "stranger",
    [MemoryKey("acme", "bob@example.com", "chat-9"), MemoryKey("globex", "alice@example.com", "chat-9")],
    ids=["other-user", "other-tenant"],
)
def test_injection_never_crosses_users_or_tenants(system: MemorySystem, stranger: MemoryKey) -> None:
    """Another user's, or another tenant's, summary is never injected."""
    _summarized_session(system, ALICE)

    async def scenario() -> str | None:
        session = ConvmemSession.for_key(system, stranger, config=INJECTING)
        return await session.instructions()

    assert run(scenario()) is None


def test_no_injection_unless_configured(system: MemorySystem, harness: Harness) -> None:
    """Without agents.cross_session_injection the session gets no instructions and starts as usual."""
    _summarized_session(system, ALICE)
    fresh = MemoryKey(ALICE.tenant_id, ALICE.user_id, "chat-3")

    async def scenario() -> str | None:
        session = ConvmemSession.for_key(system, fresh)
        await session.add_items([user("hi")])
        return await session.instructions()

    assert run(scenario()) is None
    (started,) = events_of(harness.log, fresh, SessionStarted)
    assert started.injected_summary is None


def test_the_injected_summary_is_chosen_once(system: MemorySystem) -> None:
    """A started session keeps the summary it started with, even when the user's memory moves on."""
    first = _summarized_session(system, ALICE)
    fresh = MemoryKey(ALICE.tenant_id, ALICE.user_id, "chat-4")
    run(ConvmemSession.for_key(system, fresh, config=INJECTING).add_items([user("hello again")]))
    later = _summarized_session(system, MemoryKey(ALICE.tenant_id, ALICE.user_id, "chat-5"))

    async def scenario() -> str | None:
        return await ConvmemSession.for_key(system, fresh, config=INJECTING).instructions()

    instructions = run(scenario())
    assert instructions == f"{CROSS_SESSION_HEADER}\n{first}"
    assert later  # another session summarized since; fresh still shows what it was given


# End to end with the SDK's Runner ---------------------------------------------------------------------


class ScriptedModel(Model):
    """A model that answers from a script, one list of output items per call, and records its inputs."""

    def __init__(self, *steps: list[ResponseOutputItem]) -> None:
        self.steps = list(steps)
        self.inputs: list[list[dict[str, Any]]] = []
        self.instructions: list[str | None] = []

    def _next(self, system_instructions: str | None, input: str | list[TResponseInputItem]) -> list[Any]:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else [dict(i) for i in input]
        self.inputs.append(items)
        self.instructions.append(system_instructions)
        return self.steps.pop(0)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        return ModelResponse(output=self._next(system_instructions, input), usage=Usage(), response_id=None)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        response = Response(
            id="resp_scripted",
            created_at=0,
            model="scripted",
            object="response",
            output=self._next(system_instructions, input),
            parallel_tool_calls=False,
            tool_choice="auto",
            tools=[],
        )
        yield ResponseCompletedEvent(type="response.completed", response=response, sequence_number=0)


def tool_call(call_id: str, city: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call",
        id=f"fc_{call_id}",
        call_id=call_id,
        name="get_weather",
        arguments=json.dumps({"city": city}),
    )


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        type="message",
        id=f"msg_{abs(hash(text)) % 10_000}",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


WEATHER_CALLS: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    WEATHER_CALLS.append(city)
    return f"rain in {city}"


def weather_agent(model: ScriptedModel, instructions: Any = "Answer briefly.") -> Agent[Any]:
    return Agent(name="weather", instructions=instructions, model=model, tools=[get_weather])


def _kinds(items: list[dict[str, Any]]) -> list[str]:
    return [str(item.get("type") or item.get("role")) for item in items]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_runner_carries_history_across_runs(system: MemorySystem, harness: Harness, streamed: bool) -> None:
    """The second run's model input holds the first run's items; the tool call and its output are stored."""
    model = ScriptedModel(
        [tool_call("call_1", "Oslo")],
        [say("It rains in Oslo.")],
        [say("You asked about Oslo.")],
    )
    agent = weather_agent(model)
    WEATHER_CALLS.clear()

    async def turn(session: ConvmemSession, text: str) -> Any:
        if not streamed:
            return (await Runner.run(agent, text, session=session, run_config=NO_TRACING)).final_output
        result = Runner.run_streamed(agent, text, session=session, run_config=NO_TRACING)
        async for _ in result.stream_events():
            pass
        return result.final_output

    async def scenario() -> tuple[Any, Any]:
        session = ConvmemSession.for_key(system, ALICE)
        first = await turn(session, "What's the weather in Oslo?")
        second = await turn(session, "What did I ask?")
        return first, second

    assert run(scenario()) == ("It rains in Oslo.", "You asked about Oslo.")
    assert WEATHER_CALLS == ["Oslo"]
    second_run_input = model.inputs[2]
    assert _kinds(second_run_input) == ["user", "function_call", "function_call_output", "message", "user"]
    assert second_run_input[0]["content"] == "What's the weather in Oslo?"
    assert second_run_input[1]["call_id"] == second_run_input[2]["call_id"] == "call_1"
    assert second_run_input[2]["output"] == "rain in Oslo"
    assert second_run_input[-1]["content"] == "What did I ask?"

    stored = stored_items(harness, ALICE)
    assert _kinds(stored) == ["user", "function_call", "function_call_output", "message", "user", "message"]
    assert stored[1]["name"] == "get_weather"
    assert json.loads(stored[1]["arguments"]) == {"city": "Oslo"}
    assert stored[2] == {"type": "function_call_output", "call_id": "call_1", "output": "rain in Oslo"}
    assert replay_log(harness.log, ALICE) == system.session(ALICE).snapshot_state()


def test_runner_sees_the_trimmed_view_while_the_log_keeps_everything(
    system: MemorySystem, harness: Harness
) -> None:
    """With trimming, the model's input drops old turns; the stored history does not."""
    model = ScriptedModel([say("one")], [say("two")], [say("three")])
    agent = weather_agent(model)

    async def scenario() -> None:
        session = ConvmemSession.for_key(
            system, ALICE, config=agents_config("trimming", max_turns=2, keep_last_n_turns=1)
        )
        for text in ("first", "second", "third"):
            await Runner.run(agent, text, session=session, run_config=NO_TRACING)

    run(scenario())
    assert [item.get("content") for item in model.inputs[1] if item.get("role") == "user"] == [
        "first",
        "second",
    ]
    assert [item.get("content") for item in model.inputs[2] if item.get("role") == "user"] == [
        "second",
        "third",
    ]
    assert [item.get("content") for item in stored_items(harness, ALICE) if item.get("role") == "user"] == [
        "first",
        "second",
        "third",
    ]


def test_runner_instructions_carry_the_cross_session_memory(system: MemorySystem) -> None:
    """An agent whose instructions come from agent_instructions() shows the model the injected summary."""
    summary = _summarized_session(system, ALICE)
    model = ScriptedModel([say("Welcome back.")])

    async def scenario() -> None:
        session = ConvmemSession.for_key(
            system, MemoryKey(ALICE.tenant_id, ALICE.user_id, "chat-7"), config=INJECTING
        )
        agent = weather_agent(model, instructions=session.agent_instructions("Answer briefly."))
        await Runner.run(agent, "Hi again", session=session, run_config=NO_TRACING)

    run(scenario())
    assert model.instructions == [f"Answer briefly.\n\n{CROSS_SESSION_HEADER}\n{summary}"]


# Without the extra -----------------------------------------------------------------------------------


def test_a_missing_sdk_is_reported_with_the_install_command(
    system: MemorySystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building a session without openai-agents raises ImportError naming convmem[agents]."""
    monkeypatch.setitem(sys.modules, "agents.memory", None)
    agents_session_module._require_sdk.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"pip install convmem\[agents\]"):
            ConvmemSession.for_key(system, ALICE)
    finally:
        agents_session_module._require_sdk.cache_clear()


def test_convmem_imports_without_the_sdk() -> None:
    """Importing convmem.adapters neither needs nor loads the SDK."""
    code = (
        "import sys\n"
        "import convmem.adapters\n"
        "assert 'agents' not in sys.modules, 'the SDK was imported eagerly'\n"
        "sys.modules['agents'] = None\n"
        "from convmem.adapters import ConvmemSession\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
