"""How the `peers` measure drives a store: callers, plans, rates, the check, and a process per store.

Each store runs in a child process of its own (`StoreProcess`), so that no
store pays for another's threads, heap or registries (pykka keeps every live
actor of a process in one list: a convmem system with 10,000 live sessions
would slow another system's passivations in the same process). The parent
only sequences the phases, so the rounds still alternate between stores.
Inside the child, a phase runs one thread per caller (stores whose calls
block) or one asyncio task per caller on the store's event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Iterator
from multiprocessing.connection import Connection
from typing import Any

from bench._common import exit_on_sigterm, sample_turn, session_keys
from bench._peer_stores import (
    AgentsSession,
    ConvmemTasks,
    ConvmemThreads,
    LangGraphSaver,
    LoopThread,
    PenguiFlowMemory,
    Store,
)
from bench._profile import py_spy

__all__ = ["STORES", "Plan", "StoreProcess", "check", "rate", "read_plan", "stores", "write_plan"]

PHASE_TIMEOUT = 3600.0


def stores() -> dict[str, Store]:
    """Every store of the measure, by its short name, in the order of the first round."""
    return {
        "live": ConvmemThreads(all_live=True),
        "bound": ConvmemThreads(all_live=False),
        "tasks": ConvmemTasks(),
        "agents_file": AgentsSession(on_file=True),
        "agents_memory": AgentsSession(on_file=False),
        "langgraph_file": LangGraphSaver(on_file=True),
        "langgraph_memory": LangGraphSaver(on_file=False),
        "penguiflow": PenguiFlowMemory(),
    }


STORES = tuple(stores())

Plan = list[list[tuple[int, ...]]]
"""One list of calls per caller: a write's (session, turn), a read's (session,)."""


def _ops(ops: list[tuple[int, ...]], deadline: float | None) -> Iterator[tuple[int, ...]]:
    """`ops` once; or, given a `deadline` (`time.perf_counter`), round and round them until then."""
    if deadline is None:
        yield from ops
        return
    for op in itertools.cycle(ops):
        if time.perf_counter() >= deadline:
            return
        yield op


def _in_threads(plan: Plan, call: Callable[..., Any], seconds: float | None) -> tuple[int, float]:
    """Calls made by one thread per caller, and the seconds from the moment all were ready to the last."""
    barrier = threading.Barrier(len(plan) + 1)
    errors: list[BaseException] = []
    made = [0] * len(plan)
    deadline: list[float | None] = [None]

    def caller(index: int) -> None:
        barrier.wait()
        try:
            for op in _ops(plan[index], deadline[0]):
                call(*op)
                made[index] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(len(plan))]
    for thread in threads:
        thread.start()
    started = time.perf_counter()
    deadline[0] = None if seconds is None else started + seconds
    barrier.wait()
    for thread in threads:
        thread.join(PHASE_TIMEOUT)
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    if any(thread.is_alive() for thread in threads):
        raise TimeoutError(f"callers still running after {PHASE_TIMEOUT:.0f} s")
    return sum(made), elapsed


async def _in_tasks(
    plan: Plan, call: Callable[..., Coroutine[Any, Any, Any]], seconds: float | None
) -> tuple[int, float]:
    """Calls made by one asyncio task per caller, and the seconds they took.

    A task group, not `gather`: when one caller fails the others are cancelled and
    awaited before the failure is raised, so no caller still uses the store while
    the measure (or a test) closes it.
    """
    made = [0] * len(plan)
    started = time.perf_counter()
    deadline = None if seconds is None else started + seconds

    async def caller(index: int) -> None:
        for op in _ops(plan[index], deadline):
            await call(*op)
            made[index] += 1

    try:
        async with asyncio.TaskGroup() as group:
            for i in range(len(plan)):
                group.create_task(caller(i))
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return sum(made), time.perf_counter() - started


def rate(store: Store, loop: LoopThread, plan: Plan, *, reads_for: float | None = None) -> float:
    """Writes per second along `plan`; or, given `reads_for` seconds, reads per second round it."""
    call = store.write if reads_for is None else store.read
    if store.calls == "threads":
        made, seconds = _in_threads(plan, call, reads_for)
    else:
        made, seconds = loop.run(_in_tasks(plan, call, reads_for), PHASE_TIMEOUT)
    return made / seconds


def write_plan(owned: list[list[int]], first: int, last: int) -> Plan:
    """Turns `first` .. `last - 1` to every session, each caller round its own sessions once per turn."""
    return [[(s, t) for t in range(first, last) for s in mine] for mine in owned]


def read_plan(owned: list[list[int]]) -> Plan:
    """Each caller round its own sessions (again and again, for as long as the round lasts)."""
    return [[(s,) for s in mine] for mine in owned]


def check(store: Store, loop: LoopThread, sessions: int, users: list[str]) -> int:
    """Each sampled session shows exactly the turns written (its window of them); the count shown."""
    expected = users if store.window is None else users[-store.window :]
    for session in sorted({0, sessions // 2, sessions - 1}):
        context = store.read(session)
        if store.calls == "tasks":
            context = loop.run(context, 60)
        shown = store.shown(context)
        if shown != expected:
            raise AssertionError(
                f"{store.label}: session {session} shows {len(shown)} turns {shown[-1:]!r}..., "
                f"expected the {len(expected)} written, ending {expected[-1:]!r}"
            )
    return len(expected)


def _serve(conn: Connection, name: str, turns_written: int, callers: int) -> None:
    """The child's side: one store, driven by the parent's commands until ``("exit",)``."""
    exit_on_sigterm()
    store = stores()[name]
    turns = [sample_turn(n) for n in range(turns_written)]
    loop = LoopThread()
    owned: list[list[int]] = []
    sessions = 0
    try:
        while True:
            command, *args = conn.recv()
            try:
                if command == "exit":
                    conn.send((True, None))
                    return
                if command == "open":
                    sessions = args[0]
                    owned = [list(range(c, sessions, callers)) for c in range(min(callers, sessions))]
                    store.open(session_keys(sessions, tenant="peers"), turns, loop)
                    facts = {
                        key: getattr(store, key)
                        for key in ("pragmas", "live_bound")
                        if getattr(store, key, None) is not None
                    }
                    conn.send((True, facts))
                elif command == "write":
                    conn.send((True, rate(store, loop, write_plan(owned, args[0], args[1]))))
                elif command == "read":
                    conn.send((True, rate(store, loop, read_plan(owned), reads_for=args[0])))
                elif command == "check":
                    conn.send((True, check(store, loop, sessions, [t.user_message for t in turns])))
                elif command == "profile":
                    out_dir, profile_name, seconds = args
                    details: dict[str, Any] = {}
                    with py_spy(out_dir, profile_name, details):  # an extra pass: one more turn each
                        rate(store, loop, write_plan(owned, 0, 1))
                        rate(store, loop, read_plan(owned), reads_for=seconds)
                    conn.send((True, details[profile_name]))
                elif command == "close":
                    store.close(loop)
                    conn.send((True, None))
                else:
                    raise ValueError(f"unknown command {command!r}")
            except Exception:
                conn.send((False, traceback.format_exc()))
    finally:
        loop.close()


class StoreProcess:
    """A store in a child process of its own; each call runs one phase there and returns its result."""

    def __init__(
        self, name: str, *, turns: int, callers: int, root: str | None = None, key: str | None = None
    ) -> None:
        """`root`: a checkout whose convmem and bench the child imports instead (a baseline), named `key`."""
        self.name = key or name
        self.label = stores()[name].label + (f" (baseline {root})" if root else "")
        self.window = stores()[name].window
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, name, turns, callers), name=f"peers-{name}", daemon=True
        )
        if root is not None:
            sys.path.insert(0, root)  # a spawned child starts with the parent's sys.path
        try:
            self._process.start()
        finally:
            if root is not None:
                sys.path.remove(root)
        child.close()

    def _ask(self, *command: Any) -> Any:
        self._conn.send(command)
        if not self._conn.poll(PHASE_TIMEOUT):
            raise TimeoutError(f"{self.label}: no answer to {command[0]!r} in {PHASE_TIMEOUT:.0f} s")
        ok, value = self._conn.recv()
        if not ok:
            raise RuntimeError(f"{self.label}: {command[0]} failed in its process:\n{value}")
        return value

    def open(self, sessions: int) -> dict[str, Any]:
        """A fresh store on `sessions` sessions; what it says of itself (SQLite settings, live bound)."""
        return dict(self._ask("open", sessions))

    def writes(self, first: int, last: int) -> float:
        """Writes/s of turns `first` .. `last - 1` to every session."""
        return float(self._ask("write", first, last))

    def reads(self, seconds: float) -> float:
        """Reads/s over `seconds`, every caller round its sessions."""
        return float(self._ask("read", seconds))

    def check(self) -> int:
        """How many turns a read shows, once sampled sessions showed exactly the turns written."""
        return int(self._ask("check"))

    def profile(self, out_dir: str, name: str, seconds: float) -> dict[str, Any]:
        return dict(self._ask("profile", out_dir, name, seconds))

    def close(self) -> None:
        """Close the store (the process stays for the next size)."""
        self._ask("close")

    def exit(self) -> None:
        try:
            if self._process.is_alive():
                self._ask("exit")
        finally:
            self._process.join(30)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
            self._conn.close()
