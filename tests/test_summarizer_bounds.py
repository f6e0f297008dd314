"""A summarizer that never returns costs a bounded number of threads, and a coroutine summarizer runs on a
loop where it works: the loop the system was made on, else one loop of the pool's own.

The pool's call limit is real time (a thread cannot be timed out any other
way), so these tests give it a short limit and then wait on facts: replies
delivered, health events stored, a coroutine's cancellation seen. Nothing
sleeps and nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from pool_helpers import Replies, request
from runtime_helpers import WAIT, Harness, events_of, key, summarizing_config, turn, wait_until

from convmem.actors import MemorySystem, SummarizerPool
from convmem.adapters import InMemoryEventLog
from convmem.errors import InvalidConfig
from convmem.events import HealthChanged, MemoryHealth

SHORT = 0.05
"""A call limit short enough that a hanging call is given up on quickly (only waited on, never measured)."""


class NeverReturns:
    """A summarizer whose every call blocks until `release()` (an event not set before teardown)."""

    def __init__(self) -> None:
        self._gate = threading.Event()
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def __call__(self, payload: Mapping[str, Any], /) -> dict[str, str]:
        with self._lock:
            self.threads.append(threading.current_thread())
        self._gate.wait()
        return {"summary": "<session_summary>\nlate\n</session_summary>"}

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.threads)

    def release(self) -> None:
        self._gate.set()


def summarizer_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("convmem-summarizer")}


@pytest.fixture
def never() -> Iterator[NeverReturns]:
    summarizer = NeverReturns()
    try:
        yield summarizer
    finally:
        summarizer.release()


def test_a_summarizer_that_never_returns_leaves_the_thread_count_flat(never: NeverReturns) -> None:
    """Past `workers + max_abandoned` threads making calls the pool answers at once naming the cap: no
    new thread."""
    before = summarizer_threads()
    pool = SummarizerPool(never, workers=2, max_abandoned=2, call_timeout=SHORT)
    try:
        replies = Replies()
        for n in range(40):
            assert pool.submit(request(n), replies)
            replies.wait(n + 1)  # one at a time: each job meets the pool as the last one left it
        outcomes = replies.wait(40)
        assert never.calls == 4  # 2 workers + 2 abandoned: each call a thread of its own, still blocked
        assert len(set(never.threads)) == 4
        assert pool.hanging == 4
        refused = [o.error for o in outcomes if o.error and "max_abandoned=2" in o.error]
        assert len(refused) == 36
        assert "still running past their" in refused[0]
        grown = summarizer_threads() - before
        assert len(grown) == 4 + 1  # four worker threads, each in a hanging call, and the watchdog
        for n in range(40, 80):
            pool.submit(request(n), replies)
        replies.wait(80)
        assert never.calls == 4
        assert summarizer_threads() - before == grown
        never.release()
        wait_until(lambda: pool.hanging == 0, message="abandoned calls end when the summarizer returns")
        assert pool.submit(request(80), replies)
        assert replies.wait(81)[80].summary is not None  # a fresh call thread once there is room
    finally:
        pool.close(timeout=WAIT)


def test_a_session_whose_summarizer_never_returns_degrades_saying_why(never: NeverReturns) -> None:
    """The session retries, meets the cap, degrades with the cap in its health reason; calls stay bounded."""
    harness = Harness()
    try:
        config = summarizing_config(
            full_zone_turns=1, backoff=(0.0,), degraded_retry_seconds=0.0, summarize_timeout_seconds=SHORT / 2
        )
        system = harness.system(config, summarizer=never, summarizer_workers=1)
        k = key("hangs")
        session = system.session(k)
        for n in range(3):
            session.add_turn(turn(f"t{n}"), timeout=WAIT)
        wait_until(lambda: session.health is MemoryHealth.DEGRADED, message="the session degrades")
        reasons = [e.reason for e in events_of(harness.log, k, HealthChanged)]
        assert any("max_abandoned=1" in reason for reason in reasons), reasons
        for n in range(3, 13):  # every turn probes a degraded session: answered at once, no new thread
            session.add_turn(turn(f"t{n}"), timeout=WAIT)
        session.flush(timeout=WAIT)
        assert never.calls == 2  # one worker's call thread, then one more while one hung: never more
    finally:
        never.release()
        harness.close()


def test_summarizer_abandoned_must_not_be_negative() -> None:
    """A negative cap is refused when the system is made, not when the first summary is due."""
    with pytest.raises(InvalidConfig, match="summarizer_abandoned"):
        MemorySystem(log=InMemoryEventLog(), summarizer_abandoned=-1)


# Coroutine summarizers -------------------------------------------------------------------------


def test_a_coroutine_summarizer_runs_on_the_loop_the_system_was_made_on() -> None:
    """It can await a future of the planner's loop (an HTTP client's, say) and its summary is stored."""

    async def planner() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()
        called = asyncio.Event()
        loops: list[asyncio.AbstractEventLoop] = []

        async def summarize(request: Mapping[str, Any]) -> dict[str, str]:
            loops.append(asyncio.get_running_loop())
            called.set()
            return {"summary": await answer}

        memory = MemorySystem(
            summarizing_config(full_zone_turns=1), log=InMemoryEventLog(), summarizer=summarize
        )
        try:
            session = memory.async_session(key("on-my-loop"))
            for n in range(2):
                await session.add_turn(turn(f"t{n}"))
            await asyncio.wait_for(called.wait(), WAIT)
            answer.set_result("<session_summary>\nthe planner answered\n</session_summary>")
            await session.flush(timeout=WAIT)
            context = await session.get_llm_context()
            assert loops == [loop]
            assert session.health is MemoryHealth.HEALTHY
            return context
        finally:
            await asyncio.to_thread(memory.close)

    context = asyncio.run(planner())
    assert "the planner answered" in context["conversation_memory"]["summary"]


def test_without_a_loop_coroutine_summarizers_share_one_loop_of_the_pools_own() -> None:
    """Made outside any loop, every call runs on one lasting loop: a client bound on call one still works."""
    loops: list[asyncio.AbstractEventLoop] = []

    async def summarize(request: Mapping[str, Any]) -> dict[str, str]:
        loops.append(asyncio.get_running_loop())
        return {"summary": f"<session_summary>\ncall {len(loops)}\n</session_summary>"}

    with MemorySystem(
        summarizing_config(full_zone_turns=1), log=InMemoryEventLog(), summarizer=summarize
    ) as memory:
        session = memory.session(key("own-loop"))
        for n in range(4):
            session.add_turn(turn(f"t{n}"), timeout=WAIT)
            session.flush(timeout=WAIT)
    assert len(loops) >= 2
    assert all(loop is loops[0] for loop in loops)


def test_a_coroutine_past_its_limit_is_cancelled_on_its_loop_and_health_shows_it() -> None:
    """Cancelled where it runs, it frees its call thread (none abandoned); the session's health says why."""
    cancelled = threading.Event()

    async def summarize(request: Mapping[str, Any]) -> dict[str, str]:
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    harness = Harness()
    try:
        config = summarizing_config(
            full_zone_turns=1, backoff=(0.0,), degraded_retry_seconds=0.0, summarize_timeout_seconds=SHORT / 2
        )
        system = harness.system(config, summarizer=summarize, summarizer_workers=1)
        k = key("cancelled")
        session = system.session(k)
        for n in range(2):
            session.add_turn(turn(f"t{n}"), timeout=WAIT)
        assert cancelled.wait(WAIT)
        wait_until(lambda: session.health is not MemoryHealth.HEALTHY, message="the failure is recorded")
        reasons = [e.reason for e in events_of(harness.log, k, HealthChanged)]
        assert any("coroutine did not finish" in r and "cancelled" in r for r in reasons), reasons
        pool = system._services.pool
        assert pool is not None
        assert pool.abandoned == 0
        assert pool.hanging == 0
    finally:
        harness.close()
