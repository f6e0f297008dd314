"""`convmem restore` asks the log, as a load does, before it writes a kept snapshot back.

An eraser killed inside its events step leaves the session's erasure fence
(a `SessionErased` past every erased event) with the events below it gone
and the snapshot not yet deleted. Its pending record in the erasure journal
is then the other record of the erasure; when the journal loses it too (its
file damaged: a second fault), the session looks lost, and a restore would
write the erased turns back. The fence alone refuses it: the snapshot is
deleted, nothing is written. The checks run on a real nats-server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import convmem
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend
from convmem.adapters.frontends.cli import main
from convmem.events import ConversationTurn, MemoryKey, SessionErased, ShortTermMemoryConfig

CONFIG = ShortTermMemoryConfig(strategy="truncation")
KEY = MemoryKey("acme", "gail", "chat")
SECRET = "gail's card 5500-FENCE"


def test_a_restore_over_an_erasure_fence_is_refused_without_a_journal_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with EmbeddedNatsServer(tmp_path / "nats") as server:
        with convmem.connect(server.url, config=CONFIG, snapshot_every=1) as memory:
            for n in range(3):
                memory.session(KEY).add_turn(
                    ConversationTurn(user_message=f"{SECRET} #{n}", assistant_response="ok")
                )
        with JetStreamBackend.connect(server.url) as backend:  # what the killed eraser left; no record
            last = backend.log.last_seq(KEY)
            fence = SessionErased(seq=last + 1, event_id="erased/killed", at=1.0, reason="erased on request")
            backend.log.append(KEY, [fence], expected_seq=last)
            assert backend.log.drop_before(KEY, seq=fence.seq) == last
            assert backend.snapshots.load(KEY) is not None
            assert backend.journal is not None
            assert backend.journal.pending() == []
            assert backend.journal.receipts() == []

        assert main(["-s", server.url, "restore", KEY.composite(), "--yes"]) == 5
        err = capsys.readouterr().err
        assert "is not lost" in err
        assert "an erasure's fence" in err
        with JetStreamBackend.connect(server.url) as backend:
            assert backend.snapshots.load(KEY) is None  # erased data, deleted as a load deletes it
            assert [r.seq for r in backend.log.read(KEY)] == [fence.seq]  # nothing written
        assert main(["-s", server.url, "replay", KEY.composite(), "--json"]) == 0
        assert SECRET not in capsys.readouterr().out
        assert main(["-s", server.url, "verify", "--all", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["failed"] == 0
