"""Erasing a session one of whose event messages is damaged on disk never says it is done.

One byte of one of `acme:alice:hurt`'s turns flipped in the events stream's block file (the server
stopped), on an unencrypted store, as tests/test_damage.py does: nats-server counts the message but
skips it on every read, refuses to erase it (``STREAM.MSG.DELETE`` answers 10057 "malformed or corrupt
message", the code it also gives for a message already gone) and a purge filtered by its subject
passes over it. `convmem erase` used to exit 0 with a receipt while all of the session's events (the
readable ones too: a damaged session's writer knew no last message, so it found "nothing to erase")
stayed in the block file, the user's text in clear. Now the readable messages are erased, the
unreadable one is named, the erase exits 7 and the erasure stays pending (no receipt) until the
bytes are gone (here: the whole events stream purged by the operator, the one way nats-server removes
them), when `convmem erase --resume` finishes it. Real nats-server, real block files.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import nats.js.errors
import pytest
from runtime_helpers import WAIT

import convmem
from convmem.actors import MemorySystem
from convmem.adapters import JetStreamBackend
from convmem.adapters.backends.jetstream import EmbeddedNatsServer
from convmem.adapters.backends.jetstream._write import erased_already
from convmem.adapters.backends.keys import KeySettings
from convmem.adapters.frontends.cli._main import main
from convmem.errors import SessionDamaged
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

CONFIG = ShortTermMemoryConfig(strategy="truncation")
OK = MemoryKey("acme", "alice", "ok")
HURT = MemoryKey("acme", "alice", "hurt")
TURNS = 3
PLAIN = KeySettings(encrypt=False)
BLOCKS = Path("jetstream") / "$G" / "streams" / "CONVMEM_EVENTS" / "msgs"


def _marker(key: MemoryKey, turn: int) -> str:
    return f"card-4111-{key.session_id}-{turn}-"


def _seed(data: Path, damaged_turn: int) -> None:
    """OK and HURT, three turns each (seqs 1-4), stored plain; then one byte of HURT's turn
    `damaged_turn` flipped in the events stream's block file."""
    with convmem.connect(data_dir=data, config=CONFIG, keys=PLAIN) as memory:
        for key in (OK, HURT):
            for i in range(TURNS):
                turn = ConversationTurn(user_message=f"{_marker(key, i)} question", assistant_response="ok")
                memory.session(key).add_turn(turn, timeout=WAIT)
    (block,) = (data / BLOCKS).glob("*.blk")
    raw = bytearray(block.read_bytes())
    text = _marker(HURT, damaged_turn).encode()
    at = raw.find(text)
    assert at >= 0
    assert raw.find(text, at + 1) < 0
    raw[at + len(text) // 2] ^= 0x20
    block.write_bytes(bytes(raw))


def _on_disk(data: Path, text: str) -> bool:
    """Whether any file of the store (the server stopped) holds `text`, or it as damaged (one byte off)."""
    raw = text.encode()
    half = len(raw) // 2
    needles = (raw, raw[:half] + bytes([raw[half] ^ 0x20]) + raw[half + 1 :])
    return any(
        any(n in p.read_bytes() for n in needles) for p in (data / "jetstream").rglob("*") if p.is_file()
    )


def _cli(capsys: pytest.CaptureFixture[str], data: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--data-dir", str(data), "--no-encryption", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _journal(data: Path) -> tuple[list[MemoryKey | None], int]:
    """The keys of the pending erasures, and how many receipts the journal holds."""
    with JetStreamBackend.embedded(data, keys=PLAIN) as backend:
        assert backend.journal is not None
        return [p.key for p in backend.journal.pending()], len(backend.journal.receipts())


def _purge_events(data: Path) -> None:
    """What the operator does (the error says so): purge the whole events stream."""
    with EmbeddedNatsServer(data) as server:

        async def purge() -> None:
            nc = await nats.connect(server.url)
            try:
                await nc.jetstream().purge_stream("CONVMEM_EVENTS")
            finally:
                await nc.close()

        asyncio.run(purge())


@pytest.mark.parametrize("damaged_turn", [1, 2], ids=["a-middle-event", "the-last-event"])
def test_an_erase_that_leaves_a_damaged_event_on_disk_exits_7_and_stays_pending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damaged_turn: int
) -> None:
    data = tmp_path / "data"
    _seed(data, damaged_turn)
    assert _on_disk(data, _marker(HURT, damaged_turn))

    code, out, err = _cli(capsys, data, "erase", "--key", HURT.composite(), "--yes")
    assert code == 7, out + err
    assert "erased session" not in out
    assert f"not erased: the events of session {HURT.composite()} were not erased" in err
    assert "1 message(s) of the session stay in stream CONVMEM_EVENTS" in err
    assert "purge of the whole stream" in err
    assert "convmem erase --resume" in err
    # Every event it could read is gone from disk; the damaged one is not, and the erase said so.
    for i in range(TURNS):
        assert _on_disk(data, _marker(HURT, i)) == (i == damaged_turn), i
    for i in range(TURNS):
        assert _on_disk(data, _marker(OK, i))
    assert _journal(data) == ([HURT], 0)  # pending, no receipt

    code, out, err = _cli(capsys, data, "erase", "--resume")  # still there: still not done
    assert code == 7, out + err  # named as damage, as the erase was
    assert "finished" not in out
    assert _journal(data) == ([HURT], 0)

    _purge_events(data)
    code, out, err = _cli(capsys, data, "erase", "--resume")
    assert code == 0, out + err
    assert "finished 1 pending erasure(s)" in out
    assert _journal(data) == ([], 1)
    assert not _on_disk(data, _marker(HURT, damaged_turn))


def test_a_systems_erase_of_a_session_with_a_damaged_event_raises_session_damaged(tmp_path: Path) -> None:
    """What the service's and retention's erase run: `MemorySystem.erase` raises, nothing is receipted."""
    data = tmp_path / "data"
    _seed(data, 1)
    with (
        JetStreamBackend.embedded(data, keys=PLAIN) as backend,
        MemorySystem(CONFIG, log=backend.log, snapshots=backend.snapshots) as memory,
    ):
        with pytest.raises(SessionDamaged, match="were not erased") as caught:
            memory.erase(HURT, by="test")
        assert caught.value.key == HURT.composite()
        assert [p.key for p in memory.pending_erasures()] == [HURT]
        assert memory.erasure_record(HURT) is not None
        assert backend.journal is not None
        assert backend.journal.receipts() == []
        assert memory.erase(OK, by="test").events_purged == 4  # a healthy session still erases
    assert _on_disk(data, _marker(HURT, 1))
    assert not _on_disk(data, _marker(HURT, 0))
    assert not _on_disk(data, _marker(OK, 0))


def test_nats_servers_refusal_to_erase_a_damaged_message_is_not_taken_for_gone(tmp_path: Path) -> None:
    """A message the server cannot erase is refused with 10057 "malformed or corrupt message", the code
    (or 10043) it gives for one erased already; only the latter counts as erased (`erased_already`)."""
    data = tmp_path / "data"
    _seed(data, 1)  # OK at stream seqs 1-4; HURT's start at 5, its turns at 6, 7 (damaged) and 8

    async def delete(url: str, seq: int) -> nats.js.errors.APIError:
        """The server's refusal of a delete of stream seq `seq` (a second one, when the first passes)."""
        nc = await nats.connect(url)
        try:
            for _ in range(2):
                try:
                    await nc.jetstream().delete_msg("CONVMEM_EVENTS", seq)
                except nats.js.errors.APIError as exc:
                    return exc
            raise AssertionError(f"seq {seq} deleted twice")
        finally:
            await nc.close()

    with EmbeddedNatsServer(data) as server:
        damaged = asyncio.run(delete(server.url, 7))
        gone = asyncio.run(delete(server.url, 6))  # deleted by the first call, refused by the second
    assert damaged.err_code == 10057, damaged.description  # the code of a message gone, too
    assert gone.err_code in (10057, 10043), gone.description
    assert not erased_already(damaged), damaged.description
    assert erased_already(gone), gone.description


def test_a_users_erase_erases_the_events_of_every_other_session_before_it_says_what_stays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    _seed(data, 1)  # HURT sorts before OK: the damage does not hold OK's erasure back
    code, out, err = _cli(capsys, data, "erase", "--tenant", "acme", "--user", "alice", "--yes")
    assert code == 7, out + err
    assert f"the events of session {HURT.composite()} were not erased" in err
    assert [_on_disk(data, _marker(k, i)) for k in (HURT, OK) for i in range(TURNS)] == [
        False,
        True,
        False,
        False,
        False,
        False,
    ]
    assert _journal(data) == ([None], 0)  # the user's erasure, pending
