"""A stop signal that arrives while the main thread holds the stop event's lock still stops.

`convmem serve`'s workers and supervisor wait on a `threading.Event` with a timeout, which takes the
event's lock back each time the timeout ends; their SIGTERM/SIGINT handler used to call
``event.set()``, which waits for that same lock on the same (interrupted) thread: forever. A worker
mid-load was killed after its grace period with its stacks showing nested handlers in
``Event.set`` (`tests/test_serve.py`, once in a CI run). `SignalStop` relays the signal through a
pipe to a thread of its own, and notes it at once for a worker's checks before it says ``ready``
(`tests/test_serve_stops.py`'s Ctrl-C while the workers start).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = """
import signal, sys, threading
from convmem.adapters.frontends.cli._signals import SignalStop

stop = threading.Event()
got = []
if sys.argv[1] == "signal-stop":
    stops = SignalStop(stop, got.append).install([signal.SIGTERM])
else:  # the handler as it was, to show the deadlock: this run never ends
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
with stop._cond:  # held, as `stop.wait(1.0)` holds it when its timeout ends
    signal.raise_signal(signal.SIGTERM)  # the handler runs here, on this thread, the lock held
    print("handler returned", flush=True)
    if sys.argv[1] == "signal-stop":  # known at once, before the relay thread sets the event
        print("requested", stops.requested, stops.stopping(), flush=True)
print("stopped" if stop.wait(30) else "not stopped", got, flush=True)
if sys.argv[1] == "signal-stop":
    stops.close()
    print("restored", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
"""


def _run(mode: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_stop_signal_while_the_event_lock_is_held_sets_the_event_and_restores_the_handler() -> None:
    done = _run("signal-stop", timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "handler returned",
        "requested True True",
        "stopped [15]",
        "restored True",
    ]


@pytest.mark.slow
def test_the_old_handler_deadlocks_there() -> None:
    """The mechanism the fix removes: ``event.set()`` in the handler never returns with the lock held."""
    with pytest.raises(subprocess.TimeoutExpired):
        _run("event-set", timeout=5)
