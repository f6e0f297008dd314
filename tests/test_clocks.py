"""The clocks' timers: order, cancellation, and cancelled timers letting go of what they hold."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable

import pytest

from convmem.actors import ManualClock
from convmem.actors._clock import SystemClock

WAIT = 10.0


class Payload:
    """Stands for what a timer's callback holds (a summary request, a session's key)."""


def holding(payload: Payload, fired: list[Payload]) -> Callable[[], None]:
    return lambda: fired.append(payload)


@pytest.mark.parametrize("make", [ManualClock, SystemClock], ids=["manual", "system"])
def test_a_cancelled_timer_lets_go_of_its_callback_at_once(
    make: Callable[[], ManualClock | SystemClock],
) -> None:
    """A summary's timeout is cancelled a moment after it is set: what it holds must not live on."""
    clock = make()
    try:
        payload = Payload()
        ref = weakref.ref(payload)
        fired: list[Payload] = []
        handle = clock.call_at(clock.now() + 3600, holding(payload, fired))
        del payload
        handle.cancel()
        gc.collect()
        assert ref() is None
        assert fired == []
    finally:
        if isinstance(clock, SystemClock):
            clock.close()


def test_cancelled_timers_leave_the_heap_instead_of_piling_up() -> None:
    clock = ManualClock()
    for _ in range(10_000):
        clock.call_at(clock.now() + 60, lambda: None).cancel()
    assert clock.pending_timers() == 0
    assert len(clock._timers.entries) <= 2 * 64 + 1  # what a compaction may leave behind


def test_live_timers_still_fire_in_time_order_after_cancelled_ones_are_swept() -> None:
    clock = ManualClock()
    start = clock.now()
    fired: list[int] = []
    handles = [clock.call_at(start + 1 + (i * 7919) % 400, lambda i=i: fired.append(i)) for i in range(400)]
    for i, handle in enumerate(handles):
        if i % 3:
            handle.cancel()  # two thirds: enough to sweep the heap more than once
    assert clock.pending_timers() == len(range(0, 400, 3))
    clock.advance(1000)
    assert sorted(fired) == list(range(0, 400, 3))
    assert fired == sorted(fired, key=lambda i: (i * 7919) % 400)


def test_cancelling_a_timer_that_already_fired_changes_nothing() -> None:
    clock = ManualClock()
    fired: list[int] = []
    first = clock.call_at(clock.now() + 1, lambda: fired.append(1))
    clock.call_at(clock.now() + 2, lambda: fired.append(2))
    clock.advance(1)
    first.cancel()
    first.cancel()
    clock.advance(1)
    assert fired == [1, 2]
    assert clock.pending_timers() == 0


def test_the_system_clock_fires_live_timers_among_many_cancelled_ones() -> None:
    clock = SystemClock()
    try:
        done = threading.Event()
        for _ in range(500):
            clock.call_at(clock.now() + 3600, lambda: None).cancel()
        clock.call_at(clock.now(), done.set)
        assert done.wait(WAIT)
        assert len(clock._timers.entries) <= 2 * 64 + 1
    finally:
        clock.close()


def test_the_system_clock_wakes_for_a_timer_earlier_than_every_other_and_only_then() -> None:
    """A timer later than the earliest one sets no wake-up (the thread sleeps on until the earliest);
    one earlier than all wakes the thread, which then fires it without waiting for the later ones."""
    clock = SystemClock()
    try:
        clock.call_at(clock.now() + 3600, lambda: None)  # the thread starts and sleeps toward this one
        fired = threading.Event()
        with clock._cond:  # count the wake-ups the next two timers ask for
            notify = clock._cond.notify
            woken: list[int] = []
            clock._cond.notify = lambda n=1: (woken.append(n), notify(n))[1]  # type: ignore[method-assign]
        clock.call_at(clock.now() + 7200, lambda: None)  # later than the earliest: no wake-up
        assert woken == []
        clock.call_at(clock.now(), fired.set)  # earlier than every other: wakes the thread
        assert woken == [1]
        assert fired.wait(WAIT)
    finally:
        clock.close()
