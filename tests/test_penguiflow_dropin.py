"""convmem.penguiflow.DefaultShortTermMemory keeps PenguiFlow's documented behaviour, on the log.

convmem's own conformance tests of what PenguiFlow's short-term memory does
(the seeds' RFC, guide and reference), plus what the drop-in adds: keys
learned from hydrate/persist, moves and imports as events, the planner's
summarizer on its own loop. PenguiFlow's own suite runs against the same class
with scripts/penguiflow_suite.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from penguiflow.planner import memory as pf
from penguiflow.planner import memory_integration
from penguiflow.state import InMemoryStateStore

import convmem.penguiflow
from convmem.actors import MemorySystem, verify
from convmem.adapters import InMemoryEventLog, InMemorySnapshotStore, JetStreamEventLog
from convmem.adapters.frontends.integrations.penguiflow._planner_loop import CallerLoop, LoopSummarizer
from convmem.adapters.frontends.integrations.penguiflow._store import NEW_GENERATION
from convmem.errors import ConvmemError, InvalidInput
from convmem.errors import MemoryBudgetExceeded as ConvmemBudgetExceeded
from convmem.events import (
    MemoryKey,
    SessionCleared,
    SessionRestored,
    TurnAdded,
    TurnsAdopted,
    decode_event,
)
from convmem.penguiflow import DefaultShortTermMemory, key_from_composite
from convmem.projections import SessionState

WAIT = 15.0
"""Seconds a rendezvous may take before the test fails (a hang, not a timing check)."""


@pytest.fixture
def log() -> Iterator[InMemoryEventLog]:
    """The process-wide system of the drop-in, on an in-memory log of this test's own."""
    events = InMemoryEventLog()
    system = MemorySystem(log=events, snapshots=InMemorySnapshotStore())
    convmem.penguiflow.configure(system=system)
    try:
        yield events
    finally:
        convmem.penguiflow.configure()
        system.close()


def cfg(strategy: str = "truncation", **settings: Any) -> Any:
    budget = settings.pop("budget", pf.MemoryBudget(full_zone_turns=2))
    return pf.ShortTermMemoryConfig(strategy=strategy, budget=budget, **settings)


def turn(n: int | str) -> Any:
    return pf.ConversationTurn(user_message=f"u{n}", assistant_response=f"a{n}")


def users(patch: Any, zone: str = "recent_turns") -> list[str]:
    return [t["user"] for t in patch["conversation_memory"].get(zone, [])]


def stored_keys(log: InMemoryEventLog) -> list[MemoryKey]:
    return log.keys(tenant_id=None)


def events_of(log: InMemoryEventLog, key: MemoryKey) -> list[Any]:
    return [decode_event(record.data) for record in log.read(key)]


class Store:
    """A duck-typed state store with PenguiFlow's memory methods."""

    def __init__(self) -> None:
        self.saved: dict[str, dict[str, Any]] = {}

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        self.saved[key] = state

    async def load_memory_state(self, key: str) -> dict[str, Any] | None:
        return self.saved.get(key)


KEY = "acme:alice:chat-1"


# Installing ------------------------------------------------------------------------------


def test_install_rebinds_the_one_name_penguiflows_planner_builds_memories_with() -> None:
    """install() makes both modules name convmem's class; uninstall() puts PenguiFlow's back; idempotent."""
    original = pf.DefaultShortTermMemory
    assert original is not DefaultShortTermMemory
    try:
        convmem.penguiflow.install()
        convmem.penguiflow.install()
        assert pf.DefaultShortTermMemory is DefaultShortTermMemory
        assert memory_integration.DefaultShortTermMemory is DefaultShortTermMemory
        assert convmem.penguiflow.installed()
    finally:
        convmem.penguiflow.uninstall()
        convmem.penguiflow.uninstall()
    assert pf.DefaultShortTermMemory is original
    assert memory_integration.DefaultShortTermMemory is original
    assert not convmem.penguiflow.installed()


# PenguiFlow's behaviours -----------------------------------------------------------------


def test_truncation_shows_the_last_full_zone_turns(log: InMemoryEventLog) -> None:
    """strategy truncation: the context holds the last full_zone_turns turns."""

    async def scenario() -> Any:
        memory = DefaultShortTermMemory(config=cfg())
        for n in (1, 2, 3):
            await memory.add_turn(turn(n))
        return await memory.get_llm_context()

    assert users(asyncio.run(scenario())) == ["u2", "u3"]


def test_strategy_none_stores_nothing_and_shows_nothing(log: InMemoryEventLog) -> None:
    """strategy none: add_turn is a no-op and the patch is empty."""

    async def scenario() -> Any:
        memory = DefaultShortTermMemory(config=cfg("none"))
        await memory.add_turn(turn(1))
        return await memory.get_llm_context()

    assert asyncio.run(scenario()) == {}
    assert stored_keys(log) == []


def test_a_rolling_summary_runs_the_given_summarizer_on_the_callers_loop_without_blocking(
    log: InMemoryEventLog,
) -> None:
    """add_turn returns while the summarizer waits; the summarizer runs on the loop that added the turn."""
    seen: dict[str, Any] = {}

    async def scenario() -> tuple[Any, Any, Any]:
        gate = asyncio.Event()  # bound to this loop: it works only there
        loop = asyncio.get_running_loop()

        async def summarizer(payload: dict[str, Any]) -> dict[str, str]:
            seen["loop"] = asyncio.get_running_loop() is loop
            seen["payload"] = payload
            await gate.wait()
            return {"summary": "<session_summary>ok</session_summary>"}

        memory = DefaultShortTermMemory(
            config=cfg("rolling_summary", retry_attempts=0), summarizer=summarizer
        )
        for n in (1, 2, 3):
            await asyncio.wait_for(memory.add_turn(turn(n)), WAIT)
        before = await memory.get_llm_context()
        gate.set()
        await asyncio.wait_for(memory.flush(), WAIT)
        return before, await memory.get_llm_context(), memory.health

    before, after, health = asyncio.run(scenario())
    assert (users(before), users(before, "pending_turns")) == (["u2", "u3"], ["u1"])
    assert after["conversation_memory"]["summary"] == "<session_summary>ok</session_summary>"
    assert "pending_turns" not in after["conversation_memory"]
    assert seen["loop"] is True
    assert [t["user"] for t in seen["payload"]["turns"]] == ["u1"]
    assert health is pf.MemoryHealth.HEALTHY


def test_a_failing_summarizer_degrades_to_the_recent_turns(log: InMemoryEventLog) -> None:
    """A summarizer that keeps failing leads to DEGRADED, PenguiFlow's enum, showing recent turns only."""

    async def scenario() -> tuple[Any, Any]:
        async def failing(payload: dict[str, Any]) -> dict[str, str]:
            raise RuntimeError("model down")

        config = cfg("rolling_summary", retry_attempts=0, retry_backoff_base_s=0, degraded_retry_interval_s=0)
        memory = DefaultShortTermMemory(config=config, summarizer=failing)
        for n in (1, 2, 3):
            await memory.add_turn(turn(n))
        await asyncio.wait_for(memory.flush(), WAIT)
        return memory.health, await memory.get_llm_context()

    health, patch = asyncio.run(scenario())
    assert health is pf.MemoryHealth.DEGRADED
    assert patch == {
        "conversation_memory": {
            "recent_turns": [{"user": "u2", "assistant": "a2"}, {"user": "u3", "assistant": "a3"}]
        }
    }


def test_the_error_policy_raises_penguiflows_and_convmems_exception(log: InMemoryEventLog) -> None:
    """Over budget under overflow_policy=error: one exception both `except` clauses catch; nothing stored."""
    budget = pf.MemoryBudget(
        full_zone_turns=10, summary_max_tokens=0, total_max_tokens=1, overflow_policy="error"
    )
    memory = DefaultShortTermMemory(config=cfg(budget=budget))
    with pytest.raises(pf.MemoryBudgetExceeded) as caught:
        asyncio.run(memory.add_turn(turn("x" * 100)))
    assert isinstance(caught.value, ConvmemBudgetExceeded)
    assert isinstance(caught.value, ConvmemError)
    assert all(not events_of(log, key)[1:] for key in stored_keys(log))


def test_the_configs_token_estimator_counts_the_tokens(log: InMemoryEventLog) -> None:
    """estimate_tokens uses the config's token_estimator, on PenguiFlow's rendering."""
    rendered: list[str] = []

    def estimator(text: str) -> int:
        rendered.append(text)
        return 7

    async def scenario() -> int:
        memory = DefaultShortTermMemory(config=cfg(token_estimator=estimator))
        await memory.add_turn(turn(1))
        return memory.estimate_tokens()

    assert asyncio.run(scenario()) == 7
    assert rendered[-1] == '{"recent_turns": [{"assistant": "a1", "user": "u1"}]}'


def test_the_configs_callbacks_get_penguiflows_types(log: InMemoryEventLog) -> None:
    """on_turn_added and on_health_changed are the memory's own and receive PenguiFlow's values."""

    async def scenario() -> tuple[list[Any], list[Any]]:
        turns: list[Any] = []
        healths: list[Any] = []
        done = asyncio.Event()

        async def on_turn(t: Any) -> None:
            turns.append(t)

        async def on_health(old: Any, new: Any) -> None:
            healths.append((old, new))
            done.set()

        async def failing(payload: dict[str, Any]) -> dict[str, str]:
            raise RuntimeError("down")

        config = cfg("rolling_summary", retry_attempts=0, on_turn_added=on_turn, on_health_changed=on_health)
        memory = DefaultShortTermMemory(config=config, summarizer=failing)
        for n in (1, 2, 3):
            await memory.add_turn(turn(n))
        await asyncio.wait_for(done.wait(), WAIT)
        return turns, healths

    turns, healths = asyncio.run(scenario())
    assert [t.user_message for t in turns] == ["u1", "u2", "u3"]
    assert all(isinstance(t, pf.ConversationTurn) for t in turns)
    assert healths == [(pf.MemoryHealth.HEALTHY, pf.MemoryHealth.DEGRADED)]


@pytest.mark.parametrize(
    "budget",
    [
        pf.MemoryBudget(full_zone_turns=0),
        pf.MemoryBudget(summary_max_tokens=0),
        pf.MemoryBudget(total_max_tokens=0),
    ],
    ids=["full_zone_turns=0", "summary_max_tokens=0", "total_max_tokens=0"],
)
def test_zero_budgets_are_accepted_with_penguiflows_meaning(log: InMemoryEventLog, budget: Any) -> None:
    """PenguiFlow's zero budgets build a memory and run (their meaning is pinned in test_penguiflow_zeros)."""

    async def scenario() -> Any:
        async def summarizer(payload: dict[str, Any]) -> dict[str, str]:
            return {"summary": "<session_summary>s</session_summary>"}

        memory = DefaultShortTermMemory(config=cfg("rolling_summary", budget=budget), summarizer=summarizer)
        for n in (1, 2, 3, 4, 5, 6):
            await memory.add_turn(turn(n))
        await asyncio.wait_for(memory.flush(), WAIT)
        return await memory.get_llm_context()

    memory = asyncio.run(scenario())["conversation_memory"]
    if budget.full_zone_turns == 0:
        assert memory["recent_turns"] == []
    if budget.summary_max_tokens == 0:
        assert "summary" not in memory
    assert "pending_turns" not in memory


def test_non_default_isolation_and_zero_timings_build_a_memory(log: InMemoryEventLog) -> None:
    """Settings PenguiFlow accepts (custom isolation paths, zero back-off and probe interval) are accepted."""
    config = cfg(
        isolation=pf.MemoryIsolation(tenant_key="auth.org", require_explicit_key=False),
        retry_backoff_base_s=0.0,
        degraded_retry_interval_s=0.0,
    )
    memory = DefaultShortTermMemory(config=config)
    assert memory.config.isolation.tenant_key == "auth.org"
    assert memory.config.health.degraded_retry_seconds == 0.0


# Keys, persistence, moves and imports ----------------------------------------------------


def test_persist_and_hydrate_share_the_session_and_the_store_gets_penguiflows_dict(
    log: InMemoryEventLog,
) -> None:
    """persist names the key; a memory hydrating it sees the turns; PenguiFlow's class reads the dict."""
    store = Store()

    async def scenario() -> tuple[Any, Any]:
        first = DefaultShortTermMemory(config=cfg())
        await first.add_turn(turn(1))
        await first.persist(store, KEY)
        second = DefaultShortTermMemory(config=cfg())
        await second.hydrate(store, KEY)
        back = pf.DefaultShortTermMemory(config=cfg())  # a deployment switching back
        await back.hydrate(store, KEY)
        return await second.get_llm_context(), await back.get_llm_context()

    ours, penguiflows = asyncio.run(scenario())
    assert users(ours) == users(penguiflows) == ["u1"]
    assert store.saved[KEY]["convmem"] == {"key": "acme:alice:chat-1", "seq": 2, "generation": 0}


def test_a_store_without_memory_methods_keeps_the_memory_private(log: InMemoryEventLog) -> None:
    """As in PenguiFlow, a store without save/load_memory_state turns persistence off."""

    async def scenario() -> Any:
        memory = DefaultShortTermMemory(config=cfg())
        await memory.add_turn(turn(1))
        await memory.persist(object(), KEY)
        other = DefaultShortTermMemory(config=cfg())
        await other.hydrate(object(), KEY)
        assert memory.key is None
        return await other.get_llm_context()

    assert users(asyncio.run(scenario())) == []
    assert MemoryKey("acme", "alice", "chat-1") not in stored_keys(log)


def test_turns_added_before_the_key_move_as_two_auditable_events(log: InMemoryEventLog) -> None:
    """Private turns go to the key as one TurnsAdopted; the private session's SessionCleared names it."""
    store = Store()
    target = MemoryKey("acme", "alice", "chat-1")

    async def scenario() -> MemoryKey:
        memory = DefaultShortTermMemory(config=cfg())
        await memory.add_turn(turn(1))
        await memory.add_turn(turn(2))
        private = memory.session_key
        assert private is not None
        await memory.persist(store, KEY)
        assert memory.key == target
        return private

    private = asyncio.run(scenario())
    adopted = [e for e in events_of(log, target) if isinstance(e, TurnsAdopted)]
    assert [(e.source, [t.user_message for t in e.turns]) for e in adopted] == [(private, ["u1", "u2"])]
    cleared = [e for e in events_of(log, private) if isinstance(e, SessionCleared)]
    assert [e.moved_to for e in cleared] == [target]
    assert all(check.ok for check in verify(log, None))


def test_a_move_cut_short_before_the_clear_loses_no_turn(log: InMemoryEventLog) -> None:
    """If the process stops after TurnsAdopted and before the clear, the key has the turns, once."""
    target = MemoryKey("acme", "alice", "chat-1")
    system = convmem.penguiflow.current_system()
    store = Store()  # it holds the key's memory (an earlier run persisted it)

    async def scenario() -> Any:
        earlier = DefaultShortTermMemory(config=cfg())
        await earlier.hydrate(store, KEY)
        await earlier.add_turn(turn(0))
        await earlier.persist(store, KEY)
        memory = DefaultShortTermMemory(config=cfg())
        await memory.add_turn(turn(1))
        private = memory.session_key
        assert private is not None
        state = system.session(private).snapshot_state()
        handle = system.async_session(target, config=memory.config)
        await handle.adopt(private, state.version, [r.turn for r in state.turns], idempotency_key="adopt/x")
        # ... the process dies here. A new memory on the key:
        fresh = DefaultShortTermMemory(config=cfg())
        await fresh.hydrate(store, KEY)
        return await fresh.get_llm_context()

    assert users(asyncio.run(scenario())) == ["u0", "u1"]


def test_a_state_penguiflow_saved_is_imported_once_as_one_session_restored(log: InMemoryEventLog) -> None:
    """Migration: hydrate imports PenguiFlow's saved state as one event, and never twice."""
    store = Store()
    target = MemoryKey("acme", "alice", "chat-1")

    async def scenario() -> Any:
        theirs = pf.DefaultShortTermMemory(config=cfg())
        await theirs.add_turn(turn(1))
        await theirs.persist(store, KEY)
        saved = dict(store.saved[KEY])
        first, second = DefaultShortTermMemory(config=cfg()), DefaultShortTermMemory(config=cfg())
        await asyncio.gather(first.hydrate(store, KEY), second.hydrate(store, KEY))
        assert "convmem" in store.saved[KEY]  # written back as convmem's
        store.saved[KEY] = saved  # the same PenguiFlow state again, as a stale store would give
        third = DefaultShortTermMemory(config=cfg())
        await third.hydrate(store, KEY)
        await third.add_turn(turn(2))
        return await third.get_llm_context()

    assert users(asyncio.run(scenario())) == ["u1", "u2"]
    restored = [e for e in events_of(log, target) if isinstance(e, SessionRestored)]
    assert len(restored) == 1
    assert restored[0].origin.startswith("penguiflow-state:sha256:")
    assert "convmem" in store.saved[KEY]  # written back as convmem's


def test_a_state_convmem_saved_never_overrides_the_log(log: InMemoryEventLog) -> None:
    """The log wins over convmem's own saved dict: nothing is imported while the log has the session."""
    store = Store()

    async def scenario() -> Any:
        memory = DefaultShortTermMemory(config=cfg())
        await memory.persist(store, KEY)
        await memory.add_turn(turn(1))
        await memory.add_turn(turn(2))  # the store's dict is now behind the log
        other = DefaultShortTermMemory(config=cfg())
        await other.hydrate(store, KEY)
        return await other.get_llm_context()

    assert users(asyncio.run(scenario())) == ["u1", "u2"]
    assert not [
        e for e in events_of(log, MemoryKey("acme", "alice", "chat-1")) if isinstance(e, SessionRestored)
    ]


@pytest.mark.parametrize(
    ("composite", "expected"),
    [
        ("acme:alice:chat-1", ("acme", "alice", "chat-1")),
        ("acme:user:42:chat-1", ("acme", "user:42", "chat-1")),
        ("acme:a:b:c:d", ("acme", "a:b:c", "d")),
        ("k", ("penguiflow:composite", "penguiflow:composite", "k")),
        ("acme::chat", ("penguiflow:composite", "penguiflow:composite", "acme::chat")),
    ],
)
def test_a_composite_maps_to_one_key_by_the_documented_rule(
    composite: str, expected: tuple[str, ...]
) -> None:
    """Tenant before the first ':', session after the last, user between; anything else kept whole."""
    assert key_from_composite(composite) == MemoryKey(*expected)


def test_ids_with_colons_keep_memory_on(log: InMemoryEventLog) -> None:
    """A user id holding ':' no longer turns memory off: the session is found again by the same rule."""
    store = Store()
    composite = pf.MemoryKey(tenant_id="acme", user_id="user:42", session_id="chat").composite()

    async def scenario() -> Any:
        memory = DefaultShortTermMemory(config=cfg())
        await memory.hydrate(store, composite)
        await memory.add_turn(turn(1))
        await memory.persist(store, composite)
        again = DefaultShortTermMemory(config=cfg())
        await again.hydrate(store, composite)
        return await again.get_llm_context()

    assert users(asyncio.run(scenario())) == ["u1"]
    assert MemoryKey("acme", "user:42", "chat") in stored_keys(log)


# The planner's summarizer on its loop --------------------------------------------------------


def test_a_summarizer_call_past_its_limit_is_cancelled_on_its_loop() -> None:
    """LoopSummarizer cancels the coroutine on the caller's loop when the limit passes, and says so."""
    cancelled = threading.Event()

    async def hanging(payload: dict[str, Any]) -> dict[str, str]:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return {"summary": "never"}

    async def scenario() -> BaseException:
        loop = CallerLoop()
        loop.capture()
        summarizer = LoopSummarizer(hanging, loop, timeout=0.05)
        outcome = await asyncio.to_thread(_call, summarizer)
        await asyncio.to_thread(cancelled.wait, WAIT)
        return outcome

    error = asyncio.run(scenario())
    assert isinstance(error, TimeoutError)
    assert "cancelled" in str(error)
    assert cancelled.is_set()


def _call(summarizer: Any) -> BaseException:
    try:
        summarizer({"previous_summary": "", "turns": []})
    except BaseException as exc:
        return exc
    raise AssertionError("the call did not fail")


def test_a_summarizer_whose_loop_stopped_runs_on_a_fresh_loop() -> None:
    """No wait on a loop that no longer runs: the call runs on a loop of its own."""

    async def summarizer(payload: dict[str, Any]) -> dict[str, str]:
        return {"summary": "fresh"}

    loop = CallerLoop()

    async def capture() -> None:
        loop.capture()

    asyncio.run(capture())  # that loop is closed now
    assert LoopSummarizer(summarizer, loop, timeout=WAIT)({"turns": []}) == {"summary": "fresh"}


# The embedded default ------------------------------------------------------------------------


def test_the_first_memory_opens_the_embedded_default_where_configured(tmp_path: Path) -> None:
    """No setup: the first memory starts the embedded server (data in the configured folder)."""
    convmem.penguiflow.configure(data_dir=tmp_path / "nats")
    try:

        async def scenario() -> Any:
            memory = DefaultShortTermMemory(config=cfg())
            await memory.add_turn(turn(1))
            return await memory.get_llm_context()

        assert users(asyncio.run(scenario())) == ["u1"]
        assert isinstance(convmem.penguiflow.current_system().log, JetStreamEventLog)
        assert (tmp_path / "nats").is_dir()
    finally:
        convmem.penguiflow.close()
        convmem.penguiflow.configure()


def test_the_environment_chooses_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """CONVMEM_NATS_URL (as convmem serve reads it) picks the log when configure() did not."""
    monkeypatch.setenv("CONVMEM_NATS_URL", "memory://")
    convmem.penguiflow.configure()
    try:
        assert isinstance(convmem.penguiflow.current_system().log, InMemoryEventLog)
    finally:
        convmem.penguiflow.close()


def test_a_memory_keeps_no_state_of_its_own_and_reads_a_passivated_session_from_the_log(
    log: InMemoryEventLog,
) -> None:
    """PenguiFlow's synchronous reads work on a passivated session; the memory object holds no turns."""
    store = Store()

    async def scenario() -> tuple[DefaultShortTermMemory, int]:
        memory = DefaultShortTermMemory(config=cfg())
        await memory.persist(store, KEY)
        await memory.add_turn(turn(1))
        return memory, memory.estimate_tokens()

    memory, tokens = asyncio.run(scenario())
    system = convmem.penguiflow.current_system()
    assert system.passivate(MemoryKey("acme", "alice", "chat-1"))
    assert not any(isinstance(value, SessionState) for value in vars(memory).values())
    assert memory.estimate_tokens() == tokens
    assert memory.health is pf.MemoryHealth.HEALTHY
    assert [t["user_message"] for t in memory.to_dict()["turns"]] == ["u1"]


def test_a_memory_holds_one_key(log: InMemoryEventLog) -> None:
    """PenguiFlow builds one memory per key: naming a second key is refused, nothing is moved."""

    async def scenario() -> None:
        memory = DefaultShortTermMemory(config=cfg())
        await memory.persist(Store(), KEY)
        await memory.persist(Store(), "acme:bob:chat-2")

    with pytest.raises(InvalidInput, match="acme:alice:chat-1"):
        asyncio.run(scenario())


# PenguiFlow's ReactPlanner building the memories ----------------------------------------------


class PlannerLLM:
    """Finishes every run at once; answers the planner's summary requests; keeps what each prompt showed."""

    def __init__(self) -> None:
        self.memories: list[dict[str, Any] | None] = []
        self.summaries = 0

    async def complete(self, *, messages: list[dict[str, Any]], response_format: Any = None, **_: Any) -> str:
        schema = ((response_format or {}).get("json_schema") or {}).get("name")
        if schema == "short_term_memory_summary":
            self.summaries += 1
            return json.dumps({"summary": "<session_summary>earlier turns</session_summary>"})
        shown = None
        for message in messages:
            content = message.get("content") or ""
            if message.get("role") == "system" and _OPEN in content:
                shown = json.loads(content[content.index(_OPEN) + len(_OPEN) : content.index(_CLOSE)])
        self.memories.append(shown)
        query = next(json.loads(m["content"])["query"] for m in messages if m.get("role") == "user")
        return json.dumps({"thought": "done", "next_node": None, "args": {"raw_answer": f"re: {query}"}})


_OPEN, _CLOSE = "<read_only_conversation_memory_json>", "</read_only_conversation_memory_json>"


@pytest.fixture
def installed(log: InMemoryEventLog) -> Iterator[InMemoryEventLog]:
    convmem.penguiflow.install()
    try:
        yield log
    finally:
        convmem.penguiflow.uninstall()


def planner(llm: PlannerLLM, config: Any, store: Any) -> Any:
    from penguiflow.planner import ReactPlanner  # noqa: PLC0415 (after install(), as a user's code runs)

    return ReactPlanner(llm_client=llm, catalog=[], short_term_memory=config, state_store=store)


def shown_users(memory: dict[str, Any] | None) -> list[str] | None:
    if memory is None:
        return None
    return [t["user"] for t in [*memory.get("pending_turns", []), *memory.get("recent_turns", [])]]


STORES = [pytest.param(lambda: None, id="no-store"), pytest.param(InMemoryStateStore, id="store")]


@pytest.mark.parametrize("make_store", STORES)
def test_the_planner_remembers_across_runs_per_key_and_fails_closed(
    installed: InMemoryEventLog, make_store: Any
) -> None:
    """Memory across runs, the key from tool_context, isolation by key, and no key means no memory."""
    llm = PlannerLLM()
    p = planner(llm, pf.ShortTermMemoryConfig(strategy="truncation"), make_store())
    alice = pf.MemoryKey(tenant_id="acme", user_id="alice", session_id="s1")

    async def scenario() -> None:
        await p.run("q1", memory_key=alice)
        await p.run("q2", tool_context={"tenant_id": "acme", "user_id": "alice", "session_id": "s1"})
        await p.run("q3", memory_key=pf.MemoryKey(tenant_id="acme", user_id="bob", session_id="s1"))
        await p.run("q4")

    asyncio.run(scenario())
    assert [shown_users(m) for m in llm.memories] == [[], ["q1"], [], None]
    assert all(isinstance(m, DefaultShortTermMemory) for m in p._memory_by_key.values())


@pytest.mark.parametrize("make_store", STORES)
def test_the_planners_own_summarizer_makes_the_rolling_summary(
    installed: InMemoryEventLog, make_store: Any
) -> None:
    """rolling_summary asks the planner's LLM (its summarizer), once per pending batch."""
    llm = PlannerLLM()
    config = pf.ShortTermMemoryConfig(strategy="rolling_summary", budget=pf.MemoryBudget(full_zone_turns=0))
    p = planner(llm, config, make_store())
    key = pf.MemoryKey(tenant_id="acme", user_id="alice", session_id="s1")

    async def scenario() -> int:
        await p.run("q1", memory_key=key)
        await p._memory_by_key[key.composite()].flush()
        await p.run("q2", memory_key=key)
        return llm.summaries  # q2's own summary has not started yet: it never holds the run up

    assert asyncio.run(scenario()) == 1
    assert llm.memories[-1] == {
        "recent_turns": [],
        "summary": "<session_summary>earlier turns</session_summary>",
    }


def test_a_planner_with_a_store_shares_the_session_with_a_new_planner(installed: InMemoryEventLog) -> None:
    """Two planners (as in two processes) on one key, one log and one state store see one conversation;
    a planner with a brand-new store starts a brand-new memory (the store decides, issue 25)."""
    first, second, third = PlannerLLM(), PlannerLLM(), PlannerLLM()
    config = pf.ShortTermMemoryConfig(strategy="truncation")
    key = pf.MemoryKey(tenant_id="acme", user_id="alice", session_id="s1")
    store = InMemoryStateStore()

    async def scenario() -> None:
        await planner(first, config, store).run("q1", memory_key=key)
        await planner(second, config, store).run("q2", memory_key=key)
        await planner(third, config, InMemoryStateStore()).run("q3", memory_key=key)

    asyncio.run(scenario())
    assert shown_users(second.memories[0]) == ["q1"]
    assert shown_users(third.memories[0]) == []


# The store decides whether a memory exists (issue 25, item 1) ----------------------------


def test_a_fresh_store_gives_a_fresh_memory_and_the_log_keeps_the_old_generation(
    log: InMemoryEventLog,
) -> None:
    """A key the state store holds no state for has no memory, whatever an earlier run left in the log;
    the old turns stay in the log (a SessionCleared starts the new generation), and the store records
    the generation it saved; PenguiFlow's own class reads it back."""
    first_store, second_store = Store(), Store()

    async def scenario() -> tuple[Any, ...]:
        earlier = DefaultShortTermMemory(config=cfg())
        await earlier.hydrate(first_store, KEY)
        await earlier.add_turn(turn(1))
        await earlier.add_turn(turn(2))
        await earlier.persist(first_store, KEY)
        again = DefaultShortTermMemory(config=cfg())  # the same store: the same memory
        await again.hydrate(first_store, KEY)
        same = await again.get_llm_context()
        fresh = DefaultShortTermMemory(config=cfg())  # a brand-new store: a brand-new memory
        await fresh.hydrate(second_store, KEY)
        empty = await fresh.get_llm_context()
        await fresh.add_turn(turn(3))
        await fresh.persist(second_store, KEY)
        back = pf.DefaultShortTermMemory(config=cfg())  # switching back to PenguiFlow
        await back.hydrate(second_store, KEY)
        repeat = DefaultShortTermMemory(config=cfg())  # the second store again: its memory, not the first's
        await repeat.hydrate(second_store, KEY)
        return (
            same,
            empty,
            await fresh.get_llm_context(),
            await back.get_llm_context(),
            await repeat.get_llm_context(),
        )

    same, empty, after, penguiflows, repeated = asyncio.run(scenario())
    assert users(same) == ["u1", "u2"]
    assert users(empty) == []
    assert users(after) == users(penguiflows) == users(repeated) == ["u3"]
    key = MemoryKey("acme", "alice", "chat-1")
    events = events_of(log, key)
    cleared = [e for e in events if isinstance(e, SessionCleared)]
    assert [e.reason for e in cleared] == [NEW_GENERATION]
    assert sum(isinstance(e, TurnAdded) for e in events) == 3  # the old generation's turns stay for audit
    assert first_store.saved[KEY]["convmem"]["generation"] == 0
    assert second_store.saved[KEY]["convmem"]["generation"] == cleared[0].seq


def test_an_empty_store_on_every_hydrate_writes_no_more_clears(log: InMemoryEventLog) -> None:
    """A memory that is already empty starts no generation: hydrating a key twice with nothing saved
    writes nothing, and a store that cannot save (persistence off) never clears."""

    async def scenario() -> None:
        for _ in range(2):
            memory = DefaultShortTermMemory(config=cfg())
            await memory.hydrate(Store(), KEY)
        kept = DefaultShortTermMemory(config=cfg())
        await kept.hydrate(Store(), KEY)
        await kept.add_turn(turn(1))
        loader = type("Loader", (), {"load_memory_state": Store.load_memory_state, "saved": {}})()
        other = DefaultShortTermMemory(config=cfg())
        await other.hydrate(loader, KEY)

    asyncio.run(scenario())
    events = events_of(log, MemoryKey("acme", "alice", "chat-1"))
    assert not any(isinstance(e, SessionCleared) for e in events)
