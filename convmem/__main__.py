"""`python -m convmem` and the `convmem` console script (`run`): the command line.

A Ctrl-C while the command line loads (its imports take a moment, longer on a
busy machine) is noted rather than raised as a traceback mid-import: the
command then ends at once, as an interrupted one (exit 130, one line;
`serve`, which had started nothing, with exit 0). This module and the
package's `__init__` import nothing heavy, so the note is in place before
any of the command line's imports start.
"""

import signal
import sys


def run() -> int:
    """Load the command line with Ctrl-C (and SIGTERM) noted, then run it; returns the exit code.

    While the command runs, SIGTERM (a service manager's or `timeout`'s stop) is taken as Ctrl-C: the
    command ends as an interrupted one (exit 130), through its `finally` blocks and exit handlers, so
    what it started (an embedded server, a demo's data folder) is stopped and removed; Python's
    default for SIGTERM ends the process at once and leaves them behind. `serve` installs its own
    handler (a clean stop, exit 0).
    """
    interrupted: list[int] = []

    def note(signum: int, _frame: object) -> None:
        interrupted.append(signum)

    signal.signal(signal.SIGINT, note)
    signal.signal(signal.SIGTERM, note)
    try:
        from convmem.adapters.frontends.cli import main  # noqa: PLC0415 (the point: imported with Ctrl-C noted)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _terminated)
    return main(interrupted=bool(interrupted))


def _terminated(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(run())
