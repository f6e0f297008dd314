"""Fault injection with real processes: kill -9 the server or a planner process mid-load.

Bounded in size by CONVMEM_FAULT_SCALE (default 1: a few thousand turns), so
`.ci/run` always runs them; raise it for a longer soak by hand.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

import convmem
from convmem.actors import load_state
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend
from convmem.errors import ConvmemError, ReplayError
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig, TurnAdded, decode_event
from convmem.projections import llm_context

pytestmark = pytest.mark.soak

SCALE = max(1, int(os.environ.get("CONVMEM_FAULT_SCALE", "1")))
WORKER = Path(__file__).with_name("fault_worker.py")
DEADLINE = 120.0


def stored_turns(url: str, keys: list[MemoryKey]) -> dict[MemoryKey, list[str]]:
    """Each session's turns as the log holds them (a fresh connection, a full replay)."""
    with JetStreamBackend.connect(url) as backend:
        out = {}
        for key in keys:
            state, report = load_state(backend.log, None, key)
            assert not report.poison
            out[key] = [r.turn.user_message for r in state.turns]
        return out


def all_turns_of(url: str, key: MemoryKey) -> list[str]:
    """Every TurnAdded of `key` in the log, in order (duplicates would show here)."""
    with JetStreamBackend.connect(url) as backend:
        events = [decode_event(r.data) for r in backend.log.read(key)]
    return [e.turn.user_message for e in events if isinstance(e, TurnAdded)]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    s = EmbeddedNatsServer(tmp_path / "nats").start()
    try:
        yield s
    finally:
        s.stop()


def test_killing_the_server_mid_load_loses_no_acknowledged_turn(server: EmbeddedNatsServer) -> None:
    """kill -9 of nats-server under load, restarted on its store: every acknowledged turn is stored once."""
    sessions, turns = 40, 25 * SCALE
    keys = [MemoryKey("fault", "user", f"s{i}") for i in range(sessions)]
    acked: dict[MemoryKey, list[str]] = defaultdict(list)
    errors: Counter[str] = Counter()
    lock = threading.Lock()
    enough = threading.Event()
    total = sessions * turns

    with convmem.connect(
        server.url, config=ShortTermMemoryConfig(strategy="truncation"), timeout=2.0
    ) as memory:

        def plan(group: list[MemoryKey]) -> None:
            for n in range(turns):
                for key in group:
                    text = f"{key.session_id}-{n}"
                    turn = ConversationTurn(user_message=text, assistant_response="ok")
                    for _ in range(400):
                        try:
                            memory.session(key).add_turn(turn, timeout=3, idempotency_key=text)
                            break
                        except ConvmemError as exc:  # a clear error: we retry with the same key
                            with lock:
                                errors[type(exc).__name__] += 1
                    else:
                        raise AssertionError(f"{text} never acknowledged")
                    with lock:
                        acked[key].append(text)
                        if sum(len(v) for v in acked.values()) >= total // 3:
                            enough.set()

        threads = [threading.Thread(target=plan, args=(keys[i::8],)) for i in range(8)]
        for thread in threads:
            thread.start()
        assert enough.wait(DEADLINE), "the load did not reach a third of its turns"
        server.kill()  # SIGKILL while appends are in flight
        server.start()  # same store, same port: clients reconnect
        for thread in threads:
            thread.join(DEADLINE)
            assert not thread.is_alive()

    assert sum(len(v) for v in acked.values()) == total
    assert sum(errors.values()) > 0, "the kill should have been noticed by some writer"
    stored = stored_turns(server.url, keys)
    for key in keys:
        every = all_turns_of(server.url, key)
        assert sorted(every) == sorted(set(every)), f"{key}: a turn was stored twice"
        assert set(acked[key]) <= set(every), f"{key}: an acknowledged turn is missing"
        assert stored[key] == every


def _worker(url: str, writer: str, sessions: int, turns: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), url, writer, str(sessions), str(turns)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _acks(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        parts = line.split()
        if parts and parts[0] == "ACK":
            out[parts[1]].append(parts[2])
    return out


def test_killing_a_planner_process_mid_load_leaves_a_log_that_rebuilds(server: EmbeddedNatsServer) -> None:
    """kill -9 of a process running MemorySystem: a new one rebuilds every session as a replay does."""
    sessions = 12
    proc = _worker(server.url, "w", sessions, 200 * SCALE)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())
            if len(lines) >= 300 * SCALE:
                break
        proc.kill()
    finally:
        proc.kill()
        proc.wait(30)
        if proc.stdout is not None:
            lines.extend(line.strip() for line in proc.stdout)
            proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
    acked = _acks(lines)
    assert acked, "the worker acknowledged nothing before it was killed"
    keys = [MemoryKey("fault", "user", f"s{i}") for i in range(sessions)]
    stored = stored_turns(server.url, keys)
    with convmem.connect(server.url) as memory:
        for key in keys:
            live = memory.session(key).snapshot_state()
            replayed, _ = load_state(memory.log, None, key)
            assert live == replayed
            assert llm_context(live) == llm_context(replayed)
            assert set(acked[key.session_id]) <= set(stored[key])


def test_two_processes_writing_the_same_sessions_lose_no_update(server: EmbeddedNatsServer) -> None:
    """Two MemorySystems in two processes write the same sessions: every acked turn is there, in order."""
    sessions, turns = 6, 30 * SCALE
    workers = [_worker(server.url, name, sessions, turns) for name in ("a", "b")]
    outputs = []
    for proc in workers:
        out, err = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 0, err[-2000:]
        outputs.append(out.splitlines())
    keys = [MemoryKey("fault", "user", f"s{i}") for i in range(sessions)]
    stored = stored_turns(server.url, keys)
    for lines, name in zip(outputs, ("a", "b"), strict=True):
        assert "DONE" in lines
        acked = _acks(lines)
        for key in keys:
            mine = [t for t in stored[key] if t.startswith(f"{name}-")]
            assert mine == acked[key.session_id], (
                f"{key}: {name}'s turns are not its acknowledged ones in order"
            )
    for key in keys:
        assert len(stored[key]) == 2 * turns
        assert len(set(stored[key])) == len(stored[key])


def test_a_poison_message_is_reported_with_its_position_then_skipped_or_fatal(
    server: EmbeddedNatsServer,
) -> None:
    """Bytes that are not an event, and an unknown future tag, are reported with their position."""
    key = MemoryKey("fault", "user", "poisoned")
    config = ShortTermMemoryConfig(strategy="truncation")
    with convmem.connect(server.url, config=config) as memory:
        memory.session(key).add_turn(ConversationTurn(user_message="before", assistant_response="ok"))

    async def inject() -> list[int]:
        client = await nats.connect(server.url)
        try:
            js = client.jetstream()
            subject = "convmem.ev." + ".".join(key.tokens())
            garbage = await js.publish(subject, b"\x00 definitely not msgpack")
            future = await js.publish(
                subject, b"\x82\xa4type\xacfuture.thing\xa3seq\x03", headers={"Convmem-Seq": "3"}
            )
            return [int(garbage.seq), int(future.seq)]
        finally:
            await client.close()

    positions = asyncio.run(inject())
    with convmem.connect(server.url, config=config, on_poison="skip") as memory:
        session = memory.session(key)
        session.add_turn(ConversationTurn(user_message="after", assistant_response="ok"), timeout=10)
        turns = [t["user"] for t in session.get_llm_context()["conversation_memory"]["recent_turns"]]
        assert turns == ["before", "after"]
        _, report = memory.load(key)
        assert [p.position for p in report.poison] == positions
    with (
        convmem.connect(server.url, config=config, on_poison="stop") as memory,
        pytest.raises(ReplayError, match=f"position {positions[0]}"),
    ):
        memory.load(key)
