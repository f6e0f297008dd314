"""`Supervisor.start` and `stop`: a worker that ends before it served, one that never stops.

Exit 0 is a worker that was told to stop (a Ctrl-C to serve's group reached it while it
started, and can miss serve itself): serve stops cleanly. Any other exit is a failure.
The workers here are real spawned processes that end at once with a given code.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

from convmem.adapters.frontends.cli._workers import (
    _DUMP_SIGNAL,
    Supervisor,
    WorkersFailed,
    _dump_stacks_on,
    _Slot,
)


class _EndsAtOnce(Supervisor):
    """A supervisor of one worker that exits with `code` as soon as it starts."""

    def __init__(self, code: int) -> None:  # no WorkerSpec: these workers serve nothing
        self.drain_timeout = 5.0
        self._context = multiprocessing.get_context("spawn")
        self._slots = [_Slot(cast(Any, SimpleNamespace(index=0)))]
        self.code = code

    def _start(self, slot: _Slot) -> None:
        slot.process = self._context.Process(target=sys.exit, args=(self.code,))
        slot.process.start()
        slot.started, slot.ready = time.monotonic(), False


def test_a_worker_that_ended_with_0_before_serving_stops_serve() -> None:
    """Given a worker that ends 0 while starting, when serve starts, start is False and stop is set."""
    supervisor, stop = _EndsAtOnce(0), threading.Event()
    assert supervisor.start(stop, timeout=60.0) is False
    assert stop.is_set()


def test_a_worker_that_failed_before_serving_fails_serve() -> None:
    """Given a worker that ends 1 while starting, when serve starts, it fails naming the worker and code."""
    supervisor, stop = _EndsAtOnce(1), threading.Event()
    with pytest.raises(WorkersFailed, match="worker 0 exited with 1 before serving"):
        supervisor.start(stop, timeout=60.0)
    assert not stop.is_set()


def _stuck_in_a_drain() -> None:
    threading.Event().wait(120.0)


def _a_worker_that_ignores_stops(ready: Any) -> None:
    """Takes the stack-dump signal as a worker does, ignores SIGTERM, then hangs in `_stuck_in_a_drain`."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _dump_stacks_on(_DUMP_SIGNAL)
    ready.set()
    _stuck_in_a_drain()


class _NeverStops(Supervisor):
    """A supervisor of one worker that never stops when told to."""

    stop_grace = 0.5

    def __init__(self) -> None:  # no WorkerSpec: this worker serves nothing
        self.drain_timeout = 0.0
        self._context = multiprocessing.get_context("spawn")
        self._slots = [_Slot(cast(Any, SimpleNamespace(index=0)))]
        self.ready = self._context.Event()

    def _start(self, slot: _Slot) -> None:
        slot.process = self._context.Process(target=_a_worker_that_ignores_stops, args=(self.ready,))
        slot.process.start()
        slot.started, slot.ready = time.monotonic(), True


def test_a_stuck_worker_writes_where_it_was_stuck_before_it_is_killed(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Given a worker stuck past the drain time, when serve stops, its stacks go to stderr, then it dies."""
    supervisor = _NeverStops()
    supervisor._start(supervisor._slots[0])
    assert supervisor.ready.wait(60.0), "the worker never started"
    assert supervisor.stop() is False
    process = supervisor._slots[0].process
    assert process is not None
    assert process.exitcode == -signal.SIGKILL
    err = capfd.readouterr().err
    assert "did not stop; its threads' stacks follow" in err
    assert "_stuck_in_a_drain" in err, err
