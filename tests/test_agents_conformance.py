"""`ConvmemSession` keeps the Agents SDK's session contract, in process and through `convmem serve`.

The same rules run against a session of a `MemorySystem` in this process and
against one served by a real ``convmem serve`` process (its own nats-server),
reached through `convmem.connect_remote`. They state what an SDK user relies
on: the caller's session id, the SDK's session settings, items that read back
exactly as written, newest-first pops, clears, isolation, and the `Runner`'s
runs (plain, sync, streamed, with a handoff) carrying history between them.
`tests/agents_sdk_suite.py` runs the SDK's own suites against the same two
(see the README); these tests keep the behaviour pinned in CI.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, SessionSettings
from agents.memory import Session
from agents.run_context import RunContextWrapper
from agents.run_internal.session_persistence import rewind_session_items
from agents.testing import ScriptedModel, assistant_message, function_call
from test_serve import Serve
from test_service import _user, tenants_server, tenants_service  # noqa: F401 (fixtures)

import convmem
from convmem.adapters import (
    ConvmemChatMessageHistory,
    ConvmemSession,
    EmbeddedNatsServer,
    MalformedRequest,
    PermissionDenied,
)
from convmem.errors import InvalidInput, InvalidKey, SessionClosed
from convmem.events import MemoryKey, ShortTermMemoryConfig

NO_TRACING = RunConfig(tracing_disabled=True)
Make = Callable[..., ConvmemSession]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[convmem.adapters.RemoteMemory]:
    """A `convmem serve` process on a nats-server of its own, and a connection to it."""
    tmp = tmp_path_factory.mktemp("agents-serve")
    server = EmbeddedNatsServer(tmp / "nats").start()
    try:
        serve = Serve(server.url, tmp)
        try:
            with convmem.connect_remote(server.url, timeout=30.0) as remote:
                yield remote
        finally:
            serve.stop()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def in_process() -> Iterator[convmem.MemorySystem]:
    with convmem.connect(convmem.adapters.MEMORY_URL) as memory:
        yield memory


@pytest.fixture(params=["in_process", "remote"])
def make(request: pytest.FixtureRequest) -> Make:
    """Builds sessions of one backend; every test gets a tenant of its own."""
    memory = request.getfixturevalue("in_process" if request.param == "in_process" else "served")
    tenant = f"t-{uuid.uuid4().hex[:12]}"

    def build(session_id: str, *, tenant_id: str = tenant, user_id: str = "alice", **options: Any) -> Any:
        return ConvmemSession(session_id, memory, tenant_id=tenant_id, user_id=user_id, **options)

    return build


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_get_items_returns_the_whole_history_past_the_live_horizon(make: Make) -> None:
    """A session longer than its `live_turns` (100 by default) lists every item, in process and served."""
    turns = ShortTermMemoryConfig().live_turns + 3  # type: ignore[operator]

    async def scenario() -> tuple[list[Any], list[Any]]:
        session = make("long")
        for n in range(turns):
            await session.add_items([user(f"q{n}"), {"role": "assistant", "content": f"a{n}"}])
        return await session.get_items(), await session.get_items(limit=3)

    every, last = asyncio.run(scenario())
    assert [item["content"] for item in every] == [f"{k}{n}" for n in range(turns) for k in "qa"]
    assert [item["content"] for item in last] == [f"a{turns - 2}", f"q{turns - 1}", f"a{turns - 1}"]


# The session protocol --------------------------------------------------------------------------------


def test_a_session_is_the_sdks_session_under_the_callers_id(make: Make) -> None:
    """isinstance(Session) holds; session_id reads back as passed; settings default to SessionSettings()."""
    session = make("chat:1 ü")
    assert isinstance(session, Session)
    assert session.session_id == "chat:1 ü"
    assert session.session_settings == SessionSettings()
    assert session.key == MemoryKey(session.key.tenant_id, "alice", "chat:1 ü")


def test_items_read_back_exactly_as_written(make: Make) -> None:
    """Key order, unicode, nested parts, empty handoff arguments and odd text survive byte for byte."""
    items: list[Any] = [
        {"content": "Plan my day ☂ 'x'; DROP TABLE agent_messages; --", "role": "user"},
        {
            "type": "function_call",
            "name": "transfer_to_billing",
            "call_id": "c1",
            "arguments": "",
            "id": "fc",
        },
        {"output": '{"assistant": "Billing agent"}', "call_id": "c1", "type": "function_call_output"},
        {"type": "reasoning", "summary": [{"text": "zeta", "type": "summary_text"}], "id": "rs_1"},
        {
            "status": "completed",
            "role": "assistant",
            "type": "message",
            "id": "m1",
            "content": [{"annotations": [], "text": "Done, 7°C.", "type": "output_text"}],
        },
    ]

    async def scenario() -> list[Any]:
        session = make("chat-1")
        await session.add_items(items[:2])
        await session.add_items(items[2:])
        return await make("chat-1").get_items()  # a second instance on the same id

    assert json.dumps(asyncio.run(scenario())) == json.dumps(items)


def test_limit_comes_from_the_call_then_the_settings(make: Make) -> None:
    """An explicit limit wins; else session_settings.limit; 0 gives nothing; a big one gives all."""
    items = [user(f"m{n}") for n in range(5)]

    async def scenario() -> list[list[Any]]:
        session = make("chat-1", session_settings={"limit": 2})
        await session.add_items(items)
        return [
            await session.get_items(),
            await session.get_items(limit=3),
            await session.get_items(limit=0),
            await session.get_items(limit=50),
            await make("chat-1").get_items(),
        ]

    assert asyncio.run(scenario()) == [items[-2:], items[-3:], [], items, items]


def test_settings_are_normalised_as_the_sdk_does(make: Make) -> None:
    """A dict becomes SessionSettings; an unknown key is refused; a negative limit is a named error."""
    assert make("s", session_settings={"limit": 0}).session_settings == SessionSettings(limit=0)
    with pytest.raises(Exception, match="limitt"):
        make("s", session_settings={"limitt": 1})
    with pytest.raises(InvalidInput, match="limit"):
        asyncio.run(make("s").get_items(limit=-1))


def test_pop_removes_newest_first_and_only_from_its_session(make: Make) -> None:
    """Pops return the newest item until None; another session keeps its items."""
    mine, theirs = [user("a"), user("b"), user("c")], [user("x")]

    async def scenario() -> tuple[list[Any], list[Any], list[Any]]:
        session, other = make("chat-1"), make("chat-2")
        await session.add_items(mine)
        await other.add_items(theirs)
        popped = [await session.pop_item() for _ in range(4)]
        return popped, await session.get_items(), await other.get_items()

    assert asyncio.run(scenario()) == ([*reversed(mine), None], [], theirs)


def test_the_sdks_rewind_takes_back_a_tool_call_and_its_result(make: Make) -> None:
    """The SDK rolls a run back by popping its items one by one, each checked against what it
    wrote (`rewind_session_items`): a tool call and its result go, one pop each, and the history
    is as it was; a result popped alone leaves its call (one pop per item, as the protocol says)."""
    before = [user("q1"), {"role": "assistant", "content": "a1"}]
    run = [
        user("q2"),
        {"type": "function_call", "name": "get_weather", "call_id": "c1", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "7C"},
    ]

    async def scenario() -> tuple[list[Any], Any, list[Any]]:
        session = make("chat-1")
        await session.add_items(before)
        await session.add_items(run)
        await rewind_session_items(session, run, wrapper=RunContextWrapper(context=None))
        rewound = await session.get_items()
        await session.add_items(run)
        popped = await session.pop_item(wrapper=RunContextWrapper(context=None))
        return rewound, popped, await session.get_items()

    rewound, popped, left = asyncio.run(scenario())
    assert rewound == before
    assert popped == run[-1]
    assert left == [*before, *run[:-1]]


def test_clear_then_write_again(make: Make) -> None:
    """clear_session empties the history; the session takes new items afterwards."""

    async def scenario() -> tuple[list[Any], list[Any]]:
        session = make("chat-1")
        await session.add_items([user("old")])
        await session.clear_session()
        empty = await session.get_items()
        await session.add_items([user("new")])
        return empty, await session.get_items()

    assert asyncio.run(scenario()) == ([], [user("new")])


def test_ids_and_tenants_keep_histories_apart(make: Make) -> None:
    """The same session id under another user or tenant is another history; empty adds store nothing."""

    async def scenario() -> list[list[Any]]:
        sessions = [make("chat-1"), make("chat-1", user_id="bob"), make("chat-1", tenant_id="globex-x")]
        for n, session in enumerate(sessions):
            await session.add_items([user(f"from {n}")])
            await session.add_items([])
        return [await s.get_items() for s in sessions]

    assert asyncio.run(scenario()) == [[user("from 0")], [user("from 1")], [user("from 2")]]


def test_concurrent_writers_lose_nothing(make: Make) -> None:
    """Twenty tasks adding at once: every item is stored once."""

    async def scenario() -> list[Any]:
        session = make("chat-1")
        await asyncio.gather(*(session.add_items([user(f"m{n}")]) for n in range(20)))
        return await session.get_items()

    stored = asyncio.run(scenario())
    assert sorted(item["content"] for item in stored) == sorted(f"m{n}" for n in range(20))


def test_the_key_must_be_explicit_and_valid(make: Make) -> None:
    """No tenant or user is guessed; bad ids are refused by name before anything is stored."""
    with pytest.raises(TypeError, match="tenant_id"):
        ConvmemSession("chat-1", make("x").key)  # type: ignore[call-arg,arg-type]
    with pytest.raises(InvalidKey):
        make("")
    with pytest.raises(InvalidInput, match="memory"):
        ConvmemSession("chat-1", "nats://nowhere", tenant_id="t", user_id="u")  # type: ignore[arg-type]


# With the SDK's Runner -----------------------------------------------------------------------------------


def triage(model: ScriptedModel) -> Agent[Any]:
    billing = Agent(name="billing", instructions="Bill.", model=model)
    return Agent(name="triage", instructions="Route.", model=model, handoffs=[billing])


@pytest.mark.parametrize("how", ["run", "run_sync", "run_streamed"])
def test_runner_runs_share_history_through_the_session(make: Make, how: str) -> None:
    """Three runs: each model call sees the earlier runs' items, a handoff's empty arguments included."""
    model = ScriptedModel(
        [
            [function_call("transfer_to_billing", "", call_id="call_h")],
            [assistant_message("Billing here.")],
            [assistant_message("Your bill is $5.")],
            [assistant_message("You asked about your bill.")],
        ]
    )
    agent = triage(model)
    session = make("chat-1")

    def run_once(text: str) -> Any:
        if how == "run_sync":  # on a loop of ours, closed after the run (run_sync leaves its own open)
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                return Runner.run_sync(agent, text, session=session, run_config=NO_TRACING).final_output
            finally:
                asyncio.set_event_loop(None)
                loop.close()

        async def go() -> Any:
            if how == "run":
                return (await Runner.run(agent, text, session=session, run_config=NO_TRACING)).final_output
            streamed = Runner.run_streamed(agent, text, session=session, run_config=NO_TRACING)
            async for _ in streamed.stream_events():
                pass
            return streamed.final_output

        return asyncio.run(go())

    answers = [run_once(text) for text in ("Billing please", "How much?", "What did I ask?")]
    assert answers == ["Billing here.", "Your bill is $5.", "You asked about your bill."]
    stored = asyncio.run(session.get_items())
    handoff = next(item for item in stored if item.get("type") == "function_call")
    assert handoff["arguments"] == ""
    last_input = model.calls[-1].input
    assert isinstance(last_input, list)
    assert [i["content"] for i in last_input if i.get("role") == "user"] == [
        "Billing please",
        "How much?",
        "What did I ask?",
    ]


def test_runner_honours_the_session_limit(make: Make) -> None:
    """With session_settings limit 2, the model sees only the last two stored items plus the input."""
    model = ScriptedModel([[assistant_message("one")], [assistant_message("two")]])
    agent = Agent(name="a", instructions="Answer.", model=model)
    session = make("chat-1", session_settings=SessionSettings(limit=2))

    async def scenario() -> None:
        await Runner.run(agent, "first", session=session, run_config=NO_TRACING)
        await Runner.run(agent, "second", session=session, run_config=NO_TRACING)

    asyncio.run(scenario())
    second = model.calls[1].input
    assert isinstance(second, list)
    assert second[0].get("content") == "first"
    assert len(second) == 3


def test_a_fresh_connection_reads_what_another_stored(served: Any) -> None:
    """Items stored through one connection to the service read back unchanged through another."""
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    items = [user("kept"), {"type": "message", "role": "assistant", "content": "ok", "id": "m"}]
    asyncio.run(ConvmemSession("c", served, tenant_id=tenant, user_id="u").add_items(items))
    with convmem.connect_remote(served.url, timeout=30.0) as fresh:
        again = ConvmemSession("c", fresh, tenant_id=tenant, user_id="u")
        assert json.dumps(asyncio.run(again.get_items())) == json.dumps(items)
    by_op = served.service_metrics()["service"]["by_op"]
    assert by_op.get("agents_start", 0) >= 2
    assert by_op.get("agents_items", 0) >= 1


def test_a_tenants_credentials_reach_only_its_own_sessions(
    tenants_service: tuple[int, Any],  # noqa: F811 (the fixture imported above)
) -> None:
    """Through docker/nats-tenants.conf, acme's sessions reach acme only: globex's stay as globex wrote."""
    port, _ = tenants_service
    with (
        convmem.connect_remote(_user(port, "acme"), inbox_prefix="_INBOX_acme", timeout=30.0) as acme,
        convmem.connect_remote(_user(port, "globex"), inbox_prefix="_INBOX_globex", timeout=30.0) as globex,
    ):
        theirs = ConvmemSession("chat-1", globex, tenant_id="globex", user_id="bob")
        asyncio.run(theirs.add_items([user("globex secret")]))
        intruder = ConvmemSession("chat-1", acme, tenant_id="globex", user_id="bob")
        for attempt in (
            intruder.get_items(),
            intruder.add_items([user("planted")]),
            intruder.pop_item(),
            intruder.clear_session(),
        ):
            with pytest.raises(PermissionDenied):
                asyncio.run(attempt)
        with pytest.raises(PermissionDenied):
            _ = ConvmemChatMessageHistory("chat-1", acme, tenant_id="globex", user_id="bob").messages
        assert asyncio.run(theirs.get_items()) == [user("globex secret")]
        own = ConvmemSession("chat-1", acme, tenant_id="acme", user_id="alice")
        asyncio.run(own.add_items([user("acme own")]))
        assert asyncio.run(own.get_items()) == [user("acme own")]


def test_the_new_service_ops_check_their_fields(served: Any) -> None:
    """agents_items refuses a negative or non-integer limit by name; a closed connection says so."""
    subject = convmem.adapters.session_subject(served.api_prefix, "acme", "agents_items")
    for bad in (-1, "3", 1.5):
        with pytest.raises(MalformedRequest) as error:
            served.call(subject, {"user_id": "u", "session_id": "s", "limit": bad})
        assert error.value.field == "limit"
    assert served.call(subject, {"user_id": "u", "session_id": "s"}) == []
    with convmem.connect_remote(served.url) as closing:
        pass
    with pytest.raises(SessionClosed):
        asyncio.run(closing.acall(subject, {"user_id": "u", "session_id": "s"}))
