"""PenguiFlow's real `ReactPlanner` with convmem as its short-term memory.

The planner is driven by a scripted LLM client that answers every query with a
final answer (or first calls a tool) and records every prompt it receives, so
the tests read exactly what the model would have seen. Memory is the
read-only system message PenguiFlow renders from ``conversation_memory``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pytest
from penguiflow import ModelRegistry, Node
from penguiflow.catalog import build_catalog, tool
from penguiflow.planner import PlannerFinish, PlannerPause, ReactPlanner, ToolContext
from penguiflow.planner import memory as pf
from penguiflow.state import InMemoryStateStore
from pydantic import BaseModel

from convmem.actors import MemorySystem
from convmem.adapters import (
    ConvmemShortTermMemory,
    ExtractiveSummarizer,
    InMemoryEventLog,
    config_from_penguiflow,
    turn_from_penguiflow,
)
from convmem.errors import InvalidConfig, InvalidTurn
from convmem.events import (
    ConversationTurn,
    HealthPolicy,
    MemoryBudget,
    MemoryKey,
    ShortTermMemoryConfig,
    TrajectoryDigest,
)

T = TypeVar("T")

WAIT = 15.0
"""Seconds a concurrent rendezvous may take before the test fails (a hang, not a timing check)."""

_MEMORY_OPEN = "<read_only_conversation_memory_json>"
_MEMORY_CLOSE = "</read_only_conversation_memory_json>"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# A scripted LLM and what it saw ---------------------------------------------------------------


def query_of(messages: Sequence[Mapping[str, Any]]) -> str:
    """The planner's current query: its first user message is ``{"query": ...}``."""
    for message in messages:
        if message.get("role") != "user":
            continue
        try:
            body = json.loads(message["content"])
        except (TypeError, ValueError):
            continue
        if isinstance(body, dict) and isinstance(body.get("query"), str):
            return body["query"]
    raise AssertionError(f"no query in the prompt: {messages!r}")


def memory_of(messages: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The conversation memory PenguiFlow put in the prompt, or None when there is none."""
    for message in messages:
        content = message.get("content")
        if message.get("role") == "system" and isinstance(content, str) and _MEMORY_OPEN in content:
            start = content.index(_MEMORY_OPEN) + len(_MEMORY_OPEN)
            memory: dict[str, Any] = json.loads(content[start : content.index(_MEMORY_CLOSE)])
            return memory
    return None


def remembered(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The user messages of the turns the prompt's memory shows (pending and recent)."""
    memory = memory_of(messages) or {}
    turns = [*memory.get("pending_turns", []), *memory.get("recent_turns", [])]
    return [turn["user"] for turn in turns]


def remembered_in(patch: Mapping[str, Any]) -> list[str]:
    """The user messages of the recent turns in a `get_llm_context()` patch."""
    return [turn["user"] for turn in patch.get("conversation_memory", {}).get("recent_turns", [])]


class ScriptedLLM:
    """Answers each query with a final answer; records every prompt.

    `tools` maps a query to the tool its first call asks for (its text as the argument).
    With `rendezvous`, every call waits until that many calls are in flight at
    once, so concurrent runs are provably interleaved.
    """

    def __init__(self, *, tools: Mapping[str, str] | None = None, rendezvous: int = 0) -> None:
        self.prompts: list[tuple[str, list[dict[str, Any]]]] = []
        self._tools = dict(tools or {})
        self._calls: dict[str, int] = {}
        self._barrier = asyncio.Barrier(rendezvous) if rendezvous else None

    async def complete(self, *, messages: Sequence[Mapping[str, Any]], **_: Any) -> str:
        query = query_of(messages)
        self.prompts.append((query, [dict(m) for m in messages]))
        self._calls[query] = self._calls.get(query, 0) + 1
        if self._barrier is not None:
            async with asyncio.timeout(WAIT):
                await self._barrier.wait()
        if query in self._tools and self._calls[query] == 1:
            return json.dumps({"next_node": self._tools[query], "args": {"text": query}, "thought": "use it"})
        return json.dumps(
            {"next_node": "final_response", "args": {"answer": f"noted: {query}"}, "thought": "answered"}
        )

    def prompt(self, query: str) -> list[dict[str, Any]]:
        """The last prompt of `query`."""
        found = [messages for q, messages in self.prompts if q == query]
        assert found, f"the LLM never saw {query!r}"
        return found[-1]


class ShoutArgs(BaseModel):
    text: str


class ShoutOut(BaseModel):
    response: str


@tool(desc="Repeat the text in capitals", side_effects="pure")
async def shout(args: ShoutArgs, ctx: ToolContext) -> ShoutOut:
    del ctx
    return ShoutOut(response=args.text.upper())


@tool(desc="Ask a human to approve the request", side_effects="external")
async def approve(args: ShoutArgs, ctx: ToolContext) -> ShoutOut:
    await ctx.pause("approval_required", {"request": args.text})
    return ShoutOut(response="approved")


def catalog_of(*tools: Any) -> list[Any]:
    registry = ModelRegistry()
    for fn in tools:
        registry.register(fn.__name__, ShoutArgs, ShoutOut)
    return list(build_catalog([Node(fn, name=fn.__name__) for fn in tools], registry))


# Fixtures -------------------------------------------------------------------------------------

TRUNCATION = pf.ShortTermMemoryConfig(strategy="truncation")
ALICE = pf.MemoryKey(tenant_id="acme", user_id="alice@example.com", session_id="chat-1")
BOB = pf.MemoryKey(tenant_id="acme", user_id="bob@example.com", session_id="chat-2")


def convmem_key(key: Any) -> MemoryKey:
    return MemoryKey(key.tenant_id, key.user_id, key.session_id)


@pytest.fixture
def log() -> Iterator[InMemoryEventLog]:
    log = InMemoryEventLog()
    yield log
    log.close()


@pytest.fixture
def system(log: InMemoryEventLog) -> Iterator[MemorySystem]:
    system = MemorySystem(log=log)
    yield system
    system.close()


def make_planner(
    memory: ConvmemShortTermMemory, llm: ScriptedLLM, *, catalog: list[Any] | None = None, store: bool = True
) -> ReactPlanner:
    return ReactPlanner(
        llm_client=llm,
        catalog=catalog or [],
        short_term_memory=memory,
        state_store=InMemoryStateStore() if store else None,
    )


def stored_users(system: MemorySystem, key: Any) -> list[str]:
    return [record.turn.user_message for record in system.session(convmem_key(key)).snapshot_state().turns]


# Memory behaviour through the planner ---------------------------------------------------------


def test_second_run_prompt_shows_the_first_turn(system: MemorySystem) -> None:
    """A session's next run shows the LLM the earlier turns of that session (explicit memory_key)."""
    llm = ScriptedLLM()
    planner = make_planner(ConvmemShortTermMemory(system, TRUNCATION), llm)

    async def scenario() -> None:
        first = await planner.run("my favourite colour is teal", memory_key=ALICE)
        assert isinstance(first, PlannerFinish)
        await planner.run("what is my favourite colour?", memory_key=ALICE)

    run(scenario())
    # A new session shows an empty memory, as PenguiFlow's own memory does for a configured strategy.
    assert remembered(llm.prompt("my favourite colour is teal")) == []
    memory = memory_of(llm.prompt("what is my favourite colour?"))
    assert memory == {
        "recent_turns": [
            {"user": "my favourite colour is teal", "assistant": "noted: my favourite colour is teal"}
        ]
    }
    assert stored_users(system, ALICE) == ["my favourite colour is teal", "what is my favourite colour?"]


def test_key_comes_from_tool_context(system: MemorySystem) -> None:
    """Without memory_key, the planner's key from tool_context ids selects the convmem session."""
    llm = ScriptedLLM()
    planner = make_planner(ConvmemShortTermMemory(system, TRUNCATION), llm)
    ids = {"tenant_id": ALICE.tenant_id, "user_id": ALICE.user_id, "session_id": ALICE.session_id}

    async def scenario() -> None:
        await planner.run("I live in Lisbon", tool_context=ids)
        await planner.run("where do I live?", tool_context=dict(ids))

    run(scenario())
    assert remembered(llm.prompt("where do I live?")) == ["I live in Lisbon"]
    assert stored_users(system, ALICE) == ["I live in Lisbon", "where do I live?"]


def test_no_key_means_no_read_and_no_write(system: MemorySystem, log: InMemoryEventLog) -> None:
    """Fail closed: a run with no resolvable key reads nothing, injects nothing and stores nothing."""
    llm = ScriptedLLM()
    planner = make_planner(ConvmemShortTermMemory(system, TRUNCATION), llm)

    async def scenario() -> None:
        await planner.run("keyed turn", memory_key=ALICE)
        await planner.run("anonymous turn")
        await planner.run("partial ids", tool_context={"tenant_id": "acme", "user_id": "alice@example.com"})

    run(scenario())
    assert memory_of(llm.prompt("anonymous turn")) is None
    assert memory_of(llm.prompt("partial ids")) is None
    assert log.keys() == [convmem_key(ALICE)]
    assert stored_users(system, ALICE) == ["keyed turn"]


def test_planner_without_state_store_gets_no_memory(system: MemorySystem, log: InMemoryEventLog) -> None:
    """Fail closed: a planner with no state_store names no session, so it gets no memory at all."""
    llm = ScriptedLLM()
    memory = ConvmemShortTermMemory(system, TRUNCATION)
    with_store = make_planner(memory, llm)
    without_store = make_planner(memory, llm, store=False)

    async def scenario() -> None:
        await with_store.run("alice's secret is 1234", memory_key=ALICE)
        await without_store.run("bob asks", memory_key=BOB)

    run(scenario())
    assert memory_of(llm.prompt("bob asks")) is None
    assert log.keys() == [convmem_key(ALICE)]


def test_sessions_on_one_planner_never_see_each_other(system: MemorySystem) -> None:
    """Two keys on one planner (one memory object) each see only their own turns."""
    llm = ScriptedLLM()
    planner = make_planner(ConvmemShortTermMemory(system, TRUNCATION), llm)

    async def scenario() -> None:
        await planner.run("alice: the launch code is 1234", memory_key=ALICE)
        await planner.run("bob: hello", memory_key=BOB)
        await planner.run("alice: again", memory_key=ALICE)

    run(scenario())
    assert remembered(llm.prompt("bob: hello")) == []
    assert remembered(llm.prompt("alice: again")) == ["alice: the launch code is 1234"]
    assert stored_users(system, BOB) == ["bob: hello"]


def test_concurrent_sessions_never_see_each_other(system: MemorySystem) -> None:
    """Runs of many keys in flight at once on one planner each read and write only their own session."""
    sessions = 6
    keys = [pf.MemoryKey(tenant_id="acme", user_id=f"u{i}", session_id=f"s{i}") for i in range(sessions)]
    llm = ScriptedLLM(rendezvous=sessions)
    planner = make_planner(ConvmemShortTermMemory(system, TRUNCATION), llm)

    async def round_of(label: str) -> None:
        await asyncio.gather(*(planner.run(f"{label} from {k.user_id}", memory_key=k) for k in keys))

    async def scenario() -> None:
        await round_of("first")
        await round_of("second")

    run(scenario())
    for k in keys:
        assert remembered(llm.prompt(f"second from {k.user_id}")) == [f"first from {k.user_id}"]
        assert stored_users(system, k) == [f"first from {k.user_id}", f"second from {k.user_id}"]


def test_memory_survives_a_restart_with_new_planner_and_system(log: InMemoryEventLog) -> None:
    """A new MemorySystem and a new ReactPlanner on the same log see the session's earlier turns."""
    before = MemorySystem(log=log)
    try:
        run(
            make_planner(ConvmemShortTermMemory(before, TRUNCATION), ScriptedLLM()).run(
                "my order number is 4417", memory_key=ALICE
            )
        )
    finally:
        before.close()

    after = MemorySystem(log=log)
    try:
        llm = ScriptedLLM()
        run(
            make_planner(ConvmemShortTermMemory(after, TRUNCATION), llm).run(
                "what was my order number?", memory_key=ALICE
            )
        )
    finally:
        after.close()
    assert remembered(llm.prompt("what was my order number?")) == ["my order number is 4417"]


def test_memory_persists_across_planner_instances(system: MemorySystem) -> None:
    """Two planners with their own memory objects over one system share each session's history."""
    first_llm, second_llm = ScriptedLLM(), ScriptedLLM()
    first = make_planner(ConvmemShortTermMemory(system, TRUNCATION), first_llm)
    second = make_planner(ConvmemShortTermMemory(system, TRUNCATION), second_llm)

    run(first.run("call me Ada", memory_key=ALICE))
    run(second.run("what is my name?", memory_key=ALICE))
    assert remembered(second_llm.prompt("what is my name?")) == ["call me Ada"]


def test_tool_use_is_kept_as_the_turns_trajectory_digest(system: MemorySystem) -> None:
    """The planner's turn reaches the log field by field, tool digest included, and shows next time."""
    llm = ScriptedLLM(tools={"say hi": "shout"})
    planner = make_planner(ConvmemShortTermMemory(system, TRUNCATION), llm, catalog=catalog_of(shout))

    run(planner.run("say hi", memory_key=ALICE))
    run(planner.run("again", memory_key=ALICE))

    stored = system.session(convmem_key(ALICE)).snapshot_state().turns[0].turn
    assert stored.user_message == "say hi"
    assert stored.assistant_response == "noted: say hi"
    assert stored.trajectory_digest is not None
    assert stored.trajectory_digest.tools_invoked == ("shout",)
    assert "SAY HI" in stored.trajectory_digest.observations_summary
    shown = (memory_of(llm.prompt("again")) or {})["recent_turns"][0]
    assert shown["trajectory_digest"]["tools_invoked"] == ["shout"]


def test_paused_run_stores_its_turn_when_resumed_with_the_key(system: MemorySystem) -> None:
    """A paused run stores nothing; its resume with the key stores the turn; other sessions never see it."""
    llm = ScriptedLLM(tools={"delete my data": "approve"})
    planner = make_planner(ConvmemShortTermMemory(system, TRUNCATION), llm, catalog=catalog_of(approve))

    async def scenario() -> None:
        await planner.run("alice first", memory_key=ALICE)
        paused = await planner.run("delete my data", memory_key=ALICE)
        assert isinstance(paused, PlannerPause)
        assert stored_users(system, ALICE) == ["alice first"]
        await planner.run("bob first", memory_key=BOB)
        done = await planner.resume(paused.resume_token, user_input="approved", memory_key=ALICE)
        assert isinstance(done, PlannerFinish)
        await planner.run("alice after", memory_key=ALICE)

    run(scenario())
    assert remembered(llm.prompt("delete my data")) == ["alice first"]
    assert remembered(llm.prompt("bob first")) == []
    assert remembered(llm.prompt("alice after")) == ["alice first", "delete my data"]
    assert stored_users(system, BOB) == ["bob first"]


def test_rolling_summary_appears_after_enough_turns(log: InMemoryEventLog) -> None:
    """With rolling_summary, turns evicted from the full zone come back as a summary (after flush)."""
    summarizing = MemorySystem(log=log, summarizer=ExtractiveSummarizer())
    config = pf.ShortTermMemoryConfig(strategy="rolling_summary", budget=pf.MemoryBudget(full_zone_turns=1))
    memory = ConvmemShortTermMemory(summarizing, config)
    llm = ScriptedLLM()
    planner = make_planner(memory, llm)
    facts = ["my invoice number is 88213", "ship it to Oslo on 2025-03-14", "my email is ada@example.com"]

    async def scenario() -> None:
        for fact in facts:
            await planner.run(fact, memory_key=ALICE)
        await memory.flush(ALICE)
        await planner.run("summarise please", memory_key=ALICE)

    try:
        run(scenario())
    finally:
        summarizing.close()
    memory_shown = memory_of(llm.prompt("summarise please"))
    assert memory_shown is not None
    assert "<session_summary>" in memory_shown["summary"]
    assert "88213" in memory_shown["summary"]
    assert [t["user"] for t in memory_shown["recent_turns"]] == [facts[-1]]


# The per-call binding, at the protocol level ------------------------------------------------


def test_nested_call_restores_the_outer_binding(system: MemorySystem) -> None:
    """A call nested in another (same task) uses its own session; the outer call then gets its own back."""
    memory = ConvmemShortTermMemory(system, TRUNCATION)
    store = object()

    async def scenario() -> None:
        await memory.session(ALICE).add_turn(
            ConversationTurn(user_message="earlier", assistant_response="ok")
        )
        await memory.hydrate(store, ALICE.composite())
        assert remembered_in(await memory.get_llm_context()) == ["earlier"]
        await memory.hydrate(store, BOB.composite())
        assert remembered_in(await memory.get_llm_context()) == []
        await memory.add_turn(pf.ConversationTurn(user_message="inner", assistant_response="b"))
        await memory.persist(store, BOB.composite())
        await memory.add_turn(pf.ConversationTurn(user_message="outer", assistant_response="a"))
        await memory.persist(store, ALICE.composite())

    run(scenario())
    assert stored_users(system, ALICE) == ["earlier", "outer"]
    assert stored_users(system, BOB) == ["inner"]


def test_context_is_read_once_per_hydrate(system: MemorySystem) -> None:
    """A binding serves one context read: a later read without hydrate gets nothing."""
    system.session(convmem_key(ALICE), config=config_from_penguiflow(TRUNCATION)).add_turn(
        ConversationTurn(user_message="earlier", assistant_response="ok")
    )
    memory = ConvmemShortTermMemory(system, TRUNCATION)

    async def scenario() -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        await memory.hydrate(None, ALICE.composite())
        return await memory.get_llm_context(), await memory.get_llm_context()

    first, second = run(scenario())
    assert first["conversation_memory"]["recent_turns"][0]["user"] == "earlier"
    assert second == {}


def test_persist_of_another_session_stores_nothing(
    system: MemorySystem, log: InMemoryEventLog, caplog: pytest.LogCaptureFixture
) -> None:
    """A turn is stored only in the session its call was bound to; a mismatched persist is refused."""
    memory = ConvmemShortTermMemory(system, TRUNCATION)

    async def scenario() -> None:
        await memory.hydrate(None, ALICE.composite())
        await memory.add_turn(pf.ConversationTurn(user_message="alice's", assistant_response="ok"))
        await memory.persist(None, BOB.composite())

    with caplog.at_level(logging.WARNING, logger="convmem.penguiflow"):
        run(scenario())
    assert log.keys() == []
    assert "nothing stored" in caplog.text


def test_colon_in_an_id_turns_memory_off(
    system: MemorySystem, log: InMemoryEventLog, caplog: pytest.LogCaptureFixture
) -> None:
    """PenguiFlow's composite does not escape ':', so such a key is ambiguous and gets no memory."""
    llm = ScriptedLLM()
    planner = make_planner(ConvmemShortTermMemory(system, TRUNCATION), llm)
    key = pf.MemoryKey(tenant_id="acme", user_id="alice", session_id="chat:1")

    async def scenario() -> None:
        await planner.run("first", memory_key=key)
        await planner.run("second", memory_key=key)

    with caplog.at_level(logging.WARNING, logger="convmem.penguiflow"):
        run(scenario())
    assert memory_of(llm.prompt("second")) is None
    assert log.keys() == []
    assert "ambiguous" in caplog.text


def test_health_and_tokens_follow_the_bound_session(system: MemorySystem) -> None:
    """health is PenguiFlow's enum and estimate_tokens counts the bound session (0 when unbound)."""
    memory = ConvmemShortTermMemory(system, TRUNCATION)
    assert memory.health is pf.MemoryHealth.HEALTHY
    assert memory.estimate_tokens() == 0

    async def scenario() -> int:
        await memory.hydrate(None, ALICE.composite())
        await memory.add_turn(pf.ConversationTurn(user_message="hello there", assistant_response="hi"))
        await memory.persist(None, ALICE.composite())
        await memory.hydrate(None, ALICE.composite())
        return memory.estimate_tokens()

    assert run(scenario()) > 0


# Conversions ---------------------------------------------------------------------------------


def test_turn_converts_field_by_field() -> None:
    """Every field of PenguiFlow's ConversationTurn and TrajectoryDigest lands in convmem's turn."""
    theirs = pf.ConversationTurn(
        user_message="u",
        assistant_response="a",
        trajectory_digest=pf.TrajectoryDigest(
            tools_invoked=["search", "fetch"],
            observations_summary="- search: 3 hits",
            reasoning_summary="looked it up",
            artifacts_refs=["art-1"],
        ),
        artifacts_shown={"chart": {"kind": "bar"}},
        artifacts_hidden_refs=["art-2"],
        ts=1700000000.5,
    )
    assert turn_from_penguiflow(theirs) == ConversationTurn(
        user_message="u",
        assistant_response="a",
        trajectory_digest=TrajectoryDigest(
            tools_invoked=("search", "fetch"),
            observations_summary="- search: 3 hits",
            reasoning_summary="looked it up",
            artifacts_refs=("art-1",),
        ),
        artifacts_shown={"chart": {"kind": "bar"}},
        artifacts_hidden_refs=("art-2",),
        ts=1700000000.5,
    )
    with pytest.raises(InvalidTurn, match="ConversationTurn"):
        turn_from_penguiflow({"user_message": "u"})


def test_penguiflow_config_maps_to_convmem() -> None:
    """PenguiFlow's settings map one to one (strategy, budget, retries, backlog, digest, model, back-off)."""
    theirs = pf.ShortTermMemoryConfig(
        strategy="rolling_summary",
        budget=pf.MemoryBudget(
            full_zone_turns=3,
            summary_max_tokens=300,
            total_max_tokens=4000,
            overflow_policy="truncate_summary",
        ),
        summarizer_model="gpt-4o-mini",
        include_trajectory_digest=False,
        recovery_backlog_limit=7,
        retry_attempts=2,
        retry_backoff_base_s=1.5,
        degraded_retry_interval_s=12.0,
    )
    assert config_from_penguiflow(theirs) == ShortTermMemoryConfig(
        strategy="rolling_summary",
        budget=MemoryBudget(
            full_zone_turns=3,
            summary_max_tokens=300,
            total_max_tokens=4000,
            overflow_policy="truncate_summary",
        ),
        summarizer_model="gpt-4o-mini",
        include_trajectory_digest=False,
        recovery_backlog_limit=7,
        retry_attempts=2,
        health=HealthPolicy(retry_backoff_seconds=(1.5, 3.0), degraded_retry_seconds=12.0),
    )
    assert config_from_penguiflow(pf.ShortTermMemoryConfig()) == ShortTermMemoryConfig()


async def _callback(turn: Any) -> None:
    del turn


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (pf.ShortTermMemoryConfig(on_turn_added=_callback), "on_turn_added"),
        (pf.ShortTermMemoryConfig(token_estimator=len), "token_estimator"),
        (pf.ShortTermMemoryConfig(isolation=pf.MemoryIsolation(session_key="auth.session")), "isolation"),
        (pf.ShortTermMemoryConfig(isolation=pf.MemoryIsolation(require_explicit_key=False)), "isolation"),
    ],
)
def test_settings_convmem_cannot_honour_are_refused(config: Any, field: str) -> None:
    """A PenguiFlow setting the singleton memory would silently ignore raises InvalidConfig naming it."""
    with pytest.raises(InvalidConfig) as caught:
        config_from_penguiflow(config)
    assert caught.value.field == field


def test_zero_settings_map_with_penguiflows_meaning() -> None:
    """Zeros PenguiFlow accepts map to convmem's zeros (no recent zone, retry at once)."""
    config = config_from_penguiflow(
        pf.ShortTermMemoryConfig(budget=pf.MemoryBudget(full_zone_turns=0), retry_backoff_base_s=0.0)
    )
    assert config.budget.full_zone_turns == 0
    assert set(config.health.retry_backoff_seconds) == {0.0}


def test_rolling_summary_needs_a_summarizer_on_the_system(system: MemorySystem) -> None:
    """Asking for rolling summaries from a system without a summarizer fails at construction."""
    with pytest.raises(InvalidConfig, match="summarizer"):
        ConvmemShortTermMemory(system, pf.ShortTermMemoryConfig(strategy="rolling_summary"))


# The optional extra --------------------------------------------------------------------------


def test_without_penguiflow_convmem_imports_and_the_memory_names_the_extra() -> None:
    """convmem.adapters imports without penguiflow; the memory then says which extra to install."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["penguiflow"] = None
        from convmem.actors import MemorySystem
        from convmem.adapters import ConvmemShortTermMemory, InMemoryEventLog
        system = MemorySystem(log=InMemoryEventLog())
        try:
            ConvmemShortTermMemory(system)
        except ImportError as exc:
            print(exc)
        finally:
            system.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install convmem[penguiflow]" in done.stdout
