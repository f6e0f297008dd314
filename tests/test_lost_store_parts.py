"""A writer never makes a lost part of the store again, empty, unasked.

Each case writes on a real nats-server, loses the events stream or the erasure journal's bucket (its
folder deleted from the stopped server's store, or the stream deleted through the API) and starts a
writer on what is left. A writer that made them silently again let every session start over as new
(the stream) and forgot every erasure held pending (the journal). Now it is refused (`StoreLost`,
exit 7 on the command line) naming the part and the server, nothing is made, and the operator's
`convmem repair --accept-loss` (``accept_loss=True``) makes it again, empty.

The check is exact for a store this convmem made: the events stream and the journal's bucket each
carry the other's name in their metadata once both exist, so a loss is named even when nothing else
in the store shows sessions (no snapshot, no erasure record, no data key). A store an older convmem
made (no mark) is judged by what it holds, as before, and is marked by the first writer that opens it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import convmem
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend
from convmem.adapters.backends.jetstream import NatsConnection
from convmem.adapters.backends.jetstream._lost import JOURNAL_MARK, STREAM_MARK
from convmem.adapters.frontends.cli._main import main
from convmem.errors import StoreLost
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

CONFIG = ShortTermMemoryConfig(strategy="truncation")
STREAM = "CONVMEM_EVENTS"
JOURNAL = "CONVMEM_EVENTS_ERASURES"
KEY = MemoryKey("acme", "alice", "one")


def turn(i: int) -> ConversationTurn:
    return ConversationTurn(user_message=f"question {i}", assistant_response=f"answer {i}")


def write_unsnapshotted(url: str) -> None:
    """Two turns of a session and no snapshot: nothing outside the stream shows the session."""
    with convmem.connect(url, config=CONFIG, snapshot_every=1000) as memory:
        for i in range(2):
            memory.session(KEY).add_turn(turn(i), timeout=10)


def folder(store: Path, name: str) -> Path:
    return store / "jetstream" / "$G" / "streams" / name


def lose(server: EmbeddedNatsServer, store: Path, name: str) -> None:
    """Stop the server, delete the stream's folder from its store, start it again."""
    server.stop()
    assert folder(store, name).is_dir()
    shutil.rmtree(folder(store, name))
    server.start()


def api(url: str, subject: str, request: dict[str, Any] | None = None) -> Any:
    connection = NatsConnection.connect(url)
    try:
        return connection.call(lambda: connection.api(subject, request), what=subject)
    finally:
        connection.release()


def metadata(url: str, name: str) -> dict[str, str]:
    return dict(api(url, f"$JS.API.STREAM.INFO.{name}")["config"].get("metadata") or {})


def unmark(url: str) -> None:
    """Make the store look as an older convmem left it: no mark on the stream or the journal."""
    for name in (STREAM, f"KV_{JOURNAL}"):
        config = api(url, f"$JS.API.STREAM.INFO.{name}")["config"]
        config["metadata"] = {
            k: v for k, v in (config.get("metadata") or {}).items() if not k.startswith("convmem.")
        }
        api(url, f"$JS.API.STREAM.UPDATE.{name}", config)
        assert not {STREAM_MARK, JOURNAL_MARK} & set(metadata(url, name))


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


def test_a_new_store_is_made_silently_and_each_part_marked_with_the_other(store: Path) -> None:
    with EmbeddedNatsServer(store) as server:
        with JetStreamBackend.connect(server.url) as backend:
            assert backend.accepted_loss == ()
        assert metadata(server.url, STREAM)[STREAM_MARK] == JOURNAL
        assert metadata(server.url, f"KV_{JOURNAL}")[JOURNAL_MARK] == STREAM
        with JetStreamBackend.connect(server.url) as backend:  # and opens again as it is
            assert backend.accepted_loss == ()


def test_a_lost_stream_that_only_the_mark_remembers_is_refused_until_the_loss_is_accepted(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No snapshot, no erasure, no data key: before the mark, nothing said the stream had existed,
    and a writer made it again, empty, alice's session starting over as new."""
    server = EmbeddedNatsServer(store).start()
    try:
        write_unsnapshotted(server.url)
        lose(server, store, STREAM)
        with pytest.raises(StoreLost) as refused:
            convmem.connect(server.url, config=CONFIG)
        assert (refused.value.part, refused.value.name) == ("events stream", STREAM)
        assert refused.value.where == server.url
        assert f"no events stream '{STREAM}'" in str(refused.value)
        assert "convmem repair --accept-loss" in str(refused.value)
        assert not folder(store, STREAM).exists()  # nothing made
        code, said = cli(capsys, "--nats", server.url, "erase", "--key", KEY.composite(), "--yes")
        assert code == 7, said  # a command that writes: the same refusal
        assert f"events stream: DAMAGED: the NATS server has no events stream '{STREAM}'" in said
        code, said = cli(capsys, "--nats", server.url, "serve")  # the service: refused before it starts
        assert code == 7, said
        assert f"events stream: DAMAGED: the NATS server has no events stream '{STREAM}'" in said
        code, said = cli(capsys, "--nats", server.url, "verify", "--all")  # a reader names it too
        assert code == 7, said
        assert not folder(store, STREAM).exists()

        with JetStreamBackend.connect(server.url, accept_loss=True) as backend:
            (accepted,) = backend.accepted_loss
            assert accepted.startswith(f"events stream {STREAM!r}: ")
            assert backend.log.last_seq(KEY) == 0  # made again, empty
        with convmem.connect(server.url, config=CONFIG) as memory:  # accepted once: writers go on
            memory.session(KEY).add_turn(turn(9), timeout=10)
        assert metadata(server.url, STREAM)[STREAM_MARK] == JOURNAL
    finally:
        server.stop()


def test_a_lost_journal_with_an_erasure_pending_is_refused_though_no_snapshot_was_stored(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The journal's folder deleted while alice's erasure was pending. The snapshot bucket is empty,
    so what the store holds did not show the loss (the stream and the snapshot bucket both had to
    hold messages): a writer made the journal again and the pending erasure was forgotten."""
    server = EmbeddedNatsServer(store).start()
    try:
        write_unsnapshotted(server.url)

        class Stop(Exception):
            pass

        def stop(done: str) -> None:
            if done == "record":
                raise Stop(done)

        with convmem.connect(server.url, config=CONFIG, erasure_hook=stop) as memory, pytest.raises(Stop):
            memory.erase_user("acme", "alice")
        lose(server, store, f"KV_{JOURNAL}")

        with pytest.raises(StoreLost) as refused:
            convmem.connect(server.url, config=CONFIG)
        assert (refused.value.part, refused.value.name) == ("erasure journal", JOURNAL)
        assert "every erasure it held pending" in str(refused.value)
        assert not folder(store, f"KV_{JOURNAL}").exists()
        code, said = cli(capsys, "--nats", server.url, "erase", "--resume", "--yes")
        assert code == 7, said
        assert f"erasure journal: DAMAGED: the NATS server has no erasure-journal bucket '{JOURNAL}'" in said
        assert not folder(store, f"KV_{JOURNAL}").exists()

        code, said = cli(capsys, "--nats", server.url, "repair", "--accept-loss", "--dry-run")
        assert code == 0, said
        assert "would accept the loss of 1 part(s)" in said
        assert not folder(store, f"KV_{JOURNAL}").exists()
        code, said = cli(capsys, "--nats", server.url, "repair", "--accept-loss", "--yes")
        assert code == 0, said
        assert "accepted the loss of 1 part(s) of the store" in said
        code, said = cli(
            capsys, "--nats", server.url, "erase", "--tenant", "acme", "--user", "alice", "--yes"
        )
        assert code == 0, said  # erased again, as the loss's advice says
        code, said = cli(capsys, "--nats", server.url, "repair", "--accept-loss", "--yes")
        assert code == 0, said
        assert "nothing to accept" in said
    finally:
        server.stop()


def test_the_embedded_server_names_its_data_folder(store: Path) -> None:
    """`convmem.connect(data_dir=...)` starts a private server: the refusal names the folder."""
    with convmem.connect(data_dir=store, config=CONFIG, snapshot_every=1000) as memory:
        memory.session(KEY).add_turn(turn(0), timeout=10)
    shutil.rmtree(folder(store, STREAM))
    with pytest.raises(StoreLost) as refused:
        convmem.connect(data_dir=store, config=CONFIG)
    assert refused.value.where == str(store)
    assert f"the embedded server's data folder {store}" in str(refused.value)
    assert not folder(store, STREAM).exists()
    with convmem.connect(data_dir=store, config=CONFIG, accept_loss=True) as memory:
        assert memory.session(KEY).get_llm_context()["conversation_memory"]["recent_turns"] == []


def test_a_journal_deleted_through_the_api_is_refused_too(store: Path) -> None:
    with EmbeddedNatsServer(store) as server:
        write_unsnapshotted(server.url)
        api(server.url, f"$JS.API.STREAM.DELETE.KV_{JOURNAL}")
        with pytest.raises(StoreLost, match="erasure journal: DAMAGED"):
            JetStreamBackend.connect(server.url)


def test_an_older_store_without_marks_is_judged_by_what_it_holds_and_marked_on_open(store: Path) -> None:
    """No mark (an older convmem made the store): the journal is lost when the stream and the
    snapshot bucket both hold messages, as before; a writer that opens such a store marks it."""
    with EmbeddedNatsServer(store) as server:
        with convmem.connect(server.url, config=CONFIG, snapshot_every=1) as memory:
            memory.session(KEY).add_turn(turn(0), timeout=10)
        unmark(server.url)
        with JetStreamBackend.connect(server.url) as backend:  # opened: marked
            assert backend.accepted_loss == ()
        assert metadata(server.url, STREAM)[STREAM_MARK] == JOURNAL
        assert metadata(server.url, f"KV_{JOURNAL}")[JOURNAL_MARK] == STREAM
        unmark(server.url)
        api(server.url, f"$JS.API.STREAM.DELETE.KV_{JOURNAL}")
        with pytest.raises(StoreLost, match="holds 2 message"):
            JetStreamBackend.connect(server.url)
