"""Pooled pykka actors: pykka's contract kept while many actors share a few threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pykka
import pytest
from runtime_helpers import WAIT, GatedLog, Harness, key, live_state, replay_log, turn, users, wait_until

from convmem.actors._dispatch import Dispatcher, PooledActor, claim
from convmem.adapters import InMemoryEventLog
from convmem.errors import InvalidConfig, OperationTimeout
from convmem.events import Event, MemoryKey, ShortTermMemoryConfig


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    pool = Dispatcher(2, name="test-dispatch")
    yield pool
    pykka.ActorRegistry.stop_all(block=True, timeout=WAIT)
    pool.close(WAIT)


class Interrupt(BaseException):
    """What a KeyboardInterrupt is to a thread, without pytest taking it for the user's Ctrl-C."""


class Recorder(PooledActor):
    """Records what it handles and on which thread; checks no two of its messages overlap."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__()
        self.dispatcher = dispatcher
        self.seen: list[Any] = []
        self.threads: set[str] = set()
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.failures: list[BaseException | None] = []
        self.failed = threading.Event()
        self._busy = False

    def on_start(self) -> None:
        self.started.set()

    def on_stop(self) -> None:
        self.stopped.set()

    def on_failure(self, exception_type: Any, exception_value: BaseException | None, traceback: Any) -> None:
        self.failures.append(exception_value)
        self.failed.set()

    def on_receive(self, message: Any) -> Any:
        assert not self._busy, "two messages of one actor ran at once"
        self._busy = True
        try:
            self.threads.add(threading.current_thread().name)
            if isinstance(message, threading.Event):
                assert message.wait(WAIT)
            elif message == "boom":
                raise ValueError("boom")
            elif message == "interrupt":
                raise Interrupt()
            self.seen.append(message)
            return len(self.seen)
        finally:
            self._busy = False

    def snapshot(self) -> list[Any]:
        return list(self.seen)


def test_many_actors_on_two_threads_each_see_their_messages_in_order(dispatcher: Dispatcher) -> None:
    refs = [Recorder.start(dispatcher) for _ in range(40)]

    def send(offset: int) -> None:
        for n in range(50):
            for ref in refs[offset::4]:
                ref.tell(n)

    senders = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(WAIT)
    for ref in refs:
        assert ref.proxy().snapshot().get(timeout=WAIT) == list(range(50))
    threads = set().union(*(ref.proxy().threads.get(timeout=WAIT) for ref in refs))
    assert threads <= {"test-dispatch-0", "test-dispatch-1"}


def test_ask_tell_proxy_start_and_stop_behave_as_in_pykka(dispatcher: Dispatcher) -> None:
    ref = Recorder.start(dispatcher)
    proxy = ref.proxy()
    assert proxy.started.get(timeout=WAIT).is_set()
    ref.tell("a")
    assert ref.ask("b", timeout=WAIT) == 2
    with pytest.raises(ValueError, match="boom"):
        ref.ask("boom", timeout=WAIT)  # an asked failure goes back to the asker; the actor lives on
    assert proxy.snapshot().get(timeout=WAIT) == ["a", "b"]
    stopped = proxy.stopped.get(timeout=WAIT)
    ref.stop(block=True, timeout=WAIT)
    assert stopped.is_set()
    assert not ref.is_alive()
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("late")


def test_a_stopped_actors_flag_wakes_every_waiter_and_tells_a_wait_that_timed_out(
    dispatcher: Dispatcher,
) -> None:
    """`actor_stopped` (convmem's own, lighter than an `Event`) answers `is_set`, `wait` and `set` as one."""
    ref = Recorder.start(dispatcher)
    flag = ref.actor_stopped
    assert not flag.is_set()
    assert flag.wait(0) is False  # not stopped: a wait runs out and says so
    assert flag.wait(0.01) is False
    woke: list[bool] = []
    waiters = [threading.Thread(target=lambda: woke.append(flag.wait()), daemon=True) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    ref.stop(block=True, timeout=WAIT)
    for waiter in waiters:
        waiter.join(WAIT)
    assert not any(waiter.is_alive() for waiter in waiters), "a wait without a timeout missed the stop"
    assert woke == [True, True, True]
    assert flag.is_set()
    assert flag.wait(0)
    assert flag.wait()
    flag.set()  # a second stop of the same actor is no error
    assert flag.is_set()
    assert not ref.is_alive()


def test_every_pooled_actor_has_its_own_urn_in_the_registry(dispatcher: Dispatcher) -> None:
    refs = [Recorder.start(dispatcher) for _ in range(50)]
    assert len({ref.actor_urn for ref in refs}) == 50
    for ref in refs:
        assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is ref
        ref.stop(block=True, timeout=WAIT)
        assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is None


def test_a_told_failure_stops_that_actor_only_and_calls_on_failure(dispatcher: Dispatcher) -> None:
    failing, other = Recorder.start(dispatcher), Recorder.start(dispatcher)
    failed, failures = failing.proxy().failed.get(timeout=WAIT), failing.proxy().failures.get(timeout=WAIT)
    failing.tell("boom")
    assert failed.wait(WAIT)  # as pykka does: logged, on_failure called, the actor stopped
    assert isinstance(failures[0], ValueError)
    assert not failing.is_alive()
    assert other.ask("still here", timeout=WAIT) == 1


def test_a_blocked_handler_holds_one_thread_while_others_go_on(dispatcher: Dispatcher) -> None:
    blocked, free = Recorder.start(dispatcher), Recorder.start(dispatcher)
    gate = threading.Event()
    blocked.tell(gate)
    assert free.ask("through", timeout=WAIT) == 1  # one thread is held by `blocked`, the other serves
    gate.set()
    assert blocked.ask("after", timeout=WAIT) == 2


def test_a_dispatcher_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        Dispatcher(0)


def _session_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("convmem-session-")}


def test_sessions_share_the_systems_actor_threads(harness: Harness) -> None:
    """Fifty live sessions on three threads: every turn stored, no thread each, all stopped on close."""
    before = _session_threads()  # other tests' systems may still be around
    system = harness.system(ShortTermMemoryConfig(strategy="truncation"), actor_threads=3)
    keys = [key(f"s{n}") for n in range(50)]

    def write(offset: int) -> None:
        for k in keys[offset::5]:
            for n in range(3):
                system.session(k).add_turn(turn(f"{k.session_id}-{n}"))

    writers = [threading.Thread(target=write, args=(i,)) for i in range(5)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(WAIT * 4)
    for k in keys:
        assert users(live_state(system, k)) == [f"{k.session_id}-{n}" for n in range(3)]
    mine = _session_threads() - before
    assert len(mine) == 3
    system.close()
    assert not any(t.is_alive() for t in mine)


def test_actor_threads_must_be_positive(harness: Harness) -> None:
    with pytest.raises(InvalidConfig, match="actor_threads"):
        harness.system(ShortTermMemoryConfig(strategy="truncation"), actor_threads=0)


# A thread that waits anyway runs the message itself --------------------------------------------


def claimed(ref: pykka.ActorRef[Any]) -> PooledActor:
    """`ref`'s actor, held for this thread, once it is idle (it may still be finishing a slice)."""
    held: list[PooledActor] = []

    def take() -> bool:
        actor = claim(ref)
        if actor is not None:
            held.append(actor)
        return actor is not None

    wait_until(take, message="the actor is idle")
    return held[0]


def test_a_claimed_actor_runs_one_message_on_the_calling_thread(dispatcher: Dispatcher) -> None:
    ref = Recorder.start(dispatcher)
    assert ref.ask("first", timeout=WAIT) == 1
    actor = claimed(ref)
    assert isinstance(actor, Recorder)
    actor.run_claimed("here")
    assert actor.seen == ["first", "here"]
    assert threading.current_thread().name in actor.threads
    assert ref.ask("after", timeout=WAIT) == 3  # let go: the dispatcher runs it again


def test_mail_sent_during_a_claimed_run_follows_it_in_order(dispatcher: Dispatcher) -> None:
    ref = Recorder.start(dispatcher)
    actor = claimed(ref)
    gate = threading.Event()
    runner = threading.Thread(target=actor.run_claimed, args=(gate,))
    runner.start()
    wait_until(lambda: bool(actor.threads), message="the claimed run started")
    ref.tell("a")
    ref.tell("b")
    assert claim(ref) is None  # held by the runner, and with mail waiting
    gate.set()
    runner.join(WAIT)
    assert ref.ask("c", timeout=WAIT) == 4
    assert actor.seen == [gate, "a", "b", "c"]


def test_an_actor_with_mail_or_at_work_is_not_claimed(dispatcher: Dispatcher) -> None:
    ref = Recorder.start(dispatcher)
    gate = threading.Event()
    ref.tell(gate)  # held on a dispatcher thread
    ref.tell("queued")
    assert claim(ref) is None
    gate.set()
    assert ref.ask("done", timeout=WAIT) == 3


def test_an_interrupt_of_the_calling_thread_stops_that_actor_only(dispatcher: Dispatcher) -> None:
    interrupted, other = Recorder.start(dispatcher), Recorder.start(dispatcher)
    actor = claimed(interrupted)
    assert isinstance(actor, Recorder)
    with pytest.raises(Interrupt):
        actor.run_claimed("interrupt")
    assert actor.stopped.is_set()
    assert not interrupted.is_alive()
    assert other.ask("still here", timeout=WAIT) == 1
    assert actor.failures == []  # not a failure of the actor: the caller's own interrupt


class InterruptingLog(InMemoryEventLog):
    """Stores the next append of `key`, then interrupts the thread that made it."""

    def __init__(self, key: MemoryKey) -> None:
        super().__init__()
        self.key = key
        self.armed = False

    def append(self, key: MemoryKey, events: Sequence[Event], *, expected_seq: int) -> int:
        last = super().append(key, events, expected_seq=expected_seq)
        if self.armed and key == self.key:
            self.armed = False
            raise Interrupt()
        return last


def test_an_idle_sessions_write_runs_on_the_callers_thread(harness: Harness) -> None:
    """With the one actor thread held by another session, a blocking add_turn still completes."""
    log = GatedLog()
    system = harness.system(ShortTermMemoryConfig(strategy="truncation"), log=log, actor_threads=1)
    held, free = system.session(key("held")), system.session(key("free"))
    assert free.add_turn(turn("free-0")) == 1
    assert held.add_turn(turn("held-0")) == 1
    log.arm()
    # A timeout below the system's keeps the caller apart: this write goes to the actor thread.
    waiting = threading.Thread(target=held.add_turn, args=(turn("held-1"),), kwargs={"timeout": WAIT / 2})
    waiting.start()
    assert log.entered.wait(WAIT)
    try:
        assert free.add_turn(turn("free-1")) == 2  # ran here: the only actor thread is held
        with pytest.raises(OperationTimeout):
            free.add_turn(turn("free-2"), timeout=0.2)  # queued behind the held thread, answered in time
    finally:
        log.gate.set()
    waiting.join(WAIT)
    free.flush()
    # free-2's caller gave up before it started: it never starts (as an asyncio caller's write)
    assert users(live_state(system, key("free"))) == ["free-0", "free-1"]
    assert users(live_state(system, key("held"))) == ["held-0", "held-1"]


def test_an_interrupted_write_loses_nothing_and_the_session_reloads_from_the_log(harness: Harness) -> None:
    """Ctrl-C in the caller's thread after the log stored its turn: the next call sees that turn."""
    k = key("interrupted")
    log = InterruptingLog(k)
    system = harness.system(ShortTermMemoryConfig(strategy="truncation"), log=log)
    handle = system.session(k)
    assert handle.add_turn(turn("first")) == 1
    log.armed = True
    with pytest.raises(Interrupt):
        handle.add_turn(turn("stored, then interrupted"))
    assert not system.is_live(k)  # the actor stopped: its state may be behind the log
    assert handle.add_turn(turn("third")) == 3
    assert users(live_state(system, k)) == ["first", "stored, then interrupted", "third"]
    assert live_state(system, k) == replay_log(log, k)
