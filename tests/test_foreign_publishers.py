"""Messages published on a session's subject by someone else than convmem, with nats-py directly.

Anyone with raw publish rights on the stream (or an older or newer convmem) may store any bytes
under any headers on a session's subject. Such a message never makes the session another one's,
never passes for a write it is not, and is named by the audits with its session and position; the
other sessions read and write as before. Earlier rounds cover messages that do not fit a session's
sequence (`test_foreign_messages.py`) and bytes damaged on disk (`test_damage.py`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import msgspec
import nats
import pytest
from nats_fixtures import JetStreamNames
from runtime_helpers import turn

import convmem
from convmem.actors import MemorySystem, load_state, replay_session, verify
from convmem.adapters import (
    EmbeddedNatsServer,
    JetStreamEventLog,
    JetStreamSnapshotStore,
    MemoryService,
    RemoteMemory,
)
from convmem.adapters.frontends.cli._main import main
from convmem.adapters.frontends.cli._timeline import page_data
from convmem.errors import InvalidInput
from convmem.events import (
    ConversationTurn,
    HistoryCompacted,
    KeptTurn,
    MemoryKey,
    SessionStarted,
    ShortTermMemoryConfig,
    TurnAdded,
    encode_event,
)
from convmem.projections import command_id_for

CONFIG = ShortTermMemoryConfig(strategy="truncation")
ALICE = MemoryKey("tenant-a", "alice", "chat")
BOB = MemoryKey("tenant-b", "bob", "chat")


@pytest.fixture
def log(
    nats_server_shared: EmbeddedNatsServer, jetstream_names: JetStreamNames
) -> Iterator[JetStreamEventLog]:
    stream_log = JetStreamEventLog.connect(
        nats_server_shared.url, stream=jetstream_names.stream, prefix=jetstream_names.prefix
    )
    yield stream_log
    stream_log.close()


def publish(url: str, subject: str, data: bytes, headers: dict[str, str] | None) -> dict[str, object]:
    """Publish as a stranger would (nats-py, no convmem): the server's acknowledgement."""

    async def go() -> dict[str, object]:
        nc = await nats.connect(url)
        try:
            reply = await nc.request(subject, data, timeout=5, headers=headers)
            answer: dict[str, object] = msgspec.json.decode(reply.data)
            return answer
        finally:
            await nc.close()

    return asyncio.run(go())


def _cli(server: EmbeddedNatsServer, names: JetStreamNames, *args: str) -> int:
    where = ["--nats", server.url, "--stream", names.stream, "--prefix", names.prefix]
    return main([*where, *args])


def _users(log: JetStreamEventLog, key: MemoryKey) -> list[str]:
    state, _ = replay_session(log.read(key), key)
    return [r.turn.user_message for r in state.turns]


@pytest.mark.parametrize("opener", ["started", "compacted"])
def test_an_event_naming_another_session_is_poison_and_the_session_stays_its_own(
    log: JetStreamEventLog,
    nats_server_shared: EmbeddedNatsServer,
    jetstream_names: JetStreamNames,
    capsys: pytest.CaptureFixture[str],
    opener: str,
) -> None:
    """Bob's key on Alice's subject (a start or a compaction, with a turn after it): the fold never
    takes Alice's session for Bob's; her context shows none of it; her first write opens her own
    session; verify names the message by position (exit 1); Bob's session is untouched."""
    with MemorySystem(CONFIG, log=log) as system:
        system.session(BOB).add_turn(turn("bob's own"))
    forged: SessionStarted | HistoryCompacted
    if opener == "started":
        forged = SessionStarted(seq=1, event_id="forged-1", at=1.0, key=BOB, config=CONFIG)
    else:
        planted_turn = ConversationTurn(user_message="planted", assistant_response="x")
        kept = KeptTurn(index=1, at=1.0, turn=planted_turn)
        forged = HistoryCompacted(seq=1, event_id="forged-1", at=1.0, key=BOB, config=CONFIG, turns=(kept,))
    second = ConversationTurn(user_message="planted 2", assistant_response="x")
    planted = TurnAdded(seq=2, event_id="forged-2", at=2.0, index=2, turn=second)
    subject = log.subject(ALICE)
    first = publish(nats_server_shared.url, subject, encode_event(forged), {"Convmem-Seq": "1"})
    publish(nats_server_shared.url, subject, encode_event(planted), {"Convmem-Seq": "2"})
    position = int(str(first["seq"]))

    state, report = replay_session(log.read(ALICE), ALICE)
    assert state.key is None
    assert not state.started
    assert (report.poison[0].position, report.poison[0].seq) == (position, 1)
    assert f"names session {BOB}, not {ALICE}" in report.poison[0].problem
    with MemorySystem(CONFIG, log=log) as system:
        alice = system.session(ALICE)
        assert alice.get_llm_context()["conversation_memory"]["recent_turns"] == []
        assert alice.add_turn(turn("alice's own")) == 1
        assert [t["user"] for t in alice.get_llm_context()["conversation_memory"]["recent_turns"]] == [
            "alice's own"
        ]
        assert system.session(BOB).add_turn(turn("bob again")) == 2
    state, _ = replay_session(log.read(ALICE), ALICE)
    assert state.key == ALICE
    assert _users(log, BOB) == ["bob's own", "bob again"]
    (check,) = verify(log, key=BOB)
    assert check.ok

    capsys.readouterr()
    assert _cli(nats_server_shared, jetstream_names, "verify", ALICE.composite()) == 1
    out = capsys.readouterr().out
    assert f"{ALICE.composite()}: poison at position {position} (seq 1): it names session {BOB}" in out
    assert _cli(nats_server_shared, jetstream_names, "verify", BOB.composite()) == 0
    assert _cli(nats_server_shared, jetstream_names, "sessions") == 0
    listed = capsys.readouterr().out
    assert ALICE.composite() in listed
    assert BOB.composite() in listed
    assert _cli(nats_server_shared, jetstream_names, "export", "--key", ALICE.composite()) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["position"] == position  # exported as stored, for an auditor
    assert _cli(nats_server_shared, jetstream_names, "inspect", "--json", ALICE.composite()) == 0
    rows = json.loads(capsys.readouterr().out)
    assert (rows[0]["position"], rows[0]["type"]) == (position, "POISON")
    assert f"names session {BOB}" in rows[0]["detail"]
    events = page_data(log.read(ALICE), ALICE)["events"]  # the timeline page
    assert (events[0][0], events[0][4]) == (position, "POISON")


def test_a_message_id_taken_on_another_subject_never_passes_for_a_stored_write(
    log: JetStreamEventLog, nats_server_shared: EmbeddedNatsServer
) -> None:
    """The stream deduplicates ids stream-wide, and an idempotency key's event id is predictable: a
    message published first on Alice's subject under the id Bob's keyed write will use makes the server
    drop Bob's event as a duplicate. Bob is told nothing was stored (never that the write is done),
    his session is unchanged and takes a write under another key; a new session whose opening id was
    taken is not opened. A real retry of a stored write is still answered as stored."""
    new = MemoryKey("tenant-b", "bob", "new-chat")
    with MemorySystem(CONFIG, log=log) as system:
        system.session(BOB).add_turn(turn("bob's own"))
        assert system.session(BOB).add_turn(turn("kept"), idempotency_key="order-6") == 2
    taken = [
        f"{command_id_for(BOB, 'order-7')}/turn.added/1",
        f"{command_id_for(new, 'order-1')}.start/session.started/1",
    ]
    for event_id in taken:
        publish(nats_server_shared.url, log.subject(ALICE), b"\xc1 not an event", {"Nats-Msg-Id": event_id})
    with MemorySystem(CONFIG, log=log) as system:
        bob = system.session(BOB)
        with pytest.raises(InvalidInput, match="nothing was stored") as caught:
            bob.add_turn(turn("lost?"), idempotency_key="order-7")
        assert caught.value.field == "event_id"
        assert taken[0] in str(caught.value)
        assert "tenant-a" not in str(caught.value)  # the other subject is not named to Bob
        assert bob.add_turn(turn("kept"), idempotency_key="order-6") == 0  # a retry: stored once
        assert bob.add_turn(turn("another key"), idempotency_key="order-8") == 3
        with pytest.raises(InvalidInput, match="nothing was stored"):
            system.session(new).add_turn(turn("first"), idempotency_key="order-1")
    assert _users(log, BOB) == ["bob's own", "kept", "another key"]
    assert log.read(new) == []
    assert all(check.ok for check in verify(log, key=BOB))


def test_a_stranger_s_message_under_a_session_s_own_next_id_is_not_taken_for_its_event(
    log: JetStreamEventLog, nats_server_shared: EmbeddedNatsServer
) -> None:
    """On the session's own subject, bytes under the id of its next keyed event but without its seq
    are not that event: the write is refused, named; the bytes are poison, named by verify."""
    with MemorySystem(CONFIG, log=log) as system:
        system.session(ALICE).add_turn(turn("alice's own"))
    event_id = f"{command_id_for(ALICE, 'k')}/turn.added/1"
    publish(nats_server_shared.url, log.subject(ALICE), b"\xc1 junk", {"Nats-Msg-Id": event_id})
    with MemorySystem(CONFIG, log=log) as system:
        with pytest.raises(InvalidInput, match="this session's subject"):
            system.session(ALICE).add_turn(turn("mine"), idempotency_key="k")
        assert system.session(ALICE).add_turn(turn("next")) == 2
    assert _users(log, ALICE) == ["alice's own", "next"]
    (check,) = verify(log, key=ALICE)
    assert len(check.poison) == 1


@pytest.mark.parametrize("where", ["last", "among the tail"])
def test_a_stranger_s_low_seq_header_never_hides_the_events_after_a_snapshot(
    nats_server_shared: EmbeddedNatsServer, jetstream_names: JetStreamNames, where: str
) -> None:
    """A message claiming a seq the snapshot covers, after events the snapshot does not: an activation
    from the snapshot still reads those events (the read of the tail is placed by the seq headers, which
    a stranger sets), never calls the session lost, and writes on top of them."""
    log = JetStreamEventLog.connect(
        nats_server_shared.url, stream=jetstream_names.stream, prefix=jetstream_names.prefix
    )
    snapshots = JetStreamSnapshotStore.connect(nats_server_shared.url, bucket=jetstream_names.bucket)
    try:
        with MemorySystem(CONFIG, log=log, snapshots=snapshots, snapshot_every=1) as system:
            for text in ("a0", "a1"):
                system.session(ALICE).add_turn(turn(text))
            system.session(ALICE).flush(timeout=10)
        snapshot = snapshots.load(ALICE)
        assert snapshot is not None
        with MemorySystem(CONFIG, log=log) as system:  # no snapshot store: these stay past the snapshot
            system.session(ALICE).add_turn(turn("b0"))
            if where == "among the tail":
                publish(nats_server_shared.url, log.subject(ALICE), b"\xff junk", {"Convmem-Seq": "2"})
            system.session(ALICE).add_turn(turn("b1"))
        if where == "last":
            publish(nats_server_shared.url, log.subject(ALICE), b"\xff junk", {"Convmem-Seq": "1"})
        everything = ["a0", "a1", "b0", "b1"]  # all within the context's full zone
        state, report = load_state(log, snapshots, ALICE)
        assert [r.turn.user_message for r in state.turns] == everything
        assert report.snapshot_seq == snapshot.seq
        (check,) = verify(log, key=ALICE)
        assert len(check.poison) == 1
        with MemorySystem(CONFIG, log=log, snapshots=snapshots) as system:
            alice = system.session(ALICE)
            shown = alice.get_llm_context()["conversation_memory"]["recent_turns"]
            assert [t["user"] for t in shown] == everything
            assert alice.add_turn(turn("c")) == 5
        assert _users(log, ALICE) == [*everything, "c"]
        assert snapshots.load(ALICE) is not None  # kept: the session was never lost
    finally:
        snapshots.close()
        log.close()


@pytest.mark.parametrize("header", ["0", "-5", "+2", " 2", "\u0662", "02"])
def test_a_seq_header_below_one_is_poison_not_damage(
    log: JetStreamEventLog,
    nats_server_shared: EmbeddedNatsServer,
    jetstream_names: JetStreamNames,
    capsys: pytest.CaptureFixture[str],
    header: str,
) -> None:
    """No convmem writes such a seq: the message is read back, named as poison (verify exit 1), never
    counted as a message the store holds but cannot read (damage, exit 7, refused writes)."""
    with MemorySystem(CONFIG, log=log) as system:
        system.session(ALICE).add_turn(turn("a0"))
    ack = publish(nats_server_shared.url, log.subject(ALICE), b"\xff junk", {"Convmem-Seq": header})
    (check,) = verify(log, key=ALICE)
    assert check.damage == []
    assert [p.position for p in check.poison] == [int(str(ack["seq"]))]
    capsys.readouterr()
    assert _cli(nats_server_shared, jetstream_names, "verify", ALICE.composite()) == 1
    assert f"poison at position {ack['seq']}" in capsys.readouterr().out
    with MemorySystem(CONFIG, log=log) as system:
        assert system.session(ALICE).add_turn(turn("a1")) == 2


def test_bytes_that_look_sealed_without_a_checksum_are_poison_on_a_plain_log(
    log: JetStreamEventLog, nats_server_shared: EmbeddedNatsServer
) -> None:
    """Every event convmem seals carries its checksum: bytes starting with the sealed marker and a seq
    header but no ``Convmem-Sum`` are a stranger's, poison at their position, never a demand for a
    master key that blocks every read of the session."""
    with MemorySystem(CONFIG, log=log) as system:
        system.session(ALICE).add_turn(turn("a0"))
    ack = publish(nats_server_shared.url, log.subject(ALICE), b"\xc1 junk", {"Convmem-Seq": "2"})
    (check,) = verify(log, key=ALICE)
    assert [p.position for p in check.poison] == [int(str(ack["seq"]))]
    assert check.damage == []
    with MemorySystem(CONFIG, log=log) as system:
        assert system.session(ALICE).add_turn(turn("a1")) == 2
    assert _users(log, ALICE) == ["a0", "a1"]


def test_through_the_service_a_session_with_another_s_start_shows_and_takes_only_its_own(
    nats_server_shared: EmbeddedNatsServer, jetstream_names: JetStreamNames
) -> None:
    """The same forged start and turn on Alice's subject, read and written through the service by a
    remote client: Alice's context holds none of it, her write opens her own session, Bob's is his."""
    url = nats_server_shared.url
    api_prefix = f"t{jetstream_names.bucket.lower()}.api"
    with convmem.connect(
        url,
        config=CONFIG,
        stream=jetstream_names.stream,
        prefix=jetstream_names.prefix,
        bucket=jetstream_names.bucket,
        snapshot_every=1,
    ) as system:
        system.session(BOB).add_turn(turn("bob's own"))
        log = JetStreamEventLog.connect(url, stream=jetstream_names.stream, prefix=jetstream_names.prefix)
        try:
            forged = SessionStarted(seq=1, event_id="forged-1", at=1.0, key=BOB, config=CONFIG)
            planted = TurnAdded(seq=2, event_id="forged-2", at=2.0, index=1, turn=turn("planted"))
            publish(url, log.subject(ALICE), encode_event(forged), {"Convmem-Seq": "1"})
            publish(url, log.subject(ALICE), encode_event(planted), {"Convmem-Seq": "2"})
        finally:
            log.close()
        with (
            MemoryService(system, url, api_prefix=api_prefix),
            RemoteMemory(url, api_prefix=api_prefix, timeout=30) as remote,
        ):
            alice = remote.session(ALICE)
            fresh = remote.session(MemoryKey("tenant-a", "alice", "fresh"))
            assert alice.get_llm_context() == fresh.get_llm_context()  # as a session with no event
            assert alice.add_turn(turn("alice's own")) == 1
            shown = alice.get_llm_context()["conversation_memory"]["recent_turns"]
            assert [t["user"] for t in shown] == ["alice's own"]
            assert [
                t["user"]
                for t in remote.session(BOB).get_llm_context()["conversation_memory"]["recent_turns"]
            ] == ["bob's own"]
