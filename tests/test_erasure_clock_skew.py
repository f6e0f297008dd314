"""A copy of old data (a fork, a restore, an export) asks the journal by position, not by clock.

A fork, a lost session's restore and an export to a file ask the erasure journal again once they
wrote: an erasure that ran while they read and wrote may have listed the sessions (or the export
files) before the copy existed, so the copy is erased data too.
"While" used to be a time: receipts that say they finished at or after the moment the copy began,
this machine's clock against the eraser's. With the eraser's clock hours behind, an erasure that ran
in the middle looked older than the copy and the erased turns stayed in the copy; with it hours
ahead, an erasure over before the copy began looked newer and a fork of data written since was
erased. Now the copy takes the journal's position (`receipts_mark`) before it reads and asks only
about the receipts kept after it: the clocks do not matter.

Each case runs on a real nats-server; the eraser is a second system on the same store whose clock
(injected, `ManualClock`) is 3 hours behind or ahead; the erasure runs in the copy's middle through
the copier's log read, as `tests/test_erasure_races.py` does.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import convmem
from convmem.actors import MemorySystem
from convmem.actors._clock import ManualClock
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend
from convmem.adapters.backends import FileExportRegistry
from convmem.adapters.frontends.cli import main
from convmem.errors import InvalidInput
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

CONFIG = ShortTermMemoryConfig(strategy="truncation")
TENANT, USER = "acme", "gail"
KEY = MemoryKey(TENANT, USER, "chat-1")
FORK = MemoryKey(TENANT, USER, "chat-fork")
SECRET = "gail's card 5500-SKEW"
KEPT = MemoryKey(TENANT, "hank", "chat-kept")
KEPT_TEXT = "hank's note SKEW-KEPT"
HOURS = 3 * 3600.0


def write(memory: MemorySystem, key: MemoryKey, turns: int = 3) -> None:
    for n in range(turns):
        memory.session(key).add_turn(
            ConversationTurn(user_message=f"{SECRET} #{n}", assistant_response="noted"), timeout=10
        )


@contextmanager
def eraser(url: str, skew: float) -> Iterator[MemorySystem]:
    """A system whose clock is `skew` seconds off this machine's (its receipts say so)."""
    with convmem.connect(url, config=CONFIG, clock=ManualClock(time.time() + skew)) as memory:
        yield memory


@pytest.mark.parametrize("skew", [-HOURS, HOURS], ids=["eraser 3h behind", "eraser 3h ahead"])
def test_a_fork_during_an_erasure_is_erased_whatever_the_erasers_clock_says(
    nats_server: EmbeddedNatsServer, skew: float
) -> None:
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        write(memory, KEY)
    with convmem.connect(nats_server.url, config=CONFIG) as forker, eraser(nats_server.url, skew) as other:
        read = forker.log.read

        def read_then_erase(key: MemoryKey) -> object:
            records = read(key)
            if key == KEY:  # the fork has read the source: the whole erasure runs now
                other.erase_user(TENANT, USER, by="ops")
            return records

        forker.log.read = read_then_erase  # type: ignore[method-assign]
        with pytest.raises(InvalidInput, match="erased while it was forked"):
            forker.fork(KEY, to=FORK)
        forker.log.read = read  # type: ignore[method-assign]
        assert forker.log.read(FORK) == []
        (receipt,) = [r for r in other.journal.receipts() if r.covers(KEY)]
        assert (receipt.completed_at - time.time()) * skew > 0  # the receipt carries the skewed time


@pytest.mark.parametrize("skew", [-HOURS, HOURS], ids=["eraser 3h behind", "eraser 3h ahead"])
def test_a_fork_after_an_erasure_is_kept_whatever_the_erasers_clock_says(
    nats_server: EmbeddedNatsServer, skew: float
) -> None:
    """The user was erased, then wrote again: a fork of what they wrote since is no erased data."""
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        write(memory, KEY)
    with eraser(nats_server.url, skew) as other:
        other.erase_user(TENANT, USER, by="ops")
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        write(memory, KEY, turns=2)
        forked = memory.fork(KEY, to=FORK)
        assert forked.events == 3
        assert len(memory.log.read(FORK)) == 3


@pytest.mark.parametrize("skew", [-HOURS, HOURS], ids=["eraser 3h behind", "eraser 3h ahead"])
def test_a_restore_during_an_erasure_is_erased_whatever_the_erasers_clock_says(
    nats_server: EmbeddedNatsServer, skew: float
) -> None:
    """The log lost the session (its snapshot stays); the restore has the snapshot and asked the
    journal (nothing then); the whole erasure of the user runs before it writes. What it writes is
    erased too, also when the eraser's receipt says it finished hours before the restore began."""
    with convmem.connect(nats_server.url, config=CONFIG, snapshot_every=2) as memory:
        write(memory, KEY)
    with JetStreamBackend.connect(nats_server.url) as backend:
        backend.log.erase(KEY, at=1.0)  # lost (no erasure recorded): the snapshot stays
        assert backend.snapshots is not None
        assert backend.snapshots.load(KEY) is not None
    with convmem.connect(nats_server.url, config=CONFIG) as restorer, eraser(nats_server.url, skew) as other:
        read = restorer.log.read

        def erase_then_read(key: MemoryKey) -> object:
            if key == KEY:  # the restore has its snapshot and is about to read the log
                other.erase_user(TENANT, USER, by="ops")
            return read(key)

        restorer.log.read = erase_then_read  # type: ignore[method-assign]
        with pytest.raises(InvalidInput, match="erased while it was restored"):
            restorer.restore_lost(KEY)
        restorer.log.read = read  # type: ignore[method-assign]
        assert restorer.log.read(KEY) == []
        assert restorer.snapshots is not None
        assert restorer.snapshots.load(KEY) is None


@pytest.mark.parametrize("skew", [-HOURS, HOURS], ids=["eraser 3h behind", "eraser 3h ahead"])
def test_an_export_written_during_an_erasure_loses_its_lines_whatever_the_erasers_clock_says(
    nats_server: EmbeddedNatsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    skew: float,
) -> None:
    """`convmem export -o FILE` has read the user's events and written the file; the whole erasure of
    the user runs before the export records the file (so the erasure cannot rewrite it): the export
    rewrites it without the user, also when the eraser's receipt says it finished hours before."""
    monkeypatch.setenv("CONVMEM_EXPORTS", str(tmp_path / "exports.json"))
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        write(memory, KEY)
        memory.session(KEPT).add_turn(ConversationTurn(user_message=KEPT_TEXT, assistant_response="ok"))
    out = tmp_path / "acme.jsonl"
    record = FileExportRegistry.record

    def erase_then_record(self: FileExportRegistry, path: Path, keys: Iterable[MemoryKey]) -> None:
        with eraser(nats_server.url, skew) as other:
            other.erase_user(TENANT, USER, by="ops")
        record(self, path, keys)

    monkeypatch.setattr(FileExportRegistry, "record", erase_then_record)
    assert main(["-s", nats_server.url, "export", "--tenant", TENANT, "-o", str(out)]) == 0
    capsys.readouterr()
    assert KEPT_TEXT.encode() in out.read_bytes()
    assert SECRET.encode() not in out.read_bytes()


@pytest.mark.xfail(
    raises=InvalidInput,
    strict=True,
    reason="still by clock: a lost session's snapshot is weighed against a receipt by the snapshot's "
    "last event time and the receipt's end time (restore_lost's first check, and a load's); a "
    "position needs one recorded on both sides (the snapshot's last event's and the erasure's)",
)
def test_a_lost_session_begun_after_an_erasure_whose_clock_was_ahead_is_still_restored(
    nats_server: EmbeddedNatsServer,
) -> None:
    """The user was erased (by an eraser 3 h ahead), then wrote again; the log lost the new session,
    its snapshot stays. It is no erased data, so it is restored, not deleted."""
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        write(memory, KEY)
    with eraser(nats_server.url, HOURS) as other:
        other.erase_user(TENANT, USER, by="ops")
    with convmem.connect(nats_server.url, config=CONFIG, snapshot_every=2) as memory:
        write(memory, KEY)
    with JetStreamBackend.connect(nats_server.url) as backend:
        backend.log.erase(KEY, at=1.0)  # lost (no erasure recorded): the snapshot stays
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        assert memory.restore_lost(KEY).turns >= 1
