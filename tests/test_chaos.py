"""The chaos suite: every fault of tests/chaos.py, small, asserting nothing acknowledged is lost or doubled.

Bounded by CONVMEM_CHAOS_SCALE (default 1: a few cycles, a few minutes in
all), so `.ci/run` runs it with the rest; raise it for the full run by hand
(``CONVMEM_CHAOS_SCALE=10 python -m pytest -m chaos -s``), or run
``python -m bench --only chaos`` for the recorded table. Run with ``-s`` to
see each case's row.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from chaos import Tally, server_kill

pytestmark = pytest.mark.chaos

SCALE = max(1, int(os.environ.get("CONVMEM_CHAOS_SCALE", "1")))


def report(tally: Tally) -> None:
    """Print the case's row (seen with -s) and assert its promises."""
    print(f"\n{tally.row()}")
    tally.check()


@pytest.mark.parametrize("writers", ["threads", "asyncio"])
@pytest.mark.parametrize("sync", ["always", "default"])
def test_kill_9_of_nats_server_loses_and_doubles_no_acknowledged_turn(
    tmp_path: Path, sync: str, writers: str
) -> None:
    """kill -9 of nats-server with appends in flight, restarted on its store, several times."""
    tally = server_kill(
        tmp_path / "nats",
        sync=sync,
        writers=writers,
        sessions=24,
        turns=20 * SCALE,
        cycles=2 * SCALE,  # type: ignore[arg-type]
    )
    report(tally)
    assert tally.errors, "no writer noticed the kills"
