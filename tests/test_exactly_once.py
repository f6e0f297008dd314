"""Exactly-once for an idempotency key, however long after the first try and in every process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from log_faults import wait_past_duplicate_window
from nats_fixtures import JetStreamNames
from runtime_helpers import Harness, key, turn

from convmem.actors import MemorySystem
from convmem.adapters import EmbeddedNatsServer, JetStreamEventLog, JetStreamSnapshotStore
from convmem.errors import InvalidConfig
from convmem.events import AnyEvent, MemoryKey, ShortTermMemoryConfig, TurnAdded, decode_event
from convmem.projections import (
    AddTurn,
    Clear,
    Command,
    SessionState,
    command_id_for,
    decide,
    decode_state,
    encode_state,
    evolve,
    replay,
)

KEY = MemoryKey("acme", "u@example.com", "s")
CONFIG = ShortTermMemoryConfig(strategy="truncation")


def _write(state: SessionState, command: Command, command_id: str, now: float = 1.0) -> SessionState:
    return replay(decide(state, command, now=now, command_id=command_id, key=KEY, config=CONFIG), state=state)


def _stored_turns(events: list[AnyEvent]) -> list[str]:
    return [e.turn.user_message for e in events if isinstance(e, TurnAdded)]


# The decision --------------------------------------------------------------------------------


def test_a_keyed_write_repeated_after_many_others_decides_nothing() -> None:
    """decide answers a repeat with no events, whatever came in between (within the horizon)."""
    state = _write(SessionState(), AddTurn(turn=turn("once")), command_id_for(KEY, "req-1"))
    for n in range(50):
        state = _write(state, AddTurn(turn=turn(f"other {n}")), f"{n:032x}")
    assert decide(state, AddTurn(turn=turn("once")), now=9e9, command_id=command_id_for(KEY, "req-1")) == []
    assert decide(state, AddTurn(turn=turn("new")), now=9e9, command_id=command_id_for(KEY, "req-2")) != []


def test_the_horizon_counts_keyed_writes_and_forgets_the_oldest() -> None:
    """With idempotency_horizon=N the session remembers its last N keyed writes, no more."""
    config = ShortTermMemoryConfig(strategy="truncation", idempotency_horizon=3)
    state = SessionState()
    for n in range(5):
        events = decide(
            state,
            AddTurn(turn=turn(f"t{n}")),
            now=1.0,
            command_id=command_id_for(KEY, f"k{n}"),
            key=KEY,
            config=config,
        )
        state = replay(events, state=state)
    assert state.idempotency_keys == ("k2", "k3", "k4")
    forgotten = decide(state, AddTurn(turn=turn("t0")), now=2.0, command_id=command_id_for(KEY, "k0"))
    assert _stored_turns(forgotten) == ["t0"]
    assert decide(state, AddTurn(turn=turn("t2")), now=2.0, command_id=command_id_for(KEY, "k2")) == []


def test_writes_without_a_key_and_another_sessions_ids_are_not_remembered() -> None:
    """Only this session's keyed writes take room in the state (a caller cannot retry a random id)."""
    state = _write(SessionState(), AddTurn(turn=turn("a")), "0" * 32)
    other = MemoryKey("acme", "u@example.com", "other")
    state = _write(state, AddTurn(turn=turn("b")), command_id_for(other, "req"))
    assert state.idempotency_keys == ()


def test_a_negative_horizon_is_refused_naming_the_field() -> None:
    """A bad idempotency_horizon is InvalidConfig naming it; the default is the README's 256."""
    assert ShortTermMemoryConfig().idempotency_horizon == 256
    with pytest.raises(InvalidConfig, match="idempotency_horizon"):
        ShortTermMemoryConfig(idempotency_horizon=-1)


def test_the_remembered_keys_survive_a_snapshot_round_trip() -> None:
    """A state decoded from its snapshot bytes still refuses the repeat."""
    state = _write(SessionState(), AddTurn(turn=turn("once")), command_id_for(KEY, "req-1"))
    restored = decode_state(encode_state(state))
    assert restored == state
    assert restored.idempotency_keys == ("req-1",)
    assert (
        decide(restored, AddTurn(turn=turn("once")), now=5.0, command_id=command_id_for(KEY, "req-1")) == []
    )


_commands = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d", None]), st.sampled_from(["turn", "clear"])),
    max_size=25,
)


@given(_commands, st.integers(min_value=0, max_value=24))
def test_repeats_of_any_command_id_never_change_the_state(
    plan: list[tuple[str | None, str]], snapshot_at: int
) -> None:
    """Replaying a plan where keyed writes repeat gives the state of the plan without the repeats.

    The fold goes through a snapshot round trip at a point of the plan, as a new process would.
    """
    state, deduplicated = SessionState(), SessionState()
    seen: set[str] = set()
    for n, (idempotency_key, kind) in enumerate(plan):
        command: Command = AddTurn(turn=turn(f"{idempotency_key}-{n}")) if kind == "turn" else Clear()
        command_id = command_id_for(KEY, idempotency_key) if idempotency_key else f"{n:032x}"
        if n == snapshot_at:
            state = decode_state(encode_state(state))
        before = state
        state = _write(state, command, command_id, now=float(n))
        if idempotency_key in seen:
            assert state is before  # nothing decided, nothing applied
            continue
        if idempotency_key is not None:
            seen.add(idempotency_key)
        deduplicated = _write(deduplicated, command, command_id, now=float(n))
    assert state == deduplicated


# Through a real JetStream stream, past its duplicate window ----------------------------------


@pytest.fixture
def short_window(
    nats_server: EmbeddedNatsServer, jetstream_names: JetStreamNames
) -> Iterator[JetStreamEventLog]:
    """A log whose stream forgets message ids after 0.3 s."""
    log = JetStreamEventLog.connect(
        nats_server.url, stream=jetstream_names.stream, prefix=jetstream_names.prefix, duplicate_window=0.3
    )
    yield log
    log.close()


def test_a_retry_after_the_duplicate_window_is_stored_once_in_every_process(
    nats_server: EmbeddedNatsServer, jetstream_names: JetStreamNames, short_window: JetStreamEventLog
) -> None:
    """The same keyed add_turn, retried once the stream forgot its id, stores nothing: in the process
    that wrote it, and in a new one (activated from a snapshot, and from the log alone)."""
    snapshots = JetStreamSnapshotStore.connect(nats_server.url, bucket=jetstream_names.bucket)
    probe = short_window.subject(MemoryKey("probe", "probe", "probe"))
    try:
        first = MemorySystem(CONFIG, log=short_window, snapshots=snapshots, snapshot_every=1)
        try:
            session = first.session(key())
            assert session.add_turn(turn("once"), idempotency_key="req-1") == 1
            assert session.add_turn(turn("then"), idempotency_key="req-2") == 2
            wait_past_duplicate_window(nats_server.url, probe)
            assert session.add_turn(turn("once"), idempotency_key="req-1") == 0
        finally:
            first.close()
        for store in (snapshots, None):  # a new process: from its snapshot, then from the log alone
            again = MemorySystem(CONFIG, log=short_window, snapshots=store)
            try:
                assert again.session(key()).add_turn(turn("once"), idempotency_key="req-1") == 0
                assert again.session(key()).add_turn(turn("then"), idempotency_key="req-2") == 0
            finally:
                again.close()
        stored = [decode_event(r.data) for r in short_window.read(key())]
        assert _stored_turns(stored) == ["once", "then"]
    finally:
        snapshots.close()


def test_the_in_memory_log_stores_a_late_retry_once_too(harness: Harness) -> None:
    """The same promise on the in-memory log, from a new system on the same log."""
    first = harness.system(CONFIG)
    assert first.session(key()).add_turn(turn("once"), idempotency_key="req-1") == 1
    first.close()
    again = harness.system(CONFIG)
    assert again.session(key()).add_turn(turn("once"), idempotency_key="req-1") == 0


@given(
    st.lists(st.sampled_from(["a", "b", "c", "d", None]), max_size=30),
    st.integers(min_value=0, max_value=4),
    st.integers(min_value=0, max_value=30),
)
def test_a_replay_remembers_what_evolve_remembers_event_by_event(
    plan: list[str | None], horizon: int, cut: int
) -> None:
    """replay's fast path (runs of turns) remembers the same keys as evolve applied one event at a time,
    with repeats, writes without a key, a small horizon and a summary-like event cutting the run."""
    config = ShortTermMemoryConfig(strategy="truncation", idempotency_horizon=horizon)
    events: list[AnyEvent] = []
    state = SessionState()
    for n, idempotency_key in enumerate(plan):
        command: Command = Clear() if n == cut else AddTurn(turn=turn(f"t{n}"))
        # The same key may come back in a history (a horizon ago): decide it on a state that forgot it.
        command_id = command_id_for(KEY, idempotency_key) if idempotency_key else f"{n:032x}"
        decided = decide(
            SessionState() if not state.started else msgspec.structs.replace(state, idempotency_keys=()),
            command,
            now=float(n),
            command_id=command_id,
            key=KEY,
            config=config,
        )
        events.extend(decided)
        state = replay(decided, state=state)
    one_by_one = SessionState()
    for event in events:
        one_by_one = evolve(one_by_one, event)
    assert replay(events) == one_by_one
    assert len(one_by_one.idempotency_keys) <= horizon


def test_an_async_retry_after_the_duplicate_window_is_stored_once(
    nats_server: EmbeddedNatsServer, short_window: JetStreamEventLog
) -> None:
    """The same promise through `AsyncSessionHandle`, the session live throughout."""
    probe = short_window.subject(MemoryKey("probe", "probe", "probe"))

    async def planner(system: MemorySystem) -> tuple[int, int]:
        session = system.async_session(key())
        first = await session.add_turn(turn("once"), idempotency_key="req-1")
        await asyncio.to_thread(wait_past_duplicate_window, nats_server.url, probe)
        return first, await session.add_turn(turn("once"), idempotency_key="req-1")

    with MemorySystem(CONFIG, log=short_window) as system:
        assert asyncio.run(planner(system)) == (1, 0)
    assert _stored_turns([decode_event(r.data) for r in short_window.read(key())]) == ["once"]
