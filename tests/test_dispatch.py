"""Pooled pykka actors: pykka's contract kept while many actors share a few threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pykka
import pytest
from runtime_helpers import WAIT, Harness, key, live_state, turn, users

from convmem.actors._dispatch import Dispatcher, PooledActor
from convmem.errors import InvalidConfig
from convmem.events import ShortTermMemoryConfig


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    pool = Dispatcher(2, name="test-dispatch")
    yield pool
    pykka.ActorRegistry.stop_all(block=True, timeout=WAIT)
    pool.close(WAIT)


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
