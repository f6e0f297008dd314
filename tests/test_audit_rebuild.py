"""An auditor rebuilds exactly what the model saw, at every point of a session's life.

A random program (fixed seeds) drives one session on a real nats-server, with encryption at rest,
through turns (with and without idempotency keys, retried), summaries that land late (held at a
gate while more turns come), configuration changes (a clear with a new configuration: another
token counter, recall on or off), Agents items (added, popped), restores, adoptions, retention's
compaction, key rotations, forks and the erasure of another user of the tenant. After each step it
records what `get_llm_context()` served, with and without a query, and when (the session's seq,
hence its log position, and the clock's time). Then every auditor's tool must give back the same
bytes for each recorded point: `replay_session` (Python), `convmem replay --position`,
`--time`, `--query`, `--from-file` of an export, and the timeline page's context for that event.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from convmem import (
    ConversationTurn,
    KeySettings,
    MemoryBudget,
    MemoryKey,
    RetentionPolicies,
    RetentionPolicy,
    ShortTermMemoryConfig,
    connect,
    generate_key_text,
    replay_session,
    replayed_context,
)
from convmem.actors import ManualClock, MemorySystem
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend
from convmem.adapters.backends.keys import DirKeyStore, rotate_master_file
from convmem.adapters.frontends.cli._main import main
from convmem.adapters.frontends.cli._readable import readable_lines
from convmem.adapters.frontends.cli._timeline import page_data
from convmem.events import AgentsMemoryConfig, HealthPolicy

ALICE = MemoryKey("acme", "alice", "chat")
BOB = MemoryKey("acme", "bob", "chat")
SOURCE = MemoryKey("acme", "alice", "older-chat")
QUERY = "What is the name of my cat and where does my sister teach piano?"
START = 1_764_000_000.0
SENTENCES = [
    "I adopted a grey cat named Pixel.",
    "My sister teaches piano in Lisbon.",
    "We painted the kitchen yellow.",
    "Any tips for a rainy weekend?",
    "\u4f60\u597d\u4e16\u754c " * 20 + "my cat likes the sun.",  # the estimate 26 tokens, cl100k 120
    "The bakery opens at seven on Sundays.",
    "Remind me to call the piano tuner.",
    "Pixel knocked the yellow paint over.",
    "\u4f60\u597d\u4e16\u754c " * 20 + "my sister likes Lisbon.",
]


def config_of(variant: int) -> ShortTermMemoryConfig:
    """The configurations a session switches between: counters, recall, budgets."""
    return ShortTermMemoryConfig(
        strategy="rolling_summary",
        budget=MemoryBudget(
            full_zone_turns=1,
            summary_max_tokens=60,
            total_max_tokens=200 if variant % 2 else 400,
            recall_max_tokens=0 if variant == 2 else 60,
        ),
        include_turn_dates=variant != 1,
        health=HealthPolicy(retry_backoff_seconds=(0.0, 0.0), degraded_retry_seconds=0.0),  # no timers
        token_counter="cl100k_base" if variant % 2 else None,
        agents=AgentsMemoryConfig(strategy="summarizing"),
    )


class GatedSummarizer:
    """A deterministic summary of the user lines; while `held`, calls wait at the gate (summaries land
    late, after more turns). The gate only opens; no call ever sleeps."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.failing = False

    def __call__(self, request: Mapping[str, Any]) -> dict[str, str]:
        self.gate.wait(30)
        if self.failing:  # the health machine at work: RETRY, DEGRADED, then RECOVERING
            raise ConnectionError("summarizer endpoint unreachable")
        said = "\n".join(f"- spoke of {t['user'].split()[-1]}" for t in request["turns"])
        previous = (
            request["previous_summary"].replace("<session_summary>", "").replace("</session_summary>", "")
        )
        kept = "\n".join([*previous.strip().split("\n"), *said.split("\n")][-4:])  # a bounded summary
        return {"summary": f"<session_summary>\n{kept.strip()}\n</session_summary>"}


@dataclass(frozen=True)
class Served:
    """What the model was served, and when."""

    key: MemoryKey
    seq: int
    position: int
    at: float
    context: dict[str, Any]
    queried: dict[str, Any]


@dataclass
class Store:
    server: EmbeddedNatsServer
    master: Path
    keys: Path

    def settings(self) -> KeySettings:
        return KeySettings(master_key_file=str(self.master), key_store=str(self.keys))

    def cli(self) -> list[str]:
        return ["-s", self.server.url, "--master-key-file", str(self.master), "--key-store", str(self.keys)]


@pytest.fixture
def store(nats_server: EmbeddedNatsServer, tmp_path: Path) -> Store:
    master = tmp_path / "master.key"
    master.write_text(generate_key_text() + "\n")
    master.chmod(0o600)
    return Store(nats_server, master, tmp_path / "keys")


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


OPS = {
    "turn": 10,
    "turn_idem": 4,
    "hold": 2,
    "release": 2,
    "config": 1,
    "items": 2,
    "pop": 1,
    "restore": 1,
    "adopt": 1,
    "compact": 1,
    "rotate": 1,
    "fork": 1,
    "bob": 2,
    "erase_bob": 1,
    "fail": 1,
    "passivate": 1,
}
"""Each operation and its weight; every program does each at least once."""


def program_ops(rng: random.Random, steps: int) -> list[str]:
    """Every operation once, then `steps` more drawn by weight, shuffled (first turns, and bob, to erase)."""
    ops = [*OPS, *rng.choices(list(OPS), weights=list(OPS.values()), k=steps)]
    rng.shuffle(ops)
    return ["turn", "turn", "bob", "turn", "turn", "release", *ops]


class Program:
    """One random program over ALICE's session, recording what each read served."""

    def __init__(
        self,
        reopen: Callable[[], MemorySystem],
        clock: ManualClock,
        store: Store,
        rng: random.Random,
        summarizer: GatedSummarizer,
    ) -> None:
        self.reopen, self.clock, self.store, self.rng = reopen, clock, store, rng
        self.summarizer = summarizer
        self.memory = reopen()
        self.served: list[Served] = []
        self.forks: list[MemoryKey] = []
        self.variant = 1
        self.said = 0
        self.bob_alive = False
        self.compacted_at = 0.0

    def session(self, key: MemoryKey = ALICE) -> Any:
        return self.memory.session(key)

    def turn(self, key: MemoryKey = ALICE) -> ConversationTurn:
        self.said += 1
        text = f"{self.rng.choice(SENTENCES)} (note {self.said})"
        return ConversationTurn(
            user_message=text, assistant_response=f"Noted {self.said}.", ts=self.clock.now()
        )

    def record(self, key: MemoryKey = ALICE) -> None:
        session = self.session(key)
        while True:  # a summary may land meanwhile (the planner cannot tell): read again until none did
            state = session.snapshot_state()
            context = session.get_llm_context()
            queried = session.get_llm_context(query=QUERY)
            if session.snapshot_state() is state:
                break
        if state.started:
            (position,) = [r.position for r in self.memory.log.read(key) if r.seq == state.version]
            self.served.append(Served(key, state.version, position, self.clock.now(), context, queried))

    def step(self, gate: threading.Event, op: str) -> None:
        """One operation on the session (the system's own: `system_step`)."""
        session = self.session()
        if op in ("compact", "rotate", "fork", "bob", "erase_bob"):
            self.system_step(gate, op)
        elif op == "turn":
            session.add_turn(self.turn(), timeout=10)
        elif op == "turn_idem":
            turn, idem = self.turn(), f"idem-{self.said}"
            session.add_turn(turn, idempotency_key=idem, timeout=10)
            assert session.add_turn(turn, idempotency_key=idem, timeout=10) == 0  # the retry stores nothing
        elif op == "hold":
            gate.clear()  # summaries asked from now on land only at a release, after more turns
        elif op == "release":
            self.summarizer.failing = False
            gate.set()
            session.flush(timeout=30)
        elif op == "fail":
            self.summarizer.failing = True
        elif op == "passivate":  # the next read activates it from its snapshot and the log's tail
            gate.set()
            session.flush(timeout=30)
            self.memory.passivate(ALICE)
        elif op == "config":
            self.variant = (self.variant + 1) % 3
            session.clear(config=config_of(self.variant), reason="new settings", timeout=10)
        elif op == "items":
            n = self.said = self.said + 1
            session.add_items(
                [
                    {"role": "user", "content": f"{self.rng.choice(SENTENCES)} (item {n})"},
                    {"role": "assistant", "content": f"Item {n} noted."},
                ],
                timeout=10,
            )
        elif op == "pop":
            session.pop_item(timeout=10)
        elif op == "restore":
            exported = session.to_dict()
            session.restore(exported, origin="the planner's checkpoint", timeout=10)
        elif op == "adopt":
            moved = [self.turn(SOURCE) for _ in range(2)]
            session.adopt(SOURCE, 2, moved, idempotency_key=f"adopt-{self.said}", timeout=10)

    def system_step(self, gate: threading.Event, op: str) -> None:
        """Retention, key rotation, a fork, another user's writes and erasure."""
        if op == "compact":
            gate.set()
            self.session().flush(timeout=30)
            self.memory.sweep_retention(policies=RetentionPolicies(default=RetentionPolicy(max_turns=2)))
            self.compacted_at = self.clock.now()  # what was served before may be gone from the log
        elif op == "rotate":  # the master key with the writers stopped (README), then a new data key
            gate.set()
            self.memory.close()
            rotate_master_file(self.store.master, DirKeyStore(self.store.keys))
            self.memory = self.reopen()
            self.memory.log.keyring.new_data_key("acme", "alice")  # type: ignore[attr-defined]
        elif op == "fork":
            served = [s for s in self.served if s.key == ALICE and s.at > self.compacted_at]
            if served:
                at = datetime.fromtimestamp(self.rng.choice(served).at, UTC)
                fork = MemoryKey("acme", "alice", f"fork-{len(self.forks)}")
                self.memory.fork(ALICE, to=fork, at=at)
                self.forks.append(fork)
                self.record(fork)
        elif op == "bob":
            self.session(BOB).add_turn(self.turn(BOB), timeout=10)
            self.bob_alive = True
            self.record(BOB)
        elif op == "erase_bob" and self.bob_alive:
            self.memory.erase_user("acme", "bob")
            self.bob_alive = False


def run_program(store: Store, seed: int, steps: int) -> tuple[list[Served], list[MemoryKey]]:
    rng = random.Random(seed)
    clock = ManualClock(START)
    summarizer = GatedSummarizer()

    def reopen() -> MemorySystem:
        return connect(
            store.server.url,
            config=config_of(1),
            summarizer=summarizer,
            clock=clock,
            snapshot_every=3,
            keys=store.settings(),
        )

    program = Program(reopen, clock, store, rng, summarizer)
    try:
        for op in program_ops(rng, steps):
            program.step(summarizer.gate, op)
            program.record()
            clock.advance(rng.choice([0.0, 0.0, 1.0, 2.5]))  # two events may share a time
    finally:
        summarizer.gate.set()
        program.memory.close()
    return program.served, program.forks


def cli(capsys: pytest.CaptureFixture[str], store: Store, *argv: str, offline: bool = False) -> Any:
    capsys.readouterr()
    code = main([*([] if offline else store.cli()), *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def page_contexts(data: dict[str, Any]) -> dict[int, list[str]]:
    """Each event's context as the page rebuilds it (by log position): its lines of text."""
    out: dict[int, list[str]] = {}
    chunks: list[int] = []
    for index, (event, delta) in enumerate(zip(data["events"], data["context"], strict=True)):
        if str(index) in data["whole"]:
            chunks = data["whole"][str(index)]
        elif delta is not None:
            rebuilt: list[int] = []
            for op in delta:
                rebuilt.extend(chunks[op[0] : op[1]] if isinstance(op, list) else [op])
            chunks = rebuilt
        out[event[0]] = [data["lines"][line] for chunk in chunks for line in data["chunks"][chunk]]
    return out


def audit(store: Store, served: list[Served], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Every recorded point, rebuilt by every auditor's tool, byte for byte."""
    with JetStreamBackend.connect(store.server.url, keys=store.settings(), read_only=True) as backend:
        records = {key: backend.log.read(key) for key in {s.key for s in served}}
    dump = tmp_path / "acme.jsonl"
    capsys.readouterr()
    assert main([*store.cli(), "export", "--tenant", "acme", "-o", str(dump)]) == 0
    pages = {key: page_contexts(page_data(found, key)) for key, found in records.items()}
    forked = False
    for point in served:
        found = records[point.key]
        position = point.position
        if not any(r.position == position and r.seq == point.seq for r in found):
            gone(store, point, found, capsys, fork=not forked)  # compacted away, or erased: said so
            forked = True
            continue
        where = f"{point.key} seq {point.seq} at {point.at}"
        state, _ = replay_session(found, point.key, until_position=position)
        assert canonical(replayed_context(state)) == canonical(point.context), where
        assert canonical(replayed_context(state, query=QUERY)) == canonical(point.queried), where
        composite = point.key.composite()
        by_position = cli(capsys, store, "replay", composite, "--position", str(position), "--json")
        assert canonical(by_position["context"]) == canonical(point.context), where
        asked = cli(
            capsys, store, "replay", composite, "--position", str(position), "--query", QUERY, "--json"
        )
        assert canonical(asked["context"]) == canonical(point.queried), where
        offline = cli(
            capsys,
            store,
            "replay",
            composite,
            "--from-file",
            str(dump),
            "--position",
            str(position),
            "--json",
            offline=True,
        )
        assert canonical(offline["context"]) == canonical(point.context), where
        by_time = cli(capsys, store, "replay", composite, "--time", repr(point.at), "--json")
        if by_time["position"] == position:
            assert canonical(by_time["context"]) == canonical(point.context), where
        else:  # later events share the time: the replay names them, and the position tells them apart
            assert by_time["same_time"], where
            assert by_time["position"] > position, where
            assert min(by_time["same_time"]) > position or position in by_time["same_time"], where
        assert pages[point.key][position] == readable_lines(point.context), where


def gone(
    store: Store, point: Served, found: list[Any], capsys: pytest.CaptureFixture[str], *, fork: bool
) -> None:
    """A point the log no longer holds: replay (and with `fork`, a fork of it) names why
    (retention's compaction, an erasure) and shows no context."""
    capsys.readouterr()
    argv = ["replay", point.key.composite(), "--position", str(point.position), "--json"]
    assert main([*store.cli(), *argv]) == 3, point
    out, err = capsys.readouterr()
    assert out == ""
    if point.key == BOB:
        assert "was erased" in err, err
    else:
        assert "retention compacted" in err, err
        assert f"position {found[0].position}" in err, err
        if not fork:
            return
        to = f"acme:alice:from-{point.position}"
        assert main(
            [*store.cli(), "fork", point.key.composite(), "--to", to, "--position", str(point.position)]
        )
        assert "retention compacted" in capsys.readouterr().err  # a fork of it says so too


@pytest.mark.parametrize("seed", [1, 2])
def test_every_served_context_is_rebuilt_by_every_auditor_tool(
    store: Store, seed: int, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    served, _ = run_program(store, seed, steps=8)
    assert len(served) >= 20
    assert any(point.queried != point.context for point in served)  # recall served something
    audit(store, served, capsys, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 11))
def test_every_served_context_is_rebuilt_by_every_auditor_tool_long(
    store: Store, seed: int, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    served, _ = run_program(store, seed, steps=60)
    audit(store, served, capsys, tmp_path)


def test_a_time_as_inspect_shows_it_covers_the_events_shown_at_it(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """Event times are finer than the milliseconds `inspect` shows: the state as of a time read
    there (replay --time, fork --time, inspect --until) holds the events shown at it, and epoch
    seconds stay exact."""
    clock = ManualClock(START + 0.1234567)
    with connect(store.server.url, config=config_of(0), clock=clock, keys=store.settings()) as memory:
        for n in range(3):
            memory.session(ALICE).add_turn(
                ConversationTurn(user_message=f"turn {n}", assistant_response="ok")
            )
            clock.advance(1.0)
    rows = cli(capsys, store, "inspect", ALICE.composite(), "--json")
    second = [row for row in rows if row["type"] == "turn.added"][1]
    (shown,) = [
        line
        for line in capsys_text(capsys, store, "inspect", ALICE.composite())
        if line.startswith(str(second["position"]) + " ")
    ]
    when = datetime.fromtimestamp(second["at"], UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    assert when.replace("T", " ")[:-1] in shown  # the time as inspect shows it
    replayed = cli(capsys, store, "replay", ALICE.composite(), "--time", when, "--json")
    assert (replayed["seq"], replayed["position"]) == (second["seq"], second["position"])
    assert replayed["same_time"] == [second["position"]]
    exact = cli(capsys, store, "replay", ALICE.composite(), "--time", repr(second["at"]), "--json")
    assert exact["position"] == second["position"]
    before = cli(capsys, store, "replay", ALICE.composite(), "--time", repr(second["at"] - 1e-6), "--json")
    assert before["position"] < second["position"]
    until = cli(capsys, store, "inspect", ALICE.composite(), "--until", when, "--json")
    assert until[-1]["position"] == second["position"]
    forked = cli(
        capsys, store, "fork", ALICE.composite(), "--to", "acme:alice:then", "--time", when, "--json"
    )
    assert forked["forked_at"] == second["position"]


def capsys_text(capsys: pytest.CaptureFixture[str], store: Store, *argv: str) -> list[str]:
    capsys.readouterr()
    assert main([*store.cli(), *argv]) == 0
    return capsys.readouterr().out.splitlines()
