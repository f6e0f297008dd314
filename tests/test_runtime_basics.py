"""The runtime through `SessionHandle`: the seed protocol, errors, snapshots, poison, callbacks."""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any

import msgspec
import pytest
from runtime_helpers import (
    EchoSummarizer,
    Harness,
    PlannedSummarizer,
    key,
    live_state,
    logged_events,
    replay_log,
    stored_users,
    summarizing_config,
    turn,
    users,
    wait_until,
)

from convmem.actors import MemorySystem, Snapshot, load_state
from convmem.adapters import InMemoryEventLog
from convmem.errors import (
    InvalidConfig,
    InvalidInput,
    InvalidKey,
    InvalidTurn,
    MemoryBudgetExceeded,
    ReplayError,
    SessionClosed,
)
from convmem.events import (
    ConversationTurn,
    MemoryBudget,
    MemoryHealth,
    MemoryKey,
    SessionCleared,
    SessionStarted,
    ShortTermMemoryConfig,
    SummaryProduced,
    TurnAdded,
)
from convmem.projections import (
    encode_state,
    estimate_tokens,
    llm_context,
    snapshot_interval,
    snapshot_offset,
    state_hash,
)

TRUNCATION = ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=3))


def check_replay(system: MemorySystem, log: InMemoryEventLog, k: MemoryKey) -> None:
    assert live_state(system, k) == replay_log(log, k)


# The seed protocol --------------------------------------------------------------------------


def test_add_turn_numbers_turns_and_live_state_equals_replay_after_every_write(harness: Harness) -> None:
    """Each add_turn returns the turn's number once stored, and the live state then equals the replay."""
    system = harness.system(TRUNCATION)
    session = system.session(key())
    for i in range(1, 8):
        assert session.add_turn(turn(f"t{i}")) == i
        check_replay(system, harness.log, key())
    assert stored_users(harness.log, key()) == [f"t{i}" for i in range(1, 8)]
    assert isinstance(logged_events(harness.log, key())[0], SessionStarted)


def test_strategy_none_shows_nothing_but_stores_every_turn(harness: Harness) -> None:
    """Strategy none: the context is {} and costs 0 tokens, yet every turn is in the log."""
    system = harness.system(ShortTermMemoryConfig(strategy="none"))
    session = system.session(key())
    session.add_turn(turn("hello"))
    assert session.get_llm_context() == {}
    assert session.estimate_tokens() == 0
    assert stored_users(harness.log, key()) == ["hello"]
    check_replay(system, harness.log, key())


def test_strategy_truncation_shows_only_the_full_zone(harness: Harness) -> None:
    """Strategy truncation: the context holds the last full_zone_turns turns and no summary."""
    system = harness.system(TRUNCATION)
    session = system.session(key())
    for i in range(5):
        session.add_turn(turn(f"t{i}"))
    memory = session.get_llm_context()["conversation_memory"]
    assert [t["user"] for t in memory["recent_turns"]] == ["t2", "t3", "t4"]
    assert "summary" not in memory
    assert "pending_turns" not in memory
    state = replay_log(harness.log, key())
    assert session.estimate_tokens() == estimate_tokens(state) > 0
    assert session.get_llm_context() == llm_context(state)


def test_strategy_rolling_summary_summarizes_evicted_turns(harness: Harness) -> None:
    """Strategy rolling_summary: turns leaving the full zone end up in the summary, not in the context."""
    summarizer = EchoSummarizer()
    system = harness.system(summarizing_config(), summarizer=summarizer)
    session = system.session(key())
    for i in range(1, 6):
        session.add_turn(turn(f"t{i}"))
    session.flush(timeout=10)
    memory = session.get_llm_context()["conversation_memory"]
    assert memory["summary"] == "covers 3 turns; latest: t3"
    assert [t["user"] for t in memory["recent_turns"]] == ["t4", "t5"]
    assert "pending_turns" not in memory
    assert session.health is MemoryHealth.HEALTHY
    produced = [e for e in logged_events(harness.log, key()) if isinstance(e, SummaryProduced)]
    assert produced[-1].covers_through == 3
    check_replay(system, harness.log, key())


def test_health_property_reports_healthy_for_a_fresh_session(harness: Harness) -> None:
    """A fresh session reports HEALTHY without writing anything."""
    system = harness.system(TRUNCATION)
    assert system.session(key()).health is MemoryHealth.HEALTHY
    assert harness.log.last_seq(key()) == 0


def test_to_dict_then_from_dict_restores_the_content_elsewhere(harness: Harness) -> None:
    """from_dict(to_dict()) on another session gives the same export; both states equal their replays."""
    system = harness.system(TRUNCATION)
    source = system.session(key("a"))
    for i in range(5):
        source.add_turn(turn(f"t{i}"))
    exported = source.to_dict()
    target = system.session(key("b"))
    target.add_turn(turn("to be replaced"))
    target.from_dict(exported)
    assert target.to_dict()["turns"] == exported["turns"]
    assert target.get_llm_context() == source.get_llm_context()
    check_replay(system, harness.log, key("a"))
    check_replay(system, harness.log, key("b"))


@pytest.mark.parametrize(
    "bad",
    [
        "not a mapping",
        {"version": 99, "health": "healthy", "turns": []},
        {"version": 1, "health": "sick", "turns": []},
        {"version": 1, "health": "healthy", "summary": 7, "turns": []},
        {"version": 1, "health": "healthy", "turns": "nope"},
        {"version": 1, "health": "healthy", "turns": [{"user_message": 5}]},
    ],
)
def test_from_dict_rejects_an_invalid_export_and_changes_nothing(harness: Harness, bad: Any) -> None:
    """An invalid export raises ValueError and leaves the state and the log as they were."""
    system = harness.system(TRUNCATION)
    session = system.session(key())
    session.add_turn(turn("keep me"))
    before, last = session.snapshot_state(), harness.log.last_seq(key())
    with pytest.raises(ValueError):  # noqa: PT011 - the RFC promises ValueError, whatever the field
        session.from_dict(bad)
    assert session.snapshot_state() == before
    assert harness.log.last_seq(key()) == last


def test_clear_forgets_the_turns_but_the_log_keeps_them(harness: Harness) -> None:
    """clear() empties the context; the log keeps every turn and new turns get new numbers."""
    system = harness.system(TRUNCATION)
    session = system.session(key())
    for i in range(3):
        session.add_turn(turn(f"old{i}"))
    session.clear()
    assert session.get_llm_context() == {"conversation_memory": {"recent_turns": []}}
    assert session.to_dict()["turns"] == []
    assert session.add_turn(turn("new")) == 4
    assert users(session.snapshot_state()) == ["new"]
    assert stored_users(harness.log, key()) == ["old0", "old1", "old2", "new"]
    assert any(isinstance(e, SessionCleared) for e in logged_events(harness.log, key()))
    check_replay(system, harness.log, key())


# Errors ---------------------------------------------------------------------------------------


def test_error_overflow_policy_refuses_the_turn_and_stores_nothing(harness: Harness) -> None:
    """Policy error: a turn over total_max_tokens raises MemoryBudgetExceeded; log and state unchanged."""
    config = ShortTermMemoryConfig(
        strategy="truncation",
        budget=MemoryBudget(total_max_tokens=60, summary_max_tokens=30, overflow_policy="error"),
    )
    system = harness.system(config)
    session = system.session(key())
    session.add_turn(turn("small"))
    before, last = session.snapshot_state(), harness.log.last_seq(key())
    with pytest.raises(MemoryBudgetExceeded) as caught:
        session.add_turn(turn("x" * 400))
    assert caught.value.budget == 60
    assert harness.log.last_seq(key()) == last
    assert session.snapshot_state() == before
    assert stored_users(harness.log, key()) == ["small"]


def test_error_overflow_policy_on_a_fresh_session_does_not_even_start_it(harness: Harness) -> None:
    """A refused first turn leaves the log empty (no SessionStarted either)."""
    config = ShortTermMemoryConfig(
        strategy="truncation",
        budget=MemoryBudget(total_max_tokens=60, summary_max_tokens=30, overflow_policy="error"),
    )
    session = harness.system(config).session(key())
    with pytest.raises(MemoryBudgetExceeded):
        session.add_turn(turn("x" * 400))
    assert harness.log.last_seq(key()) == 0


def test_rolling_summary_without_a_summarizer_is_an_invalid_config(harness: Harness) -> None:
    """rolling_summary needs a summarizer: refused for the system and for one session."""
    with pytest.raises(InvalidConfig, match="summarizer"):
        MemorySystem(summarizing_config(), log=harness.log, clock=harness.clock)
    system = harness.system(TRUNCATION)
    with pytest.raises(InvalidConfig, match="summarizer"):
        system.session(key(), config=summarizing_config())


def test_bad_keys_and_turns_raise_invalid_input(harness: Harness) -> None:
    """Bad keys, turns and idempotency keys raise InvalidInput subclasses and store nothing."""
    system = harness.system(TRUNCATION)
    with pytest.raises(InvalidKey):
        MemoryKey("", "u", "s")
    with pytest.raises(InvalidKey):
        MemoryKey("t", "u\x00", "s")
    with pytest.raises(InvalidInput):
        system.session("acme:u:s")  # type: ignore[arg-type]
    with pytest.raises(InvalidTurn):
        ConversationTurn(user_message="", assistant_response="")
    session = system.session(key())
    with pytest.raises(InvalidInput):
        session.add_turn("a plain string")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        session.add_turn(turn("t"), idempotency_key="")
    with pytest.raises(InvalidInput):
        session.add_turn(turn("t"), idempotency_key="bad\nkey")
    assert harness.log.last_seq(key()) == 0


def test_calls_after_close_raise_session_closed(harness: Harness) -> None:
    """After close(), every call on a handle or the system raises SessionClosed."""
    system = harness.system(TRUNCATION)
    session = system.session(key())
    session.add_turn(turn("t"))
    system.close()
    assert system.closed
    with pytest.raises(SessionClosed):
        session.add_turn(turn("late"))
    with pytest.raises(SessionClosed):
        session.get_llm_context()
    with pytest.raises(SessionClosed):
        session.flush(timeout=5)
    with pytest.raises(SessionClosed):
        system.session(key("other"))
    assert stored_users(harness.log, key()) == ["t"]


def test_memory_system_is_a_context_manager(harness: Harness) -> None:
    """Leaving the with block closes the system."""
    with MemorySystem(TRUNCATION, log=harness.log, clock=harness.clock) as system:
        system.session(key()).add_turn(turn("inside"))
        assert system.live_sessions() == 1
    assert system.closed
    assert system.live_sessions() == 0
    with pytest.raises(SessionClosed):
        system.session(key())


# Snapshots ------------------------------------------------------------------------------------


def test_snapshots_are_saved_every_n_events_and_activation_from_them_equals_replay(harness: Harness) -> None:
    """A snapshot lands every snapshot_every events, at the session's own offset on that cadence;
    snapshot plus tail equals the full replay."""
    system = harness.system(TRUNCATION, snapshot_every=4)
    offset = snapshot_offset(key(), 4)
    session = system.session(key())

    def last_point(seq: int) -> int:  # the latest snapshot point at or below seq (0: none yet)
        point = seq - (seq - offset) % 4
        return point if point > 0 else 0

    for i in range(12):
        session.add_turn(turn(f"t{i}"))
        snapshot = harness.snapshots.load(key())
        last = harness.log.last_seq(key())
        assert (snapshot.seq if snapshot is not None else 0) == last_point(last)
    state, report = load_state(harness.log, harness.snapshots, key())
    assert report.snapshot_seq == last_point(13)
    assert report.events_applied == 13 - last_point(13)
    assert state == replay_log(harness.log, key())
    session.add_turn(turn("tail"))
    system.passivate(key())
    check_replay(system, harness.log, key())
    assert system.load(key())[1].snapshot_seq == last_point(14)


def test_a_session_with_many_live_turns_saves_snapshots_less_often(harness: Harness) -> None:
    """Given a cadence of 4 and a session keeping up to 40 live turns, when it grows to 80 turns, then
    once it holds more than 16 live turns it saves on a stretched cadence (`snapshot_interval`): far
    fewer saves than one every 4 events, each on a point of the plain cadence, and its snapshot plus
    the log's tail still equals the full replay."""
    config = ShortTermMemoryConfig(
        strategy="truncation", live_turns=40, budget=MemoryBudget(full_zone_turns=3)
    )
    system = harness.system(config, snapshot_every=4)
    offset = snapshot_offset(key(), 4)
    session = system.session(key())
    saved: list[int] = []
    for i in range(80):
        session.add_turn(turn(f"t{i}"))
        snapshot = harness.snapshots.load(key())
        if snapshot is not None and (not saved or saved[-1] != snapshot.seq):
            saved.append(snapshot.seq)
    assert all((seq - offset) % 4 == 0 for seq in saved)
    late = [seq for seq in saved if seq > 40]
    assert late
    assert all(b - a == snapshot_interval(4, 40) == 16 for a, b in itertools.pairwise(late))
    assert len(saved) < 81 // 4 - 2
    system.passivate(key())
    check_replay(system, harness.log, key())
    state, report = load_state(harness.log, harness.snapshots, key())
    assert report.snapshot_seq == saved[-1]
    assert state == replay_log(harness.log, key())


def test_sessions_started_together_save_their_snapshots_at_different_turns(harness: Harness) -> None:
    """Given two sessions started together that receive identical turns, when they pass the snapshot
    interval, then each saves at its own versions (no snapshot storm), never more than snapshot_every
    events apart, and after a restart both read back exactly the state their logs replay to."""
    every = 8
    first, second = key("a"), key("b")
    assert snapshot_offset(first, every) != snapshot_offset(second, every)  # given: different places
    system = harness.system(TRUNCATION, snapshot_every=every)
    saved: dict[MemoryKey, list[int]] = {first: [], second: []}
    for i in range(20):  # when: the same turns, in lockstep
        for k in (first, second):
            system.session(k).add_turn(turn(f"t{i}"))
            snapshot = harness.snapshots.load(k)
            if snapshot is not None and (not saved[k] or saved[k][-1] != snapshot.seq):
                saved[k].append(snapshot.seq)
    assert not set(saved[first]) & set(saved[second])  # then: never at the same version
    for k, points in saved.items():
        last = harness.log.last_seq(k)
        assert 0 < points[0] <= every  # the first within the interval
        assert all(b - a == every for a, b in itertools.pairwise(points))
        assert last - points[-1] < every  # and no more than the interval left unsaved
    system.close()
    restarted = harness.system(TRUNCATION, snapshot_every=every)
    for k in (first, second):
        state, report = restarted.load(k)
        assert report.snapshot_seq == saved[k][-1]
        assert state == replay_log(harness.log, k)
        assert users(restarted.session(k).snapshot_state()) == [f"t{i}" for i in range(20)]


def test_a_snapshot_with_a_wrong_hash_is_ignored(harness: Harness) -> None:
    """A snapshot whose hash does not match its state is ignored: activation replays the log."""
    system = harness.system(TRUNCATION, snapshot_every=1000)
    session = system.session(key())
    for i in range(4):
        session.add_turn(turn(f"t{i}"))
    real = session.snapshot_state()
    forged = msgspec.structs.replace(real, turns=real.turns[:1])
    harness.snapshots.save(
        Snapshot(key=key(), seq=real.version, state_hash=state_hash(real), data=encode_state(forged))
    )
    system.passivate(key())
    assert users(session.snapshot_state()) == ["t0", "t1", "t2", "t3"]
    check_replay(system, harness.log, key())
    assert system.load(key())[1].snapshot_rejected == "snapshot hash does not match its state"


def test_a_snapshot_that_does_not_decode_is_ignored(harness: Harness) -> None:
    """Snapshot bytes that are not a state are ignored: activation replays the log."""
    system = harness.system(TRUNCATION, snapshot_every=1000)
    session = system.session(key())
    for i in range(3):
        session.add_turn(turn(f"t{i}"))
    harness.snapshots.save(Snapshot(key=key(), seq=99, state_hash="0" * 64, data=b"\xc1not msgpack"))
    system.passivate(key())
    assert users(session.snapshot_state()) == ["t0", "t1", "t2"]
    check_replay(system, harness.log, key())
    assert system.load(key())[1].snapshot_rejected is not None


# Poison messages --------------------------------------------------------------------------------


def future_event(seq: int) -> bytes:
    """A well-formed event of a tag this version does not know."""
    return msgspec.msgpack.encode({"type": "future.x", "seq": seq, "event_id": f"f/{seq}", "at": 1.0})


def test_garbage_bytes_are_skipped_and_counted_with_on_poison_skip(harness: Harness) -> None:
    """on_poison=skip: undecodable bytes are skipped, counted, and the session goes on."""
    writer = harness.system(TRUNCATION)
    writer.session(key()).add_turn(turn("before"))
    harness.log.append_raw(key(), b"\xc1\xc1 garbage")
    reader = harness.system(TRUNCATION, on_poison="skip")
    session = reader.session(key())
    assert users(session.snapshot_state()) == ["before"]
    assert reader.metrics.snapshot()["counts"]["poison_events"] == 1
    assert session.add_turn(turn("after")) == 2
    assert users(session.snapshot_state()) == ["before", "after"]
    check_replay(reader, harness.log, key())


def test_an_unknown_future_event_is_skipped_without_a_gap(harness: Harness) -> None:
    """on_poison=skip: an event of an unknown tag is skipped; later writes follow its seq."""
    writer = harness.system(TRUNCATION)
    writer.session(key()).add_turn(turn("before"))
    harness.log.append_raw(key(), future_event(3), seq=3)
    session = writer.session(key())  # the live actor does not know about seq 3 yet: conflict path
    assert session.add_turn(turn("after")) == 2
    assert session.snapshot_state().version == 4
    check_replay(writer, harness.log, key())
    fresh = harness.system(TRUNCATION)
    assert users(fresh.session(key()).snapshot_state()) == ["before", "after"]
    assert fresh.metrics.snapshot()["counts"]["poison_events"] == 1


@pytest.mark.parametrize("poison", ["garbage", "future"])
def test_poison_raises_replay_error_naming_its_position_with_on_poison_stop(
    harness: Harness, poison: str
) -> None:
    """on_poison=stop: activating a session with poison raises ReplayError naming the log position."""
    writer = harness.system(TRUNCATION)
    writer.session(key()).add_turn(turn("before"))
    data = b"\xc1 garbage" if poison == "garbage" else future_event(3)
    position = harness.log.append_raw(key(), data, seq=None if poison == "garbage" else 3)
    strict = harness.system(TRUNCATION, on_poison="stop")
    with pytest.raises(ReplayError, match=f"position {position}"):
        strict.session(key()).add_turn(turn("after"))
    with pytest.raises(ReplayError, match=f"position {position}"):
        strict.session(key()).get_llm_context()
    assert stored_users(harness.log, key()) == ["before"]
    assert not strict.is_live(key())


# Idempotency ----------------------------------------------------------------------------------


@pytest.mark.parametrize("earlier_turns", [0, 2])
def test_a_retried_add_turn_with_the_same_idempotency_key_stores_the_turn_once(
    harness: Harness, earlier_turns: int
) -> None:
    """The same add_turn retried with its idempotency_key is stored once (first turn or later)."""
    system = harness.system(TRUNCATION)
    session = system.session(key())
    for i in range(earlier_turns):
        session.add_turn(turn(f"e{i}"))
    first = session.add_turn(turn("once"), idempotency_key="req-1")
    assert first == earlier_turns + 1
    assert session.add_turn(turn("once"), idempotency_key="req-1") == 0
    assert stored_users(harness.log, key()).count("once") == 1
    assert session.add_turn(turn("twice"), idempotency_key="req-2") == earlier_turns + 2
    check_replay(system, harness.log, key())


def test_an_idempotency_key_is_scoped_to_its_session(harness: Harness) -> None:
    """The same idempotency_key on two sessions stores a turn in each."""
    system = harness.system(TRUNCATION)
    assert system.session(key("a")).add_turn(turn("x"), idempotency_key="same") == 1
    assert system.session(key("b")).add_turn(turn("x"), idempotency_key="same") == 1
    assert stored_users(harness.log, key("b")) == ["x"]


def test_a_retry_after_the_first_attempt_timed_out_on_the_caller_stores_once(harness: Harness) -> None:
    """A caller that gave up waiting and retries with the same key still gets one stored turn."""
    system = harness.system(TRUNCATION)
    session = system.session(key())
    results = [session.add_turn(turn("t"), idempotency_key="k") for _ in range(3)]
    assert sorted(results) == [0, 0, 1]
    assert stored_users(harness.log, key()) == ["t"]


def test_a_retry_whose_decision_changed_since_still_stores_the_turn_once(harness: Harness) -> None:
    """A retry that now also trims the DEGRADED backlog is recognised as applied, not a conflict."""
    summarizer = PlannedSummarizer(default="fail")
    config = summarizing_config(retry_attempts=0, recovery_backlog_limit=1)
    system = harness.system(config, summarizer=summarizer)
    session = system.session(key())
    session.add_turn(turn("a"))
    session.add_turn(turn("b"))
    assert session.add_turn(turn("c"), idempotency_key="req") == 3
    wait_until(lambda: session.health is MemoryHealth.DEGRADED)
    session.add_turn(turn("d"))  # the backlog is now at its limit: the next turn trims it
    assert session.add_turn(turn("c"), idempotency_key="req", timeout=10) == 0
    assert stored_users(harness.log, key()) == ["a", "b", "c", "d"]
    check_replay(system, harness.log, key())


# Callbacks ------------------------------------------------------------------------------------


class Recorder:
    """Collects callback calls from any thread; tests wait on it with a timeout."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._cond = threading.Condition()

    def record(self, *args: Any) -> None:
        with self._cond:
            self.calls.append(args)
            self._cond.notify_all()

    def wait_for(self, n: int, timeout: float = 10) -> list[tuple[Any, ...]]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.calls) >= n, timeout), self.calls
            return list(self.calls)


def test_callbacks_fire_with_the_seed_arguments(harness: Harness) -> None:
    """on_turn_added(turn), on_summary_updated(old, new), on_health_changed(old, new) fire as events land."""
    turns, summaries, health = Recorder(), Recorder(), Recorder()
    summarizer = PlannedSummarizer("fail", "ok")
    system = harness.system(
        summarizing_config(),
        summarizer=summarizer,
        on_turn_added=turns.record,
        on_summary_updated=summaries.record,
        on_health_changed=health.record,
    )
    session = system.session(key())
    for i in range(3):
        session.add_turn(turn(f"t{i}"))
    assert sorted(c[0].user_message for c in turns.wait_for(3)) == ["t0", "t1", "t2"]
    assert health.wait_for(1) == [(MemoryHealth.HEALTHY, MemoryHealth.RETRY)]
    harness.clock.advance(2)
    session.flush(timeout=10)
    assert health.wait_for(2)[1] == (MemoryHealth.RETRY, MemoryHealth.HEALTHY)
    assert summaries.wait_for(1) == [("", "covers 1 turns; latest: t0")]


def test_callbacks_with_a_key_keyword_get_the_session_key(harness: Harness) -> None:
    """A callback that accepts `key` is called with the session's key."""
    turns = Recorder()

    def on_turn(t: ConversationTurn, *, key: MemoryKey) -> None:
        turns.record(t.user_message, key)

    system = harness.system(TRUNCATION, on_turn_added=on_turn)
    system.session(key("a")).add_turn(turn("x"))
    system.session(key("b")).add_turn(turn("y"))
    assert sorted(turns.wait_for(2)) == [("x", key("a")), ("y", key("b"))]


def test_async_callbacks_are_awaited(harness: Harness) -> None:
    """Coroutine callbacks run to completion (with and without `key`)."""
    plain, keyed = Recorder(), Recorder()

    async def on_turn(t: ConversationTurn) -> None:
        await asyncio.sleep(0)
        plain.record(t.user_message)

    async def on_health(old: MemoryHealth, new: MemoryHealth, key: MemoryKey) -> None:
        await asyncio.sleep(0)
        keyed.record(old, new, key)

    system = harness.system(
        summarizing_config(),
        summarizer=PlannedSummarizer(default="fail"),
        on_turn_added=on_turn,
        on_health_changed=on_health,
    )
    session = system.session(key())
    for i in range(3):
        session.add_turn(turn(f"t{i}"))
    assert sorted(plain.wait_for(3)) == [("t0",), ("t1",), ("t2",)]
    assert keyed.wait_for(1)[0] == (MemoryHealth.HEALTHY, MemoryHealth.RETRY, key())


def test_a_raising_callback_is_swallowed_and_the_session_keeps_working(harness: Harness) -> None:
    """A callback that raises is logged and ignored; writes and later callbacks go on."""
    calls = Recorder()

    def explode(t: ConversationTurn) -> None:
        calls.record(t.user_message)
        raise RuntimeError("callback bug")

    system = harness.system(TRUNCATION, on_turn_added=explode)
    session = system.session(key())
    for i in range(5):
        assert session.add_turn(turn(f"t{i}")) == i + 1
    assert len(calls.wait_for(5)) == 5
    assert users(session.snapshot_state()) == [f"t{i}" for i in range(5)]
    check_replay(system, harness.log, key())


def test_turn_added_events_carry_the_turn_stored(harness: Harness) -> None:
    """The stored TurnAdded holds exactly the turn the planner passed."""
    system = harness.system(TRUNCATION)
    original = ConversationTurn(user_message="q", assistant_response="a", ts=12.5)
    system.session(key()).add_turn(original)
    added = [e for e in logged_events(harness.log, key()) if isinstance(e, TurnAdded)]
    assert [e.turn for e in added] == [original]
