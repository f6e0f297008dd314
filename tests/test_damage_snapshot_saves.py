"""A live session whose stored snapshot is damaged on disk never makes its writer wait at a save point.

One byte of `acme:alice:hurt`'s stored snapshot flipped in the snapshot bucket's block file (the
server stopped), as in tests/test_damage_erasure.py: nats-server counts the message but cannot read
it back, and never acknowledges a publish on its subject (its expected-last-subject-sequence check
cannot read the last message; the write may be stored all the same). Each snapshot save of the
session used to wait out the connection's timeout on the session actor's thread, holding the
session's next writes behind it at every save point; and once an erase had rewritten the damaged
block (another session's save over its own snapshot), the bucket stopped answering at all, so the
healthy session's saves waited too. Now the load that finds no snapshot to read asks whether the
bucket counts one (damaged), marks the key unsavable, says once what to do (``convmem repair KEY``),
and its saves return at once, not one publish sent; every write is still acknowledged and stored,
the other session saves as before, and a repair (or an erasure) of the session removes the damage
and its saves resume. Real nats-server, real block files; a short connection timeout so a wait
(before the fix) is cheap.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import nats.errors
import pytest
from runtime_helpers import WAIT
from test_damage_erasure import CONFIG, HURT, OK, TURNS, _seed, _store_keys

from convmem.actors import MemorySystem
from convmem.adapters import JetStreamBackend
from convmem.events import ConversationTurn

MORE = 12  # turns written after the damage: with a snapshot every 2 events, several save points


class _Publishes:
    """Every publish on the connection, by subject, with whether the server acknowledged it."""

    def __init__(self, js: Any) -> None:
        self.seen: list[tuple[str, bool]] = []
        self._publish = js.publish

    async def __call__(self, subject: str, *args: Any, **kwargs: Any) -> Any:
        try:
            ack = await self._publish(subject, *args, **kwargs)
        except (nats.errors.TimeoutError, asyncio.CancelledError):  # no acknowledgement came
            self.seen.append((subject, False))
            raise
        self.seen.append((subject, True))
        return ack

    def of(self, prefix: str) -> list[bool]:
        return [acked for name, acked in self.seen if name == prefix or name.startswith(prefix + ".")]


def _turn(i: int) -> ConversationTurn:
    return ConversationTurn(user_message=f"after the damage {i}", assistant_response="noted")


@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypted", "plain"])
def test_a_session_whose_snapshot_is_damaged_on_disk_sends_no_save_to_wait_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, encrypt: bool
) -> None:
    data = tmp_path / "data"
    _seed(data, encrypt=encrypt)
    with (
        JetStreamBackend.embedded(data, keys=_store_keys(data), timeout=1.0) as backend,
        MemorySystem(CONFIG, log=backend.log, snapshots=backend.snapshots, snapshot_every=2) as memory,
    ):
        store: Any = backend.snapshots
        publishes = _Publishes(store._conn.js)
        monkeypatch.setattr(store._conn.js, "publish", publishes)
        caplog.set_level(logging.WARNING, logger="convmem")
        hurt, ok = memory.session(HURT), memory.session(OK)
        for i in range(MORE):
            hurt.add_turn(_turn(i), timeout=WAIT)  # each acknowledged (a wait past WAIT raises)
            ok.add_turn(_turn(i), timeout=WAIT)
        hurt_saves = publishes.of(store.subject(HURT))
        assert hurt_saves == [], publishes.seen  # not one save waited (nor stored a copy unanswered)
        ok_saves = publishes.of(store.subject(OK))
        assert len(ok_saves) >= MORE // 4  # the healthy session saves as before
        assert all(ok_saves)
        told = [r.getMessage() for r in caplog.records if "damaged on disk" in r.getMessage()]
        assert len(told) == 1, told  # said once, with what to do
        assert f"convmem repair {HURT.composite()}" in told[0]

        memory.passivate(HURT)  # nothing stored was lost: a load replays every turn
        state, report = memory.load(HURT)
        assert report.snapshot_seq == 0
        messages = [t.turn.user_message for t in state.turns]
        assert messages[TURNS:] == [_turn(i).user_message for i in range(MORE)]

        plan = memory.repair(HURT)  # replaces the damaged snapshot (the bucket purged, the rest kept)
        assert plan.applied
        assert not plan.snapshot_problem
        assert memory.load(OK)[1].snapshot_seq > 0
        before = len(publishes.of(store.subject(HURT)))
        for i in range(8):
            hurt.add_turn(_turn(MORE + i), timeout=WAIT)
        after = publishes.of(store.subject(HURT))[before:]
        assert after, publishes.seen  # its saves resume, acknowledged
        assert all(after), publishes.seen
        memory.passivate(HURT)
        state, report = memory.load(HURT)
        assert report.snapshot_seq > plan.seq
        assert len(state.turns) == TURNS + MORE + 8


def test_an_erasure_of_such_a_session_removes_the_damage_and_its_saves_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    _seed(data, encrypt=False)
    with (
        JetStreamBackend.embedded(data, keys=_store_keys(data), timeout=1.0) as backend,
        MemorySystem(CONFIG, log=backend.log, snapshots=backend.snapshots, snapshot_every=2) as memory,
    ):
        store: Any = backend.snapshots
        publishes = _Publishes(store._conn.js)
        monkeypatch.setattr(store._conn.js, "publish", publishes)
        hurt = memory.session(HURT)
        for i in range(4):
            hurt.add_turn(_turn(i), timeout=WAIT)
        assert publishes.of(store.subject(HURT)) == []
        erased = memory.erase(HURT, by="test")
        assert erased.sessions == 1
        assert memory.pending_erasures() == []
        assert store.check(HURT) is None  # nothing of it left in the bucket
        hurt = memory.session(HURT)  # begun again
        for i in range(8):
            hurt.add_turn(_turn(i), timeout=WAIT)
        saves = publishes.of(store.subject(HURT))
        assert saves, publishes.seen
        assert all(saves), publishes.seen
        memory.passivate(HURT)
        state, report = memory.load(HURT)
        assert report.snapshot_seq > 0
        assert [t.turn.user_message for t in state.turns] == [_turn(i).user_message for i in range(8)]
