"""A CPU-bound summarizer run in a worker process of its own, so its work does not hold this process's GIL.

The extractive summarizer is pure-Python work (a fraction of a millisecond
per call); run on the summarizer pool's threads it competes with the writes
for the interpreter, and `add_turn`'s tail latency grows with it.
`ProcessSummarizer` runs the same summarizer in a child Python process
(started with ``python -m``, never forked from this threaded process) and
talks to it over a pipe: the calling thread only encodes the request, writes
it and waits, without the GIL, for the reply.

* **Warm before use.** The child starts, imports and builds its summarizer
  when the `ProcessSummarizer` is made (the constructor waits for it to say
  it is ready), so no start-up falls inside a burst of writes. With
  ``start=False`` it starts on the first call instead (on the summarizer
  pool's thread: the writes do not wait for it, the first summary does).
* **Bounded.** One call at a time goes to the child; the callers (the
  summarizer pool's workers) wait their turn, and
  the pool's own queue bounds the rest. Nothing queues without bound here.
* **A call past its limit** (`timeout`) kills the child and starts a fresh
  one, warmed, before the next call: a hung summarizer never holds a thread
  nor the pipe for good. So does a child that died.

The summarizer is named by its import path (``"module:attribute"``) and the
keyword arguments to build it with (plain values: they travel as MessagePack).
The child answers requests with what the summarizer returns, or the error it
raised (re-raised here as `SummarizerError`).
"""

from __future__ import annotations

import os
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import msgspec

from convmem.actors._bounds import check_seconds
from convmem.errors import InvalidConfig, SummarizerError

__all__ = ["ProcessSummarizer"]

_LENGTH = struct.Struct("!I")
_START_SECONDS = 60.0
"""How long a child may take to start and build its summarizer (a cold import on a busy machine)."""


class ProcessSummarizer:
    """A summarizer built and run in a warm child process: ``ProcessSummarizer("pkg.mod:Name", **kwargs)``."""

    def __init__(self, target: str, /, *, timeout: float = 30.0, start: bool = True, **kwargs: Any) -> None:
        """Build `target(**kwargs)` in a child; with `start` False the child starts on the first call."""
        if not isinstance(target, str) or target.count(":") != 1:
            raise InvalidConfig("target", f"must be 'module:attribute', got {target!r}")
        timeout = check_seconds("timeout", timeout)  # at most a day, as every wait
        try:
            self._spec = msgspec.msgpack.encode({"target": target, "kwargs": kwargs})
        except (TypeError, msgspec.EncodeError) as exc:
            raise InvalidConfig(
                "kwargs", f"must be plain values to send to the child process: {exc}"
            ) from None
        self.target = target
        self.kwargs = dict(kwargs)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._closed = False
        self.restarts = 0
        """Children killed and replaced (a call past its limit, or a child that died)."""
        if start:
            with self._lock:
                self._start()

    def __repr__(self) -> str:
        return (
            f"ProcessSummarizer({self.target!r}, {', '.join(f'{k}={v!r}' for k, v in self.kwargs.items())})"
        )

    @property
    def pid(self) -> int | None:
        """The child's process id (None once closed)."""
        child = self._child
        return child.pid if child is not None else None

    def __call__(self, request: Mapping[str, Any], /) -> Any:
        data = msgspec.msgpack.encode(dict(request))
        with self._lock:
            if self._closed:
                raise SummarizerError("the process summarizer is closed")
            reply = self._exchange(data)
        answer = msgspec.msgpack.decode(reply)
        if "error" in answer:
            raise SummarizerError(f"the summarizer raised in its process: {answer['error']}")
        return answer["result"]

    def _exchange(self, data: bytes) -> bytes:
        """Send one request and read its reply (lock held). A child found dead is replaced and asked
        once more (it answered nothing, and a summarizer call is a pure function of its request)."""
        deadline = time.monotonic() + self.timeout
        died: OSError | None = None
        for _ in range(2):
            if self._child is None:
                self._start()  # the first call of a lazy one, or after a child that died
            elif self._child.poll() is not None:
                self._restart()
            child = self._child
            assert child is not None
            assert child.stdin is not None
            assert child.stdout is not None
            try:
                _send(child.stdin.fileno(), data)
                return _receive(child.stdout.fileno(), deadline)
            except TimeoutError:
                self._restart()
                raise SummarizerError(
                    f"the summarizer process did not answer within {self.timeout:g}s; it was killed and a "
                    "fresh one started"
                ) from None
            except OSError as exc:  # the child died before or during the call
                self._stop()
                self.restarts += 1
                died = exc
        raise SummarizerError(f"the summarizer process failed twice ({died})")

    def close(self) -> None:
        """Stop the child (calls after this raise `SummarizerError`)."""
        with self._lock:
            self._closed = True
            self._stop()

    def __enter__(self) -> ProcessSummarizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        """Start a child, send it the summarizer to build and wait until it is ready (lock held)."""
        child = subprocess.Popen(
            [sys.executable, "-m", "convmem.adapters.backends.summarizers._process_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            close_fds=True,
        )
        assert child.stdin is not None
        assert child.stdout is not None
        try:
            _send(child.stdin.fileno(), self._spec)
            ready = msgspec.msgpack.decode(_receive(child.stdout.fileno(), time.monotonic() + _START_SECONDS))
        except (OSError, TimeoutError) as exc:
            _kill(child)
            raise SummarizerError(f"the summarizer process did not start ({exc})") from None
        if "error" in ready:
            _kill(child)
            raise InvalidConfig(
                "target", f"{self.target!r} could not be built in its process: {ready['error']}"
            )
        self._child = child
        # Never closed: the child is stopped and its pipes closed when this object goes, and at exit.
        # (A finalizer, not __del__: it holds the Popen, so the Popen cannot be collected first.)
        self._finalizer = weakref.finalize(self, _kill, child)

    def _restart(self) -> None:
        self._stop()
        self.restarts += 1
        self._start()

    def _stop(self) -> None:
        child, self._child = self._child, None
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer.detach()
        if child is not None:
            _kill(child)


def _kill(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.kill()
    child.wait()
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            pipe.close()


def _send(fd: int, data: bytes) -> None:
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int, deadline: float) -> bytes:
    """One framed message from `fd`; `TimeoutError` past `deadline`, `OSError` when the pipe closed."""
    header = _read(fd, _LENGTH.size, deadline)
    return _read(fd, _LENGTH.unpack(header)[0], deadline)


def _read(fd: int, size: int, deadline: float) -> bytes:
    parts: list[bytes] = []
    while size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            raise TimeoutError
        chunk = os.read(fd, size)
        if not chunk:
            raise OSError("the summarizer process closed its pipe")
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)
