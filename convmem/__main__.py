"""`python -m convmem` runs the command line.

A Ctrl-C while the command line loads (its imports take a moment, longer on a
busy machine) is noted rather than raised as a traceback mid-import: the
command then ends at once, as an interrupted one (`serve`, which had started
nothing, with exit 0).
"""

import signal
import sys

_interrupted: list[int] = []


def _note(signum: int, _frame: object) -> None:
    _interrupted.append(signum)


signal.signal(signal.SIGINT, _note)
try:
    from convmem.adapters.cli import main
finally:
    signal.signal(signal.SIGINT, signal.default_int_handler)

sys.exit(main(interrupted=bool(_interrupted)))
