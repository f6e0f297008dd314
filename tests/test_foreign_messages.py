"""A message that does not fit a session's sequence never blocks its writes, never hides an event,
and is reported with its session and position by replay, verify and the CLI; on both logs."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from log_faults import POISON_KINDS, PoisonKind, poison, write_poison
from nats_fixtures import JetStreamNames
from runtime_helpers import Harness, key, live_state, turn

from convmem.actors import EventLog, MemorySystem, load_state, replay_session, verify
from convmem.adapters import EmbeddedNatsServer, InMemoryEventLog, JetStreamEventLog
from convmem.adapters.frontends.cli._main import main
from convmem.adapters.frontends.cli._timeline import page_data
from convmem.events import (
    MemoryKey,
    SessionErased,
    ShortTermMemoryConfig,
    TurnAdded,
    decode_event,
    encode_event,
)
from convmem.projections import SessionSequence, SessionState

CONFIG = ShortTermMemoryConfig(strategy="truncation")


@pytest.fixture(params=["memory", "jetstream"])
def log(
    request: pytest.FixtureRequest, nats_server_shared: EmbeddedNatsServer, jetstream_names: JetStreamNames
) -> Iterator[EventLog]:
    if request.param == "memory":
        yield InMemoryEventLog()
        return
    stream_log = JetStreamEventLog.connect(
        nats_server_shared.url, stream=jetstream_names.stream, prefix=jetstream_names.prefix
    )
    yield stream_log
    stream_log.close()


def _users(state: SessionState) -> list[str]:
    return [r.turn.user_message for r in state.turns]


def _stored_users(log: EventLog, k: MemoryKey) -> list[str]:
    state, _ = replay_session(log.read(k), k)
    return _users(state)


@pytest.mark.parametrize("kind", POISON_KINDS)
def test_a_foreign_message_leaves_the_session_writable_and_every_event_in_place(
    log: EventLog, kind: PoisonKind
) -> None:
    """Poison of any kind: writes go on (in the live process and in a new one), no valid event
    vanishes, the message stays, and replay and verify report it with its session and position,
    their counts agreeing."""
    k = key()
    with MemorySystem(CONFIG, log=log) as live:
        session = live.session(k)
        for text in ("t1", "t2", "t3"):
            session.add_turn(turn(text))
        version = len(log.read(k))  # one SessionStarted and three turns
        position = write_poison(log, k, kind, version)
        assert session.add_turn(turn("live after")) == 4  # the live process: not blocked
    with MemorySystem(CONFIG, log=log) as fresh:  # a new process
        assert fresh.session(k).add_turn(turn("fresh after")) == 5
        assert _users(live_state(fresh, k)) == ["t1", "t2", "t3", "live after", "fresh after"]
    assert position in [r.position for r in log.read(k)]  # the foreign message stays where it is
    state, report = replay_session(log.read(k), k)
    assert _users(state) == ["t1", "t2", "t3", "live after", "fresh after"]
    assert [(p.key, p.position) for p in report.poison] == [(k, position)]
    (check,) = verify(log, key=k)
    assert [(p.key, p.position) for p in check.poison] == [(k, position)]
    assert check.turns == len(state.turns) == 5
    assert check.last_seq == state.version
    assert check.events == state.version  # each seq is one event (an unreadable one holds its seq too)


def test_an_unknown_event_sharing_a_seq_with_a_valid_one_does_not_hide_it(log: EventLog) -> None:
    """An event of an unknown type claiming (in its bytes only) the seq the next valid event takes
    is reported; the valid event is replayed."""
    k = key()
    with MemorySystem(CONFIG, log=log) as system:
        system.session(k).add_turn(turn("t1"))
        write_poison(log, k, "unknown-tag", 2)
        system.session(k).add_turn(turn("t2"))
    assert _stored_users(log, k) == ["t1", "t2"]


def test_the_writer_and_the_fold_count_a_session_alike(log: EventLog) -> None:
    """After every kind of poison, the log's last seq is the fold's version (one source of truth)."""
    k = key()
    with MemorySystem(CONFIG, log=log) as system:
        system.session(k).add_turn(turn("t1"))
    for kind in POISON_KINDS:
        state, _ = replay_session(log.read(k), k)
        write_poison(log, k, kind, state.version)
        state, _ = replay_session(log.read(k), k)
        assert log.last_seq(k) == state.version, kind


def test_the_cli_reports_foreign_messages_with_session_and_position(
    nats_server_shared: EmbeddedNatsServer,
    jetstream_names: JetStreamNames,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`convmem replay` and `convmem verify` (text and --json) name the session and the position."""
    log = JetStreamEventLog.connect(
        nats_server_shared.url, stream=jetstream_names.stream, prefix=jetstream_names.prefix
    )
    k = key()
    try:
        with MemorySystem(CONFIG, log=log) as system:
            for text in ("t1", "t2", "t3"):
                system.session(k).add_turn(turn(text))
        position = write_poison(log, k, "no-header", 4)
    finally:
        log.close()
    where = ["--nats", nats_server_shared.url, "--stream", jetstream_names.stream]
    where += ["--prefix", jetstream_names.prefix]
    capsys.readouterr()
    main([*where, "replay", k.composite()])
    err = capsys.readouterr().err
    assert f"{k.composite()}: poison at position {position}" in err
    assert main([*where, "verify", k.composite()]) != 0
    out = capsys.readouterr().out
    assert f"{k.composite()}: poison at position {position}" in out
    main([*where, "verify", "--json", k.composite()])
    (check,) = json.loads(capsys.readouterr().out)["checks"]
    assert check["turns"] == 3
    assert [p["position"] for p in check["poison"]] == [position]
    main([*where, "inspect", "--json", k.composite()])
    rows = json.loads(capsys.readouterr().out)
    assert [(r["position"], r["type"]) for r in rows if r["type"] == "POISON"] == [(position, "POISON")]


def test_session_sequence_takes_the_next_seq_and_reports_anything_else() -> None:
    """The one rule: the next seq by header; no header, rewound or skipping seqs do not fit."""
    walk = SessionSequence()
    data = b""
    assert walk.take(1, data) is None
    assert "no Convmem-Seq header" in (walk.take(None, data) or "")
    assert "rewound" in (walk.take(1, data) or "")
    assert "skips" in (walk.take(5, data) or "")
    assert walk.version == 1
    assert walk.take(2, data) is None
    assert walk.version == 2


def test_session_sequence_lets_a_fence_or_an_intact_message_open_a_history_above_it() -> None:
    """Given a session at seq 2, when an erasure fence with its own seq 7 comes, then it is taken;
    when an intact message skips seqs, it is taken and the seqs it skipped are the gap (lost);
    the same bytes without a matching checksum do not fit."""
    walk = SessionSequence(2)
    fence = encode_event(SessionErased(seq=7, event_id="erased/x", at=1.0, reason="asked"))
    assert walk.take(7, fence) is None
    assert (walk.version, walk.gap) == (7, None)
    assert "skips 2 seq(s)" in (walk.take(10, b"?") or "")
    assert walk.take(10, b"?", intact=True) is None
    assert (walk.version, walk.gap) == (10, (8, 9))
    assert walk.take(11, b"") is None
    assert walk.gap is None  # told once, for the message that skipped


def test_a_poison_turn_forged_without_a_header_is_no_turn() -> None:
    """`write_poison`'s ``no-header`` message is a valid event: only its missing header makes it foreign."""
    data, seq = poison("no-header", 4)
    assert seq is None
    assert isinstance(decode_event(data), TurnAdded)


@pytest.mark.parametrize("kind", ["no-header", "garbage"])
def test_a_fork_copies_the_session_s_events_and_leaves_foreign_messages_out(
    log: EventLog, kind: PoisonKind
) -> None:
    """A fork of a session holding a foreign message copies exactly its events (no forged turn)."""
    k, to = key(), key("fork")
    with MemorySystem(CONFIG, log=log) as system:
        system.session(k).add_turn(turn("t1"))
        write_poison(log, k, kind, 2)
        system.session(k).add_turn(turn("t2"))
        system.fork(k, to=to)
        assert _users(live_state(system, to)) == ["t1", "t2"]
    assert _stored_users(log, to) == ["t1", "t2"]


def test_the_timeline_page_marks_a_foreign_message_and_folds_around_it() -> None:
    """The page's rows: the foreign message is POISON with why; the turns after it still show."""
    log = InMemoryEventLog()
    k = key()
    with MemorySystem(CONFIG, log=log) as system:
        system.session(k).add_turn(turn("t1"))
        position = write_poison(log, k, "no-header", 2)
        system.session(k).add_turn(turn("t2"))
    data = page_data(log.read(k), k)
    rows = data["events"]  # each: position, seq, at, stamp, type, detail, health
    assert [(r[0], r[4]) for r in rows][1:] == [
        (2, "turn.added"),
        (position, "POISON"),
        (position + 1, "turn.added"),
    ]
    assert "no Convmem-Seq header" in rows[2][5]
    assert data["context"][-1] is not None  # the turn after it changed the context the model saw
    assert any("t2" in line for line in data["lines"])


def test_activation_from_a_snapshot_reads_only_what_came_after_it(harness: Harness) -> None:
    """A foreign message before the snapshot's event is not reported again at every activation
    (verify still reports it); one after it is."""
    k = key()
    with harness.system(CONFIG, snapshot_every=1) as system:
        system.session(k).add_turn(turn("t1"))
        write_poison(harness.log, k, "no-header", 3)
        system.session(k).add_turn(turn("t2"))
        system.session(k).flush(timeout=10)
    state, report = load_state(harness.log, harness.snapshots, k)
    assert report.snapshot_seq == state.version == 3
    assert report.poison == []
    write_poison(harness.log, k, "no-header", 3)
    _, report = load_state(harness.log, harness.snapshots, k)
    assert len(report.poison) == 1
    (check,) = verify(harness.log, key=k)
    assert len(check.poison) == 2
