"""The embedded nats-server's watcher: once the process that started the server dies, it stops the
server and removes the server's runtime folder.

`EmbeddedNatsServer` starts one per server it launches, as a script run by path
(``python -I -S _watcher.py RUNTIME_DIR SERVER_PID [PIDFD]``): the standard
library only, nothing of convmem imported, so it needs no import path and
starts in milliseconds. Its stdin is the read end of a pipe whose write end
only the owner (the Python process that started the server) holds.

The owner writes ``done`` and closes the pipe once it has stopped the server
itself (`EmbeddedNatsServer.stop`, `kill`, its exit): the watcher then ends
and touches nothing. The pipe ending without ``done`` means the owner died
without stopping its server (kill -9, a crash, a signal it did not handle): the
watcher stops the server (SIGTERM, SIGKILL after `GRACE` seconds) and
removes the runtime folder (the server's configuration, log, and a reader's
private copy of a store; never the store folder itself, which is elsewhere).

The server is named by a pidfd (Linux), opened by the owner while the server
was its unreaped child and so certainly that process; elsewhere by its pid.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import time

GRACE = 10.0
"""Seconds the server has to stop on SIGTERM before SIGKILL (as `EmbeddedNatsServer.stop`)."""
DONE = b"done"
"""What the owner writes when it stopped the server itself."""


def main(argv: list[str]) -> int:
    runtime, pid = argv[0], int(argv[1])
    pidfd = int(argv[2]) if len(argv) > 2 else None
    for signum in (signal.SIGINT, signal.SIGHUP):  # a terminal's signals are the owner's to act on
        signal.signal(signum, signal.SIG_IGN)
    said = b""
    while chunk := os.read(0, 64):  # until the owner closes the pipe, or dies and the kernel does
        said += chunk
    if said.strip() == DONE:
        return 0
    stop(pid, pidfd)
    shutil.rmtree(runtime, ignore_errors=True)
    return 0


def stop(pid: int, pidfd: int | None) -> None:
    """SIGTERM the server, SIGKILL it if it has not ended within `GRACE` seconds."""
    if not send(pid, pidfd, signal.SIGTERM):
        return
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline:
        if ended(pid, pidfd, min(0.05, max(0.0, deadline - time.monotonic()))):
            return
    send(pid, pidfd, signal.SIGKILL)


def send(pid: int, pidfd: int | None, signum: int) -> bool:
    """Signal the server; False when it is gone already."""
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def ended(pid: int, pidfd: int | None, wait: float) -> bool:
    """Whether the server has ended, waiting up to `wait` seconds for it."""
    if pidfd is not None:  # readable once the process has ended
        return bool(select.select([pidfd], [], [], wait)[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
        if stat.read().rsplit(") ", 1)[-1][:1] == "Z":  # ended, not yet reaped by its new parent
            return True
    time.sleep(wait)  # the watcher's only pause: no pidfd to wait on, nothing else to do
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
