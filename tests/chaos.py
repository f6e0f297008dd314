"""The chaos cases: faults an operator meets, each counted the same way.

Every case drives writers that retry a failed `add_turn` with the same
`idempotency_key` until it is acknowledged, injects its fault (kill -9 of
nats-server or of a writing process, a cluster node lost, a `convmem serve`
killed or stopped), then reads the log back and returns a `Tally`: turns
acknowledged, turns stored, acknowledged turns lost, turns stored more than
once and the longest stall between two acknowledgements. The tests
(tests/test_chaos.py) run each case small and assert nothing acknowledged was
lost or duplicated; ``python -m bench --only chaos`` runs them larger and
records the table.

Every server and process is started on free loopback ports with a temporary
store and stopped by pid on the way out, also when the case fails. Nothing
sleeps to synchronise: the cases wait on facts (acknowledgements counted,
a process exited, a leader elected) with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import convmem
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend
from convmem.errors import ConvmemError, EventDecodeError, LogUnavailable
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig, TurnAdded, decode_event

__all__ = [
    "CONFIG",
    "DEADLINE",
    "AsyncLoad",
    "Tally",
    "ThreadLoad",
    "keys_for",
    "server_kill",
    "stored_texts",
]

DEADLINE = 120.0
"""The longest any one fact may take to come true before the case fails naming it."""
CONFIG = ShortTermMemoryConfig(strategy="truncation")
TENANT = "chaos"


def keys_for(sessions: int, user: str = "user") -> list[MemoryKey]:
    return [MemoryKey(TENANT, user, f"s{i}") for i in range(sessions)]


@dataclass
class Tally:
    """What a case acknowledged and what the log holds afterwards, per session."""

    case: str
    acked: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    stamps: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    messages: Counter[str] = field(default_factory=Counter)
    """The failed writes' errors as the planner saw them (the first thousand kinds)."""
    error_stamps: list[float] = field(default_factory=list)
    stored: dict[str, list[str]] = field(default_factory=dict)
    faults: list[float] = field(default_factory=list)
    """When each fault was injected (monotonic seconds)."""
    spans: list[tuple[float, float]] = field(default_factory=list)
    """(started, ended) of each write whose writer said when it started, acknowledged or failed."""
    notes: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Condition = field(default_factory=threading.Condition, repr=False)

    # Recording (from any thread) --------------------------------------------------------

    def ack(self, session: str, text: str, at: float | None = None, *, started: float | None = None) -> None:
        with self._lock:
            ended = time.monotonic() if at is None else at
            self.acked[session].append(text)
            self.stamps.append(ended)
            if started is not None:
                self.spans.append((started, ended))
            self._lock.notify_all()

    def error(
        self, name: str, at: float | None = None, message: str = "", *, started: float | None = None
    ) -> None:
        with self._lock:
            ended = time.monotonic() if at is None else at
            self.errors[name] += 1
            if message and len(self.messages) < 1000:
                self.messages[f"{name}: {message}"] += 1
            self.error_stamps.append(ended)
            if started is not None:
                self.spans.append((started, ended))
            self._lock.notify_all()

    def fault(self) -> None:
        with self._lock:
            self.faults.append(time.monotonic())

    def wait_acks(self, at_least: int, *, alive: Callable[[], bool], timeout: float = DEADLINE) -> None:
        """Until `at_least` turns are acknowledged (see `wait_until`)."""
        self.wait_until(lambda: len(self.stamps) >= at_least, f"{at_least} acknowledged", alive=alive)

    def wait_errors(self, more_than: int, *, alive: Callable[[], bool], timeout: float = DEADLINE) -> None:
        """Until more than `more_than` writes have failed (see `wait_until`)."""
        self.wait_until(lambda: len(self.error_stamps) > more_than, "a failed write", alive=alive)

    def wait_until(
        self, fact: Callable[[], bool], what: str, *, alive: Callable[[], bool], timeout: float = DEADLINE
    ) -> None:
        """Until `fact()` holds, woken by each acknowledgement or failure; fails if `alive()` turns
        false first (the writers ended) or `timeout` passes, naming `what` and the counts so far."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not fact():
                left = deadline - time.monotonic()
                counts = f"{len(self.stamps)} acknowledged, {len(self.error_stamps)} failed"
                if left <= 0:
                    raise AssertionError(f"{self.case}: {what}: not within {timeout:g}s ({counts})")
                if not alive():
                    raise AssertionError(f"{self.case}: {what}: the writers ended first ({counts})")
                self._lock.wait(min(left, 0.2))

    # Figures ----------------------------------------------------------------------------

    @property
    def acknowledged(self) -> int:
        return sum(len(set(texts)) for texts in self.acked.values())

    @property
    def stored_count(self) -> int:
        return sum(map(len, self.stored.values()))

    @property
    def lost(self) -> int:
        return sum(len(set(texts) - set(self.stored.get(s, ()))) for s, texts in self.acked.items())

    @property
    def duplicated(self) -> int:
        return sum(len(texts) - len(set(texts)) for texts in self.stored.values())

    @property
    def reordered(self) -> int:
        """Sessions whose stored acknowledged turns are not in the order they were acknowledged."""
        out = 0
        for session, texts in self.acked.items():
            stored = list(dict.fromkeys(self.stored.get(session, ())))
            kept = set(stored)
            wanted = [t for t in dict.fromkeys(texts) if t in kept]
            if [t for t in stored if t in set(wanted)] != wanted:
                out += 1
        return out

    @property
    def longest_stall(self) -> float:
        """The longest time between two consecutive acknowledgements (seconds)."""
        return max((b - a for a, b in itertools.pairwise(sorted(self.stamps))), default=0.0)

    @property
    def error_window(self) -> float:
        """The longest time from a fault to the last write that failed before the next fault (seconds)."""
        bounds = [*self.faults, float("inf")]
        window = 0.0
        for at, until in itertools.pairwise(bounds):
            failed = [t for t in self.error_stamps if at <= t < until]
            window = max(window, max(failed, default=at) - at)
        return window

    @property
    def faults_hit(self) -> int:
        """The faults that landed on the load: a write was in flight across it, or one failed after it.

        A write in flight when a server dies may still be acknowledged (the client resends it on
        reconnecting and the log drops the copy), so a fault can land without any failed write:
        that it hit a write in flight is the fact a case needs, not that a planner saw an error.
        """
        bounds = [*self.faults, float("inf")]
        hit = 0
        for at, until in itertools.pairwise(bounds):
            spanned = any(started < at < ended for started, ended in self.spans)
            failed = any(at <= t < until for t in self.error_stamps)
            hit += spanned or failed
        return hit

    def row(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "acknowledged": self.acknowledged,
            "stored": self.stored_count,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "reordered": self.reordered,
            "longest_stall_s": round(self.longest_stall, 3),
            "error_window_s": round(self.error_window, 3),
            "failed_writes": dict(self.errors),
            "faults": len(self.faults),
            "faults_hit": self.faults_hit,
            **self.notes,
        }

    def check(self) -> None:
        """Nothing acknowledged lost, nothing stored twice, every session in order; something happened."""
        assert self.acknowledged > 0, f"{self.case}: nothing was acknowledged"
        assert self.lost == 0, f"{self.case}: {self.lost} acknowledged turns lost: {self.row()}"
        assert self.duplicated == 0, f"{self.case}: {self.duplicated} turns stored twice: {self.row()}"
        assert self.reordered == 0, f"{self.case}: sessions out of order: {self.row()}"


def stored_texts(
    url: str, keys: dict[str, MemoryKey], *, settle: float = 90.0, **options: Any
) -> dict[str, list[str]]:
    """Every TurnAdded of each labelled session, in log order, read by a fresh connection.

    A turn stored twice shows twice; a message that is no event is passed over. A cluster
    that has just lost a node may not answer at once (its leaders re-elect): the reading is
    tried again, each try bounded by the connection's own timeout, for up to `settle` seconds.
    """
    deadline = time.monotonic() + settle
    while True:
        try:
            return _stored_texts(url, keys, **options)
        except LogUnavailable:
            if time.monotonic() > deadline:
                raise


def _stored_texts(url: str, keys: dict[str, MemoryKey], **options: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    with JetStreamBackend.connect(url, **options) as backend:
        for label, key in keys.items():
            out[label] = []
            for record in backend.log.read(key):
                with contextlib.suppress(EventDecodeError):
                    event = decode_event(record.data)
                    if isinstance(event, TurnAdded):
                        out[label].append(event.turn.user_message)
    return out


def _turn(text: str) -> ConversationTurn:
    return ConversationTurn(user_message=text, assistant_response="ok")


# Writers in this process --------------------------------------------------------------


class ThreadLoad:
    """Planner threads, each writing its sessions round robin, retrying a failure with the same key.

    `session` opens a session's handle: a `MemorySystem`'s or a `RemoteMemory`'s.
    """

    def __init__(
        self,
        session: Callable[[MemoryKey], Any],
        tally: Tally,
        keys: list[MemoryKey],
        turns: int,
        *,
        start: int = 0,
        give_up: float = DEADLINE,
        make_turn: Callable[[str], ConversationTurn] | None = None,
    ) -> None:
        """Turns `start` .. `turns` - 1 of each session (`make_turn(text)`, default a short turn); a
        turn not acknowledged within `give_up` seconds of retries fails the load."""
        self.session, self.tally, self.turns = session, tally, turns
        self.start_at, self.give_up = start, give_up
        self.make_turn = make_turn or _turn
        self.failures: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._plan, args=(keys[i::8],), name=f"chaos-writer-{i}")
            for i in range(8)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def join(self, timeout: float = DEADLINE) -> None:
        for thread in self._threads:
            thread.join(timeout)
        assert not self.alive(), f"{self.tally.case}: the writers did not finish"
        if self.failures:
            raise self.failures[0]

    def start_and_join(self, timeout: float = DEADLINE) -> None:
        self.start()
        self.join(timeout)

    def _plan(self, group: list[MemoryKey]) -> None:
        try:
            for n in range(self.start_at, self.turns):
                for key in group:
                    self._add(key, f"{key.session_id}-{n}")
        except BaseException as exc:
            self.failures.append(exc)

    def _add(self, key: MemoryKey, text: str) -> None:
        deadline = time.monotonic() + self.give_up
        while True:
            started = time.monotonic()
            try:
                self.session(key).add_turn(self.make_turn(text), timeout=3, idempotency_key=text)
            except ConvmemError as exc:  # a clear error: the planner retries with the same key
                self.tally.error(type(exc).__name__, message=str(exc), started=started)
                if time.monotonic() > deadline:
                    raise AssertionError(f"{text}: never acknowledged") from exc
                continue
            self.tally.ack(key.session_id, text, started=started)
            return


class AsyncLoad:
    """asyncio planner tasks on `connect_here`, on a loop of their own thread, retrying with the key."""

    def __init__(self, url: str, tally: Tally, keys: list[MemoryKey], turns: int) -> None:
        self.url, self.tally, self.keys, self.turns = url, tally, keys, turns
        self.failures: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="chaos-async-writers")

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float = DEADLINE) -> None:
        self._thread.join(timeout)
        assert not self.alive(), f"{self.tally.case}: the asyncio writers did not finish"
        if self.failures:
            raise self.failures[0]

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self.failures.append(exc)

    async def _main(self) -> None:
        memory = await convmem.connect_here(self.url, config=CONFIG, timeout=2.0)
        try:
            await asyncio.gather(*(self._plan(memory, self.keys[i::8]) for i in range(8)))
        finally:
            await memory.aclose()

    async def _plan(self, memory: convmem.MemorySystem, group: list[MemoryKey]) -> None:
        for n in range(self.turns):
            for key in group:
                text = f"{key.session_id}-{n}"
                deadline = time.monotonic() + DEADLINE
                while True:
                    started = time.monotonic()
                    try:
                        await memory.session(key).aio.add_turn(_turn(text), timeout=3, idempotency_key=text)
                    except ConvmemError as exc:
                        self.tally.error(type(exc).__name__, started=started)
                        if time.monotonic() > deadline:
                            raise AssertionError(f"{text}: never acknowledged") from exc
                        continue
                    self.tally.ack(key.session_id, text, started=started)
                    break


# Case: kill -9 of nats-server ---------------------------------------------------------


@contextmanager
def running_server(store: Path, sync_interval: str | None, **options: Any) -> Iterator[EmbeddedNatsServer]:
    """A nats-server on a free loopback port and `store`, stopped by pid on the way out."""
    server = EmbeddedNatsServer(store, sync_interval=sync_interval, **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def server_kill(
    store: Path,
    *,
    sync: Literal["always", "default"],
    writers: Literal["threads", "asyncio"],
    sessions: int,
    turns: int,
    cycles: int,
) -> Tally:
    """`cycles` kill -9 of nats-server under load, each restarted on its store as soon as it is down."""
    tally = Tally(f"server kill -9, sync={sync}, {writers}")
    keys = keys_for(sessions)
    total = sessions * turns
    with running_server(store, "always" if sync == "always" else None) as server:
        with convmem.connect(server.url, config=CONFIG, timeout=2.0) as memory:
            load: ThreadLoad | AsyncLoad = (
                ThreadLoad(memory.session, tally, keys, turns)
                if writers == "threads"
                else AsyncLoad(server.url, tally, keys, turns)
            )
            load.start()
            try:
                for cycle in range(1, cycles + 1):
                    tally.wait_acks(total * cycle // (cycles + 1), alive=load.alive)
                    tally.fault()
                    server.kill()  # SIGKILL with appends in flight
                    server.start()  # the same store and port: clients reconnect
            finally:
                load.join()
        tally.stored = stored_texts(server.url, {k.session_id: k for k in keys})
    tally.notes["sessions"] = sessions
    return tally
