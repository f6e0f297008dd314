"""Virtual sessions: the live-set bound, idle passivation, races with passivation, reactivation."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading

import pykka
import pytest
from runtime_helpers import (
    WAIT,
    EchoSummarizer,
    GatedLog,
    Harness,
    PlannedSummarizer,
    assert_each_writer_in_order,
    key,
    live_state,
    replay_log,
    run_threads,
    stored_users,
    summarizing_config,
    turn,
    users,
    wait_until,
)

from convmem.actors import LoggedEvent
from convmem.actors._live import LiveSessions
from convmem.actors._session import Message, Refresh, SessionActor, SummaryDone
from convmem.adapters import InMemoryEventLog
from convmem.events import MemoryBudget, MemoryHealth, MemoryKey, ShortTermMemoryConfig

TRUNCATION = ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=3))


def test_the_live_set_never_exceeds_its_bound_and_no_acknowledged_turn_is_lost(harness: Harness) -> None:
    """max_live_sessions=4 over 30 busy sessions: never over 4 live; each equals a never-passivating run."""
    bounded = harness.system(TRUNCATION, max_live_sessions=4)
    reference_log = InMemoryEventLog()
    unbounded = harness.system(TRUNCATION, log=reference_log, snapshots=None, max_live_sessions=1000)
    keys = [key(f"s{i}") for i in range(30)]
    acked: dict[MemoryKey, list[str]] = {k: [] for k in keys}
    over_bound: list[int] = []

    def work(t: int) -> None:
        rnd = random.Random(t)
        mine = keys[t * 5 : (t + 1) * 5]  # each session has one writer: its order is known
        for i in range(30):
            k = mine[rnd.randrange(5)]
            text = f"{k.session_id}-{i}"
            bounded.session(k).add_turn(turn(text))
            unbounded.session(k).add_turn(turn(text))
            acked[k].append(text)
            assert text in users(bounded.session(k).snapshot_state())  # a read right after the ack
            bounded.session(rnd.choice(keys)).get_llm_context()  # readers activate and evict too
            live = bounded.live_sessions()
            if live > 4:
                over_bound.append(live)

    run_threads(6, work)
    assert over_bound == []
    for k in keys:
        assert users(replay_log(harness.log, k)) == acked[k]
        assert bounded.session(k).get_llm_context() == unbounded.session(k).get_llm_context()
        assert bounded.session(k).snapshot_state() == replay_log(harness.log, k)
        assert bounded.live_sessions() <= 4
    assert bounded.metrics.snapshot()["counts"]["passivations"] >= len(keys) - 4  # all 30 were live once


def test_an_evicted_session_finishes_its_write_before_it_reactivates(harness: Harness) -> None:
    """A session evicted while its write is still in the log call reactivates only after that write.

    Meanwhile its cell is cached: a read shows the last acknowledged state (reads never wait for a
    write), and the next write waits for the evicted actor, then decides on top of its turn.
    """
    log = GatedLog()
    system = harness.system(TRUNCATION, log=log, max_live_sessions=1)
    stuck, other = key("stuck"), key("other")
    system.session(stuck).add_turn(turn("first"))
    system.session(other).add_turn(turn("o1"))
    system.session(stuck).add_turn(turn("again"))
    log.arm()
    writer = threading.Thread(target=lambda: system.session(stuck).add_turn(turn("second")))
    writer.start()
    assert log.entered.wait(15)
    system.session(other).add_turn(turn("o2"))  # `other` comes back from the cache: `stuck` is evicted
    assert not system.is_live(stuck)
    assert system.is_cached(stuck)
    assert users(system.session(stuck).snapshot_state()) == ["first", "again"]
    late = threading.Thread(target=lambda: system.session(stuck).add_turn(turn("third")))
    late.start()
    log.gate.set()
    writer.join(15)
    late.join(15)
    assert users(system.session(stuck).snapshot_state()) == ["first", "again", "second", "third"]
    assert system.session(stuck).snapshot_state() == replay_log(log, stuck)
    assert system.metrics.snapshot()["counts"].get("conflicts", 0) == 0


def test_passivate_while_a_write_is_in_flight_loses_nothing(harness: Harness) -> None:
    """passivate(key) during an append: a concurrent reactivation waits for it and sees the turn."""
    log = GatedLog()
    system = harness.system(TRUNCATION, log=log)
    k = key()
    system.session(k).add_turn(turn("first"))
    log.arm()
    writer = threading.Thread(target=lambda: system.session(k).add_turn(turn("second")))
    writer.start()
    assert log.entered.wait(15)
    passivator = threading.Thread(target=lambda: system.passivate(k))
    passivator.start()
    wait_until(lambda: not system.is_live(k))
    read: list[list[str]] = []
    reader = threading.Thread(target=lambda: read.append(users(system.session(k).snapshot_state())))
    reader.start()
    log.gate.set()
    for thread in (writer, passivator, reader):
        thread.join(15)
    assert read == [["first", "second"]]
    assert system.session(k).snapshot_state() == replay_log(log, k)


def test_an_idle_session_passivates_after_idle_seconds_on_the_clock(harness: Harness) -> None:
    """A session untouched for idle_seconds (manual clock) loses its actor; its next write reactivates it."""
    system = harness.system(TRUNCATION, idle_seconds=10.0)
    busy, idle = system.session(key("busy")), system.session(key("idle"))
    idle.add_turn(turn("sleepy"))
    busy.add_turn(turn("b0"))
    harness.clock.advance(5.0)
    busy.add_turn(turn("b1"))
    harness.clock.advance(5.0)
    assert not system.is_live(key("idle"))
    assert system.is_live(key("busy"))
    harness.clock.advance(5.0)
    assert not system.is_live(key("busy"))
    assert system.live_sessions() == 0
    assert system.is_cached(key("idle"))
    assert users(idle.snapshot_state()) == ["sleepy"]  # a read is served from the cache, with no actor
    assert not system.is_live(key("idle"))
    idle.add_turn(turn("awake"))
    assert system.is_live(key("idle"))
    assert not system.is_cached(key("idle"))
    assert users(idle.snapshot_state()) == ["sleepy", "awake"]


def test_a_session_that_still_has_summary_work_is_not_passivated_when_idle(harness: Harness) -> None:
    """Idle passivation keeps a session that is retrying its summary live, so it heals on time."""
    summarizer = PlannedSummarizer("fail", default="ok")
    system = harness.system(summarizing_config(backoff=(100.0,)), summarizer=summarizer, idle_seconds=10.0)
    session = system.session(key())
    for i in range(3):
        session.add_turn(turn(f"t{i}"))
    wait_until(lambda: session.health is MemoryHealth.RETRY)
    session.refresh(timeout=10)  # the retry timer is set
    harness.clock.advance(50.0)
    assert system.is_live(key())
    harness.clock.advance(50.0)
    session.flush(timeout=10)
    assert session.health is MemoryHealth.HEALTHY


def test_messages_racing_passivation_are_not_lost(harness: Harness) -> None:
    """Writers on one session while another thread keeps passivating it: every turn stored once, in order."""
    system = harness.system(TRUNCATION)
    k = key()
    writers, per_writer = 4, 25
    done = threading.Event()
    cond = threading.Condition()
    counts = {"passivations": 0, "writers_done": 0}

    def passivate_until_done() -> None:
        while not done.is_set():
            if system.passivate(k):
                with cond:
                    counts["passivations"] += 1
                    cond.notify_all()
            else:
                done.wait(0.001)  # nothing live to passivate yet: let a writer activate it

    def write(t: int) -> None:
        seen = 0
        try:
            for i in range(per_writer):
                system.session(k).add_turn(turn(f"w{t}-{i}"))
                if i % 5 == 4:  # make sure passivations land between this writer's turns
                    with cond:
                        assert cond.wait_for(lambda s=seen: counts["passivations"] > s, timeout=15)
                        seen = counts["passivations"]
        finally:
            with cond:
                counts["writers_done"] += 1
                if counts["writers_done"] == writers:
                    done.set()

    run_threads(writers + 1, lambda t: passivate_until_done() if t == writers else write(t))
    assert_each_writer_in_order(stored_users(harness.log, k), writers, per_writer)
    assert counts["passivations"] >= 5
    assert system.session(k).snapshot_state() == replay_log(harness.log, k)


def test_writes_and_flushes_over_a_small_live_set_are_not_lost(harness: Harness) -> None:
    """Writes and flushes to sessions being evicted all land: queued messages follow the next activation."""
    summarizer = EchoSummarizer()
    system = harness.system(summarizing_config(), summarizer=summarizer, max_live_sessions=2)
    keys = [key(f"s{i}") for i in range(6)]

    def work(t: int) -> None:
        for i in range(20):
            k = keys[(t + i) % len(keys)]
            session = system.session(k)
            session.add_turn(turn(f"w{t}-{i}"))
            if i % 5 == 0:
                session.flush(timeout=10)

    run_threads(4, work)
    total = sum(len(stored_users(harness.log, k)) for k in keys)
    assert total == 80
    for k in keys:
        session = system.session(k)
        session.flush(timeout=10)
        assert session.snapshot_state() == replay_log(harness.log, k)


def test_a_summary_answered_while_the_session_activates_is_not_lost(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Summary work resumed on activation gets its answer even when it comes before registration ends."""
    stalled = PlannedSummarizer(default="hang")
    writer = harness.system(summarizing_config(), summarizer=stalled)
    for i in range(3):
        writer.session(key()).add_turn(turn(f"t{i}"))
    stalled.wait_calls(1)
    writer.close()  # turn 1 is pending, unsummarized: the next activation asks at once
    system = harness.system(summarizing_config(), summarizer=EchoSummarizer())
    answered = threading.Event()
    deliver = LiveSessions.tell  # where a summary's answer reaches its (live) session

    def tell(sessions: LiveSessions, k: MemoryKey, message: Message, *, here: bool = False) -> bool:
        delivered = deliver(sessions, k, message, here=here)
        if isinstance(message, SummaryDone):
            answered.set()
        return delivered

    start = SessionActor.start

    def slow_start(*args: object) -> object:
        ref = start(*args)  # type: ignore[arg-type]
        answered.wait(0.3)  # hold registration open until an answer was tried (if one was asked)
        return ref

    monkeypatch.setattr(LiveSessions, "tell", tell)
    monkeypatch.setattr(SessionActor, "start", slow_start)
    session = system.session(key())
    session.flush(timeout=10)
    assert session.get_llm_context()["conversation_memory"]["summary"] == "covers 1 turns; latest: t0"


def test_concurrent_activations_of_one_key_start_one_actor_and_close_stops_them_all(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads racing to activate the same keys never leave a second, orphaned actor behind."""
    started: list[pykka.ActorRef[SessionActor]] = []
    start = SessionActor.start

    def recording_start(*args: object) -> pykka.ActorRef[SessionActor]:
        ref = start(*args)  # type: ignore[arg-type]
        started.append(ref)
        return ref

    monkeypatch.setattr(SessionActor, "start", recording_start)
    system = harness.system(TRUNCATION, max_live_sessions=1)
    keys = [key(f"s{i}") for i in range(3)]

    def work(t: int) -> None:
        rnd = random.Random(t)
        for _ in range(150):
            system.session(rnd.choice(keys)).get_llm_context()

    run_threads(8, work)
    system.close()
    wait_until(
        lambda: not any(ref.is_alive() for ref in started),
        message="every session actor stopped after close() (none orphaned)",
    )


@pytest.mark.parametrize("with_snapshots", [True, False])
def test_a_passivated_session_reactivates_from_the_log_with_an_equal_state(
    harness: Harness, with_snapshots: bool
) -> None:
    """Passivate then reactivate: the state equals the one before, from snapshot + tail or full replay."""
    summarizer = EchoSummarizer()
    system = harness.system(
        summarizing_config(),
        summarizer=summarizer,
        snapshot_every=3,
        snapshots=harness.snapshots if with_snapshots else None,
    )
    session = system.session(key())
    for i in range(10):
        session.add_turn(turn(f"t{i}"))
    session.flush(timeout=10)
    before = session.snapshot_state()
    assert system.passivate(key())
    assert not system.is_live(key())
    assert not system.passivate(key())
    after = session.snapshot_state()  # loaded from the log into the idle cache: no actor for a read
    assert after == before
    assert system.is_cached(key())
    assert not system.is_live(key())
    _, report = system.load(key())
    assert (report.snapshot_seq > 0) is with_snapshots
    assert session.add_turn(turn("after")) == 11
    assert session.snapshot_state() == replay_log(harness.log, key())


def test_a_session_with_a_summary_under_way_is_not_passivated_until_it_lands(harness: Harness) -> None:
    """The live bound gives way to a session whose summary is being made, then holds again.

    Passivating it would throw the summary away, and the session would be woken
    again to ask for it anew: with more such sessions than the bound allows, they
    evicted each other without end (20,000 activations for 38 turns in a run).
    """
    summarizer = PlannedSummarizer("hang")
    system = harness.system(summarizing_config(), summarizer=summarizer, max_live_sessions=1)
    busy, other, third = key("busy"), key("other"), key("third")
    for n in range(3):  # full zone 2: the third turn asks for a summary
        system.session(busy).add_turn(turn(f"b{n}"))
    summarizer.wait_calls(1)
    system.session(other).add_turn(turn("o0"))
    assert system.is_live(busy)  # kept: its summary is under way
    assert system.live_sessions() == 2
    summarizer.release()
    system.session(busy).flush(timeout=WAIT)
    assert live_state(system, busy).summary.startswith("covers")
    system.session(third).add_turn(turn("t0"))
    assert system.live_sessions() == 1  # idle again: the bound holds
    assert system.is_live(third)


class ReadsWatched(InMemoryEventLog):
    """The in-memory log, noting which thread made each read (activation reads the log)."""

    def __init__(self) -> None:
        super().__init__()
        self.readers: list[str] = []

    def read(self, key: MemoryKey, *, after_seq: int = 0) -> list[LoggedEvent]:
        self.readers.append(threading.current_thread().name)
        return super().read(key, after_seq=after_seq)


def test_a_flush_a_passivated_session_still_held_is_redelivered_on_a_session_thread(harness: Harness) -> None:
    """What a stopping actor held goes to the next activation through the dispatcher, not a new thread."""
    log = ReadsWatched()
    summarizer = PlannedSummarizer("hang")
    system = harness.system(summarizing_config(), summarizer=summarizer, log=log)
    session = system.session(key())
    for n in range(3):  # full zone 2: the third turn asks for a summary, which hangs
        session.add_turn(turn(f"t{n}"))
    summarizer.wait_calls(1)
    flushed: concurrent.futures.Future[None] = concurrent.futures.Future()
    threading.Thread(target=lambda: flushed.set_result(session.flush(timeout=WAIT))).start()

    def waiting() -> bool:
        activity = system.activity(key())
        return activity is not None and activity.flushes_waiting == 1

    wait_until(waiting, message="the flush waits for the hanging summary")
    log.readers.clear()
    assert system.passivate(key())  # the waiting flush is handed back and delivered again
    wait_until(lambda: system.is_live(key()), message="the redelivered flush activated the session")
    assert log.readers
    assert all(name.startswith("convmem-session") for name in log.readers), log.readers
    flushed.result(WAIT)  # the new activation asked again, and got its summary
    assert live_state(system, key()) == replay_log(log, key())


def test_a_message_told_here_runs_on_the_calling_thread_unless_it_runs_a_loop(harness: Harness) -> None:
    """`tell(here=True)` (how a summarizer worker delivers its answer) has an idle live session
    handle the message on the calling thread, with no dispatcher woken; on a thread that runs an
    event loop, or to a session that is not live, nothing runs there."""
    system = harness.system()
    sessions: LiveSessions = system._sessions
    session = system.session(key())
    session.add_turn(turn("t0"))

    def handled_on(told_from_loop: bool) -> threading.Thread:
        reply: concurrent.futures.Future[object] = concurrent.futures.Future()
        where: concurrent.futures.Future[threading.Thread] = concurrent.futures.Future()
        reply.add_done_callback(lambda _: where.set_result(threading.current_thread()))

        async def on_loop() -> None:
            assert sessions.tell(key(), Refresh(reply), here=True)

        if told_from_loop:
            asyncio.run(on_loop())
        else:
            assert sessions.tell(key(), Refresh(reply), here=True)
        return where.result(timeout=WAIT)

    assert handled_on(told_from_loop=False) is threading.current_thread()
    assert handled_on(told_from_loop=True) is not threading.current_thread()
    assert not sessions.tell(key("never-started"), Refresh(concurrent.futures.Future()), here=True)
