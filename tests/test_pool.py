"""The summarizer pool on its own: worker actors that make their calls on their own threads, placement,
timeouts, failures, close, a bounded queue."""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pykka
import pytest
from pool_helpers import Replies, request
from runtime_helpers import WAIT, wait_until

from convmem.actors import SummarizerPool, SummaryOutcome
from convmem.actors._pool import _Worker

CALL_TIMEOUT = 1.0
"""Long enough that a call that returns at once never times out on a busy machine."""


class Summarizer:
    """Answers with the request's first turn; hangs on the requests in `hang` until `release()`.

    Records the thread of every call, and of each hanging call.
    """

    def __init__(self, *, hang: tuple[str, ...] = ()) -> None:
        self._hang = hang
        self._gate = threading.Event()
        self._cond = threading.Condition()
        self.threads: list[threading.Thread] = []
        self.hanging: dict[str, threading.Thread] = {}

    def __call__(self, payload: Mapping[str, Any], /) -> dict[str, str]:
        first = payload["turns"][0]["user"]
        with self._cond:
            self.threads.append(threading.current_thread())
            if first in self._hang:
                self.hanging[first] = threading.current_thread()
            self._cond.notify_all()
        if first in self._hang:
            assert self._gate.wait(WAIT * 4)
        return {"summary": f"summary of {first}"}

    def wait_hanging(self, *turns: str) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: set(turns) <= set(self.hanging), WAIT), turns

    def release(self) -> None:
        self._gate.set()


@pytest.fixture
def pools() -> Iterator[list[SummarizerPool]]:
    """Pools a test made; closed at teardown whatever happened."""
    made: list[SummarizerPool] = []
    try:
        yield made
    finally:
        for pool in made:
            pool.close(timeout=WAIT)


def make(pools: list[SummarizerPool], summarizer: Any, **kwargs: Any) -> SummarizerPool:
    pool = SummarizerPool(summarizer, **{"call_timeout": CALL_TIMEOUT, **kwargs})
    pools.append(pool)
    return pool


def worker_urns() -> set[str]:
    """The URNs of every summarizer worker actor registered with pykka now."""
    return {ref.actor_urn for ref in pykka.ActorRegistry.get_by_class(_Worker)}


def test_the_workers_are_pykka_actors_registered_until_the_pool_closes(pools: list[SummarizerPool]) -> None:
    """Each worker is a live pykka actor while the pool is open; close() stops and unregisters them."""
    before = worker_urns()
    pool = make(pools, Summarizer(), workers=3)
    workers = worker_urns() - before
    assert len(workers) == 3
    refs = [ref for ref in pykka.ActorRegistry.get_by_class(_Worker) if ref.actor_urn in workers]
    assert all(ref.is_alive() for ref in refs)
    replies = Replies()
    assert pool.submit(request(0), replies)
    assert replies.wait(1)[0].summary == "summary of turn 0"

    pool.close(timeout=WAIT)
    assert not any(ref.is_alive() for ref in refs)
    assert not workers & worker_urns()


def test_many_jobs_are_answered_once_each_by_no_more_threads_than_workers(
    pools: list[SummarizerPool],
) -> None:
    """Each worker reuses its call thread: 200 jobs from 8 threads run on at most `workers` threads."""
    summarizer = Summarizer()
    pool = make(pools, summarizer, workers=3, queue_limit=200)
    replies = Replies()

    def submit_25(start: int) -> None:
        for n in range(start, start + 25):
            assert pool.submit(request(n), replies)

    submitters = [threading.Thread(target=submit_25, args=(25 * i,)) for i in range(8)]
    for thread in submitters:
        thread.start()
    for thread in submitters:
        thread.join(WAIT)
    outcomes = replies.wait(200)
    assert sorted(o.request.covers_from for o in outcomes) == list(range(200))
    assert all(o.summary == f"summary of turn {o.request.covers_from}" for o in outcomes)
    assert all(o.error is None for o in outcomes)
    assert len(set(summarizer.threads)) <= 3
    wait_until(lambda: pool.queued == 0, message="every job finished")
    assert pool.abandoned == 0


def test_a_string_or_a_mapping_is_a_summary_and_anything_else_an_error(pools: list[SummarizerPool]) -> None:
    """`{'summary': text}` or a string is a summary; a mapping without it or a non-string is an error."""
    answers: dict[str, object] = {
        "turn 0": {"summary": "A"},
        "turn 1": "B",
        "turn 2": {"text": "C"},
        "turn 3": {"summary": 4},
    }
    pool = make(pools, lambda payload: answers[payload["turns"][0]["user"]], workers=1)
    replies = Replies()
    for n in range(4):
        pool.submit(request(n), replies)
    by_n = {o.request.covers_from: o for o in replies.wait(4)}
    assert (by_n[0].summary, by_n[0].error) == ("A", None)
    assert (by_n[1].summary, by_n[1].error) == ("B", None)
    assert by_n[2].summary is None
    assert "no 'summary' key" in str(by_n[2].error)
    assert by_n[3].summary is None
    assert "not a string" in str(by_n[3].error)


class _Hostile(str):
    """A summarizer's str subclass whose own methods fail: they must never run past the pool."""

    def __len__(self) -> int:
        raise RuntimeError("len of a hostile summary")

    def __hash__(self) -> int:
        raise RuntimeError("hash of a hostile summary")


def test_a_str_subclass_from_a_summarizer_becomes_a_plain_string(pools: list[SummarizerPool]) -> None:
    """The pool hands on a plain `str` of the same text: the subclass's methods never reach the core."""
    pool = make(pools, lambda payload: {"summary": _Hostile("the gist")}, workers=1)
    replies = Replies()
    pool.submit(request(0), replies)
    (outcome,) = replies.wait(1)
    assert outcome.error is None
    assert type(outcome.summary) is str
    assert outcome.summary == "the gist"
    assert len(outcome.summary) == 8


class Stop(BaseException):
    """A BaseException that is none of Python's own."""


@pytest.mark.parametrize(
    ("raised", "error"),
    [
        (RuntimeError("model overloaded"), "RuntimeError: model overloaded"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (SystemExit(3), "SystemExit: 3"),
        (GeneratorExit(), "GeneratorExit"),
        (Stop("halt"), "Stop: halt"),
    ],
)
def test_whatever_a_summarizer_raises_is_an_error_outcome_and_the_thread_serves_on(
    pools: list[SummarizerPool], raised: BaseException, error: str
) -> None:
    """A raise (BaseException included) answers the job with an error; the same thread takes the next."""
    threads: list[threading.Thread] = []

    def summarizer(payload: Mapping[str, Any]) -> str:
        threads.append(threading.current_thread())
        if payload["turns"][0]["user"] == "turn 0":
            raise raised
        return "fine"

    pool = make(pools, summarizer, workers=1)
    replies = Replies()
    pool.submit(request(0), replies)
    pool.submit(request(1), replies)
    first, second = replies.wait(2)
    assert (first.summary, first.error) == (None, error)
    assert (second.summary, second.error) == ("fine", None)
    assert threads[0] is threads[1]


def test_an_async_summarizer_is_awaited(pools: list[SummarizerPool]) -> None:
    """A coroutine function's result is awaited on the call thread; what it raises is an error."""

    async def summarizer(payload: Mapping[str, Any]) -> dict[str, str]:
        first = payload["turns"][0]["user"]
        if first == "turn 1":
            raise ValueError("bad reply")
        return {"summary": f"async summary of {first}"}

    pool = make(pools, summarizer, workers=1)
    replies = Replies()
    pool.submit(request(0), replies)
    pool.submit(request(1), replies)
    ok, failed = replies.wait(2)
    assert (ok.summary, ok.error) == ("async summary of turn 0", None)
    assert (failed.summary, failed.error) == (None, "ValueError: bad reply")


def test_each_call_starts_in_an_empty_context(pools: list[SummarizerPool]) -> None:
    """A context variable set by one call is not seen by the next call on the same thread."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[str] = []

    def summarizer(payload: Mapping[str, Any]) -> str:
        seen.append(var.get())
        var.set(payload["turns"][0]["user"])
        return "ok"

    pool = make(pools, summarizer, workers=1)
    replies = Replies()
    pool.submit(request(0), replies)
    pool.submit(request(1), replies)
    replies.wait(2)
    assert seen == ["unset", "unset"]


def test_a_job_goes_to_an_idle_worker_rather_than_behind_a_hanging_call(pools: list[SummarizerPool]) -> None:
    """While one worker's call hangs, each later job goes to the worker that holds none and is answered."""
    summarizer = Summarizer(hang=("turn 0",))
    pool = make(pools, summarizer, workers=2, call_timeout=WAIT * 8)
    replies = Replies()
    pool.submit(request(0), replies)
    summarizer.wait_hanging("turn 0")
    for n in range(1, 6):
        assert pool.submit(request(n), replies)
        assert replies.wait(n)[n - 1].summary == f"summary of turn {n}"
    assert not replies.of(0)
    assert summarizer.hanging["turn 0"] not in summarizer.threads[1:]
    assert len({*summarizer.threads[1:]}) == 1

    summarizer.release()
    assert replies.wait(6)[5].summary == "summary of turn 0"
    assert pool.abandoned == 0


def test_a_hanging_call_times_out_and_costs_one_abandoned_thread_not_a_worker(
    pools: list[SummarizerPool],
) -> None:
    """At `call_timeout` the job gets an error, a fresh call thread serves on, the late answer is dropped."""
    summarizer = Summarizer(hang=("turn 0",))
    pool = make(pools, summarizer, workers=1)
    replies = Replies()
    pool.submit(request(0), replies)
    summarizer.wait_hanging("turn 0")
    pool.submit(request(1), replies)
    pool.submit(request(2), replies)
    outcomes = {o.request.covers_from: o for o in replies.wait(3)}
    assert outcomes[0].summary is None
    assert outcomes[0].error == f"summarizer timed out after {CALL_TIMEOUT:g}s limit"
    assert (outcomes[1].summary, outcomes[2].summary) == ("summary of turn 1", "summary of turn 2")
    hung = summarizer.hanging["turn 0"]
    assert hung.is_alive()  # the two jobs were served while the hanging call still ran
    assert len({*summarizer.threads[1:]}) == 1
    assert hung not in summarizer.threads[1:]
    assert pool.abandoned == 1
    assert pool.queued == 0

    summarizer.release()
    hung.join(WAIT)
    assert not hung.is_alive()  # an abandoned thread ends with its call
    assert len(replies.of(0)) == 1
    pool.submit(request(3), replies)
    assert replies.wait(4)[3].summary == "summary of turn 3"
    assert hung not in summarizer.threads[3:]


def test_close_answers_running_and_queued_jobs_at_once(
    pools: list[SummarizerPool], caplog: pytest.LogCaptureFixture
) -> None:
    """close() answers every job with an error without waiting for a hanging call, and refuses new jobs."""
    summarizer = Summarizer(hang=("turn 0",))
    pool = make(pools, summarizer, workers=1, call_timeout=WAIT * 8)
    replies = Replies()
    pool.submit(request(0), replies)
    summarizer.wait_hanging("turn 0")
    pool.submit(request(1), replies)
    pool.submit(request(2), replies)
    with caplog.at_level(logging.WARNING, logger="convmem.summarizer"):
        pool.close(timeout=WAIT)
    assert "did not stop" not in caplog.text  # it waited for no call
    outcomes = {o.request.covers_from: o for o in replies.wait(3)}
    assert outcomes[0].error == "summarizer pool closed during the call"
    assert outcomes[1].error == outcomes[2].error == "summarizer pool closed"
    assert all(o.summary is None for o in outcomes.values())
    assert (pool.queued, pool.abandoned) == (0, 1)
    assert not pool.submit(request(3), replies)

    hung = summarizer.hanging["turn 0"]
    summarizer.release()
    hung.join(WAIT)
    assert not hung.is_alive()
    assert len(replies.outcomes) == 3  # the late answer went nowhere


def test_a_reply_may_close_the_pool(pools: list[SummarizerPool], caplog: pytest.LogCaptureFixture) -> None:
    """close() from a reply, on a worker's own thread, does not wait for that worker; it stops after."""
    before = worker_urns()
    pool = make(pools, Summarizer(), workers=2)
    refs = [ref for ref in pykka.ActorRegistry.get_by_class(_Worker) if ref.actor_urn not in before]
    closed = threading.Event()

    def closing(outcome: SummaryOutcome) -> None:
        pool.close(timeout=WAIT)
        closed.set()

    with caplog.at_level(logging.WARNING, logger="convmem.summarizer"):
        assert pool.submit(request(0), closing)
        assert closed.wait(WAIT)
    assert "did not stop" not in caplog.text
    wait_until(lambda: not any(ref.is_alive() for ref in refs), message="every worker stopped")
    assert not pool.submit(request(1), Replies())


def test_a_worker_stopped_from_outside_answers_the_jobs_it_still_held(pools: list[SummarizerPool]) -> None:
    """A job told to a worker after pykka was asked to stop it gets an error, and none is lost."""
    before = worker_urns()
    summarizer = Summarizer(hang=("turn 0",))
    pool = make(pools, summarizer, workers=1, call_timeout=WAIT * 8)
    (ref,) = [ref for ref in pykka.ActorRegistry.get_by_class(_Worker) if ref.actor_urn not in before]
    replies = Replies()
    pool.submit(request(0), replies)
    summarizer.wait_hanging("turn 0")
    stopped = ref.stop(block=False)  # as pykka's stop_all does when an actor dies of a BaseException
    assert pool.submit(request(1), replies)  # told after the stop, so the worker never runs it

    summarizer.release()
    assert stopped.get(timeout=WAIT)
    outcomes = {o.request.covers_from: o for o in replies.wait(2)}
    assert outcomes[0].summary == "summary of turn 0"
    assert (outcomes[1].summary, outcomes[1].error) == (None, "summarizer worker stopped")
    assert pool.queued == 0
    assert not pool.submit(request(2), replies)
    assert pool.queued == 0


def test_submit_refuses_past_the_queue_limit_and_accepts_again_once_jobs_finish(
    pools: list[SummarizerPool],
) -> None:
    """The limit counts running and queued jobs; a refused job is not queued and `queued` stays put."""
    summarizer = Summarizer(hang=("turn 0", "turn 1"))
    pool = make(pools, summarizer, workers=1, queue_limit=2, call_timeout=WAIT * 8)
    replies = Replies()
    assert pool.submit(request(0), replies)
    assert pool.submit(request(1), replies)
    summarizer.wait_hanging("turn 0")
    assert not pool.submit(request(2), replies)
    assert pool.queued == 2

    summarizer.release()
    assert [o.request.covers_from for o in replies.wait(2)] == [0, 1]
    wait_until(lambda: pool.queued == 0, message="both jobs finished")
    assert pool.submit(request(3), replies)
    assert replies.wait(3)[2].summary == "summary of turn 3"
    assert not replies.of(2)


def test_a_reply_that_raises_is_logged_and_the_pool_serves_on(
    pools: list[SummarizerPool], caplog: pytest.LogCaptureFixture
) -> None:
    """A failing reply callback is logged; it takes no thread down and later jobs are answered."""
    summarizer = Summarizer()
    pool = make(pools, summarizer, workers=1)
    replies = Replies()

    def broken(outcome: SummaryOutcome) -> None:
        raise Stop("reply lost")

    with caplog.at_level(logging.ERROR, logger="convmem.summarizer"):
        pool.submit(request(0), broken)
        pool.submit(request(1), replies)
        assert replies.wait(1)[0].summary == "summary of turn 1"
    assert "delivering a summary" in caplog.text
    assert summarizer.threads[0] is summarizer.threads[1]


@pytest.mark.parametrize(
    "kwargs",
    [{"workers": 0}, {"workers": 4, "queue_limit": 3}, {"call_timeout": 0.0}, {"call_timeout": -1.0}],
)
def test_nonsense_sizes_are_refused(kwargs: dict[str, Any]) -> None:
    """workers < 1, queue_limit < workers and a call_timeout that is not positive raise ValueError."""
    with pytest.raises(ValueError, match="must be"):
        SummarizerPool(lambda payload: "s", **kwargs)
