"""The stores of the `peers` measure: convmem three ways and the memories a planner would pick instead.

Each store does what a planner does once per turn, through that store's own
public API: `write` a finished turn (the user's message and the assistant's
answer) to a session, and `read` what the store offers as the context to
inject. A store is called either from threads (``calls == "threads"``: its
methods block) or from asyncio tasks on one event loop (``calls == "tasks"``:
its methods are coroutines); `shown` turns a read into the user messages it
holds, so the measure can check that every store holds what was written.
"""

from __future__ import annotations

import asyncio
import collections
import sqlite3
import tempfile
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import convmem
from convmem.actors import AsyncSessionHandle, MemorySystem, SessionHandle
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

if TYPE_CHECKING:  # each store imports its peer when opened: a store's process loads only its own
    from agents import SQLiteSession
    from langchain_core.messages import BaseMessage
    from langgraph.checkpoint.base import BaseCheckpointSaver

__all__ = [
    "AGENTS_OPEN_SESSIONS",
    "AgentsSession",
    "ConvmemTasks",
    "ConvmemThreads",
    "LangGraphSaver",
    "LoopThread",
    "PenguiFlowMemory",
    "Store",
]

T = TypeVar("T")
Calls = Literal["threads", "tasks"]

AGENTS_OPEN_SESSIONS = 1024
"""File-backed `SQLiteSession` objects kept open at once (least recently used closed first).

Each open one holds a connection per worker thread that touched it (about ten file
descriptors per session here): keeping every session's object open runs out of the
process's descriptors long before 10,000 sessions."""

_CONFIG = ShortTermMemoryConfig(strategy="truncation")
"""convmem's and PenguiFlow's memory: a window of the newest 5 turns (``full_zone_turns`` default)."""


class LoopThread:
    """An event loop running in a thread of its own, for the stores called from asyncio tasks.

    It keeps running between the measure's phases, so a NATS connection on it
    answers the server's pings while other stores are measured.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="peers-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


class Store:
    """One memory under test; subclasses fill in the calls."""

    label = ""
    """The figure's name for it, saying how durable its writes are."""
    calls: Calls = "threads"
    window: int | None = None
    """How many of the newest turns a read shows (None: the whole list)."""

    def folder(self) -> Path:
        """A temporary folder of the store's own, removed by `close`."""
        self._folder = tempfile.TemporaryDirectory(prefix="convmem-bench-peers-")
        return Path(self._folder.name)

    def open(self, keys: list[MemoryKey], turns: list[ConversationTurn], loop: LoopThread) -> None:
        """Make the store for `keys`; `turns` are the turns the measure will write, by number."""
        raise NotImplementedError

    def write(self, session: int, turn: int) -> Any:
        """Store turn number `turn` in session number `session` (a coroutine when calls are tasks)."""
        raise NotImplementedError

    def read(self, session: int) -> Any:
        """The context this store offers for `session` (a coroutine when calls are tasks)."""
        raise NotImplementedError

    def shown(self, context: Any) -> list[str]:
        """The user messages a read returned, oldest first."""
        raise NotImplementedError

    def close(self, loop: LoopThread) -> None:
        """Release the store; a subclass closes its own first and calls this even if that failed."""
        folder = getattr(self, "_folder", None)
        if folder is not None:
            folder.cleanup()


class ConvmemThreads(Store):
    """`convmem.connect()` (the embedded server, ``sync_interval: always``) called from threads."""

    calls: Calls = "threads"
    window = _CONFIG.budget.full_zone_turns

    def __init__(self, *, all_live: bool) -> None:
        self.all_live = all_live
        self.label = (
            "convmem, threads, fsync always, every session live"
            if all_live
            else "convmem, threads, fsync always, connect()'s default live bound"
        )

    def open(self, keys: list[MemoryKey], turns: list[ConversationTurn], loop: LoopThread) -> None:
        # Every session live: a bound above the session count, and no idle passivation
        # while the other stores are measured. Otherwise connect()'s defaults, untouched.
        live = {"max_live_sessions": len(keys) + 24, "idle_seconds": 24 * 3600.0} if self.all_live else {}
        self.system: MemorySystem = convmem.connect(data_dir=self.folder() / "nats", config=_CONFIG, **live)
        self.live_bound = getattr(self.system, "max_live_sessions", None)
        self.handles: list[SessionHandle] = [self.system.session(k) for k in keys]
        self.turns = turns

    def write(self, session: int, turn: int) -> Any:
        return self.handles[session].add_turn(self.turns[turn], timeout=120)

    def read(self, session: int) -> Any:
        return self.handles[session].get_llm_context()

    def shown(self, context: Any) -> list[str]:
        return [t["user"] for t in context["conversation_memory"].get("recent_turns", [])]

    def close(self, loop: LoopThread) -> None:
        try:
            self.system.close()
        finally:
            super().close(loop)


class ConvmemTasks(Store):
    """`convmem.connect_here()` on the tasks' own loop, the server's default flush, every session live."""

    label = "convmem, asyncio tasks, connect_here, NATS default flush (no fsync before the ack), all live"
    calls: Calls = "tasks"
    window = _CONFIG.budget.full_zone_turns

    def open(self, keys: list[MemoryKey], turns: list[ConversationTurn], loop: LoopThread) -> None:
        async def connect() -> MemorySystem:
            return await convmem.connect_here(
                data_dir=self.folder() / "nats",
                config=_CONFIG,
                sync_interval=None,
                max_live_sessions=len(keys) + 24,
                idle_seconds=24 * 3600.0,
            )

        self.system = loop.run(connect(), 60)
        self.handles: list[AsyncSessionHandle] = [self.system.session(k).aio for k in keys]
        self.turns = turns

    async def write(self, session: int, turn: int) -> Any:
        return await self.handles[session].add_turn(self.turns[turn], timeout=120)

    async def read(self, session: int) -> Any:
        return await self.handles[session].get_llm_context()

    def shown(self, context: Any) -> list[str]:
        return [t["user"] for t in context["conversation_memory"].get("recent_turns", [])]

    def close(self, loop: LoopThread) -> None:
        try:
            loop.run(self.system.aclose(), 120)
        finally:
            super().close(loop)


class AgentsSession(Store):
    """The OpenAI Agents SDK's `SQLiteSession`: `add_items` (one commit) and `get_items` (the whole list)."""

    calls: Calls = "tasks"

    def __init__(self, *, on_file: bool) -> None:
        self.on_file = on_file
        self.label = (
            "OpenAI Agents SQLiteSession, file (WAL, synchronous FULL: fsync per commit)"
            if on_file
            else "OpenAI Agents SQLiteSession, :memory: (not durable)"
        )

    def open(self, keys: list[MemoryKey], turns: list[ConversationTurn], loop: LoopThread) -> None:
        from agents import SQLiteSession  # noqa: PLC0415 (see the TYPE_CHECKING imports)

        self.session_class = SQLiteSession
        self.ids = [k.composite() for k in keys]
        self.db = str(self.folder() / "agents.db") if self.on_file else ":memory:"
        self.items = [
            [
                {"role": "user", "content": t.user_message},
                {"role": "assistant", "content": t.assistant_response},
            ]
            for t in turns
        ]
        # In memory every session is its own database, so each keeps its object; on a file
        # the open objects are bounded (`AGENTS_OPEN_SESSIONS`) and the rest made on demand.
        self.sessions: collections.OrderedDict[int, SQLiteSession] = collections.OrderedDict()
        self.in_use: collections.Counter[SQLiteSession] = collections.Counter()
        if not self.on_file:
            for index, session_id in enumerate(self.ids):
                self.sessions[index] = self.session_class(session_id)
        else:
            self.pragmas = _agents_file_pragmas(self.session_class, self.db)

    def _acquire(self, index: int) -> SQLiteSession:
        """Session `index`'s object, counted in use until `_release`: the bound never closes one in use.

        A call's SQLite work runs in a worker thread after the task yields; closing the object
        meanwhile (another task making room) would fail that call with "SQLiteSession is closed".
        """
        session = self.sessions.get(index)
        if session is None:
            session = self.sessions[index] = self.session_class(self.ids[index], self.db)
        elif self.on_file:
            self.sessions.move_to_end(index)
        self.in_use[session] += 1
        self._evict()
        return session

    def _release(self, session: SQLiteSession) -> None:
        self.in_use[session] -= 1
        if not self.in_use[session]:
            del self.in_use[session]
        self._evict()

    def _evict(self) -> None:
        """Close the least recently used objects not in use while more than the bound are open.

        At most one object per caller is in use, so the bound is exceeded by at most the callers.
        """
        if not self.on_file:
            return
        while len(self.sessions) > AGENTS_OPEN_SESSIONS:
            idle = next((i for i, s in self.sessions.items() if not self.in_use[s]), None)
            if idle is None:
                return
            self.sessions.pop(idle).close()

    async def write(self, session: int, turn: int) -> Any:
        opened = self._acquire(session)
        try:
            await opened.add_items(self.items[turn])  # type: ignore[arg-type]
        finally:
            self._release(opened)

    async def read(self, session: int) -> Any:
        opened = self._acquire(session)
        try:
            return await opened.get_items()
        finally:
            self._release(opened)

    def shown(self, context: Any) -> list[str]:
        return [item["content"] for item in context if item.get("role") == "user"]

    def close(self, loop: LoopThread) -> None:
        async def close_all() -> None:  # on the loop that uses them: no task changes the dict meanwhile
            while self.sessions:
                self.sessions.popitem(last=False)[1].close()

        try:
            loop.run(close_all(), 120)
        finally:
            super().close(loop)


class LangGraphSaver(Store):
    """A LangGraph checkpointer holding a thread's ``messages`` channel, as a chat graph's state.

    A turn is what `update_state` stores for it, without the graph's own work:
    read the thread's latest checkpoint, append the turn's two messages, put
    the next checkpoint (the whole list, as LangGraph keeps a channel's value).
    A read is the latest checkpoint (`get_tuple`), its messages.
    """

    calls: Calls = "threads"

    def __init__(self, *, on_file: bool) -> None:
        self.on_file = on_file
        self.label = (
            "LangGraph SqliteSaver, file (WAL, synchronous FULL: fsync per commit)"
            if on_file
            else "LangGraph InMemorySaver (not durable)"
        )

    def open(self, keys: list[MemoryKey], turns: list[ConversationTurn], loop: LoopThread) -> None:
        from langchain_core.messages import AIMessage, HumanMessage  # noqa: PLC0415
        from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint  # noqa: PLC0415
        from langgraph.checkpoint.memory import InMemorySaver  # noqa: PLC0415
        from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: PLC0415

        self.create_checkpoint, self.empty_checkpoint = create_checkpoint, empty_checkpoint
        self.configs = [{"configurable": {"thread_id": k.composite(), "checkpoint_ns": ""}} for k in keys]
        self.messages: list[tuple[BaseMessage, ...]] = [
            (HumanMessage(t.user_message), AIMessage(t.assistant_response)) for t in turns
        ]
        self.saver: BaseCheckpointSaver[Any]
        if self.on_file:
            # As SqliteSaver.from_conn_string opens it; the saver serialises its calls with a lock.
            self.conn = sqlite3.connect(self.folder() / "langgraph.db", check_same_thread=False)
            self.saver = SqliteSaver(self.conn)
            self.saver.setup()
            self.pragmas = {
                "journal_mode": self.conn.execute("PRAGMA journal_mode").fetchone()[0],
                "synchronous": self.conn.execute("PRAGMA synchronous").fetchone()[0],
            }
            _require_fsync(self.pragmas, "LangGraph SqliteSaver")
        else:
            self.saver = InMemorySaver()

    def write(self, session: int, turn: int) -> Any:
        config: Any = self.configs[session]
        latest = self.saver.get_tuple(config)
        if latest is None:
            base, before, step, parent = self.empty_checkpoint(), [], -1, config
        else:
            base, step, parent = latest.checkpoint, latest.metadata["step"], latest.config
            before = base["channel_values"]["messages"]
        version = self.saver.get_next_version(base["channel_versions"].get("messages"), None)
        following = {
            **base,
            "channel_values": {"messages": [*before, *self.messages[turn]]},
            "channel_versions": {"messages": version},
        }
        checkpoint = self.create_checkpoint(following, None, step + 1)  # type: ignore[arg-type]
        metadata: Any = {"source": "update", "step": step + 1, "parents": {}}
        return self.saver.put(parent, checkpoint, metadata, {"messages": version})

    def read(self, session: int) -> Any:
        latest = self.saver.get_tuple(self.configs[session])  # type: ignore[arg-type]
        return [] if latest is None else latest.checkpoint["channel_values"]["messages"]

    def shown(self, context: Any) -> list[str]:
        return [m.content for m in context if m.type == "human"]

    def close(self, loop: LoopThread) -> None:
        try:
            if self.on_file:
                self.conn.close()
        finally:
            super().close(loop)


class PenguiFlowMemory(Store):
    """PenguiFlow's `DefaultShortTermMemory`, one per session, in the process."""

    label = "PenguiFlow DefaultShortTermMemory (in process, not durable)"
    calls: Calls = "tasks"
    window = _CONFIG.budget.full_zone_turns

    def open(self, keys: list[MemoryKey], turns: list[ConversationTurn], loop: LoopThread) -> None:
        from penguiflow.planner import memory as pf  # noqa: PLC0415 (see the TYPE_CHECKING imports)

        config = pf.ShortTermMemoryConfig(strategy="truncation")
        if config.budget.full_zone_turns != self.window:
            raise AssertionError("PenguiFlow's default window differs from convmem's: the reads would differ")
        self.memories = [pf.DefaultShortTermMemory(config=config) for _ in keys]
        self.turns = [
            pf.ConversationTurn(user_message=t.user_message, assistant_response=t.assistant_response)
            for t in turns
        ]

    async def write(self, session: int, turn: int) -> Any:
        await self.memories[session].add_turn(self.turns[turn])

    async def read(self, session: int) -> Any:
        return await self.memories[session].get_llm_context()

    def shown(self, context: Any) -> list[str]:
        return [t["user"] for t in context["conversation_memory"].get("recent_turns", [])]


def _agents_file_pragmas(session_class: type[SQLiteSession], path: str) -> dict[str, Any]:
    """What a fresh connection to `path` gets once a `SQLiteSession` made the file.

    `SQLiteSession` switches its connections to WAL (kept in the file) and leaves
    ``synchronous`` at SQLite's default; a connection of our own shows both.
    """
    session_class("bench-probe", path).close()
    conn = sqlite3.connect(path)
    try:
        pragmas = {
            "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
            "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
        }
    finally:
        conn.close()
    _require_fsync(pragmas, "OpenAI Agents SQLiteSession")
    return pragmas


def _require_fsync(pragmas: dict[str, Any], who: str) -> None:
    """The figure's name says WAL with synchronous FULL; refuse to measure if that is not so."""
    if str(pragmas["journal_mode"]).lower() != "wal" or pragmas["synchronous"] != 2:
        raise RuntimeError(
            f"{who}'s database runs with journal_mode={pragmas['journal_mode']} and "
            f"synchronous={pragmas['synchronous']}, not WAL with FULL (2) as the figure's name says"
        )
