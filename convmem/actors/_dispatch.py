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

A handler may block (the session actor waits for the log): it holds one
dispatcher thread meanwhile, and the others go on with other actors. Handlers
must not wait on another pooled actor that could be waiting for a thread.

A thread that is about to wait for an idle actor's answer anyway can run the
message itself (`_Inbox.claim`, then `PooledActor.run_claimed`): one message,
in order, with the actor held for it as a dispatcher thread would hold it.
That saves the two thread hand-offs of a round trip through the dispatcher.

The actor loop, the inbox and the failure handling override pykka 4.x
internals (`_start_actor_loop`, `_create_actor_inbox`, `_handle_receive`,
`_handle_failure`, `_stop`, ...). pyproject.toml bounds pykka below 5, and
tests/test_patched_internals.py names any of them that changes shape.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
from typing import Any

import pykka
from pykka import ActorRegistry, ThreadingFuture
from pykka._envelope import Envelope

__all__ = ["Dispatcher", "PooledActor", "claim"]

_log = logging.getLogger("convmem.dispatch")

_SLICE = 32
"""Messages an actor handles before its thread goes to the next actor in line."""


def claim(ref: pykka.ActorRef[Any]) -> PooledActor | None:
    """`ref`'s actor, held for the calling thread, if it is a pooled actor, idle, with no mail.

    The caller must then run one message with `PooledActor.run_claimed`, which lets go of it.
    """
    inbox = ref.actor_inbox
    return inbox.claim() if isinstance(inbox, _Inbox) else None


class Dispatcher:
    """A fixed set of daemon threads running the actors that have mail, in turn."""

    def __init__(self, threads: int, *, name: str = "convmem-actors") -> None:
        if threads < 1:
            raise ValueError(f"a dispatcher needs at least one thread, got {threads}")
        self._ready: collections.deque[PooledActor] = collections.deque()
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
    """A pykka inbox that queues its actor on the dispatcher when mail comes to an idle actor."""

    __slots__ = ("_items", "_lock", "_scheduled", "actor")

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._scheduled = True  # until the actor has started: its start schedules it
        self.actor: PooledActor | None = None

    def put(self, envelope: Any, /) -> None:
        with self._lock:
            self._items.append(envelope)
            actor = self.actor
            if self._scheduled or actor is None:
                return  # already in line, or torn down (as a stopped thread's queue, nobody reads it)
            self._scheduled = True
        actor.dispatcher.schedule(actor)

    def get(self) -> Any:
        """The next message (pykka's teardown asks only after `empty()` said there is one)."""
        with self._lock:
            return self._items.popleft()

    def empty(self) -> bool:
        with self._lock:
            return not self._items

    def claim(self) -> PooledActor | None:
        """The actor, held for the calling thread, if it is idle with no mail; else None."""
        with self._lock:
            if self._scheduled or self._items or self.actor is None:
                return None
            self._scheduled = True
            return self.actor

    def release(self) -> bool:
        """After a claimed run: True, the actor idle, when no mail came; False (still in line) else."""
        with self._lock:
            if self._items:
                return False
            self._scheduled = False
            return True

    def take(self) -> Any | None:
        """The next message, or None, and the actor counts as idle until the next `put`."""
        with self._lock:
            if self._items:
                return self._items.popleft()
            self._scheduled = False
            return None


class PooledActor(pykka.Actor):
    """A pykka actor run by a `Dispatcher` (set `dispatcher` before `start` returns)."""

    dispatcher: Dispatcher
    actor_inbox: _Inbox
    on_caller_thread = False
    """True while a message runs on the thread that sent it (`run_claimed`)."""

    @staticmethod
    def _create_actor_inbox() -> _Inbox:
        return _Inbox()

    @staticmethod
    def _create_future() -> ThreadingFuture[Any]:
        return ThreadingFuture()

    def _start_actor_loop(self) -> None:
        self._set_up = False
        self.actor_inbox.actor = self
        self.dispatcher.schedule(self)

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
            self._handle_envelope(envelope)
        if self.actor_stopped.is_set():
            self._tear_down()
            return
        self.dispatcher.schedule(self)  # more mail, perhaps: back in line behind the others

    def run_claimed(self, message: Any) -> None:
        """Handle `message` on the calling thread, once `actor_inbox.claim()` returned this actor.

        The thread that claimed the actor is its thread for this one message:
        mail sent meanwhile waits in the inbox and goes to the dispatcher after
        it, in order. An interrupt of the calling thread (a `BaseException`
        raised mid-message) stops this actor, whose state may then be behind
        what it did, and reaches the caller; the other actors go on.
        """
        self.on_caller_thread = True
        try:
            self._handle_envelope(Envelope(message))
        except BaseException:
            self._stop()
            raise
        finally:
            self.on_caller_thread = False
            self.release()

    def release(self) -> None:
        """Let go of the actor after `actor_inbox.claim()`: mail that came meanwhile goes to the dispatcher.

        A holder that handles its message in parts (across an event loop's
        awaits) calls this once, when the last part is done.
        """
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
