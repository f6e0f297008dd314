"""Fork: a new session whose first event says where it came from and whose state is the source's then."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import msgspec
import pytest

import convmem
from convmem.actors import MemorySystem, replay_session, verify
from convmem.adapters import EmbeddedNatsServer, InMemoryEventLog, MemoryService, RemoteMemory
from convmem.adapters.frontends.cli._main import main
from convmem.errors import InvalidInput
from convmem.events import (
    ConversationTurn,
    MemoryBudget,
    MemoryKey,
    SessionStarted,
    ShortTermMemoryConfig,
    decode_event,
)

SOURCE = MemoryKey("acme", "alice", "chat-1")
FORK = MemoryKey("acme", "alice", "chat-1-branch")
CONFIG = ShortTermMemoryConfig(strategy="rolling_summary", budget=MemoryBudget(full_zone_turns=2))


def summarize(request: dict[str, object]) -> dict[str, str]:
    turns = request["turns"]
    assert isinstance(turns, list)
    return {"summary": f"<session_summary>\n{len(turns)} turns\n</session_summary>"}


def fill(memory: MemorySystem, key: MemoryKey = SOURCE, turns: int = 6) -> None:
    session = memory.session(key)
    for n in range(turns):
        session.add_turn(ConversationTurn(user_message=f"message {n}", assistant_response="ok"))
        session.flush(timeout=10)


def state_at(log: InMemoryEventLog, key: MemoryKey, position: int) -> object:
    state, _ = replay_session(log.read(key), key, until_position=position)
    return state


def test_a_fork_equals_the_source_as_of_a_position_and_says_where_it_came_from() -> None:
    """Every position of the source forks into a session whose state is the source's there, key aside."""
    log = InMemoryEventLog()
    with MemorySystem(CONFIG, log=log, summarizer=summarize) as memory:
        fill(memory)
        positions = [r.position for r in log.read(SOURCE)]
        for n, position in enumerate(positions):
            to = MemoryKey("acme", "alice", f"fork-{n}")
            forked = memory.fork(SOURCE, to=to, at=position)
            assert forked.forked_at == position
            first = decode_event(log.read(to)[0].data)
            assert isinstance(first, SessionStarted)
            assert (first.forked_from, first.forked_at) == (SOURCE, position)
            mine = memory.session(to).snapshot_state()
            assert msgspec.structs.replace(mine, key=SOURCE) == state_at(log, SOURCE, position)
        assert all(check.ok for check in verify(log, None))  # forks verify like any session
        memory.session(FORK)  # and they go on as sessions of their own
        latest = memory.fork(SOURCE, to=FORK)
        assert latest.forked_at == positions[-1]
        memory.session(FORK).add_turn(
            ConversationTurn(user_message="only in the branch", assistant_response="ok")
        )
        assert "only in the branch" not in json.dumps(memory.session(SOURCE).to_dict())


def test_a_fork_as_of_a_time() -> None:
    """`at` as a datetime forks as of the last event at or before it."""
    log = InMemoryEventLog()
    with MemorySystem(CONFIG, log=log, summarizer=summarize) as memory:
        fill(memory, turns=2)
        records = log.read(SOURCE)
        third = decode_event(records[2].data)
        forked = memory.fork(SOURCE, to=FORK, at=datetime.fromtimestamp(third.at, tz=UTC))
        assert forked.forked_at >= records[2].position


def test_bad_forks_are_refused_clearly() -> None:
    """Into itself, into a session with events, from nothing, with a naive time: each a clear error."""
    log = InMemoryEventLog()
    with MemorySystem(CONFIG, log=log, summarizer=summarize) as memory:
        fill(memory, turns=1)
        with pytest.raises(InvalidInput, match="another session"):
            memory.fork(SOURCE, to=SOURCE)
        memory.fork(SOURCE, to=FORK)
        with pytest.raises(InvalidInput, match="has events already"):
            memory.fork(SOURCE, to=FORK)
        with pytest.raises(InvalidInput, match="nothing to fork"):
            memory.fork(MemoryKey("acme", "nobody", "x"), to=MemoryKey("acme", "nobody", "y"))
        with pytest.raises(InvalidInput, match="time zone"):
            memory.fork(SOURCE, to=MemoryKey("a", "b", "c"), at=datetime(2026, 1, 1))
        with pytest.raises(InvalidInput, match=r"had no events as of time 0\.0: nothing to fork"):
            memory.fork(SOURCE, to=MemoryKey("a", "b", "d"), at=datetime.fromtimestamp(0, tz=UTC))


def test_fork_through_the_service_and_the_cli(
    nats_server: EmbeddedNatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The service's fork op and `convmem fork` make the same fork; `sessions` lists it."""
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        fill(memory, turns=3)
        position = memory.log.read(SOURCE)[3].position
        with MemoryService(memory, nats_server.url), RemoteMemory(nats_server.url) as remote:
            reply = remote.session(SOURCE).fork("remote-branch", at_position=position)
            assert reply == {"events": 4, "forked_at": position}
            listed = {row["session_id"] for row in remote.sessions("acme", "alice")}
            assert listed == {"chat-1", "remote-branch"}
    argv = ["-s", nats_server.url, "fork", SOURCE.composite(), "--to", FORK.composite()]
    code = main([*argv, "--position", str(position), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out) == {"key": FORK.composite(), "events": 4, "forked_at": position}
    code = main(["-s", nats_server.url, "replay", FORK.composite(), "--json"])
    from_fork = json.loads(capsys.readouterr()[0])
    code = main(["-s", nats_server.url, "replay", SOURCE.composite(), "--position", str(position), "--json"])
    from_source = json.loads(capsys.readouterr()[0])
    assert from_fork["context"] == from_source["context"]
    assert main(["-s", nats_server.url, "verify", "--all"]) == 0
