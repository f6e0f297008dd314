"""Turns from outside: a wrong type is `InvalidTurn` naming the field, a turn too large for the server is
refused before anything is sent, and a full store is named as such and heals without a restart.

Every entry point that takes a turn (the blocking and asyncio handles, the
PenguiFlow drop-in, the service API) refuses the same inputs with the same
error, never a bare `TypeError` from deep inside the encoder.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from penguiflow.planner import memory as pf
from runtime_helpers import WAIT, turn

import convmem
import convmem.penguiflow
from convmem.actors import MemorySystem
from convmem.adapters import (
    EmbeddedNatsServer,
    InMemoryEventLog,
    JetStreamEventLog,
    MemoryService,
    RemoteMemory,
)
from convmem.adapters.frontends.integrations.agents import ConvmemSession
from convmem.errors import InvalidTurn, LogUnavailable, StoreFull
from convmem.events import (
    ConversationTurn,
    EntityMention,
    MemoryKey,
    MessageItem,
    ShortTermMemoryConfig,
    TrajectoryDigest,
    TurnAdded,
    decode_event,
    encode_event,
)
from convmem.events._checks import as_stored

KEY = MemoryKey("acme", "alice", "limits")
TRUNCATION = ShortTermMemoryConfig(strategy="truncation")

# Malformed turns ----------------------------------------------------------------------------

BAD_TURNS: list[tuple[dict[str, Any], str]] = [
    ({"user_message": 5}, "user_message"),
    ({"user_message": None}, "user_message"),
    ({"user_message": b"x"}, "user_message"),
    ({"assistant_response": 1.5}, "assistant_response"),
    ({"artifacts_shown": {"chart": object()}}, "artifacts_shown.chart"),
    ({"artifacts_shown": {"rows": [{1, 2}]}}, "artifacts_shown.rows[0]"),
    ({"artifacts_shown": {"blob": b"\x00\x01"}}, "artifacts_shown.blob"),
    ({"artifacts_shown": {1: "one"}}, "artifacts_shown"),
    ({"artifacts_shown": {"n": 2**70}}, "artifacts_shown.n"),
    ({"artifacts_shown": {"n": float("nan")}}, "artifacts_shown.n"),
    ({"artifacts_shown": {"rows": [1.0, float("inf")]}}, "artifacts_shown.rows[1]"),
    ({"artifacts_shown": {"rows": {"low": -float("inf")}}}, "artifacts_shown.rows.low"),
    ({"artifacts_shown": "a chart"}, "artifacts_shown"),
    ({"artifacts_hidden_refs": "ref-1"}, "artifacts_hidden_refs"),
    ({"artifacts_hidden_refs": [1]}, "artifacts_hidden_refs[0]"),
    ({"ts": "yesterday"}, "ts"),
    ({"ts": True}, "ts"),
    ({"items": None}, "items"),
    ({"items": [{"role": "user", "content": "hi"}]}, "items[0]"),
    ({"entities": ["Alice"]}, "entities[0]"),
    ({"trajectory_digest": {"tools_invoked": ["search"]}}, "trajectory_digest"),
    ({"source": "planner"}, "source"),
]


def _deep(levels: int) -> object:
    value: object = "leaf"
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(("fields", "field"), BAD_TURNS, ids=[f for _, f in BAD_TURNS])
def test_a_turn_of_a_wrong_type_is_refused_naming_its_field(fields: dict[str, Any], field: str) -> None:
    """Building a turn with a value of the wrong type raises InvalidTurn naming the field, never TypeError."""
    values = {"user_message": "hi", "assistant_response": "hello", **fields}
    with pytest.raises(InvalidTurn) as raised:
        ConversationTurn(**values)
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: TrajectoryDigest(tools_invoked="search"), "trajectory_digest.tools_invoked"),  # type: ignore[arg-type]
        (lambda: TrajectoryDigest(observations_summary=3), "trajectory_digest.observations_summary"),  # type: ignore[arg-type]
        (lambda: MessageItem(kind="message", role="user", content=5), "content"),  # type: ignore[arg-type]
        (lambda: MessageItem(kind="bogus", content="x"), "kind"),  # type: ignore[arg-type]
        (lambda: MessageItem(kind="message", role="robot", content="x"), "role"),  # type: ignore[arg-type]
        (lambda: MessageItem(kind="function_call", call_id=5, name="f"), "call_id"),  # type: ignore[arg-type]
        (lambda: MessageItem(kind="other", raw="{"), "raw"),
        (lambda: MessageItem(kind="other", raw="[1]"), "raw"),
        (lambda: MessageItem(kind="other", raw="[" * 5_000), "raw"),
        (lambda: MessageItem.from_agents({"type": "x", "score": float("nan")}), "item.score"),
        (lambda: MessageItem.from_agents({"type": "x", "deep": _deep(100)}), "item.deep" + "[0]" * 63),
        (lambda: EntityMention(name=5), "entities.name"),  # type: ignore[arg-type]
        (lambda: EntityMention(name="Alice", attributes={"age": 30}), "entities.attributes.age"),  # type: ignore[dict-item]
        (
            lambda: ConversationTurn(
                user_message="a", assistant_response="b", artifacts_shown={"x": _deep(100)}
            ),
            "artifacts_shown.x" + "[0]" * 63,
        ),
    ],
)
def test_the_parts_of_a_turn_are_checked_by_type_too(build: Any, field: str) -> None:
    """Digests, items and entities of a wrong type, and artifacts nested past the limit, name their field."""
    with pytest.raises(InvalidTurn) as raised:
        build()
    assert raised.value.field == field


def test_a_number_json_cannot_carry_stored_by_an_older_version_still_decodes() -> None:
    """NaN is refused in a new turn, but an event stored before that rule replays (no turn lost)."""
    with pytest.raises(InvalidTurn):
        ConversationTurn(user_message="a", assistant_response="b", artifacts_shown={"x": float("nan")})
    with as_stored():  # how a version before the rule built and stored it
        old = ConversationTurn(
            user_message="a",
            assistant_response="b",
            artifacts_shown={"x": float("inf")},
            items=(MessageItem(kind="other", raw="[1]"),),
        )
        stored = encode_event(TurnAdded(turn=old, index=1, seq=2, at=1.0, event_id="e"))
    decoded = decode_event(stored)
    assert isinstance(decoded, TurnAdded)
    assert decoded.turn.artifacts_shown == {"x": float("inf")}
    with pytest.raises(InvalidTurn):  # the rule is back once the decode is over
        ConversationTurn(user_message="a", assistant_response="b", artifacts_shown={"x": float("inf")})


def test_lists_given_for_tuples_are_kept_as_the_tuples_a_replay_decodes() -> None:
    """A list of refs is accepted and stored as the tuple the log gives back, so live equals replay."""
    built = ConversationTurn(user_message="a", assistant_response="b", artifacts_hidden_refs=["r1"])  # type: ignore[arg-type]
    assert built.artifacts_hidden_refs == ("r1",)


@pytest.mark.parametrize("bad", ["a turn", {"user_message": "hi"}, None])
def test_every_handle_refuses_what_is_not_a_turn_as_invalid_turn(bad: object) -> None:
    """SessionHandle and AsyncSessionHandle refuse a non-turn with InvalidTurn before anything is stored."""
    log = InMemoryEventLog()
    with MemorySystem(TRUNCATION, log=log) as memory:
        with pytest.raises(InvalidTurn) as raised:
            memory.session(KEY).add_turn(bad, timeout=WAIT)  # type: ignore[arg-type]
        assert raised.value.field == "turn"

        async def from_asyncio() -> None:
            with pytest.raises(InvalidTurn):
                await memory.async_session(KEY).add_turn(bad)  # type: ignore[arg-type]

        asyncio.run(from_asyncio())
        assert log.last_seq(KEY) == 0


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"user_message": 5}, "user_message"),
        ({"artifacts_shown": None}, "artifacts_shown"),
        ({"artifacts_hidden_refs": None}, "artifacts_hidden_refs"),
        ({"artifacts_shown": {"chart": object()}}, "artifacts_shown.chart"),
    ],
)
def test_the_penguiflow_drop_in_refuses_a_malformed_penguiflow_turn(
    fields: dict[str, Any], field: str
) -> None:
    """PenguiFlow's own turn type with a wrong field is InvalidTurn through the drop-in, not TypeError."""
    system = MemorySystem(log=InMemoryEventLog())
    convmem.penguiflow.configure(system=system)
    try:
        memory = convmem.penguiflow.DefaultShortTermMemory(
            config=pf.ShortTermMemoryConfig(strategy="truncation")
        )
        bad = pf.ConversationTurn(user_message="hi", assistant_response="hello")
        for name, value in fields.items():
            object.__setattr__(bad, name, value)

        async def add() -> None:
            await memory.add_turn(bad)

        with pytest.raises(InvalidTurn) as raised:
            asyncio.run(add())
        assert raised.value.field == field
    finally:
        convmem.penguiflow.configure()
        system.close()


@pytest.mark.parametrize(
    ("items", "field"),
    [
        ("a message", "items"),
        ([5], "items[0]"),
        ([{"role": "user", "content": object()}], "items[0]"),
        ([{"type": "function_call", "call_id": 5, "name": "lookup"}], "items[0].call_id"),
        ([{"role": "user", "content": "hi", "score": float("inf")}], "items[0].score"),
    ],
)
def test_the_agents_session_refuses_malformed_items_as_invalid_turn(items: Any, field: str) -> None:
    """ConvmemSession.add_items: not a list, not a mapping, not JSON, a bad call id: InvalidTurn naming it."""

    async def add() -> None:
        with MemorySystem(log=InMemoryEventLog()) as memory:
            session = ConvmemSession("chat", memory=memory, tenant_id="acme", user_id="alice")
            await session.add_items(items)

    with pytest.raises(InvalidTurn) as raised:
        asyncio.run(add())
    assert raised.value.field == field


# Sizes against the server's max_payload --------------------------------------------------------


@pytest.fixture
def small_payload_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    """A server whose max_payload is 64 KiB, so the limit is seen to follow the server's INFO."""
    server = EmbeddedNatsServer(tmp_path / "nats", extra_config="max_payload: 65536").start()
    try:
        yield server
    finally:
        server.stop()


def test_a_turn_over_the_servers_max_payload_is_invalid_before_anything_is_sent(
    nats_server: EmbeddedNatsServer,
) -> None:
    """A million 'é' (2 MB encoded) or a 5 MB artifact is InvalidTurn, not LogUnavailable; nothing stored."""
    with convmem.connect(nats_server.url, config=TRUNCATION) as memory:
        session = memory.session(KEY)
        session.add_turn(turn("before"), timeout=WAIT)
        log = memory.log
        assert isinstance(log, JetStreamEventLog)
        stored = log.last_seq(KEY)
        for big in (
            ConversationTurn(user_message="é" * 1_000_000, assistant_response="ok"),
            ConversationTurn(
                user_message="chart", assistant_response="ok", artifacts_shown={"png": "x" * 5_000_000}
            ),
        ):
            with pytest.raises(InvalidTurn) as raised:
                session.add_turn(big, timeout=WAIT)
            assert raised.value.field == "turn"
            assert "max_payload" in str(raised.value)
            assert "nothing was stored" in str(raised.value)
            assert not isinstance(raised.value, LogUnavailable)
        assert log.last_seq(KEY) == stored
        session.add_turn(turn("after"), timeout=WAIT)

        async def from_asyncio() -> None:
            with pytest.raises(InvalidTurn):
                await memory.async_session(KEY).add_turn(
                    ConversationTurn(user_message="é" * 1_000_000, assistant_response="ok")
                )

        asyncio.run(from_asyncio())
        assert [t["user"] for t in session.get_llm_context()["conversation_memory"]["recent_turns"]][-2:] == [
            "before",
            "after",
        ]


def test_the_size_limit_is_the_connected_servers_max_payload(
    small_payload_server: EmbeddedNatsServer,
) -> None:
    """On a server with a 64 KiB max_payload a 100 KB turn is refused and a 30 KB one stored."""
    with convmem.connect(small_payload_server.url, config=TRUNCATION) as memory:
        session = memory.session(KEY)
        with pytest.raises(InvalidTurn, match="65,536"):
            session.add_turn(
                ConversationTurn(user_message="x" * 100_000, assistant_response="ok"), timeout=WAIT
            )
        assert (
            session.add_turn(
                ConversationTurn(user_message="x" * 30_000, assistant_response="ok"), timeout=WAIT
            )
            == 1
        )


def test_the_service_refuses_a_turn_too_large_to_send_as_invalid_turn(
    small_payload_server: EmbeddedNatsServer,
) -> None:
    """Through `convmem serve`'s API a turn over max_payload is InvalidTurn on the client, nothing sent."""
    url = small_payload_server.url
    with (
        convmem.connect(url, config=TRUNCATION) as memory,
        MemoryService(memory, url, api_prefix="limits.api"),
        RemoteMemory(url, api_prefix="limits.api", timeout=WAIT) as remote,
    ):
        session = remote.session(KEY)
        with pytest.raises(InvalidTurn) as raised:
            session.add_turn(ConversationTurn(user_message="x" * 100_000, assistant_response="ok"))
        assert raised.value.field == "turn"
        assert "max_payload" in str(raised.value)
        assert memory.log.last_seq(KEY) == 0
        assert session.add_turn(turn("small")) == 1


# A full store ---------------------------------------------------------------------------------


@pytest.fixture
def tiny_store(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    """A server whose JetStream may keep 2 MB on disk in all."""
    server = EmbeddedNatsServer(tmp_path / "nats", max_file_store=2_000_000).start()
    try:
        yield server
    finally:
        server.stop()


async def _admin(url: str, action: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        if action == "fill":
            await js.add_stream(name="FILLER", subjects=["filler.>"])
            for _ in range(1_000):
                try:
                    await js.publish("filler.x", b"z" * 8_000)
                except nats.js.errors.APIError:  # the server's own answer once full
                    return
            pytest.fail("the store never filled")
        else:
            await js.purge_stream("FILLER")
    finally:
        await nc.close()


def test_a_full_store_is_named_and_writes_resume_once_there_is_room(tiny_store: EmbeddedNatsServer) -> None:
    """A full store is StoreFull (not 'is nats-server up?'); after a purge writes resume with no restart."""
    with convmem.connect(tiny_store.url, config=TRUNCATION) as memory:
        session = memory.session(KEY)
        session.add_turn(turn("stored"), timeout=WAIT)
        asyncio.run(_admin(tiny_store.url, "fill"))
        for _ in range(2):  # the fast path and the full one
            with pytest.raises(StoreFull) as raised:
                session.add_turn(turn("refused"), timeout=WAIT)
            assert "store is full" in str(raised.value)
            assert "nats-server is up" not in str(raised.value)
            assert raised.value.err_code == 10023
        asyncio.run(_admin(tiny_store.url, "purge"))
        assert session.add_turn(turn("resumed"), timeout=WAIT) == 2
        users = [t["user"] for t in session.get_llm_context()["conversation_memory"]["recent_turns"]]
        assert users == ["stored", "resumed"]


def test_a_stream_at_its_max_bytes_is_a_full_store_too(nats_server: EmbeddedNatsServer) -> None:
    """A stream that discards new messages at max_bytes refuses with StoreFull; raising the limit heals it."""
    with convmem.connect(nats_server.url, config=TRUNCATION) as memory:
        session = memory.session(KEY)
        session.add_turn(turn("stored"), timeout=WAIT)
        log = memory.log
        assert isinstance(log, JetStreamEventLog)

        async def limit(max_bytes: int) -> None:
            nc = await nats.connect(nats_server.url)
            try:
                js = nc.jetstream()
                config = (await js.stream_info(log.stream)).config
                config.max_bytes = max_bytes
                config.discard = nats.js.api.DiscardPolicy.NEW
                await js.update_stream(config)
            finally:
                await nc.close()

        asyncio.run(limit(4_000))
        refused = None
        for n in range(100):
            try:
                session.add_turn(
                    ConversationTurn(user_message=f"{n}" * 500, assistant_response="ok"), timeout=WAIT
                )
            except StoreFull as exc:
                refused = exc
                break
        assert refused is not None
        assert "store is full" in str(refused)
        asyncio.run(limit(-1))
        session.add_turn(turn("resumed"), timeout=WAIT)
