"""The NATS service API and its clients, on real nats-server processes."""

from __future__ import annotations

import asyncio
import http.client
import inspect
import math
import re
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from runtime_helpers import WAIT, turn, wait_until

import convmem
from convmem.actors import MemorySystem
from convmem.adapters import (
    AsyncRemoteSession,
    EmbeddedNatsServer,
    InMemoryEventLog,
    InMemorySnapshotStore,
    InternalError,
    MalformedRequest,
    MemoryService,
    PermissionDenied,
    RemoteError,
    RemoteMemory,
    RemoteSession,
    ServiceUnavailable,
    UnknownOperation,
    UnsupportedVersion,
    session_subject,
)
from convmem.adapters.backends.jetstream._embedded import find_nats_server
from convmem.adapters.frontends.service._errors import exception_of
from convmem.adapters.frontends.service._inboxes import reply_inbox
from convmem.adapters.frontends.service._protocol import decode_reply
from convmem.adapters.frontends.service._remote import OnConnection, awaiting, blocking
from convmem.adapters.frontends.service._requests import SessionRequests
from convmem.errors import (
    ConvmemError,
    InvalidInput,
    InvalidKey,
    InvalidTurn,
    LogUnavailable,
    MemoryBudgetExceeded,
    OperationTimeout,
    SessionClosed,
)
from convmem.events import (
    AgentsMemoryConfig,
    ConversationMemoryConfig,
    ConversationTurn,
    EntityMention,
    Event,
    MemoryBudget,
    MemoryHealth,
    MemoryKey,
    MessageItem,
    ShortTermMemoryConfig,
    TrajectoryDigest,
    TurnAdded,
    decode_event,
)
from convmem.projections import (
    agent_items,
    buffer_messages,
    entity_messages,
    summary_messages,
    to_dict,
    window_messages,
)

CONFIG = ShortTermMemoryConfig(
    strategy="truncation",
    budget=MemoryBudget(full_zone_turns=3),
    agents=AgentsMemoryConfig(strategy="trimming", max_turns=3, keep_last_n_turns=2),
    memories=ConversationMemoryConfig(window_size=4),
)
VIEWS = {
    "agents": agent_items,
    "buffer": buffer_messages,
    "window": window_messages,
    "summary": summary_messages,
    "entity": entity_messages,
}
IDS = {"user_id": "u", "session_id": "s"}
TENANTS_CONF = Path(__file__).resolve().parent.parent / "docker" / "nats-tenants.conf"


def rich_turn(n: int) -> ConversationTurn:
    """A turn with a digest, a tool call and its result, and an entity."""
    return ConversationTurn(
        user_message=f"question {n} about Paris",
        assistant_response=f"answer {n}",
        trajectory_digest=TrajectoryDigest(tools_invoked=("search",), observations_summary=f"found {n}"),
        items=(
            MessageItem(kind="function_call", call_id=f"c{n}", name="search", arguments="{}"),
            MessageItem(kind="function_call_output", call_id=f"c{n}", output=f"result {n}"),
        ),
        entities=(EntityMention(name="Paris", kind="city", attributes={"visit": str(n)}),),
        ts=1000.0 + n,
    )


def stored_users(system: MemorySystem, key: MemoryKey) -> list[str]:
    """The user messages of every `TurnAdded` in the log of `key`."""
    events = [decode_event(record.data) for record in system.log.read(key)]
    return [e.turn.user_message for e in events if isinstance(e, TurnAdded)]


def raw_request(url: str, subject: str, payload: bytes) -> bytes:
    """A request from a plain nats-py client, as a program in another language would send it: its
    reply inbox is the requester's own (``_INBOX_<tenant token>``, or ``_OPS_INBOX`` for an operator)."""
    inbox = reply_inbox(subject.split(".v1.", maxsplit=1)[0].removesuffix(".ops"), subject)

    async def run() -> bytes:
        nc = await nats.connect(url, inbox_prefix=inbox)
        try:
            return (await nc.request(subject, payload, timeout=WAIT)).data
        finally:
            await nc.close()

    return asyncio.run(run())


@pytest.fixture
def api_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}.api"


@pytest.fixture
def url(nats_server_shared: EmbeddedNatsServer) -> str:
    return nats_server_shared.url


@pytest.fixture
def system(url: str, jetstream_names: Any) -> Iterator[MemorySystem]:
    memory = convmem.connect(
        url,
        config=CONFIG,
        stream=jetstream_names.stream,
        prefix=jetstream_names.prefix,
        bucket=jetstream_names.bucket,
        snapshot_every=1,
    )
    try:
        yield memory
    finally:
        memory.close()


@pytest.fixture
def service(system: MemorySystem, url: str, api_prefix: str) -> Iterator[MemoryService]:
    with MemoryService(system, url, api_prefix=api_prefix) as running:
        yield running


@pytest.fixture
def remote(url: str, api_prefix: str) -> Iterator[RemoteMemory]:
    with RemoteMemory(url, api_prefix=api_prefix, timeout=WAIT) as client:
        yield client


# Every operation -----------------------------------------------------------------------


@pytest.mark.usefixtures("service")
@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_every_operation_answers_what_the_local_handle_answers(
    system: MemorySystem, url: str, api_prefix: str, encoding: Any
) -> None:
    """A RemoteSession and a local SessionHandle given the same calls return the same results."""
    with RemoteMemory(url, api_prefix=api_prefix, timeout=WAIT, encoding=encoding) as remote:
        far = remote.session(MemoryKey("acme", "alice@example.com", "far.1"))
        near = system.session(MemoryKey("acme", "alice@example.com", "near.1"))

        def same(call: Any) -> Any:
            got, expected = call(far), call(near)
            assert got == expected
            return got

        def same_reads() -> None:
            same(lambda h: h.get_llm_context())
            same(lambda h: h.estimate_tokens())
            same(lambda h: h.health)
            same(lambda h: h.to_dict())
            for name, view in VIEWS.items():
                assert far.view(name) == view(near.snapshot_state())
            # and the remote key read in process gives what the service gave
            assert far.get_llm_context() == system.session(far.key).get_llm_context()

        same_reads()  # nothing stored yet: both read the configuration the session will start with
        assert [same(lambda h, n=n: h.add_turn(rich_turn(n))) for n in range(5)] == [1, 2, 3, 4, 5]
        same_reads()
        items = [
            {"role": "user", "content": "and Lyon?"},
            {"type": "function_call", "call_id": "x1", "name": "search", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "x1", "output": "sunny"},
        ]
        same(lambda h: h.add_items(items))
        assert same(lambda h: h.pop_item()) == items[-1]
        same_reads()
        exported = far.to_dict()
        same(lambda h: h.clear())
        assert far.get_llm_context() == {"conversation_memory": {"recent_turns": []}}
        same(lambda h: h.from_dict(exported))
        same(lambda h: h.flush())
        same_reads()
        assert far.get_llm_context()["conversation_memory"]["recent_turns"]


@pytest.mark.usefixtures("service")
def test_async_remote_session_offers_the_same_operations(
    system: MemorySystem, url: str, api_prefix: str
) -> None:
    """AsyncRemoteSession, on its own connection or on the caller's, matches the local handle."""
    key, shared_key = MemoryKey("acme", "bob", "async"), MemoryKey("acme", "bob", "shared-client")

    async def scenario() -> dict[str, Any]:
        async with AsyncRemoteSession(url, key, api_prefix=api_prefix, timeout=WAIT) as session:
            assert await session.add_turn(rich_turn(1)) == 1
            await session.add_items([{"role": "user", "content": "more"}])
            assert await session.pop_item() == {"role": "user", "content": "more"}
            await session.flush()
            exported = await session.to_dict()
            await session.clear()
            await session.restore(exported)
            out = {
                "context": await session.get_llm_context(),
                "tokens": await session.estimate_tokens(),
                "health": await session.health(),
                "export": await session.to_dict(),
                "window": await session.view("window"),
            }
        nc = await nats.connect(url)
        try:
            shared = AsyncRemoteSession(nc, shared_key, api_prefix=api_prefix, timeout=WAIT)
            out["shared_index"] = await shared.add_turn(rich_turn(2))
            await shared.aclose()  # leaves the caller's connection open
            assert nc.is_connected
        finally:
            await nc.close()
        return out

    out = asyncio.run(scenario())
    local = system.session(key)
    assert out["context"] == local.get_llm_context()
    assert out["tokens"] == local.estimate_tokens()
    assert out["health"] is local.health is MemoryHealth.HEALTHY
    assert out["export"] == local.to_dict()
    assert out["window"] == window_messages(local.snapshot_state())
    assert out["shared_index"] == 1
    assert stored_users(system, shared_key) == ["question 2 about Paris"]


def _operations(handle: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(getattr(handle, name))
        for name in dir(handle)
        if not name.startswith("_") and inspect.isfunction(getattr(handle, name))
    }


def test_the_blocking_handle_is_the_async_operations_run_on_the_connection() -> None:
    """RemoteSession's methods are SessionRequests' coroutines made blocking: same names, same signatures."""
    operations = _operations(SessionRequests)
    blocking = _operations(RemoteSession)
    assert set(blocking) - {"close"} == set(operations) - {"health", "restore"} | {"from_dict"}
    for name, signature in blocking.items():
        if name != "close":
            assert signature == operations["restore" if name == "from_dict" else name], name
    assert isinstance(RemoteSession.health, property)
    assert set(operations) <= set(_operations(AsyncRemoteSession))


class _Probe(OnConnection):
    async def echo(self, value: int, timeout: float | None = None) -> tuple[int, float | None]:
        return value, timeout


class _ProbeHandle:
    def __init__(self, remote: RemoteMemory) -> None:
        self.on_connection = _Probe(remote, MemoryKey("acme", "alice", "probe"), None)

    echo = blocking(_Probe.echo)
    aecho = awaiting(_Probe.echo)


def test_a_derived_method_finds_its_timeout_positionally_or_by_name(remote: RemoteMemory) -> None:
    """`blocking` and `awaiting` read the call's own timeout (a bad one is refused before the work runs)."""
    probe = _ProbeHandle(remote)
    assert probe.echo(1) == (1, None)
    assert probe.echo(2, 5) == (2, 5)
    assert asyncio.run(probe.aecho(3, timeout=5)) == (3, 5)
    for call in (lambda: probe.echo(1, 0), lambda: probe.echo(1, timeout=-1)):
        with pytest.raises(InvalidInput, match="timeout"):
            call()
    with pytest.raises(InvalidInput, match="timeout"):
        asyncio.run(probe.aecho(3, 0))


def test_a_closed_connection_refuses_its_sessions(url: str, api_prefix: str) -> None:
    """After RemoteMemory.close, a session's blocking and awaited calls raise SessionClosed."""
    remote = RemoteMemory(url, api_prefix=api_prefix, timeout=WAIT)
    session = remote.session(MemoryKey("acme", "alice", "closed"))
    remote.close()
    with pytest.raises(SessionClosed, match="this RemoteMemory is closed"):
        session.get_llm_context()
    with pytest.raises(SessionClosed, match="this RemoteMemory is closed"):
        asyncio.run(remote.acall(session_subject(api_prefix, "acme", "context"), {}))


@pytest.mark.usefixtures("service")
def test_an_async_remote_session_forks(system: MemorySystem, url: str, api_prefix: str) -> None:
    """Every operation is written once, so the asyncio handle forks as the blocking one does."""
    source, fork = MemoryKey("acme", "bob", "fork-source"), MemoryKey("acme", "bob", "fork-copy")

    async def scenario() -> dict[str, int]:
        async with AsyncRemoteSession(url, source, api_prefix=api_prefix, timeout=WAIT) as session:
            await session.add_turn(rich_turn(1))
            return await session.fork(fork.session_id)

    assert asyncio.run(scenario())["events"] >= 1
    assert system.session(fork).get_llm_context() == system.session(source).get_llm_context()


# Errors ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("service")
def test_a_bad_turn_comes_back_as_invalid_turn_with_its_field(remote: RemoteMemory, api_prefix: str) -> None:
    """The service raises, field for field, the InvalidTurn that building the turn in process raises."""
    subject = session_subject(api_prefix, "acme", "add_turn")
    ids = {"user_id": "u", "session_id": "s"}
    with pytest.raises(InvalidTurn) as local:
        ConversationTurn(user_message="a\x00b", assistant_response="ok")
    with pytest.raises(InvalidTurn) as far:
        remote.call(subject, {**ids, "turn": {"user_message": "a\x00b", "assistant_response": "ok"}})
    assert (far.value.field, far.value.problem, str(far.value)) == (
        local.value.field,
        local.value.problem,
        str(local.value),
    )
    unpaired = {"kind": "function_call", "call_id": "c1", "name": "search"}
    with pytest.raises(InvalidTurn) as far:
        remote.call(
            subject, {**ids, "turn": {"user_message": "q", "assistant_response": "a", "items": [unpaired]}}
        )
    assert far.value.field == "items[0].call_id"
    with pytest.raises(InvalidTurn) as far:
        remote.call(subject, {**ids, "turn": {"user_message": "q", "assistant_response": "a", "ts": "noon"}})
    assert far.value.field == "turn.ts"


@pytest.mark.usefixtures("service")
@pytest.mark.parametrize(
    ("subject_tail", "payload", "error_type", "field"),
    [
        ("v1.acme.context", b"{not json", MalformedRequest, "payload"),
        ("v1.acme.context", b"\x81\xc1", MalformedRequest, "payload"),
        ("v1.acme.context", b"[1, 2]", MalformedRequest, "payload"),
        ("v1.acme.context", b'{"user_id": 5, "session_id": "s"}', MalformedRequest, "user_id"),
        ("v1.acme.views", b'{"user_id": "u", "session_id": "s", "view": "nope"}', MalformedRequest, "view"),
        ("v1.acme.add_turn", b'{"user_id": "u", "session_id": "s"}', InvalidTurn, "turn"),
        ("v1.acme.flush", b'{"user_id": "u", "session_id": "s", "timeout": -1}', MalformedRequest, "timeout"),
        ("v1.acme.frobnicate", b'{"user_id": "u", "session_id": "s"}', UnknownOperation, "op"),
        ("v1.acme", b"{}", UnknownOperation, "op"),
        ("ops.v1.restart", b"{}", UnknownOperation, "op"),
        ("v1.acme.context", b'{"v": 2, "user_id": "u", "session_id": "s"}', UnsupportedVersion, "v"),
        ("v1.acme.context", b'{"user_id": "", "session_id": "s"}', InvalidKey, "user_id"),
        ("v1.acme.context", b'{"user_id": "u"}', InvalidKey, "session_id"),
        ("v1.a=zz.context", b'{"user_id": "u", "session_id": "s"}', InvalidKey, "tenant_id"),
        (
            "v1.acme.fork",
            msgspec.msgpack.encode({**IDS, "to_session_id": "f", "at_time": 1e20}),
            MalformedRequest,
            "at_time",
        ),
        (
            "v1.acme.fork",
            msgspec.msgpack.encode({**IDS, "to_session_id": "f", "at_time": math.nan}),
            MalformedRequest,
            "at_time",
        ),
        (
            "v1.acme.fork",
            b'{"user_id": "u", "session_id": "s", "to_session_id": "f", "at_time": 1e999}',
            MalformedRequest,
            "at_time",
        ),
        (
            "v1.acme.add_turn",
            b'{"user_id": "u", "session_id": "s", "turn": {"user_message": "\xff"}}',
            InvalidTurn,
            "turn.user_message",
        ),
        ("v1.acme.context", b'{"user_id": "u", "session_id": "s", "note": "\xfe"}', MalformedRequest, "note"),
        (
            "v1.acme.add_items",
            b'{"user_id": "u", "session_id": "s", "items": [{"x": ' + b"[" * 1_000 + b"]" * 1_000 + b"}]}",
            InvalidTurn,
            "items[0].x[0][0][0]...",
        ),
        (
            "v1.acme.add_items",
            msgspec.msgpack.encode({**IDS, "items": [{"role": "user", "content": "x", "n": math.inf}]}),
            InvalidTurn,
            "items[0].n",
        ),
        (
            "v1.acme.add_turn",
            msgspec.msgpack.encode(
                {
                    **IDS,
                    "turn": {
                        "user_message": "q",
                        "assistant_response": "a",
                        "artifacts_shown": {"x": math.nan},
                    },
                }
            ),
            InvalidTurn,
            "artifacts_shown.x",
        ),
    ],
)
def test_bad_requests_come_back_as_structured_errors(
    url: str, api_prefix: str, subject_tail: str, payload: bytes, error_type: type[InvalidInput], field: str
) -> None:
    """Malformed payloads, unknown ops, bad versions and bad keys are answered, in the request's encoding."""
    data = raw_request(url, f"{api_prefix}.{subject_tail}", payload)
    assert (data[0] >= 0x80) == (payload[0] >= 0x80)  # msgpack in, msgpack out
    reply = decode_reply(data)
    assert reply.ok is False
    assert reply.error is not None
    assert reply.error.type == error_type.__name__
    error = exception_of(reply.error)
    assert type(error) is error_type
    assert isinstance(error, InvalidInput)
    assert error.field == field


@pytest.mark.usefixtures("service")
def test_a_budget_overflow_comes_back_with_its_tokens_and_budget(
    system: MemorySystem, remote: RemoteMemory
) -> None:
    """The "error" overflow policy raises MemoryBudgetExceeded remotely with the local numbers."""
    strict = ShortTermMemoryConfig(
        strategy="truncation",
        budget=MemoryBudget(total_max_tokens=60, summary_max_tokens=10, overflow_policy="error"),
    )
    near, far_key = MemoryKey("acme", "u", "near"), MemoryKey("acme", "u", "far")
    system.session(far_key, config=strict)  # the service starts the session with it
    big = ConversationTurn(user_message="word " * 200, assistant_response="ok")
    with pytest.raises(MemoryBudgetExceeded) as local:
        system.session(near, config=strict).add_turn(big)
    with pytest.raises(MemoryBudgetExceeded) as far:
        remote.session(far_key).add_turn(big)
    assert (far.value.tokens, far.value.budget, str(far.value)) == (
        local.value.tokens,
        local.value.budget,
        str(local.value),
    )
    assert stored_users(system, far_key) == []


@pytest.mark.usefixtures("service")
def test_payloads_over_the_servers_limit_fail_with_a_reason(remote: RemoteMemory) -> None:
    """A request or a reply too big for NATS fails at once and says why, instead of timing out."""
    session = remote.session(MemoryKey("acme", "u", "big"))
    with pytest.raises(InvalidInput, match="max_payload"):
        session.add_turn(turn("x" * 600_000))  # with its answer, over 1 MB
    for n in range(3):
        session.add_turn(turn(f"{n}" * 400_000))
    with pytest.raises(RemoteError) as error:
        session.view("buffer")
    assert error.value.type == "ReplyTooLarge"
    assert "max_payload" in str(error.value)


class FlakyLog(InMemoryEventLog):
    """An in-memory log whose appends fail with `failure`, or wait for `gate` once armed."""

    def __init__(self) -> None:
        super().__init__()
        self.failure: Exception | None = None
        self.armed = False
        self.entered = threading.Event()
        self.gate = threading.Event()

    def append(self, key: MemoryKey, events: Sequence[Event], *, expected_seq: int) -> int:
        if self.failure is not None:
            raise self.failure
        if self.armed:
            self.entered.set()
            assert self.gate.wait(WAIT)
        return super().append(key, events, expected_seq=expected_seq)


@pytest.fixture
def flaky(url: str, api_prefix: str) -> Iterator[tuple[FlakyLog, MemoryService, RemoteMemory]]:
    log = FlakyLog()
    memory = MemorySystem(CONFIG, log=log, snapshots=InMemorySnapshotStore())
    service = MemoryService(memory, url, api_prefix=api_prefix).start()
    client = RemoteMemory(url, api_prefix=api_prefix, timeout=WAIT)
    try:
        yield log, service, client
    finally:
        log.gate.set()
        client.close()
        service.stop()
        memory.close()


def test_log_failures_come_back_structured_and_never_as_timeouts(
    flaky: tuple[FlakyLog, MemoryService, RemoteMemory],
) -> None:
    """An unavailable log, an internal failure and a slow write each come back as their own error."""
    log, _service, remote = flaky
    session = remote.session(MemoryKey("acme", "u", "s"))
    log.failure = LogUnavailable("the test's log is down; retry later")
    with pytest.raises(LogUnavailable, match="the test's log is down"):
        session.add_turn(turn("a"))
    log.failure = RuntimeError("secret internals")
    with pytest.raises(InternalError) as internal:
        session.add_turn(turn("b"))
    assert "secret internals" not in str(internal.value)
    log.failure, log.armed = None, True
    with pytest.raises(OperationTimeout) as slow:
        session.add_turn(turn("c"), timeout=2.0)  # the service gives up first, after 1.5s
    assert not isinstance(slow.value, ServiceUnavailable)
    log.gate.set()


def test_without_a_service_a_call_fails_at_once_as_service_unavailable(url: str) -> None:
    """No responder: ServiceUnavailable (an OperationTimeout) without waiting for the timeout."""
    with RemoteSession(url, MemoryKey("acme", "u", "s"), api_prefix="nobody.home", timeout=60) as session:
        with pytest.raises(ServiceUnavailable, match="no convmem service is subscribed"):
            session.get_llm_context()
        assert issubclass(ServiceUnavailable, OperationTimeout)


# Several services, stopping -------------------------------------------------------------


def test_two_services_see_each_others_writes_to_sessions_past_their_live_bound(
    url: str, jetstream_names: Any, api_prefix: str
) -> None:
    """A session in a service's idle cache is checked against the log before a read, as a live one is."""
    names = msgspec.structs.asdict(jetstream_names)
    systems = [convmem.connect(url, config=CONFIG, max_live_sessions=1, **names) for _ in range(2)]
    services = [MemoryService(s, url, api_prefix=api_prefix).start() for s in systems]
    try:
        with RemoteMemory(url, api_prefix=api_prefix, timeout=WAIT) as remote:
            sessions = [remote.session(MemoryKey("acme", "dave", f"s{n}")) for n in range(3)]
            for n in range(8):
                for session in sessions:
                    session.add_turn(turn(f"{session.key.session_id}-{n}"))
                for session in sessions:
                    recent = session.get_llm_context()["conversation_memory"]["recent_turns"]
                    assert recent[-1]["user"] == f"{session.key.session_id}-{n}"
            assert any(system.cached_sessions()[0] for system in systems)
    finally:
        for svc in services:
            svc.stop()
        for memory in systems:
            memory.close()


def test_two_services_in_one_queue_group_share_requests_and_lose_no_turn(
    url: str, jetstream_names: Any, api_prefix: str
) -> None:
    """Writes spread over two services land once each, and each read sees the writes before it."""
    names = msgspec.structs.asdict(jetstream_names)
    systems = [convmem.connect(url, config=CONFIG, **names) for _ in range(2)]
    services = [MemoryService(s, url, api_prefix=api_prefix).start() for s in systems]
    try:
        with RemoteMemory(url, api_prefix=api_prefix, timeout=WAIT) as remote:
            session = remote.session(MemoryKey("acme", "carol", "busy"))
            for n in range(12):
                session.add_turn(turn(f"seq-{n}"))
                recent = session.get_llm_context()["conversation_memory"]["recent_turns"]
                assert recent[-1]["user"] == f"seq-{n}"

            def writer(w: int) -> None:
                for n in range(10):
                    session.add_turn(turn(f"w{w}-{n}"), idempotency_key=f"w{w}-{n}")

            threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT)
            expected = [f"seq-{n}" for n in range(12)] + [f"w{w}-{n}" for w in range(4) for n in range(10)]
            assert sorted(stored_users(systems[0], session.key)) == sorted(expected)
            assert session.to_dict() == to_dict(systems[1].session(session.key).refresh())
            for svc in services:
                assert svc.metrics()["service"]["by_op"].get("add_turn", 0) > 0
    finally:
        for svc in services:
            svc.stop()
        for memory in systems:
            memory.close()


def test_stop_answers_the_requests_in_flight(flaky: tuple[FlakyLog, MemoryService, RemoteMemory]) -> None:
    """stop() waits for a request already received, answers it, and later calls find no service."""
    log, service, remote = flaky
    session = remote.session(MemoryKey("acme", "u", "stopping"))
    log.armed = True
    answers: list[int] = []
    writer = threading.Thread(target=lambda: answers.append(session.add_turn(turn("kept"))))
    writer.start()
    assert log.entered.wait(WAIT)
    stoppers = [threading.Thread(target=service.stop) for _ in range(2)]  # stop() twice, at once
    for stopper in stoppers:
        stopper.start()
    wait_until(lambda: service.stopping, message="stop() did not begin")
    assert all(s.is_alive() for s in stoppers)  # the write is still owed an answer
    assert service.in_flight == 1
    log.gate.set()
    for thread in (*stoppers, writer):
        thread.join(WAIT)
    assert answers == [1]
    assert service.in_flight == 0
    assert not service.running
    with pytest.raises(ServiceUnavailable):
        session.get_llm_context()
    service.stop()  # idempotent


def test_run_forever_serves_until_its_event_is_set(system: MemorySystem, url: str, api_prefix: str) -> None:
    """The helper `convmem serve` uses: start, serve, and stop when told to."""
    service = MemoryService(system, url, api_prefix=api_prefix)
    stop = threading.Event()
    runner = threading.Thread(target=service.run_forever, args=(stop,))
    runner.start()
    try:
        wait_until(lambda: service.running, message="the service did not start")
        with RemoteSession(url, MemoryKey("acme", "u", "s"), api_prefix=api_prefix) as session:
            assert session.add_turn(turn("served")) == 1
    finally:
        stop.set()
        runner.join(WAIT)
    assert not runner.is_alive()
    assert not service.running


# Operators, erasure ---------------------------------------------------------------------


def test_operator_subjects_answer_health_and_metrics(
    service: MemoryService, system: MemorySystem, remote: RemoteMemory
) -> None:
    """ops.v1.health and ops.v1.metrics report the log, the counters and the append latency."""
    session = remote.session(MemoryKey("acme", "u", "s"))
    for n in range(3):
        session.add_turn(turn(f"t{n}"))
    health = remote.service_health()
    assert health["status"] == "ok"
    assert health["log"] == "ok"
    assert health["instance"] == service.instance
    assert health["live_sessions"] == system.live_sessions() >= 1
    metrics = remote.service_metrics()
    assert metrics["turns"] == 3
    assert metrics["summaries"] == 0
    assert metrics["live_sessions"] >= 1
    assert set(metrics["append_ms"]) >= {"p50", "p99"}
    assert metrics["service"]["by_op"]["add_turn"] == 3


@pytest.mark.usefixtures("service")
def test_a_tenant_named_ops_is_not_an_operator_request(remote: RemoteMemory) -> None:
    """Operator subjects live outside v1.<tenant>, so tenant "ops" is served like any other."""
    session = remote.session(MemoryKey("ops", "u", "s"))
    assert session.add_turn(turn("hello")) == 1
    assert session.health is MemoryHealth.HEALTHY
    assert remote.service_health()["status"] == "ok"


@pytest.mark.usefixtures("service")
def test_erase_purges_a_session_then_a_users_sessions(system: MemorySystem, remote: RemoteMemory) -> None:
    """erase removes the events and the snapshot; erase of a user spares other users."""
    one, two, other = (
        MemoryKey("acme", "dave", "one"),
        MemoryKey("acme", "dave", "two"),
        MemoryKey("acme", "erin", "one"),
    )
    for key in (one, two, other):
        remote.session(key).add_turn(turn(f"{key.user_id}-{key.session_id}"))
    assert system.snapshots is not None
    assert system.snapshots.load(one) is not None
    assert remote.session(one).erase() >= 2
    assert stored_users(system, one) == []
    assert system.snapshots.load(one) is None
    assert remote.session(one).to_dict()["turns"] == []
    assert remote.erase_user("acme", "dave") == {"sessions": 1, "events_purged": 2}  # `one` is gone already
    assert stored_users(system, two) == []
    assert remote.session(two).get_llm_context().get("conversation_memory", {}).get("recent_turns", []) == []
    assert stored_users(system, other) == ["erin-one"]


# Tenants confined by NATS permissions ----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tenants_config(port: int, monitor: int, store: Path) -> str:
    """docker/nats-tenants.conf with the listen address, monitor port and store rewritten for a test."""
    text = TENANTS_CONF.read_text(encoding="utf-8")
    for pattern, line in (
        (r"^listen: .*$", f'listen: "127.0.0.1:{port}"'),
        (r"^http: .*$", f'http: "127.0.0.1:{monitor}"'),
        (r"^(\s*)store_dir: .*$", rf'\g<1>store_dir: "{store}"'),
    ):
        text, count = re.subn(pattern, line, text, flags=re.MULTILINE)
        assert count == 1, pattern
    return text


def _ready(monitor: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", monitor, timeout=0.5)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


@pytest.fixture
def tenants_server(tmp_path: Path) -> Iterator[int]:
    """A nats-server running the shipped tenants configuration; yields its port."""
    port, monitor = _free_port(), _free_port()
    config = tmp_path / "tenants.conf"
    config.write_text(tenants_config(port, monitor, tmp_path / "js"), encoding="utf-8")
    with open(tmp_path / "nats.log", "wb") as log:
        proc = subprocess.Popen([str(find_nats_server()), "-c", str(config)], stdout=log, stderr=log)
    try:
        while not _ready(monitor):
            try:  # waiting on the process is the pause between checks
                proc.wait(timeout=0.05)
                pytest.fail(f"nats-server exited: {(tmp_path / 'nats.log').read_text()}")
            except subprocess.TimeoutExpired:
                continue
        yield port
    finally:
        proc.terminate()
        proc.wait(WAIT)


def test_the_shipped_tenants_config_is_valid() -> None:
    """`nats-server -t` accepts docker/nats-tenants.conf as shipped."""
    done = subprocess.run(
        [str(find_nats_server()), "-c", str(TENANTS_CONF), "-t"],
        check=False,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr
    assert "is valid" in done.stdout + done.stderr


def _user(port: int, user: str) -> str:
    return f"nats://{user}:{user}-secret@127.0.0.1:{port}"


@pytest.fixture
def tenants_service(tenants_server: int) -> Iterator[tuple[int, MemorySystem]]:
    store_url = f"nats://convmem:convmem-service-secret@127.0.0.1:{tenants_server}"
    memory = convmem.connect(store_url, config=CONFIG)
    try:
        with MemoryService(memory, _user(tenants_server, "convmem-api")):
            yield tenants_server, memory
    finally:
        memory.close()


def test_a_tenant_cannot_read_or_write_another_tenants_sessions(
    tenants_service: tuple[int, MemorySystem],
) -> None:
    """acme's credentials reach acme's sessions only; globex's session keeps exactly what globex wrote."""
    port, memory = tenants_service
    theirs = MemoryKey("globex", "bob", "s1")
    with (
        RemoteMemory(_user(port, "acme"), inbox_prefix="_INBOX_acme", timeout=WAIT) as acme,
        RemoteMemory(_user(port, "globex"), inbox_prefix="_INBOX_globex", timeout=WAIT) as globex,
        RemoteMemory(_user(port, "operator"), timeout=WAIT) as operator,
    ):
        assert globex.session(theirs).add_turn(turn("globex secret")) == 1
        assert acme.session(MemoryKey("acme", "alice", "s1")).add_turn(turn("acme own")) == 1
        intruder = acme.session(theirs)
        with pytest.raises(PermissionDenied):
            intruder.add_turn(turn("planted by acme"))
        for read in (intruder.get_llm_context, intruder.to_dict, intruder.erase, acme.service_metrics):
            with pytest.raises(PermissionDenied):
                read()
        with pytest.raises(PermissionDenied):
            acme.erase_user("globex", "bob")
        assert stored_users(memory, theirs) == ["globex secret"]
        assert [t["user_message"] for t in globex.session(theirs).to_dict()["turns"]] == ["globex secret"]
        assert operator.service_health()["status"] == "ok"
        with pytest.raises(PermissionDenied):
            operator.session(theirs).get_llm_context()
    with RemoteMemory(_user(port, "acme"), timeout=WAIT) as plain:  # no inbox_prefix: acme's inbox anyway
        assert plain.session(MemoryKey("acme", "alice", "s1")).get_llm_context()["conversation_memory"]


@pytest.mark.usefixtures("tenants_service")
def test_a_tenant_cannot_read_another_tenants_requests_or_replies(tenants_server: int) -> None:
    """Subscriptions to another inbox or to the request subjects are refused; nothing reaches acme."""
    port = tenants_server

    async def scenario() -> tuple[list[str], list[str]]:
        refusals: list[str] = []
        refused = asyncio.Event()
        seen: list[str] = []

        async def on_error(exc: Exception) -> None:
            refusals.append(str(exc))
            if len(refusals) == 3:
                refused.set()

        async def spy(msg: Any) -> None:
            seen.append(msg.subject)

        acme = await nats.connect(_user(port, "acme"), inbox_prefix="_INBOX_acme", error_cb=on_error)
        try:
            for subject in ("_INBOX_globex.>", "_INBOX.>", "convmem.api.>"):
                await acme.subscribe(subject, cb=spy)
            await asyncio.wait_for(refused.wait(), WAIT)
            key = MemoryKey("globex", "bob", "s1")
            async with AsyncRemoteSession(_user(port, "globex"), key, inbox_prefix="_INBOX_globex") as globex:
                await globex.add_turn(turn("globex secret"))
                assert (await globex.to_dict())["turns"]
            await acme.flush()  # whatever the server routed to acme has arrived by now
        finally:
            await acme.close()
        return refusals, seen

    refusals, seen = asyncio.run(scenario())
    assert seen == []
    assert all("permissions violation for subscription" in r for r in refusals)


def test_remote_session_checks_its_arguments_like_the_local_handle(url: str) -> None:
    """Wrong argument types fail before anything is sent, with the local handle's errors."""
    with RemoteSession(url, MemoryKey("acme", "u", "s"), api_prefix="nobody.home") as session:
        with pytest.raises(InvalidInput) as error:
            session.add_turn({"user_message": "hi"})  # type: ignore[arg-type]
        assert error.value.field == "turn"
        with pytest.raises(InvalidInput, match="items"):
            session.add_items({"role": "user", "content": "x"})  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="state"):
            session.from_dict([])  # type: ignore[arg-type]
        with pytest.raises(InvalidTurn) as error:  # JSON would send NaN as null: refused before it is sent
            session.add_items([{"role": "user", "content": "x", "score": math.nan}])
        assert error.value.field == "items[0].score"
        nan_turn = {"user_message": "q", "assistant_response": "a", "artifacts_shown": {"x": math.inf}}
        with pytest.raises(InvalidInput) as error:
            session.from_dict({"version": 1, "health": "healthy", "turns": [nan_turn]})
        assert error.value.field == "turns[0]"
        for at_time in (math.nan, math.inf, 1e20, -1e20):  # JSON would send NaN as null: a fork as of now
            with pytest.raises(MalformedRequest) as error:
                session.fork("copy", at_time=at_time)
            assert error.value.field == "at_time"
    with pytest.raises(ConvmemError):
        RemoteSession(url, "acme:u:s")  # type: ignore[arg-type]
