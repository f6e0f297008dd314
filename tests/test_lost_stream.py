"""A store whose events stream is gone while the rest of it is not: its lost history is named.

Each case writes sessions on a real nats-server, stops it (cleanly, or with
kill -9), deletes the stream's folder from the store
(``jetstream/$G/streams/<stream>``) and starts the server again on the same
folder. The snapshot bucket, the erasure journal, the key store and the
byte tallies are left as they were. Then

* `verify`, `sessions`, `replay`, `inspect`, `timeline` and `export` name
  every session that has a snapshot and no event as lost, say that the
  stream is gone and what the store still holds, and exit 7;
* a writer that starts afterwards is refused (`StoreLost`, exit 7) and makes
  nothing; once an operator accepts the loss (`convmem repair --accept-loss`)
  the stream is made again, empty: verify and `sessions` still name those
  sessions lost, and `convmem repair` writes each snapshot back;
* a store that never held a session (or whose events are under another
  stream name) still says the stream does not exist, exit 3.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest

import convmem
from convmem.actors import verify
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend
from convmem.adapters.backends.jetstream import JetStreamEventLog, NatsConnection
from convmem.adapters.frontends.cli._main import main
from convmem.errors import SessionLost, StoreLost, StoreNotFound
from convmem.events import ConversationTurn, MemoryKey, RetentionPolicies, ShortTermMemoryConfig

CONFIG = ShortTermMemoryConfig(strategy="truncation")
SNAPSHOTTED = (
    MemoryKey("acme", "alice", "one"),
    MemoryKey("acme", "bob", "two"),
    MemoryKey("globex", "carol", "three"),
)
"""Sessions with a snapshot after every event: what the store keeps of them once the stream is gone."""
UNSNAPSHOTTED = MemoryKey("acme", "dave", "four")
"""A session with no snapshot: nothing in the store names it once the stream is gone."""
TURNS = 3  # seqs 1-4 each: the start and three turns
STREAM = "CONVMEM_EVENTS"


def turn(i: int) -> ConversationTurn:
    return ConversationTurn(user_message=f"question {i}", assistant_response=f"answer {i}")


def write(url: str, keys: tuple[MemoryKey, ...], *, snapshot_every: int) -> None:
    with convmem.connect(url, config=CONFIG, snapshot_every=snapshot_every) as memory:
        for key in keys:
            for i in range(TURNS):
                memory.session(key).add_turn(turn(i), timeout=10)


def lose_the_stream(server: EmbeddedNatsServer, store: Path, *, crash: bool = False) -> None:
    """Stop the server (kill -9 when `crash`), delete the events stream's folder, start it again."""
    if crash:
        server.kill()
    else:
        server.stop()
    folder = store / "jetstream" / "$G" / "streams" / STREAM
    assert folder.is_dir(), sorted(p.name for p in folder.parent.iterdir())
    shutil.rmtree(folder)
    server.start()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """A command's exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "nats"


@pytest.mark.parametrize("crash", [False, True], ids=["stopped", "killed"])
def test_a_deleted_events_stream_names_every_session_it_lost(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], crash: bool
) -> None:
    """Snapshots of three sessions (two tenants, three users) outlive the stream: each is named lost
    by verify, sessions and the auditor's views (exit 7, never "no stream", exit 3), and the stream's
    loss is named once with what the store holds; the session without a snapshot cannot be named."""
    server = EmbeddedNatsServer(store).start()
    try:
        write(server.url, SNAPSHOTTED, snapshot_every=1)
        write(server.url, (UNSNAPSHOTTED,), snapshot_every=1000)
        lose_the_stream(server, store, crash=crash)
        nats = ["--nats", server.url]

        code, out, err = cli(capsys, *nats, "verify", "--all")
        assert code == 7, out + err
        for key in SNAPSHOTTED:
            assert f"{key}: DAMAGED seq 1: event seqs 1-4 missing: the snapshot at seq 4 covers them" in out
        assert UNSNAPSHOTTED.composite() not in out
        assert f"events stream: DAMAGED: the NATS server has no events stream '{STREAM}'" in out
        assert "snapshots of 3 session(s)" in out
        assert "0/3 sessions verified" in out

        code, out, err = cli(capsys, *nats, "verify", "--all", "--json")
        assert code == 7, err
        verified = json.loads(out)
        assert [c["key"] for c in verified["checks"]] == sorted(k.composite() for k in SNAPSHOTTED)
        assert not any(c["ok"] for c in verified["checks"])
        assert "every event the stream held is lost" in verified["history_lost"]

        code, out, err = cli(capsys, *nats, "verify", UNSNAPSHOTTED.composite())
        assert code == 7, out + err  # its events may have been in the stream: not "nothing to verify"
        assert "events stream: DAMAGED" in out

        code, out, err = cli(capsys, *nats, "sessions", "--json")
        assert code == 7, err
        listed = {r["key"]: r["health"] for r in json.loads(out)}
        assert listed == {k.composite(): "lost" for k in SNAPSHOTTED}
        assert "events stream: DAMAGED" in err
        code, out, err = cli(capsys, *nats, "sessions", "--tenant", "globex")
        assert code == 7, out + err
        assert "globex:carol:three: LOST: session globex:carol:three is lost from the log" in err

        assert_views_name_the_loss(capsys, nats, tmp_path)
    finally:
        server.stop()


def assert_views_name_the_loss(capsys: pytest.CaptureFixture[str], nats: list[str], tmp_path: Path) -> None:
    """replay, inspect, timeline and export name a lost session and the stream's loss (exit 7); a
    reader that does not name it itself (a retention dry run) stops on it, exit 7."""
    key = SNAPSHOTTED[1]
    for argv in (
        ["replay", key.composite()],
        ["inspect", key.composite()],
        ["timeline", key.composite(), "-o", str(tmp_path / "two.html")],
    ):
        code, out, err = cli(capsys, *nats, *argv)
        assert code == 7, (argv, out + err)
        assert f"{key}: DAMAGED seq 1: event seqs 1-4 missing" in out + err
        assert f"{key}: DAMAGED: the NATS server has no events stream" in out + err
    assert not (tmp_path / "two.html").exists()
    code, out, err = cli(capsys, *nats, "replay", UNSNAPSHOTTED.composite())
    assert code == 7, out + err  # not "no events for session" (exit 3)

    exported = tmp_path / "acme.jsonl"
    code, out, err = cli(capsys, *nats, "export", "--tenant", "acme", "-o", str(exported))
    assert code == 7, err
    assert "acme:alice:one: DAMAGED seq 1" in err
    assert "globex" not in err.split("events stream:")[0]  # the scope's sessions only
    assert not exported.exists()

    policy = tmp_path / "policy.toml"
    policy.write_text('[default]\nidle = "30d"\n', encoding="utf-8")
    code, out, err = cli(capsys, *nats, "retention", "--dry-run", "--policy", str(policy))
    assert code == 7, out + err  # a reader that does not name the loss itself stops on it
    assert "no events stream" in err


def test_a_stream_a_writer_made_again_still_leaves_the_snapshot_sessions_lost(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A writer started after the loss is refused and makes nothing; once the loss is accepted
    (`repair --accept-loss`) the stream is made again, empty, and a new session is written: verify
    and sessions still name the snapshot sessions lost (exit 7), the new one verifies, a
    writer refuses the lost ones (`SessionLost`), a retention sweep names them (no policy can apply
    to them, their snapshots keep their turns), and `convmem repair` writes each snapshot back."""
    server = EmbeddedNatsServer(store).start()
    fresh = MemoryKey("initech", "erin", "new")
    try:
        write(server.url, SNAPSHOTTED, snapshot_every=1)
        lose_the_stream(server, store)
        with pytest.raises(StoreLost) as refused:
            convmem.connect(server.url, config=CONFIG)
        assert (refused.value.part, refused.value.name) == ("events stream", STREAM)
        assert "snapshots of 3 session(s)" in str(refused.value)
        assert not (store / "jetstream" / "$G" / "streams" / STREAM).exists()  # nothing made
        code, out, err = cli(capsys, "--nats", server.url, "repair", "--accept-loss", "--yes")
        assert code == 0, out + err
        assert f"events stream: DAMAGED: the NATS server has no events stream '{STREAM}'" in err
        with convmem.connect(server.url, config=CONFIG) as memory:
            memory.session(fresh).add_turn(turn(0), timeout=10)
            with pytest.raises(SessionLost):
                memory.session(SNAPSHOTTED[0]).get_llm_context()
        nats = ["--nats", server.url]

        code, out, err = cli(capsys, *nats, "verify", "--all", "--json")
        assert code == 7, err
        verified = json.loads(out)
        assert verified["history_lost"] is None  # the stream is there again: each loss is a session's
        checks = {c["key"]: c for c in verified["checks"]}
        assert checks[fresh.composite()]["ok"]
        for key in SNAPSHOTTED:
            (damage,) = checks[key.composite()]["damage"]
            assert "event seqs 1-4 missing" in damage["problem"]
        code, out, err = cli(capsys, *nats, "sessions", "--json")
        assert code == 7, err
        assert {r["key"]: r["health"] for r in json.loads(out)} == {
            **{k.composite(): "lost" for k in SNAPSHOTTED},
            fresh.composite(): "healthy",
        }
        policy = tmp_path / "policy.toml"
        policy.write_text('[default]\nidle = "30d"\n', encoding="utf-8")
        code, out, err = cli(capsys, *nats, "retention", "--dry-run", "--policy", str(policy))
        assert code == 1, out + err
        for key in SNAPSHOTTED:
            assert f"convmem: left alone {key}: lost: session {key} is lost from the log" in err
        assert fresh.composite() not in err
        with convmem.connect(server.url, config=CONFIG) as memory:
            swept = memory.sweep_retention(policies=RetentionPolicies.parse({"default": {"idle": "30d"}}))
            assert sorted(p.key.composite() for p in swept.problems) == sorted(
                map(MemoryKey.composite, SNAPSHOTTED)
            )

        for key in SNAPSHOTTED:
            code, out, err = cli(capsys, *nats, "repair", key.composite(), "--yes")
            assert code == 0, out + err
        code, out, err = cli(capsys, *nats, "verify", "--all")
        assert code == 0, out + err
        with convmem.connect(server.url, config=CONFIG) as memory:
            recent = memory.session(SNAPSHOTTED[2]).get_llm_context()["conversation_memory"]["recent_turns"]
            assert [t["user"] for t in recent] == [f"question {i}" for i in range(TURNS)]
    finally:
        server.stop()


def test_a_reader_backend_says_what_the_store_lost_and_verify_names_the_sessions(store: Path) -> None:
    """The library's reader (`read_only`): the log reads as empty and says why (`history_lost`), and
    `verify` names each session with a snapshot; a log opened on its own still raises `StoreNotFound`."""
    server = EmbeddedNatsServer(store).start()
    try:
        write(server.url, SNAPSHOTTED[:2], snapshot_every=1)
        lose_the_stream(server, store)
        with JetStreamBackend.connect(server.url, read_only=True) as backend:
            assert backend.log.stream_absent
            assert backend.log.history_lost is not None
            assert "snapshots of 2 session(s)" in backend.log.history_lost
            assert backend.log.keys() == []
            checks = verify(backend.log, backend.snapshots)
            assert [c.key for c in checks] == list(SNAPSHOTTED[:2])
            assert all(c.lost and c.events == 0 for c in checks)
        connection = NatsConnection.connect(server.url)
        try:
            with pytest.raises(StoreNotFound, match="nothing was stored there yet"):
                JetStreamEventLog(connection, create=False)
        finally:
            connection.release()
    finally:
        server.stop()


def test_repair_brings_a_session_back_into_a_stream_that_is_gone(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`convmem repair KEY` alone is refused (exit 7: it would make the stream again); with
    `--accept-loss`, as the loss's advice says, it makes the stream again and writes the snapshot back."""
    server = EmbeddedNatsServer(store).start()
    try:
        write(server.url, SNAPSHOTTED[:1], snapshot_every=1)
        lose_the_stream(server, store)
        code, out, err = cli(capsys, "--nats", server.url, "repair", SNAPSHOTTED[0].composite(), "--yes")
        assert code == 7, out + err
        assert "--accept-loss" in err
        code, out, err = cli(
            capsys, "--nats", server.url, "repair", SNAPSHOTTED[0].composite(), "--accept-loss", "--yes"
        )
        assert code == 0, out + err
        code, out, err = cli(capsys, "--nats", server.url, "verify", "--all")
        assert code == 0, out + err
    finally:
        server.stop()


@pytest.mark.parametrize("evidence", ["erasure journal", "data keys", "byte tallies"])
def test_a_stream_gone_without_snapshots_is_still_damage_when_the_store_shows_sessions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], evidence: str
) -> None:
    """No snapshot names a session, but an erasure's receipt, a user's data key or a tenant's byte
    tally shows that the stream held events: verify and sessions say it is lost (exit 7), naming
    what the store holds; no session can be named."""
    data = tmp_path / "data"
    key = MemoryKey("acme", "alice", "one")
    if evidence == "data keys":  # the embedded default: a master key and a key folder in its data folder
        with convmem.connect(data_dir=data, config=CONFIG, snapshot_every=1000) as memory:
            memory.session(key).add_turn(turn(0), timeout=10)
    else:
        with EmbeddedNatsServer(data) as server:
            with convmem.connect(server.url, config=CONFIG, snapshot_every=1000) as memory:
                memory.session(key).add_turn(turn(0), timeout=10)
                if evidence == "erasure journal":
                    memory.erase(key, by="test")
            if evidence == "byte tallies":
                with JetStreamBackend.connect(server.url) as backend:
                    backend.log.prepare_usage_tallies(within=10)
                    assert backend.log.put_usage_tally("acme", 123, 0) is not None
    shutil.rmtree(data / "jetstream" / "$G" / "streams" / STREAM)
    held = {
        "erasure journal": "1 erasure-journal record(s)",
        "data keys": "data keys of 1 user(s)",
        "byte tallies": "byte tallies of 1 tenant(s)",
    }[evidence]
    with contextlib.ExitStack() as stack:
        if evidence == "data keys":  # the CLI starts a reader's server on the data folder
            where = ["--data-dir", str(data)]
        else:
            server = stack.enter_context(EmbeddedNatsServer(data))
            where = ["--nats", server.url]
        code, out, err = cli(capsys, *where, "verify", "--all")
        assert code == 7, out + err
        assert f"events stream: DAMAGED: the NATS server has no events stream '{STREAM}'" in out
        assert f"the store holds {held}:" in out
        assert "no snapshot is left to name a session by" in out
        code, out, err = cli(capsys, *where, "sessions")
        assert code == 7, out + err
        assert "events stream: DAMAGED" in err


def test_a_store_that_never_held_a_session_still_has_no_stream(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No false alarm: a store nothing was written to, and a stream name given wrong (its subjects are
    in another stream) say the stream does not exist, exit 3, as before. A store whose writer made
    the stream and buckets is another matter: the journal's bucket is marked as made beside the
    stream, and the mark cannot tell an empty stream from one whose sessions left no snapshot, so
    the stream's loss is named (exit 7), stored in or not."""
    server = EmbeddedNatsServer(store).start()
    try:
        nats = ["--nats", server.url]
        for argv in (["verify", "--all"], ["sessions"]):
            code, out, err = cli(capsys, *nats, *argv)
            assert code == 3, (argv, out + err)
            assert f"the NATS server has no stream '{STREAM}'" in err

        with convmem.connect(server.url, config=CONFIG):
            pass  # makes the stream, the snapshot bucket and the journal's bucket; stores nothing
        lose_the_stream(server, store)
        for argv in (["verify", "--all"], ["sessions"], ["replay", SNAPSHOTTED[0].composite()]):
            code, out, err = cli(capsys, *nats, *argv)
            assert code == 7, (argv, out + err)
            assert "marked as made beside it" in out + err
        code, out, err = cli(capsys, *nats, "repair", "--accept-loss", "--yes")
        assert code == 0, out + err

        write(server.url, SNAPSHOTTED, snapshot_every=1)
        for argv in (["verify", "--all"], ["sessions"]):
            code, out, err = cli(capsys, *nats, "--stream", "CONVMEM_EVENTZ", *argv)
            assert code == 3, (argv, out + err)
            assert "no stream 'CONVMEM_EVENTZ'" in err
            assert "DAMAGED" not in out + err
    finally:
        server.stop()
