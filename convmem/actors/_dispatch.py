"""Pykka actors that share a pool of threads instead of owning a thread each.

A `ThreadingActor` sleeps on a thread of its own between messages; with a
thousand live sessions every message wakes one of a thousand threads, and the
hand-offs (a futex wake, then a wait for the GIL behind the others) cost more
than the session's own work. A `PooledActor` keeps pykka's contract (an
`ActorRef`, `tell`/`ask`, proxies, the registry, one message at a time, in
order, `on_start`/`on_stop`/`on_failure`) while its messages run on one of a
`Dispatcher`'s threads: an actor with mail is queued on the dispatcher once,
a free thread runs a slice of its inbox, and a busy dispatcher takes new mail
without waking anyone.

An actor is *held* while one of its messages is handled: nobody else runs it
then, and mail waits in its inbox. Three kinds of holder:

- a dispatcher thread, running a slice of its inbox;
- a thread (or an event loop) that claimed the idle actor to run one message
  itself (`claim`, then `PooledActor.run_claimed`), because it is about to
  wait for the answer anyway: that saves the two thread hand-offs of a round
  trip through the dispatcher;
- work the message started and that goes on elsewhere (`PooledActor.hold`,
  then `let_go` from wherever it ends): a session's write, from its decision
  until the log settles its append, holds its actor without holding a thread.

The actor is let go when its last holder is done: it goes back in line if
mail came meanwhile, else it is idle. A handler may also block (a session
reading the log): it holds one dispatcher thread meanwhile, and the others go
on with other actors. Handlers must not wait on another pooled actor that
could be waiting for a thread. `Dispatcher.submit` runs plain work on the
same threads (a session's leftover mail, redelivered).

The actor's fields, its loop, the inbox and the failure handling override pykka 4.x
internals (`_start_actor_loop`, `_create_actor_inbox`, `_handle_receive`,
`_handle_failure`, `_stop`, ...). pyproject.toml bounds pykka below 5, and
tests/test_patched_internals.py names any of them that changes shape.
"""

from __future__ import annotations

import collections
import itertools
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

import pykka
from pykka import ActorRef, ActorRegistry, ThreadingFuture
from pykka._envelope import Envelope

from convmem.errors import InvalidConfig

__all__ = ["Dispatcher", "PooledActor", "claim", "is_busy", "stop_idle"]

_log = logging.getLogger("convmem.dispatch")

_SLICE = 32
"""Messages an actor handles before its thread goes to the next actor in line."""

_serials = itertools.count(1)
"""Pooled actors' URNs: unique in the process, as pykka's registry needs, without a random UUID each."""


def claim(ref: pykka.ActorRef[Any]) -> PooledActor | None:
    """`ref`'s actor, held for the calling thread, if it is a pooled actor, idle, with no mail.

    The caller must then run one message with `PooledActor.run_claimed`, which lets go of it.
    """
    inbox = ref.actor_inbox
    return inbox.claim() if isinstance(inbox, _Inbox) else None


def stop_idle(ref: pykka.ActorRef[Any]) -> bool:
    """Stop `ref`'s actor on the calling thread if it is a pooled actor, idle, with no mail.

    Its `on_stop` runs here, at once, as it would on a dispatcher thread after
    a stop message: no thread hand-off. False (nothing done) when the actor is
    busy or has mail: stop it with `ref.stop()` then, behind its mail.
    """
    actor = claim(ref)
    if actor is None:
        return False
    actor.stop_claimed()
    return True


def is_busy(ref: pykka.ActorRef[Any]) -> bool:
    """Whether `ref`'s actor is held (a message of it runs, or work it started) or has mail waiting."""
    inbox = ref.actor_inbox
    return inbox.busy() if isinstance(inbox, _Inbox) else not inbox.empty()


class _Work:
    """Plain work queued on a dispatcher beside the actors (`Dispatcher.submit`)."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[], object]) -> None:
        self._fn = fn

    def _run_slice(self) -> None:
        try:
            self._fn()
        except Exception:
            _log.exception("work submitted to the dispatcher failed")


class Dispatcher:
    """A fixed set of daemon threads running the actors that have mail, in turn."""

    def __init__(self, threads: int, *, name: str = "convmem-actors") -> None:
        if threads < 1:
            raise InvalidConfig("threads", f"a dispatcher needs at least one thread, got {threads}")
        self._ready: collections.deque[PooledActor | _Work] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{n}", daemon=True) for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def schedule(self, actor: PooledActor) -> None:
        with self._cond:
            self._ready.append(actor)
            self._cond.notify()

    def submit(self, fn: Callable[[], object]) -> bool:
        """Run `fn()` on one of the threads, in line with the actors; False once the dispatcher closed.

        `fn` may block like a handler (it holds its thread meanwhile); what it raises is logged.
        """
        with self._cond:
            if self._closed:
                return False
            self._ready.append(_Work(fn))
            self._cond.notify()
            return True

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._ready and not self._closed:
                    self._cond.wait()
                if not self._ready:
                    return
                actor = self._ready.popleft()
            actor._run_slice()

    def close(self, timeout: float = 5.0) -> None:
        """Let the threads finish what is queued, then stop them (waiting at most `timeout` each)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout)


class _Inbox:
    """A pykka inbox that queues its actor on the dispatcher when mail comes to an idle actor.

    `scheduled` is True while the actor is in line or held; `holders` counts
    who holds it during and after a message (the thread running it, and any
    work it left holding it: `PooledActor.hold`). Its queue is made with its first queued message:
    a session whose messages all run on their callers' threads keeps none (a deque is 600 bytes
    and one more object for every full collection to walk).
    """

    __slots__ = ("_items", "_lock", "_scheduled", "actor", "holders")

    def __init__(self) -> None:
        self._items: collections.deque[Any] | None = None
        self._lock = threading.Lock()
        self._scheduled = True  # until the actor has started: its start schedules it
        self.actor: PooledActor | None = None
        self.holders = 0

    def put(self, envelope: Any, /) -> None:
        with self._lock:
            self._queue().append(envelope)
            actor = self.actor
            if self._scheduled or actor is None:
                return  # already in line, or torn down (as a stopped thread's queue, nobody reads it)
            self._scheduled = True
        actor.dispatcher.schedule(actor)

    def put_first(self, envelope: Any) -> None:
        """Queue `envelope` ahead of the mail, by a holder of the actor: it is the actor's next message."""
        with self._lock:
            self._queue().appendleft(envelope)

    def get(self) -> Any:
        """The next message (pykka's teardown asks only after `empty()` said there is one)."""
        with self._lock:
            return self._queue().popleft()

    def _queue(self) -> collections.deque[Any]:
        """The queue, made now if need be (under the lock)."""
        items = self._items
        if items is None:
            items = self._items = collections.deque()
        return items

    def empty(self) -> bool:
        with self._lock:
            return not self._items

    def busy(self) -> bool:
        with self._lock:
            return self._scheduled or bool(self._items)

    def claim(self) -> PooledActor | None:
        """The actor, held for the calling thread, if it is idle with no mail; else None."""
        with self._lock:
            if self._scheduled or self._items or self.actor is None:
                return None
            self._scheduled = True
            return self.actor

    def take(self) -> Any | None:
        """The next message, or None, and the actor counts as idle until the next `put`."""
        with self._lock:
            if self._items:
                return self._items.popleft()
            self._scheduled = False
            return None

    def drop_holder(self) -> bool:
        """One holder is done; True when it was the last (the caller must then let the actor go)."""
        with self._lock:
            self.holders -= 1
            return self.holders == 0

    def release(self) -> bool:
        """After the last holder: True, the actor idle, when no mail came; False (still in line) else."""
        with self._lock:
            if self._items:
                return False
            self._scheduled = False
            return True


class _Stopped:
    """`threading.Event`'s `is_set`, `set` and `wait` for `actor_stopped`, without a `Condition`.

    A flag, and a lock made only when a thread first waits for the stop (few ever do): held from
    then until `set` releases it; each waiter takes it and gives it back at once. A live session
    keeps no lock of its own for it (each tracked object is walked by every full collection).
    """

    __slots__ = ("_flag", "_lock")

    def __init__(self) -> None:
        self._flag = False
        self._lock: threading.Lock | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with _STOPPING:
            if self._flag:
                return
            self._flag = True
            lock = self._lock
        if lock is not None:
            lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        with _STOPPING:
            if self._flag:
                return True
            lock = self._lock
            if lock is None:
                lock = self._lock = threading.Lock()
                lock.acquire()
        if not lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return self._flag
        lock.release()
        return True


_STOPPING = threading.Lock()
"""Makes `_Stopped.set` once-only when two threads stop the same actor, and its lock made once."""


class PooledActor(pykka.Actor):
    """A pykka actor run by a `Dispatcher` (set `dispatcher` before `start` returns)."""

    dispatcher: Dispatcher
    actor_inbox: _Inbox
    on_caller_thread = False
    """True while a message runs on the thread (or loop) that sent it (`run_claimed`)."""
    on_loop = False
    """True while a message runs on an event loop that claimed the actor: it must not block."""
    starts_idle = False
    """Start on the starting thread (`on_start` runs there) and idle, ready to be claimed at once,
    instead of setting up on a dispatcher thread first."""

    def __init__(self) -> None:
        # What pykka's `Actor.__init__` sets (tests/test_patched_internals.py checks it still sets only
        # these), cheaper: a session starts an actor each time it comes back past the live bound, and
        # pykka's random UUID and `threading.Event` (a `Condition` each) were a fifth of that start.
        self.actor_urn = f"urn:convmem:actor:{next(_serials)}"
        self.actor_inbox = self._create_actor_inbox()
        self.actor_stopped = _Stopped()  # type: ignore[assignment]  # the Event calls pykka and convmem make
        self._actor_ref = ActorRef(self)

    @staticmethod
    def _create_actor_inbox() -> _Inbox:
        return _Inbox()

    @staticmethod
    def _create_future() -> ThreadingFuture[Any]:
        return ThreadingFuture()

    def _start_actor_loop(self) -> None:
        self._set_up = False
        inbox = self.actor_inbox
        inbox.actor = self
        if not self.starts_idle:
            self.dispatcher.schedule(self)
            return
        self._set_up = True
        self._actor_loop_setup()
        with inbox._lock:
            if not inbox._items:
                inbox._scheduled = False
                return
        self.dispatcher.schedule(self)  # mail came already (a broadcast): to the dispatcher with it

    def _run_slice(self) -> None:
        """Run on a dispatcher thread: start up once, then handle up to `_SLICE` messages."""
        if not self._set_up:
            self._set_up = True
            self._actor_loop_setup()
        for _ in range(_SLICE):
            if self.actor_stopped.is_set():
                break
            envelope = self.actor_inbox.take()
            if envelope is None:
                return
            self.actor_inbox.holders = 1
            self._handle_envelope(envelope)
            if not self.actor_inbox.drop_holder():
                return  # work the message started holds the actor: its `let_go` goes on from there
        if self.actor_stopped.is_set():
            self._tear_down()
            return
        self.dispatcher.schedule(self)  # more mail, perhaps: back in line behind the others

    def run_claimed(self, message: Any, *, on_loop: bool = False) -> None:
        """Handle `message` on the calling thread, once `claim` returned this actor.

        The thread that claimed the actor is its thread for this one message:
        mail sent meanwhile waits in the inbox and goes to the dispatcher after
        it, in order. With `on_loop`, the caller is an event loop: the handler
        must not block (`on_loop` tells it so). An interrupt of the calling
        thread (a `BaseException` raised mid-message) stops this actor, whose
        state may then be behind what it did, and reaches the caller; the
        other actors go on.
        """
        self.on_caller_thread = True
        self.on_loop = on_loop
        self.actor_inbox.holders = 1
        try:
            self.on_claimed(message)
        except BaseException:
            self._stop()
            raise
        finally:
            self.on_caller_thread = False
            self.on_loop = False
            self._drop_holder()

    def stop_claimed(self) -> None:
        """Stop the actor on the thread that claimed it (`stop_idle`): `on_stop` runs here."""
        self.actor_inbox.holders = 1
        try:
            self._stop()
        finally:
            self._drop_holder()

    def on_claimed(self, message: Any) -> None:
        """Handle a message run by the thread that claimed the actor (`run_claimed`).

        As a dispatcher thread would (pykka's `on_receive`, failures included);
        an actor whose `on_receive` never raises may handle it more directly.
        """
        self._handle_envelope(Envelope(message))

    def hold(self) -> None:
        """Keep the actor held after the current message returns, until `let_go`.

        For work that the message starts and that ends elsewhere (another
        thread, an event loop): no other message of this actor runs before it
        ends. Call from the message's handler, or from work holding the actor.
        """
        with self.actor_inbox._lock:
            self.actor_inbox.holders += 1

    def let_go(self) -> None:
        """End one `hold`: the actor goes on to its mail, or idles, once nothing holds it."""
        self._drop_holder()

    def requeue(self, message: Any) -> None:
        """From work holding the actor: run `message` next, on a dispatcher thread, then `let_go`."""
        self.actor_inbox.put_first(Envelope(message))
        self._drop_holder()

    def _drop_holder(self) -> None:
        # `drop_holder` then `_release`, under one lock for the common end: the last holder of an
        # actor that runs on, with no mail come meanwhile, leaves it idle right here.
        inbox = self.actor_inbox
        with inbox._lock:
            inbox.holders -= 1
            if inbox.holders:
                return
            if not inbox._items and not self.actor_stopped.is_set():
                inbox._scheduled = False
                return
        self._release()

    def _release(self) -> None:
        """Let go of the held actor: mail that came meanwhile goes to the dispatcher."""
        if self.actor_stopped.is_set():
            self._tear_down()
        elif not self.actor_inbox.release():
            self.dispatcher.schedule(self)

    def _tear_down(self) -> None:
        """Once: a stopped actor is never queued again (its inbox no longer points to it)."""
        self._actor_loop_teardown()
        with self.actor_inbox._lock:
            self.actor_inbox.actor = None  # no cycle keeps a stopped actor and its state alive

    def _handle_envelope(self, envelope: Any) -> None:
        """What pykka's thread loop does with one message, exceptions included."""
        try:
            response = self._handle_receive(envelope.message)
            if envelope.reply_to is not None:
                envelope.reply_to.set(response)
        except Exception:
            if envelope.reply_to is not None:
                envelope.reply_to.set_exception()
            else:
                self._handle_failure(*sys.exc_info())
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:
                    self._handle_failure(*sys.exc_info())
        except BaseException:
            if self.on_caller_thread:
                raise  # the caller's own interrupt: `run_claimed` stops this actor and passes it on
            # As pykka does: stop everything, but keep the dispatcher thread.
            _log.debug("%r in %s: stopping all actors", sys.exc_info()[1], self)
            self._stop()
            threading.Thread(target=ActorRegistry.stop_all, daemon=True).start()
