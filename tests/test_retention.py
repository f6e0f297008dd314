"""Retention: idle sessions erased, long histories compacted to their summary and newest turns.

Every sweep runs at a `ManualClock`'s time; nothing sleeps. The sweeps run
against the in-memory log and a JetStream stream on a real nats-server.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import nats
import pytest
from nats_fixtures import JetStreamNames
from runtime_helpers import (
    EchoSummarizer,
    key,
    live_state,
    run_threads,
    summarizing_config,
    turn,
    wait_until,
)

import convmem
from convmem.actors import (
    EventLog,
    ManualClock,
    MemorySystem,
    SnapshotStore,
    load_state,
    sweep_retention,
    timeline,
    verify,
)
from convmem.actors._retention import _NO_ERASER
from convmem.adapters import (
    EmbeddedNatsServer,
    InMemoryEventLog,
    InMemorySnapshotStore,
    JetStreamBackend,
    JetStreamEventLog,
    RemoteMemory,
)
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.backends.keys import KeySettings
from convmem.adapters.frontends.cli._main import main
from convmem.errors import InvalidConfig, InvalidInput, StoreNotFound
from convmem.events import (
    ConversationTurn,
    EntityMention,
    Event,
    HistoryCompacted,
    MemoryKey,
    RetentionPolicies,
    RetentionPolicy,
    SessionErased,
    SessionRepaired,
    SessionStarted,
    ShortTermMemoryConfig,
    TurnAdded,
    decode_event,
    format_duration,
    parse_duration,
)
from convmem.projections import (
    RetentionOutcome,
    RetentionProblem,
    RetentionReport,
    SessionState,
    compacted_state,
    compaction,
    encode_state,
    evolve,
    history_facts,
    plan_retention,
    replay,
    without_horizon,
)

DAY = 86_400.0
START = 1_765_000_000.0
TRUNCATION = ShortTermMemoryConfig(strategy="truncation")


# Policies: readable durations, hostile settings named --------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90d", 90 * DAY), ("12h", 43_200.0), ("1d12h", 1.5 * DAY), ("2w", 14 * DAY), ("45s", 45.0), (30, 30.0)],
)
def test_durations_read_as_people_write_them(text: object, seconds: float) -> None:
    """A number is seconds; text is numbers with units w, d, h, m, s."""
    assert parse_duration(text, field="idle") == seconds


def test_durations_print_back_readably() -> None:
    """A duration is shown as days, hours, minutes and seconds."""
    assert format_duration(90 * DAY) == "90d"
    assert format_duration(1.5 * DAY + 30) == "1d12h30s"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"default": {"idle": "soon"}}, "retention.default.idle"),
        ({"default": {"idle": "-3d"}}, "retention.default.idle"),
        ({"default": {"idle": 0}}, "retention.default.idle"),
        ({"default": {"idle": 30}}, "retention.default.idle"),  # no unit: days? seconds? refused
        ({"tenants": {"acme": {"max_age": 180.0}}}, "retention.tenants.acme.max_age"),
        ({"default": {"idle": float("nan")}}, "retention.default.idle"),
        ({"default": {"idle": True}}, "retention.default.idle"),
        ({"default": {"max_age": "100000w"}}, "retention.default.max_age"),
        ({"default": {"max_turns": 0}}, "retention.default.max_turns"),
        ({"default": {"max_turns": "ten"}}, "retention.default.max_turns"),
        ({"default": {"max_events": 2.5}}, "retention.default.max_events"),
        ({"default": {"idel": "3d"}}, "retention.default.idel"),
        ({"default": ["idle"]}, "retention.default"),
        ({"tenants": {"acme": {"idle": "1y"}}}, "retention.tenants.acme.idle"),
        ({"tenants": ["acme"]}, "retention.tenants"),
        ({"tenants": {"": {"idle": "1d"}}}, "retention.tenants"),
        ({"sweep_every": "-1h"}, "retention.sweep_every"),
        ({"sweeps": "1h"}, "retention.sweeps"),
        ("idle=3d", "retention"),
    ],
)
def test_a_hostile_policy_is_refused_naming_its_key(data: object, field: str) -> None:
    """Each bad setting raises InvalidConfig whose field is the key as written in the file."""
    with pytest.raises(InvalidConfig) as caught:
        RetentionPolicies.parse(data)
    assert caught.value.field == field


def test_a_system_refuses_hostile_policies_before_it_starts(harness_log: InMemoryEventLog) -> None:
    """MemorySystem(retention=...) checks a mapping as the file is checked, naming the key."""
    with pytest.raises(InvalidConfig, match=r"retention\.tenants\.acme\.max_turns"):
        MemorySystem(log=harness_log, retention={"tenants": {"acme": {"max_turns": -1}}})


def test_a_tenant_policy_replaces_the_default_whole() -> None:
    """A tenant with a policy of its own is swept by it alone; others by the default."""
    policies = RetentionPolicies.parse(
        {"retention": {"default": {"idle": "30d"}, "tenants": {"acme": {"max_turns": 5}}}}
    )
    assert policies.for_tenant("acme") == RetentionPolicy(max_turns=5)
    assert policies.for_tenant("other") == RetentionPolicy(idle=30 * DAY)
    assert RetentionPolicies().empty


@pytest.fixture
def harness_log() -> InMemoryEventLog:
    return InMemoryEventLog()


# The fold of a compaction --------------------------------------------------------------


def rich_system(log: EventLog, snapshots: SnapshotStore | None, clock: ManualClock) -> MemorySystem:
    """A summarizing system (summaries land at once) on `log`."""
    return MemorySystem(
        summarizing_config(full_zone_turns=2),
        log=log,
        snapshots=snapshots,
        summarizer=EchoSummarizer(),
        clock=clock,
        snapshot_every=3,
        timeout=15.0,
    )


def chat(system: MemorySystem, k: MemoryKey, count: int, clock: ManualClock, *, first: int = 0) -> None:
    """`count` turns, an hour apart, with entities and idempotency keys; waits for the summaries."""
    session = system.session(k)
    for n in range(first, first + count):
        mention = EntityMention(name=f"item-{n % 3}", kind="thing", attributes={"n": str(n)})
        session.add_turn(
            ConversationTurn(user_message=f"turn {n}", assistant_response=f"ok {n}", entities=(mention,)),
            idempotency_key=f"req-{n}",
        )
        # The summarizer's timeout runs on this clock: an hour passing while a summary is under way
        # would time it out, so the clock moves only once the session is quiet.
        wait_until(lambda: quiet(system, k), message="the session went quiet")
        clock.advance(3600)
    wait_until(lambda: settled(system, k), message="the summaries landed")


def quiet(system: MemorySystem, k: MemoryKey) -> bool:
    """Nothing under way in the session: no summary asked for, no message queued."""
    activity = system.activity(k)
    return activity is None or not (activity.summarizing or activity.busy or activity.flushes_waiting)


def settled(system: MemorySystem, k: MemoryKey) -> bool:
    """The session has a summary and nothing under way (no summary asked for, no message queued)."""
    return quiet(system, k) and bool(live_state(system, k).summary)


def test_a_compaction_that_keeps_every_turn_changes_nothing_but_the_version() -> None:
    """The fold of a compaction of a state to all its turns is that state (summary, health, entities,
    idempotency keys, last_at): the event carries everything the fold needs."""
    log, clock = InMemoryEventLog(), ManualClock(START)
    with rich_system(log, None, clock) as system:
        chat(system, key(), 9, clock)
        state = live_state(system, key())
    assert state.summary
    assert state.retired_entities.entities == ()
    assert state.idempotency_keys
    event = compaction(state, state.turns, event_id="retention/x", at=START + 99 * DAY)
    after = evolve(state, event)
    assert after == msgspec.structs.replace(state, version=state.version + 1)
    assert after.last_at == state.last_at  # a compaction is not activity
    assert decode_event(msgspec.msgpack.encode(event)) == event


def test_a_compaction_keeps_the_summary_and_the_newest_turns_and_the_entities_of_the_rest() -> None:
    """Dropped turns leave the state as the horizon retires turns: their entities stay counted."""
    log, clock = InMemoryEventLog(), ManualClock(START)
    with rich_system(log, None, clock) as system:
        chat(system, key(), 9, clock)
        state = live_state(system, key())
    after = compacted_state(compaction(state, state.turns[-2:], event_id="retention/x", at=START))
    assert [r.turn.user_message for r in after.turns] == ["turn 7", "turn 8"]
    assert after.summary == state.summary
    assert after.next_index == state.next_index
    assert after.retired_through == state.turns[-3].index
    mentions = {e.name: e.mentions for e in after.retired_entities.entities}
    assert mentions == {"item-0": 3, "item-1": 2, "item-2": 2}
    with pytest.raises(InvalidInput, match="newest turns"):
        compaction(state, state.turns[:2], event_id="retention/x", at=START)


def six_daily_turns() -> tuple[InMemoryEventLog, ManualClock, SessionState]:
    """Turns "t0" to "t5" a day apart from START, in memory: the log, the clock and the state."""
    log, clock = InMemoryEventLog(), ManualClock(START)
    with MemorySystem(TRUNCATION, log=log, clock=clock) as system:
        for n in range(6):
            system.session(key()).add_turn(turn(f"t{n}"))
            clock.advance(DAY)
        state = live_state(system, key())
    return log, clock, state


def test_the_plan_follows_the_policy() -> None:
    """Idle past the limit: erase; over a cap: compact to the caps; within them: nothing."""
    log, _clock, state = six_daily_turns()
    events = [decode_event(r.data) for r in log.read(key())]
    facts = history_facts(events)
    assert (facts.events, facts.first_index, facts.oldest_at) == (7, 1, START)
    now = START + 6 * DAY
    assert plan_retention(state, facts, RetentionPolicy(idle=2 * DAY), now) is None
    erase = plan_retention(state, facts, RetentionPolicy(idle=0.5 * DAY), now)
    assert erase is not None
    assert "idle for 1d" in erase.reason
    by_turns = plan_retention(state, facts, RetentionPolicy(max_turns=4), now)
    assert by_turns is not None
    assert [r.turn.user_message for r in by_turns.keep] == ["t2", "t3", "t4", "t5"]
    by_age = plan_retention(state, facts, RetentionPolicy(max_age=2.5 * DAY), now)
    assert by_age is not None
    assert [r.turn.user_message for r in by_age.keep] == ["t4", "t5"]
    assert plan_retention(state, facts, RetentionPolicy(max_events=7, max_turns=6), now) is None


def test_a_history_opened_by_a_repair_counts_from_the_turns_it_restored() -> None:
    """After an operator's repair, the stored turns are those of the restored state and what follows."""
    log, clock, state = six_daily_turns()
    kept = msgspec.structs.replace(state, turns=state.turns[-2:])
    repaired = SessionRepaired(
        seq=state.version + 1,
        event_id="repair/1",
        at=clock.now(),
        state=encode_state(kept),
        method="cut",
        restored_seq=state.version,
    )
    facts = history_facts([decode_event(r.data) for r in log.read(key())] + [repaired])
    assert (facts.events, facts.first_index, facts.oldest_at, facts.unfinished) == (
        1,
        5,
        START + 4 * DAY,
        None,
    )


def test_a_sweep_s_report_counts_what_was_done_and_says_it_in_one_line() -> None:
    """Given outcomes done, skipped and unreadable sessions, when the report is read, then only what
    was carried out counts (a dry run counts what it planned), and the line says both."""
    k = key()
    outcomes = [
        RetentionOutcome(key=k, action="erase", reason="idle", done=True, events_removed=4),
        RetentionOutcome(
            key=k, action="compact", reason="cap", events_removed=9, skipped="written meanwhile"
        ),
        RetentionOutcome(key=k, action="finish", reason="left", done=True, events_removed=2),
    ]
    problems = [RetentionProblem(key=k, problem="poison")]
    report = RetentionReport(dry_run=False, at=START, sessions=5, outcomes=outcomes, problems=problems)
    assert (report.count("erase"), report.count("compact"), report.count("finish")) == (1, 0, 1)
    assert report.skipped == 1
    assert report.summary() == (
        "5 session(s) examined; did erase 1, compact 0, finish 1 compaction(s); 6 event(s) removed; "
        "1 skipped, 1 unreadable"
    )
    planned = [msgspec.structs.replace(o, done=False, skipped=None) for o in outcomes]
    dry = RetentionReport(dry_run=True, at=START, sessions=5, outcomes=planned)
    assert dry.count("compact") == 1
    assert dry.summary().startswith("5 session(s) examined; would erase 1, compact 1, finish 1")
    assert "15 event(s) to remove; 0 skipped" in dry.summary()


# Sweeping a real log ---------------------------------------------------------------------


@dataclass
class Store:
    """A log and snapshot store, and a way to open another handle on them (another process)."""

    log: EventLog
    snapshots: SnapshotStore
    other: Callable[[], tuple[EventLog, SnapshotStore]]


@pytest.fixture(params=["memory", "jetstream"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "memory":
        log, snapshots = InMemoryEventLog(), InMemorySnapshotStore()
        yield Store(log, snapshots, lambda: (log, snapshots))
        return
    server: EmbeddedNatsServer = request.getfixturevalue("nats_server_shared")
    names: JetStreamNames = request.getfixturevalue("jetstream_names")
    opened: list[JetStreamBackend] = []

    def connect() -> tuple[EventLog, SnapshotStore]:
        backend = JetStreamBackend.connect(
            server.url, stream=names.stream, prefix=names.prefix, bucket=names.bucket, timeout=15.0
        )
        opened.append(backend)
        assert backend.snapshots is not None
        return backend.log, backend.snapshots

    log, snapshots = connect()
    try:
        yield Store(log, snapshots, connect)
    finally:
        for backend in opened:
            backend.close()


def stored(log: EventLog, k: MemoryKey) -> list[tuple[int, int | None, bytes]]:
    """The session's records as they are stored: position, seq, bytes."""
    return [(r.position, r.seq, r.data) for r in log.read(k)]


def texts(log: EventLog, k: MemoryKey) -> bytes:
    return b"".join(r.data for r in log.read(k))


IDLE = RetentionPolicies(default=RetentionPolicy(idle=30 * DAY))


def test_idle_sessions_are_erased_and_active_ones_kept(store: Store) -> None:
    """A session with no event for longer than `idle` goes through erasure (events and snapshot);
    one written within it stays as it was."""
    clock = ManualClock(START)
    old, fresh = key("old"), key("fresh")
    with MemorySystem(
        TRUNCATION, log=store.log, snapshots=store.snapshots, clock=clock, snapshot_every=2
    ) as system:
        system.session(old).add_turn(turn("old secret ZQX-OLD"))
        system.session(old).add_turn(turn("old again"))
        clock.advance(20 * DAY)
        system.session(fresh).add_turn(turn("fresh"))
        clock.advance(15 * DAY)
        before = stored(store.log, fresh)
        report = system.sweep_retention(policies=IDLE)
        assert [(o.key, o.action, o.done) for o in report.outcomes] == [(old, "erase", True)]
        assert report.outcomes[0].events_removed == 3
        assert store.log.read(old) == []
        assert store.log.keys() == [fresh]
        assert store.snapshots.load(old) is None
        assert system.session(old).get_llm_context() == {"conversation_memory": {"recent_turns": []}}
        assert stored(store.log, fresh) == before


def erase_with(system: MemorySystem) -> Callable[[MemoryKey], int]:
    """The system's journaled erasure, as a sweep takes it."""
    return lambda k: system.erase(k, by="test").events_purged


def test_a_session_written_after_the_decision_is_kept() -> None:
    """The erasure is conditional on the event the decision saw: a turn written meanwhile wins."""
    clock = ManualClock(START)

    class WrittenMeanwhile(InMemoryEventLog):
        """Right after the sweep reads the session, its planner writes a turn."""

        armed = False

        def read(self, k: MemoryKey, *, after_seq: int = 0) -> list:  # type: ignore[type-arg]
            records = super().read(k, after_seq=after_seq)
            if self.armed:
                self.armed = False
                writer.session(k).add_turn(turn("back after a month"))
            return records

    log = WrittenMeanwhile()
    with MemorySystem(TRUNCATION, log=log, clock=clock) as writer:
        writer.session(key()).add_turn(turn("before"))
        clock.advance(40 * DAY)
        log.armed = True
        report = sweep_retention(log, IDLE, now=clock.now(), dry_run=False, erase=erase_with(writer))
        assert report.outcomes[0].skipped == "written meanwhile: kept"
        assert [r.turn.user_message for r in live_state(writer, key()).turns] == [
            "before",
            "back after a month",
        ]
        assert load_state(log, None, key())[0] == live_state(writer, key())


def test_a_session_begun_again_over_the_fence_is_kept_and_its_idle_history_dropped() -> None:
    """A planner that writes right after the sweep's fence begins the session again above it: the
    sweep then drops only the idle history before the fence, never the new turn."""
    clock = ManualClock(START)

    class BegunAgain(InMemoryEventLog):
        """Right after the sweep's fence is stored, the planner writes a turn."""

        def append(self, k: MemoryKey, events: Sequence[Event], *, expected_seq: int) -> int:
            last = super().append(k, events, expected_seq=expected_seq)
            if any(e.event_id.startswith("erased/retention/") for e in events):
                writer.session(k).add_turn(turn("back after a month"))
            return last

    log = BegunAgain()
    with MemorySystem(TRUNCATION, log=log, clock=clock) as writer:
        writer.session(key()).add_turn(turn("idle secret ZQX"))
        clock.advance(40 * DAY)
        (outcome,) = sweep_retention(
            log, IDLE, now=clock.now(), dry_run=False, erase=erase_with(writer)
        ).outcomes
        assert outcome.skipped is not None
        assert outcome.skipped.startswith("begun again meanwhile")
        assert outcome.events_removed == 2
        assert [type(decode_event(r.data)).__name__ for r in log.read(key())] == [
            "SessionErased",
            "SessionStarted",
            "TurnAdded",
        ]
        assert b"ZQX" not in texts(log, key())
        assert [r.turn.user_message for r in live_state(writer, key()).turns] == ["back after a month"]


def test_an_erasure_cut_short_after_its_fence_is_finished(store: Store) -> None:
    """A fence stored over a session's events (the sweeper died before erasing): the next sweep of
    that tenant erases them."""
    clock = ManualClock(START)
    with MemorySystem(TRUNCATION, log=store.log, clock=clock) as system:
        system.session(key()).add_turn(turn("cut short"))
    fence = SessionErased(seq=3, event_id="erased/retention/cut-short", at=clock.now())
    store.log.append(key(), [fence], expected_seq=2)
    policies = RetentionPolicies(default=RetentionPolicy(max_turns=9))
    report = sweep_retention(store.log, policies, now=clock.now(), dry_run=False)
    assert [o.skipped for o in report.outcomes] == [_NO_ERASER]  # never erased outside the journal
    with MemorySystem(TRUNCATION, log=store.log, snapshots=store.snapshots, clock=clock) as system:
        report = system.sweep_retention(policies=policies)
        assert [(o.action, o.done) for o in report.outcomes] == [("erase", True)]
        assert store.log.read(key()) == []
        (record,) = [system.erasure_record(key())]
        assert record is not None


def test_a_fence_without_its_erasure_then_a_new_session_over_it_leaves_no_snapshot_of_the_erased(
    store: Store,
) -> None:
    """Given a sweep that died between its fence and the journaled erasure (no record), and a
    planner that began the session again above the fence, when the next sweep drops the history
    before the fence, then the snapshot of that history goes with it: the session reads as its new
    history (not `SessionLost`, whose restore would write the erased turns back), and no snapshot
    holds the erased text."""
    clock = ManualClock(START)
    with MemorySystem(
        TRUNCATION, log=store.log, snapshots=store.snapshots, clock=clock, snapshot_every=2
    ) as system:
        system.session(key()).add_turn(turn("idle secret ZQX-SNAP"))
        system.session(key()).add_turn(turn("idle again ZQX-SNAP"))
    old = store.snapshots.load(key())
    assert old is not None  # given: a snapshot of the history to erase
    last = store.log.last_seq(key())
    fence = SessionErased(seq=last + 1, event_id="erased/retention/died-here", at=clock.now())
    store.log.append(key(), [fence], expected_seq=last)
    clock.advance(DAY)
    with MemorySystem(TRUNCATION, log=store.log, snapshots=store.snapshots, clock=clock) as system:
        system.session(key()).add_turn(turn("a new start"))  # begun again above the fence
        report = system.sweep_retention(policies=IDLE)
        assert [(o.action, o.events_removed) for o in report.outcomes] == [("finish", last)]
        kept = store.snapshots.load(key())
        assert kept is None or kept.seq > fence.seq
        assert kept is None or b"ZQX" not in kept.data
    with MemorySystem(TRUNCATION, log=store.log, snapshots=store.snapshots, clock=clock) as system:
        shown = system.session(key()).get_llm_context()["conversation_memory"]["recent_turns"]
        assert [t["user"] for t in shown] == ["a new start"]
    assert b"ZQX" not in texts(store.log, key())


def test_a_snapshot_under_a_fence_whose_history_is_gone_is_deleted_not_lost(store: Store) -> None:
    """Given a snapshot of a history that a fence in the log says was erased, and the events before
    the fence gone, with no journal record, when the session loads, then the fence is the record:
    the snapshot (erased data) is deleted and the session is what the log holds after the fence."""
    clock = ManualClock(START)
    with MemorySystem(
        TRUNCATION, log=store.log, snapshots=store.snapshots, clock=clock, snapshot_every=2
    ) as system:
        system.session(key()).add_turn(turn("erased ZQX-GONE"))
        system.session(key()).add_turn(turn("erased too"))
    last = store.log.last_seq(key())
    store.log.append(
        key(), [SessionErased(seq=last + 1, event_id="erased/x", at=clock.now())], expected_seq=last
    )
    store.log.drop_before(key(), seq=last + 1)
    state, report = load_state(store.log, store.snapshots, key())
    assert not state.started
    assert report.snapshot_rejected is not None
    assert store.snapshots.load(key()) is None


def test_a_capped_history_is_compacted_and_replays_to_the_live_state(store: Store) -> None:
    """Over max_turns: the log then begins with a compaction holding the summary and the newest turns;
    the live session, a replay, a snapshot load and verify all agree, and writes go on."""
    clock = ManualClock(START)
    k = key("long")
    policies = RetentionPolicies(default=RetentionPolicy(max_turns=3))
    with rich_system(store.log, store.snapshots, clock) as system:
        chat(system, k, 10, clock)
        before = live_state(system, k)
        report = system.sweep_retention(policies=policies)
        (outcome,) = report.outcomes
        assert (outcome.action, outcome.done, outcome.turns_kept, outcome.turns_dropped) == (
            "compact",
            True,
            3,
            7,
        )
        records = store.log.read(k)
        first = decode_event(records[0].data)
        assert isinstance(first, HistoryCompacted)
        assert first.summary == before.summary
        assert [t.turn.user_message for t in first.turns] == ["turn 7", "turn 8", "turn 9"]
        assert outcome.events_removed == first.dropped_events
        assert b"turn 2" not in texts(store.log, k)
        after = live_state(system, k)
        assert after == load_state(store.log, None, k)[0] == load_state(store.log, store.snapshots, k)[0]
        assert [r.turn.user_message for r in after.turns] == ["turn 7", "turn 8", "turn 9"]
        assert after.summary == before.summary
        assert after.version == before.version + 1
        (check,) = verify(store.log, store.snapshots)
        assert check.ok, check.problems
        assert timeline(store.log.read(k))[0].type == "history.compacted"
        chat(system, k, 2, clock, first=10)
        assert live_state(system, k) == load_state(store.log, None, k)[0]
        assert system.session(k).add_turn(turn("turn 3"), idempotency_key="req-9") == 0  # still remembered
        again = system.sweep_retention(policies=policies)
        assert [o.turns_kept for o in again.outcomes] == [3]
    other_log, other_snapshots = store.other()
    with MemorySystem(log=other_log, snapshots=other_snapshots, clock=clock) as reopened:
        assert live_state(reopened, k) == load_state(store.log, None, k)[0]


def test_turns_within_the_cap_past_the_live_horizon_stay_in_the_log(store: Store) -> None:
    """A cap above the live horizon keeps that many turns in the log: the live state's own, and the
    older ones it had retired (the whole-history views still read them); the live state is unchanged."""
    clock = ManualClock(START)
    config = ShortTermMemoryConfig(strategy="truncation", live_turns=1)  # a horizon of 10 turns
    k = key("long")
    policies = RetentionPolicies(default=RetentionPolicy(max_turns=13))
    with MemorySystem(config, log=store.log, snapshots=store.snapshots, clock=clock) as system:
        for n in range(16):
            system.session(k).add_turn(turn(f"t{n}"))
        before = live_state(system, k)
        assert len(before.turns) == 10
        (outcome,) = system.sweep_retention(policies=policies).outcomes
        assert (outcome.turns_kept, outcome.turns_dropped) == (13, 3)
        after = live_state(system, k)
        assert after == msgspec.structs.replace(before, version=before.version + 1)
        assert after == load_state(store.log, None, k)[0]
        whole = replay(without_horizon(decode_event(r.data) for r in store.log.read(k)))
        assert [r.turn.user_message for r in whole.turns] == [f"t{n}" for n in range(3, 16)]
        assert system.sweep_retention(policies=policies).outcomes == []


def test_a_history_over_its_age_keeps_only_recent_turns(store: Store) -> None:
    """max_age drops turns older than it; a session whose turns are all older keeps its summary."""
    clock = ManualClock(START)
    with MemorySystem(TRUNCATION, log=store.log, snapshots=store.snapshots, clock=clock) as system:
        for n in range(4):
            system.session(key()).add_turn(turn(f"day {n}"))
            clock.advance(DAY)
        report = system.sweep_retention(policies=RetentionPolicies(default=RetentionPolicy(max_age="2d")))
        assert [o.turns_kept for o in report.outcomes] == [2]
        assert [r.turn.user_message for r in live_state(system, key()).turns] == ["day 2", "day 3"]
        assert (
            system.sweep_retention(policies=RetentionPolicies(default=RetentionPolicy(max_age="2d"))).outcomes
            == []
        )


def test_a_dry_run_writes_nothing(store: Store) -> None:
    """A dry run lists the erasure and the compaction it would make; the stream and bucket are unchanged."""
    clock = ManualClock(START)
    policies = RetentionPolicies(
        default=RetentionPolicy(idle=30 * DAY), tenants={"big": RetentionPolicy(max_events=3)}
    )
    with MemorySystem(
        TRUNCATION, log=store.log, snapshots=store.snapshots, clock=clock, snapshot_every=1
    ) as system:
        system.session(key("idle")).add_turn(turn("idle"))
        clock.advance(31 * DAY)
        for n in range(4):
            system.session(key("busy", tenant="big")).add_turn(turn(f"busy {n}"))
        keys = sorted(store.log.keys(), key=MemoryKey.composite)
        before = {k: (stored(store.log, k), store.snapshots.load(k)) for k in keys}
        report = system.sweep_retention(policies=policies, dry_run=True)
        assert [(o.key.session_id, o.action, o.done) for o in report.outcomes] == [
            ("idle", "erase", False),
            ("busy", "compact", False),
        ]
        assert "would erase 1, compact 1" in report.summary()
        assert {k: (stored(store.log, k), store.snapshots.load(k)) for k in keys} == before


def test_an_interrupted_compaction_is_finished_by_the_next_sweep(store: Store) -> None:
    """A compaction stored but whose earlier events were not dropped (the sweeper died) is finished."""
    clock = ManualClock(START)
    with MemorySystem(TRUNCATION, log=store.log, clock=clock) as system:
        for n in range(5):
            system.session(key()).add_turn(turn(f"t{n}"))
        state = live_state(system, key())
    event = compaction(state, state.turns[-1:], event_id="retention/cut-short", at=clock.now())
    store.log.append(key(), [event], expected_seq=state.version)
    report = sweep_retention(
        store.log, RetentionPolicies(default=RetentionPolicy(max_turns=50)), now=clock.now(), dry_run=False
    )
    assert [(o.action, o.events_removed) for o in report.outcomes] == [("finish", 6)]
    assert [r.seq for r in store.log.read(key())] == [event.seq]
    assert load_state(store.log, None, key())[0] == compacted_state(event)


SWEEPER = Path(__file__).with_name("retention_worker.py")


def test_a_compaction_killed_during_its_drop_reads_right_and_the_next_sweep_finishes_it(
    nats_server: EmbeddedNatsServer,
) -> None:
    """Given a sweeper killed (kill -9) between two windows of its drop's deletions, then meanwhile
    the session reads as its compaction (from the snapshot and from the log alone) and verifies, the
    next sweep finishes the drop, and no file of the stopped store holds a dropped turn."""
    k = key("long")
    with convmem.connect(nats_server.url, config=TRUNCATION, snapshot_every=4) as memory:
        for n in range(70):
            memory.session(k).add_turn(turn(f"dropped-ZQX{n:02d}" if n < 65 else f"kept-ZQX{n:02d}"))
    killed = subprocess.run(
        [sys.executable, str(SWEEPER), nats_server.url, "5", "64"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert killed.stdout.strip() == "KILLED-AFTER 64 deletes"
    kept = [f"kept-ZQX{n}" for n in range(65, 70)]
    policies = RetentionPolicies(default=RetentionPolicy(max_turns=5))
    with JetStreamBackend.connect(nats_server.url) as backend:
        log, snapshots = backend.log, backend.snapshots
        event = decode_event(log.read(k)[-1].data)
        assert isinstance(event, HistoryCompacted)
        assert 1 < len(log.read(k)) < event.seq  # given: the drop was cut short
        for where in (snapshots, None):
            state, loaded = load_state(log, where, k)
            assert state == compacted_state(event)
            assert (loaded.poison, loaded.damage) == ([], [])
        (check,) = verify(log, snapshots)
        assert check.ok, (check.problems, check.poison, check.damage)
        with MemorySystem(TRUNCATION, log=log, snapshots=snapshots) as system:
            assert [r.turn.user_message for r in live_state(system, k).turns] == kept
            report = system.sweep_retention(policies=policies)
            assert [(o.action, o.done) for o in report.outcomes] == [("finish", True)]
            assert [r.turn.user_message for r in live_state(system, k).turns] == kept
        assert [r.seq for r in log.read(k)] == [event.seq]
        (check,) = verify(log, snapshots)
        assert check.ok, (check.problems, check.poison, check.damage)
    nats_server.stop()
    files = [p for p in nats_server.store_dir.rglob("*") if p.is_file()]
    assert [p for p in files if b"dropped-ZQX" in p.read_bytes()] == []
    assert any(b"kept-ZQX69" in p.read_bytes() for p in files)  # the scan can find what is there


@dataclass
class Stream:
    """A JetStream log of a stream of its own on the shared server, and a way to delete its messages."""

    log: EventLog
    url: str
    name: str

    def delete(self, positions: Sequence[int]) -> None:
        """Delete these messages of the stream, as a drop killed on the way left them deleted."""

        async def delete() -> None:
            client = await nats.connect(self.url)
            try:
                for position in positions:
                    subject = f"$JS.API.STREAM.MSG.DELETE.{self.name}"
                    answer = await client.request(subject, json.dumps({"seq": position}).encode(), timeout=10)
                    assert json.loads(answer.data).get("success"), answer.data
            finally:
                await client.close()

        asyncio.run(delete())


@pytest.fixture
def stream(nats_server_shared: EmbeddedNatsServer, jetstream_names: JetStreamNames) -> Iterator[Stream]:
    names = jetstream_names
    backend = JetStreamBackend.connect(
        nats_server_shared.url, stream=names.stream, prefix=names.prefix, bucket=names.bucket, timeout=15.0
    )
    try:
        yield Stream(backend.log, nats_server_shared.url, names.stream)
    finally:
        backend.close()


def cut_short(stream: Stream, k: MemoryKey, opener: int, left: str) -> list[int]:
    """Delete part of the session's messages before seq `opener`: the oldest half (the newest are
    `left`, as an older convmem's drop killed half-way left them), or every other one; the positions
    of the ones left."""
    below = [r.position for r in stream.log.read(k) if r.seq is not None and r.seq < opener]
    gone = below[: len(below) // 2] if left == "newest" else below[1::2]
    stream.delete(gone)
    return [p for p in below if p not in gone]


def users_of(log: EventLog, k: MemoryKey) -> list[str]:
    return [r.turn.user_message for r in load_state(log, None, k)[0].turns]


@pytest.mark.parametrize("left", ["newest", "every-other"])
@pytest.mark.parametrize("opener", ["compaction", "fence"])
def test_whatever_part_of_the_dropped_events_a_kill_left_the_next_sweep_finishes(
    stream: Stream, opener: str, left: str
) -> None:
    """Given a drop before a stored compaction (or a fence a session was begun again over) cut short
    with any part of the events before it left: the newest (an older convmem deleted oldest first,
    so the history starts in its middle) or every other one (deletions in flight at once), then the
    session reads as what follows that event, and the next sweep finishes the drop: it folds the
    session from that event, never what is left before it."""
    clock, k, log = ManualClock(START), key(), stream.log
    with MemorySystem(TRUNCATION, log=log, clock=clock) as system:
        for n in range(8):
            system.session(k).add_turn(turn(f"dropped-ZQX{n}" if n < 6 else f"kept {n}"))
        state = live_state(system, k)
    event: Event
    if opener == "compaction":
        event = compaction(state, state.turns[-2:], event_id="retention/cut-short", at=clock.now())
        log.append(k, [event], expected_seq=state.version)
    else:
        event = SessionErased(seq=state.version + 1, event_id="erased/retention/cut-short", at=clock.now())
        log.append(k, [event], expected_seq=state.version)
        with MemorySystem(TRUNCATION, log=log, clock=clock) as system:
            system.session(k).add_turn(turn("a new start"))
    after = users_of(log, k)
    left_over = cut_short(stream, k, event.seq, left)
    assert users_of(log, k) == after
    policies = RetentionPolicies(default=RetentionPolicy(max_turns=50))
    report = sweep_retention(log, policies, now=clock.now(), dry_run=False)
    assert report.problems == []
    assert [(o.action, o.done, o.events_removed) for o in report.outcomes] == [
        ("finish", True, len(left_over))
    ]
    assert log.read(k)[0].seq == event.seq
    (check,) = verify(log)
    assert check.ok, (check.problems, check.poison, check.damage)
    assert users_of(log, k) == after
    assert b"dropped-ZQX" not in texts(log, k)


@pytest.mark.parametrize("left", ["newest", "every-other"])
def test_an_erasure_whose_deletions_were_cut_short_is_finished_by_the_next_sweep(
    stream: Stream, left: str
) -> None:
    """Given a sweep's fence over a session and part of the events under it deleted when the eraser
    was killed, then the session reads as erased, and the next sweep erases the rest (journaled)."""
    clock, k, log = ManualClock(START), key(), stream.log
    with MemorySystem(TRUNCATION, log=log, clock=clock) as system:
        for n in range(8):
            system.session(k).add_turn(turn(f"erased-ZQX{n}"))
    last = log.last_seq(k)
    fence = SessionErased(seq=last + 1, event_id="erased/retention/x", at=clock.now())
    log.append(k, [fence], expected_seq=last)
    cut_short(stream, k, fence.seq, left)
    assert not load_state(log, None, k)[0].started
    with MemorySystem(TRUNCATION, log=log, clock=clock) as system:
        report = system.sweep_retention(policies=RetentionPolicies(default=RetentionPolicy(max_turns=50)))
        assert report.problems == []
        assert [(o.action, o.done) for o in report.outcomes] == [("erase", True)]
        assert system.erasure_record(k) is not None
    assert log.read(k) == []


def test_concurrent_sweeps_compact_each_session_once_and_lose_nothing(store: Store) -> None:
    """Four sweepers on two handles at once: each session ends with one compaction and its newest turns."""
    clock = ManualClock(START)
    keys = [key(f"s{n}") for n in range(6)]
    with MemorySystem(TRUNCATION, log=store.log, clock=clock) as system:
        for k in keys:
            for n in range(5):
                system.session(k).add_turn(turn(f"{k.session_id}-{n}"))
    policies = RetentionPolicies(default=RetentionPolicy(max_turns=2))
    handles = [store.log, store.other()[0]]
    reports = []

    def sweep(i: int) -> None:
        reports.append(sweep_retention(handles[i % 2], policies, now=clock.now(), dry_run=False))

    run_threads(4, sweep)
    for k in keys:
        events = [decode_event(r.data) for r in store.log.read(k)]
        assert [type(e) for e in events] == [HistoryCompacted]
        assert [t.turn.user_message for t in events[0].turns] == [f"{k.session_id}-3", f"{k.session_id}-4"]
    done = [o for r in reports for o in r.outcomes if o.done and o.action == "compact"]
    assert sorted(o.key.session_id for o in done) == sorted(k.session_id for k in keys)


def test_the_system_sweeps_on_its_clock() -> None:
    """With policies, a system sweeps every sweep_every seconds of its clock; no sweep before that."""
    clock, log = ManualClock(START), InMemoryEventLog()
    policies = RetentionPolicies(default=RetentionPolicy(idle="1d"), sweep_every="1h")
    with MemorySystem(TRUNCATION, log=log, clock=clock, retention=policies) as system:
        sweeper = system.retention_sweeper
        assert sweeper is not None
        assert sweeper.due == START + 3600
        system.session(key()).add_turn(turn("hello"))
        clock.advance(3599)
        assert sweeper.sweeps == 0  # not due yet (a due timer fires inside advance)
        clock.advance(1)
        wait_until(lambda: sweeper.due == START + 7200, message="the first sweep ran and the next is due")
        assert sweeper.sweeps == 1
        assert log.keys() == [key()]  # idle for an hour only
        clock.advance(DAY)  # the sweep due on the way may run at its due time: the one after it erases
        wait_until(
            lambda: log.keys() == [] and sweeper.sweeps >= 2,
            message="a sweep erased the session idle for a day",
        )
    assert sweeper.due is None
    with MemorySystem(log=log) as plain:
        assert plain.retention_sweeper is None


def test_a_fork_of_a_compacted_session_starts_from_its_compaction(store: Store) -> None:
    """Forking a session whose log begins with a compaction copies the state it carries."""
    clock = ManualClock(START)
    with MemorySystem(TRUNCATION, log=store.log, clock=clock) as system:
        for n in range(5):
            system.session(key()).add_turn(turn(f"t{n}"))
        system.sweep_retention(policies=RetentionPolicies(default=RetentionPolicy(max_turns=2)))
        system.fork(key(), to=key("copy"))
        copy = live_state(system, key("copy"))
        assert [r.turn.user_message for r in copy.turns] == ["t3", "t4"]
        events = [decode_event(r.data) for r in store.log.read(key("copy"))]
        assert isinstance(events[0], SessionStarted)
        assert events[0].forked_from == key()
        assert not any(isinstance(e, TurnAdded) for e in events)


def test_sessions_of_tenants_without_a_policy_are_not_read() -> None:
    """Only tenants with a policy are swept (a store of other tenants costs nothing)."""
    reads: list[MemoryKey] = []

    class Counting(InMemoryEventLog):
        def read(self, k: MemoryKey, *, after_seq: int = 0) -> list:  # type: ignore[type-arg]
            reads.append(k)
            return super().read(k, after_seq=after_seq)

    log, clock = Counting(), ManualClock(START)
    with MemorySystem(TRUNCATION, log=log, clock=clock) as system:
        system.session(key(tenant="kept")).add_turn(turn("a"))
        system.session(key(tenant="swept")).add_turn(turn("b"))
        reads.clear()
        policies = RetentionPolicies(tenants={"swept": RetentionPolicy(max_turns=5)})
        assert system.sweep_retention(policies=policies).sessions == 1
    assert reads == [key(tenant="swept")]


def test_an_unreadable_session_is_left_alone_and_reported() -> None:
    """Poison in a session's log: the sweep does not compact or erase it, and says so."""
    log, clock = InMemoryEventLog(), ManualClock(START)
    with MemorySystem(TRUNCATION, log=log, clock=clock) as system:
        system.session(key()).add_turn(turn("a"))
    log.append_raw(key(), b"\xc1 not an event", seq=3)
    before = stored(log, key())
    report = sweep_retention(log, IDLE, now=START + 99 * DAY, dry_run=False)
    assert report.outcomes == []
    assert [p.key for p in report.problems] == [key()]
    assert stored(log, key()) == before


def test_sweeps_stop_when_asked() -> None:
    """A set stop event ends a sweep before its next session."""
    log, clock = InMemoryEventLog(), ManualClock(START)
    with MemorySystem(TRUNCATION, log=log, clock=clock) as system:
        system.session(key()).add_turn(turn("a"))
    stop = threading.Event()
    stop.set()
    report = sweep_retention(log, IDLE, now=START + 99 * DAY, dry_run=False, stop=stop)
    assert report.stopped
    assert report.sessions == 0
    assert log.keys() == [key()]


# The command line ---------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def deployment(nats_server: EmbeddedNatsServer, tmp_path: Path) -> tuple[str, Path]:
    """A session idle for 40 days, a fresh one, a long one of tenant big; and a policy file for them."""
    now = time.time()
    clock = ManualClock(now - 40 * DAY)
    with convmem.connect(nats_server.url, config=TRUNCATION, clock=clock) as memory:
        memory.session(key("idle")).add_turn(turn("idle"))
        clock.set(now - 3600)
        memory.session(key("fresh")).add_turn(turn("fresh"))
        for n in range(5):
            memory.session(key("long", tenant="big")).add_turn(turn(f"long {n}"))
    policy = tmp_path / "retention.toml"
    policy.write_text('[default]\nidle = "30d"\n\n[tenants.big]\nmax_turns = 2\n', encoding="utf-8")
    return nats_server.url, policy


def test_the_cli_dry_run_lists_and_writes_nothing_then_apply_does_it(
    deployment: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--dry-run prints what would happen and leaves the stream as it was; --apply does it."""
    url, policy = deployment
    log = JetStreamEventLog.connect(url)
    try:
        keys = sorted(log.keys(), key=MemoryKey.composite)
        before = {k: stored(log, k) for k in keys}
        code, out, err = run(capsys, "-s", url, "retention", "--dry-run", "--policy", str(policy))
        assert (code, err) == (0, "")
        assert "acme:u@example.com:idle  erase    would" in out
        assert "big:u@example.com:long   compact  would" in out
        assert "dry run: 3 session(s) examined; would erase 1, compact 1" in out
        assert {k: stored(log, k) for k in keys} == before
        code, out, _ = run(capsys, "-s", url, "retention", "--apply", "--policy", str(policy), "--json")
        assert code == 0
        result = json.loads(out)
        assert result["dry_run"] is False
        assert sorted((o["key"]["session_id"], o["action"], o["done"]) for o in result["outcomes"]) == [
            ("idle", "erase", True),
            ("long", "compact", True),
        ]
        left = log.keys()
        assert sorted(k.session_id for k in left) == ["fresh", "long"]
        assert seqs_of(log, key("long", tenant="big")) == [7]
    finally:
        log.close()
    # The auditor's commands read a log that begins with a compaction like any other.
    long = "big:u@example.com:long"
    code, out, _ = run(capsys, "-s", url, "inspect", long, "--type", "history.compacted", "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert "6 earlier events dropped (3 turns), turns #4-#5 kept" in row["detail"]
    code, out, _ = run(capsys, "-s", url, "replay", long, "--json")
    assert code == 0
    assert [t["user"] for t in json.loads(out)["context"]["conversation_memory"]["recent_turns"]] == [
        "long 3",
        "long 4",
    ]
    assert run(capsys, "-s", url, "verify", "--all")[0] == 0
    assert run(capsys, "-s", url, "timeline", long, "-o", str(policy.parent / "long.html"))[0] == 0


def seqs_of(log: EventLog, k: MemoryKey) -> list[int | None]:
    return [r.seq for r in log.read(k)]


def test_a_dry_run_never_creates_the_stream(
    nats_server: EmbeddedNatsServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a server that holds no events, --dry-run says so (exit 3) and creates nothing."""
    policy = tmp_path / "retention.json"
    policy.write_text('{"default": {"idle": "30d"}}', encoding="utf-8")
    code, _, err = run(capsys, "-s", nats_server.url, "retention", "--dry-run", "--policy", str(policy))
    assert code == 3
    assert "no stream" in err
    connection = NatsConnection.connect(nats_server.url)
    try:
        with pytest.raises(StoreNotFound):
            JetStreamEventLog(connection, create=False)
    finally:
        connection.release()


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ('[default]\nidle = "forever"\n', "retention.default.idle"),
        ("[tenants.acme]\nmax_turns = -2\n", "retention.tenants.acme.max_turns"),
        ('[default]\nidle = "1d"\nkeep = "all"\n', "retention.default.keep"),
        ("[default\n", "not valid TOML"),
    ],
)
def test_the_cli_refuses_a_hostile_policy_file_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, named: str
) -> None:
    """A bad policy file exits 5 with one line naming the file and the key."""
    policy = tmp_path / "retention.toml"
    policy.write_text(content, encoding="utf-8")
    code, _, err = run(capsys, "-s", "memory://", "retention", "--apply", "--policy", str(policy))
    assert code == 5
    assert named in err
    assert str(policy) in err
    assert err.count("\n") == 1


def test_the_cli_needs_a_policy_and_as_of_only_with_a_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Usage errors exit 2: no policy file; --as-of with --apply."""
    monkeypatch.delenv("CONVMEM_RETENTION", raising=False)
    assert run(capsys, "-s", "memory://", "retention", "--apply")[0] == 2
    policy = tmp_path / "retention.toml"
    policy.write_text('[default]\nidle = "1d"\n', encoding="utf-8")
    assert (
        run(capsys, "-s", "memory://", "retention", "--apply", "--policy", str(policy), "--as-of", "0")[0]
        == 2
    )


# convmem serve ------------------------------------------------------------------------------


@pytest.mark.slow  # `serve` with its worker processes, 10 s and more (`.ci/run` runs it)
def test_serve_sweeps_with_its_retention_policies(deployment: tuple[str, Path], tmp_path: Path) -> None:
    """`convmem serve --retention FILE` erases the idle session and compacts the long one by itself
    (worker 0 sweeps every sweep_every), keeping the fresh one; stopping it is clean."""
    url, policy = deployment
    policy.write_text('sweep_every = "3s"\n' + policy.read_text(encoding="utf-8"), encoding="utf-8")
    ready, err_path = tmp_path / "ready", tmp_path / "serve.err"
    log = JetStreamEventLog.connect(url)
    with open(err_path, "wb") as err:
        serve = subprocess.Popen(
            [
                *(sys.executable, "-m", "convmem", "--nats", url, "serve", "--workers", "2"),
                *("--retention", str(policy), "--ready-file", str(ready)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_until(ready.exists, timeout=60.0, message="serve is ready")
        with RemoteMemory(url) as remote:  # the long session is live in a worker (before the sweep, mostly)
            long = remote.session(key("long", tenant="big"))
            long.get_llm_context()
            wait_until(lambda: swept(log), timeout=60.0, message="serve swept")
            recent = long.get_llm_context()["conversation_memory"]["recent_turns"]
        assert [t["user"] for t in recent] == ["long 3", "long 4"]  # a read through the service sees it
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(60.0)
        log.close()
    assert code == 0, err_path.read_text(encoding="utf-8")
    assert "retention: 3 session(s) examined; did erase 1, compact 1" in err_path.read_text(encoding="utf-8")


def swept(log: EventLog) -> bool:
    """The deployment's idle session is erased and its long one compacted; the fresh one is kept."""
    left = log.keys()
    return sorted(k.session_id for k in left) == ["fresh", "long"] and seqs_of(
        log, key("long", tenant="big")
    ) == [7]


def test_serve_refuses_a_hostile_policy_file_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad --retention file stops serve at once with exit 5, naming the key (no server is started)."""
    policy = tmp_path / "retention.toml"
    policy.write_text('[tenants.acme]\nidle = "5d"\nmax_turns = true\n', encoding="utf-8")
    code, _, err = run(capsys, "--data-dir", str(tmp_path / "store"), "serve", "--retention", str(policy))
    assert code == 5, err
    assert "retention.tenants.acme.max_turns" in err
    assert not (tmp_path / "store").exists()


# Bytes on disk, and sealed stores ----------------------------------------------------------------


def test_no_byte_of_a_dropped_turn_stays_in_the_store(tmp_path: Path) -> None:
    """Compacted away, the server stopped: no file of its store holds the dropped turns (their
    messages and the old snapshot were erased, not only forgotten); the kept ones are there."""
    data = tmp_path / "data"
    clock = ManualClock(START)
    policies = RetentionPolicies(default=RetentionPolicy(max_turns=2))
    with convmem.connect(
        data_dir=data, keys=KeySettings(encrypt=False), config=TRUNCATION, clock=clock, snapshot_every=2
    ) as memory:
        for n in range(6):
            memory.session(key()).add_turn(turn(f"dropped-ZQX{n}" if n < 4 else f"kept-ZQX{n}"))
        assert [o.done for o in memory.sweep_retention(policies=policies).outcomes] == [True]
    files = [p for p in (data / "jetstream").rglob("*") if p.is_file()]
    dropped = [p for p in files for n in range(4) if f"dropped-ZQX{n}".encode() in p.read_bytes()]
    assert dropped == []
    assert any(b"kept-ZQX5" in p.read_bytes() for p in files)  # the scan can find what is there


def test_retention_on_a_sealed_store(tmp_path: Path) -> None:
    """With encryption at rest (the embedded default), compaction and idle erasure work the same and a
    new process rebuilds the compacted session exactly."""
    data = tmp_path / "data"
    clock = ManualClock(START)
    policies = RetentionPolicies(default=RetentionPolicy(max_turns=2, idle="30d"))
    with convmem.connect(data_dir=data, config=TRUNCATION, clock=clock) as memory:
        for n in range(5):
            memory.session(key("long")).add_turn(turn(f"long {n}"))
        memory.session(key("idle")).add_turn(turn("idle"))
        clock.advance(10 * DAY)
        memory.session(key("long")).add_turn(turn("long 5"))
        clock.advance(25 * DAY)
        report = memory.sweep_retention(policies=policies)
        assert sorted((o.key.session_id, o.action, o.done) for o in report.outcomes) == [
            ("idle", "erase", True),
            ("long", "compact", True),
        ]
        live = live_state(memory, key("long"))
    assert (data / "master.key").is_file()
    with convmem.connect(data_dir=data, config=TRUNCATION, clock=clock) as again:
        assert again.load(key("long"))[0] == live
        assert [r.turn.user_message for r in live.turns] == ["long 4", "long 5"]
        assert again.log.keys() == [key("long")]


def test_the_cli_as_of_and_an_unreadable_session(
    deployment: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--as-of applies the policies at another time (a month on, the fresh session is idle too); a
    session with a message that cannot be read is left alone and the command exits 1, naming it."""
    url, policy = deployment
    later = str(time.time() + 31 * DAY)
    code, out, _ = run(capsys, "-s", url, "retention", "--dry-run", "--policy", str(policy), "--as-of", later)
    assert code == 0
    assert "acme:u@example.com:fresh  erase    would" in out
    log = JetStreamEventLog.connect(url)
    try:
        log.append_raw(key("idle"), b"\xc1 not an event", seq=3)
    finally:
        log.close()
    code, out, err = run(capsys, "-s", url, "retention", "--dry-run", "--policy", str(policy))
    assert code == 1
    assert "left alone acme:u@example.com:idle" in err
    assert "1 unreadable" in out


def test_connect_takes_retention_policies_and_checks_them() -> None:
    """connect(retention=...) gives a system that sweeps; a hostile mapping is refused naming its key."""
    with convmem.connect("memory://", retention={"default": {"idle": "30d"}, "sweep_every": "10m"}) as memory:
        assert memory.retention is not None
        assert memory.retention.sweep_every == 600.0
        assert memory.retention_sweeper is not None
    with pytest.raises(InvalidConfig, match=r"retention\.sweep_every"):
        convmem.connect("memory://", retention={"sweep_every": "never"})
