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
    """Load the command line with Ctrl-C noted, then run it; returns the exit code."""
    interrupted: list[int] = []

    def note(signum: int, _frame: object) -> None:
        interrupted.append(signum)

    signal.signal(signal.SIGINT, note)
    try:
        from convmem.adapters.frontends.cli import main  # noqa: PLC0415 (the point: imported with Ctrl-C noted)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return main(interrupted=bool(interrupted))


if __name__ == "__main__":
    sys.exit(run())
