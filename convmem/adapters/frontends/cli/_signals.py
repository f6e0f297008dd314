"""`SignalStop`: a stop signal sets a `threading.Event` without taking its lock on the interrupted thread.

A Python signal handler runs on the main thread between two of its bytecodes, possibly while that
thread holds the lock of the very event the handler would set: ``event.wait(1.0)`` takes the
event's condition lock back each time its timeout ends, and ``Event.set`` takes the same lock,
which is not reentrant. A handler calling ``event.set()`` at that moment waits forever for a lock
its own thread holds, and every repeated SIGTERM nests one more such wait (a `convmem serve`
worker's stacks showed exactly that, killed after its grace period). So the handler only writes a
byte to a pipe (``os.write`` takes no Python lock) and a thread of its own reads it and sets the
event.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType

__all__ = ["SignalStop"]


class SignalStop:
    """Sets `event` when one of the signals `install` takes arrives; `on_signal(signum)` is called
    first, on the interrupted thread (keep it to an append or an assignment: no lock, no I/O)."""

    def __init__(self, event: threading.Event, on_signal: Callable[[int], None] | None = None) -> None:
        self.event = event
        self.requested = False
        """Set by the handler itself, at once (a plain assignment): a stop asked for, even if the
        relay thread has not set `event` yet."""
        self._on_signal = on_signal
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._relay = threading.Thread(target=self._relay_stops, name="convmem-signal-stop", daemon=True)
        self._relay.start()
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    def install(self, signals: Iterable[int]) -> SignalStop:
        """Take `signals` (on the main thread); `restore` gives them back their handlers."""
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self.handler)
        return self

    def handler(self, signum: int, _frame: FrameType | None) -> None:
        self.requested = True
        if self._on_signal is not None:
            self._on_signal(signum)
        with contextlib.suppress(OSError):  # a full pipe: a stop is on its way already; a closed one: over
            os.write(self._write, b"s")

    def _relay_stops(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if not data:  # `close`: the write end is gone
                return
            self.event.set()

    def stopping(self) -> bool:
        """A stop asked for: by a signal (even one the relay has not passed on yet) or `event` set."""
        return self.requested or self.event.is_set()

    def restore(self) -> None:
        """Put back the handlers `install` replaced (on the main thread)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def close(self) -> None:
        """Restore the handlers and end the relay thread."""
        self.restore()
        with contextlib.suppress(OSError):
            os.close(self._write)
        self._relay.join(5.0)
        with contextlib.suppress(OSError):
            os.close(self._read)
