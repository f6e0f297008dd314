"""Property: no request body, however malformed, gets anything but a typed error, and nothing stored changes.

Every session operation of the service is fed random bytes, random JSON
values, and valid bodies with one defect (a value of a wrong type, a number
JSON cannot carry, a value nested far too deep, a string that is not UTF-8, a
missing field, the bytes cut short), in JSON and in msgpack. Each gets an error
reply whose type is a convmem error the client rebuilds (never
`InternalError`), and the session's log and live state are what they were.
The bodies go through `ApiOperations`, the service's request-to-reply half,
both its worker-thread path and the on-loop ``add_turn`` path;
test_service.py sends the same kinds over a real nats-server.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from runtime_helpers import WAIT, turn

from convmem.actors import MemorySystem
from convmem.adapters import InMemoryEventLog
from convmem.adapters.frontends.service._errors import exception_of
from convmem.adapters.frontends.service._operations import ApiOperations
from convmem.adapters.frontends.service._protocol import SESSION_OPS, decode_reply
from convmem.errors import ConvmemError, InvalidInput
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig
from convmem.projections import to_dict

KEY = MemoryKey("acme", "alice", "fuzzed")
PREFIX = "fuzz.api"
READS = frozenset(
    {"context", "tokens", "views", "flush", "health", "export_state", "agents_items", "sessions"}
)
"""Operations that change nothing: a random body that happens to be valid may get an answer."""

_IDS = {"user_id": KEY.user_id, "session_id": KEY.session_id, "timeout": 5.0}
_TURN = {
    "user_message": "what is the weather",
    "assistant_response": "sunny",
    "artifacts_shown": {"chart": [1, 2.5, {"unit": "C"}]},
    "ts": 1_700_000_000.0,
    "items": [
        {"kind": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"kind": "function_call_output", "call_id": "c1", "output": "sunny"},
    ],
    "entities": [{"name": "Paris", "attributes": {"sky": "clear"}}],
    "trajectory_digest": {"tools_invoked": ["weather"]},
}
_EXTRA: dict[str, dict[str, Any]] = {
    "add_turn": {"turn": _TURN, "idempotency_key": "k-1"},
    "add_items": {
        "items": [
            {"role": "user", "content": "hi", "meta": {"score": 0.5}},
            {"type": "function_call", "call_id": "c9", "name": "lookup", "arguments": "{}"},
        ]
    },
    "views": {"view": "buffer"},
    "agents_items": {"limit": 5},
    "erase": {"scope": "session"},
    "sessions": {"limit": 10},
    "fork": {"to_session_id": "forked", "to_user_id": "bob", "at_time": 4_000_000_000.0},
    "restore": {"state": {}},  # the seeded session's own export, filled in by the fixture
}

# Where a value of the wrong kind makes a body invalid, per kind of value.
_ID, _TEXT, _TS, _SECONDS, _OBJECT, _LIST, _JSON, _LIMIT = (
    "id",
    "text",
    "ts",
    "seconds",
    "object",
    "list",
    "json",
    "limit",
)
_COMMON: dict[tuple[Any, ...], str] = {
    ("user_id",): _ID,
    ("session_id",): _ID,
    ("timeout",): _SECONDS,
    ("v",): "v",
}
_TYPED: dict[str, dict[tuple[Any, ...], str]] = {
    "add_turn": {
        ("turn",): _OBJECT,
        ("turn", "user_message"): "message",
        ("turn", "assistant_response"): "message",
        ("turn", "ts"): "turn_ts",
        ("turn", "artifacts_shown"): _OBJECT,
        ("turn", "artifacts_shown", "chart", 1): _JSON,
        ("turn", "items"): _LIST,
        ("turn", "items", 0): _OBJECT,
        ("turn", "items", 0, "call_id"): "call_id",
        ("turn", "items", 1, "output"): _TEXT,
        ("turn", "entities", 0, "name"): _TEXT,
        ("turn", "entities", 0, "attributes", "sky"): _TEXT,
        ("turn", "trajectory_digest", "tools_invoked"): _LIST,
        ("idempotency_key",): "idempotency",
    },
    "add_items": {
        ("items",): _LIST,
        ("items", 0): _OBJECT,
        ("items", 0, "meta", "score"): _JSON,
        ("items", 1, "call_id"): "call_id",
    },
    "views": {("view",): "enum"},
    "agents_items": {("limit",): "count"},
    "erase": {("scope",): "enum"},
    "sessions": {("user_id",): "named", ("limit",): _LIMIT},
    "fork": {("to_session_id",): _ID, ("to_user_id",): "named", ("at_time",): _TS},
    "restore": {
        ("state",): _OBJECT,
        ("state", "version"): "v",
        ("state", "turns", 0, "user_message"): "message",
        ("state", "turns", 0, "ts"): "turn_ts",
        ("state", "turns", 0, "artifacts_shown", "chart", 1): _JSON,
    },
}
_REQUIRED = {"add_turn": "turn", "add_items": "items", "restore": "state", "fork": "to_session_id"}


def _deep(levels: int) -> Any:
    value: Any = "leaf"
    for n in range(levels):
        value = [value] if n % 2 else {"k": value}
    return value


_DEEP = "\x01too-deep"
"""Stands for a list 2,000 levels deep (put into the encoded bytes: an encoder cannot nest that far)."""
_NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
_TOO_DEEP = st.sampled_from([_deep(70), _deep(300), _DEEP])
_INTS = st.integers(-(2**63), 2**64 - 1)
_OTHER_TYPES = st.one_of(
    st.booleans(), st.lists(_INTS, max_size=2), st.dictionaries(st.text(max_size=3), _INTS, max_size=2)
)
_WRONG: dict[str, st.SearchStrategy[Any]] = {
    _ID: st.one_of(
        _INTS, st.floats(), _OTHER_TYPES, st.just(""), st.just("a\x00b"), st.just("x" * 300), _TOO_DEEP
    ),
    "named": st.one_of(_INTS, st.floats(), _OTHER_TYPES, st.just("a\x1bb"), st.just("y" * 300)),
    _TEXT: st.one_of(_INTS, st.floats(), _OTHER_TYPES, _TOO_DEEP),
    "turn_ts": st.one_of(st.text(max_size=4), _NOT_FINITE, st.sampled_from([-1.0, -1e20]), _OTHER_TYPES),
    "count": st.one_of(st.integers(-(2**63), -1), st.text(max_size=4), st.floats(), _OTHER_TYPES),
    "call_id": st.one_of(st.just(""), st.none(), _INTS, st.floats(), _OTHER_TYPES, _TOO_DEEP),
    "message": st.one_of(_INTS, st.floats(), st.none(), _OTHER_TYPES, st.just("nul \x00 inside"), _TOO_DEEP),
    _TS: st.one_of(st.text(max_size=4), _NOT_FINITE, st.sampled_from([-1.0, -1e20, 1e20]), _OTHER_TYPES),
    _SECONDS: st.one_of(
        st.text(max_size=4), _NOT_FINITE, st.sampled_from([0, -1.0]), _OTHER_TYPES, _TOO_DEEP
    ),
    _OBJECT: st.one_of(_INTS, st.text(max_size=4), st.lists(_INTS, max_size=2), _NOT_FINITE),
    _LIST: st.one_of(
        _INTS,
        st.text(min_size=1, max_size=4),
        st.none(),
        st.dictionaries(st.text(max_size=3), _INTS, min_size=1, max_size=2),
    ),
    _JSON: st.one_of(_NOT_FINITE, _TOO_DEEP),
    _LIMIT: st.one_of(st.integers(-(2**63), 0), st.text(max_size=4), st.floats(), _OTHER_TYPES),
    "v": st.one_of(_INTS.filter(lambda v: v != 1), st.text(max_size=3), st.floats(), st.none()),
    "enum": st.one_of(
        st.text(max_size=8).filter(
            lambda s: s not in {"buffer", "session", "user", "agents", "window", "summary", "entity"}
        ),
        _INTS,
        st.none(),
    ),
    "idempotency": st.one_of(st.just(""), st.just("k" * 201), _INTS, _OTHER_TYPES),
}


@pytest.fixture(scope="module")
def ops() -> Iterator[ApiOperations]:
    """The service's operations on a memory system holding one session of two turns."""
    config = ShortTermMemoryConfig(strategy="truncation")
    with MemorySystem(config, log=InMemoryEventLog()) as system:
        session = system.session(KEY)
        session.add_turn(msgspec.convert(_TURN, ConversationTurn), timeout=WAIT)
        session.add_turn(turn("second"), timeout=WAIT)
        _EXTRA["restore"] = {"state": session.to_dict()}
        yield ApiOperations(
            system,
            api_prefix=PREFIX,
            instance="fuzz",
            max_timeout=WAIT,
            fresh_reads=True,
            running=lambda: True,
        )


def _stored(ops: ApiOperations) -> tuple[list[tuple[MemoryKey, int | None, bytes]], dict[str, Any]]:
    records = [(r.key, r.seq, bytes(r.data)) for r in ops.system.log.read_all()]
    return records, to_dict(ops.system.session(KEY).snapshot_state())


def _send(ops: ApiOperations, op: str, data: bytes) -> ConvmemError | None:
    """The error `op` on `data` came back with (None for an answer), by both of the service's paths."""
    subject = f"{PREFIX}.v1.acme.{op}"
    answers = [ops.answer(subject, data)]
    if op == "add_turn":
        answers.append(asyncio.run(ops.add_turn_here(subject, data)))
    errors = []
    for answer in answers:
        reply = decode_reply(answer.reply)
        assert (answer.reply[0] >= 0x80) == (bool(data.strip()) and data[0] >= 0x80)  # encoding kept
        errors.append(None if reply.ok else exception_of(reply.error))  # type: ignore[arg-type]
    assert len({type(e) for e in errors}) == 1  # both paths agree
    return errors[0]


def _assert_refused(ops: ApiOperations, op: str, data: bytes, *, reads_may_answer: bool = False) -> None:
    before = _stored(ops)
    error = _send(ops, op, data)
    if error is None:
        assert reads_may_answer, f"{op} accepted {data[:200]!r}"
        assert op in READS, f"{op} accepted {data[:200]!r}"
    else:
        assert type(error).__name__ != "InternalError", f"{op} on {data[:200]!r}: {error}"
        assert not type(error).__name__.startswith("Remote"), error
        if isinstance(error, InvalidInput):
            assert error.field, error
    assert _stored(ops) == before


# Encoding: msgpack carries every float; JSON spells the ones it cannot carry as the tokens a hostile
# client would send (NaN, 1e999), since a JSON encoder would write null.
_MARK = "\x01not-finite:"


def _marked(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{_MARK}{value!r}"
    if isinstance(value, dict):
        return {k: _marked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_marked(v) for v in value]
    return value


def _encode(value: Any, encoding: str) -> bytes:
    if encoding == "msgpack":
        return msgspec.msgpack.encode(value).replace(
            msgspec.msgpack.encode(_DEEP), b"\x91" * 2_000 + msgspec.msgpack.encode("leaf")
        )
    data = msgspec.json.encode(_marked(value))
    for spelled, token in (("nan", b"NaN"), ("inf", b"1e999"), ("-inf", b"-1e999")):
        data = data.replace(msgspec.json.encode(f"{_MARK}{spelled}"), token)
    return data.replace(msgspec.json.encode(_DEEP), b"[" * 2_000 + b'"leaf"' + b"]" * 2_000)


def _valid(op: str) -> dict[str, Any]:
    return msgspec.json.decode(msgspec.json.encode({**_IDS, **_EXTRA.get(op, {})}))


def _set(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    inner: Any = body
    for step in path[:-1]:
        inner = inner[step]
    inner[path[-1]] = value


def test_the_valid_bodies_are_valid(ops: ApiOperations) -> None:
    """The bodies the defects are put into are answered as they are (so the defect is what is refused)."""
    for op in ("add_turn", "views", "agents_items", "sessions", "fork", "restore"):
        for encoding in ("json", "msgpack"):
            body = _valid(op)
            if op == "fork":
                body["to_session_id"] = f"valid-{encoding}"
            assert _send(ops, op, _encode(body, encoding)) is None, op


@given(op=st.sampled_from(SESSION_OPS), data=st.binary(max_size=200))
@example(op="add_turn", data=b"\xff\xfe")
@example(op="pop_item", data=b'{"user_id": "alice", "session_id": "fuzzed", "x": "\xff"}')
def test_random_bytes_get_a_typed_error(ops: ApiOperations, op: str, data: bytes) -> None:
    """Any bytes at all: a typed error (or, for a read that happens to be valid, its answer)."""
    _assert_refused(ops, op, data, reads_may_answer=True)


_TOKENS = st.sampled_from(
    ["v1", "v2", "acme", "ops", "p3", "p64", "add_turn", "health", "metrics", "*", ">", ""]
)


@given(
    tokens=st.lists(st.one_of(_TOKENS, st.text(max_size=6)), max_size=5),
    data=st.one_of(st.binary(max_size=60), st.just(b'{"user_id": "alice"}')),
)
@example(tokens=["ops", "v1", "health"], data=b"\xff")
@example(tokens=["ops", "v1", "metrics"], data=b'{"v": "1"}')
@example(tokens=["v1", "a=zz", "clear"], data=b'{"user_id": "alice"}')
def test_any_subject_gets_an_answer_or_a_typed_error(
    ops: ApiOperations, tokens: list[str], data: bytes
) -> None:
    """Any subject under the prefix, operator ones too, any body: never InternalError, nothing changes."""
    before = _stored(ops)
    reply = decode_reply(ops.answer(".".join([PREFIX, *tokens]), data).reply)
    if not reply.ok:
        assert reply.error is not None
        error = exception_of(reply.error)
        assert type(error).__name__ != "InternalError", (tokens, data, error)
        assert isinstance(error, InvalidInput), (tokens, data, error)
    assert _stored(ops) == before


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@given(
    op=st.sampled_from(SESSION_OPS),
    encoding=st.sampled_from(["json", "msgpack"]),
    value=st.one_of(
        _JSON_VALUES,
        st.dictionaries(
            st.sampled_from(
                sorted(
                    {
                        *_IDS,
                        "turn",
                        "items",
                        "state",
                        "view",
                        "limit",
                        "scope",
                        "to_session_id",
                        "at_time",
                        "at_position",
                    }
                )
            ),
            _JSON_VALUES,
            max_size=5,
        ),
    ),
)
def test_random_values_get_a_typed_error(ops: ApiOperations, op: str, encoding: str, value: Any) -> None:
    """Any JSON-shaped value, with the op's field names or not: a typed error, nothing stored changes."""
    _assert_refused(ops, op, _encode(value, encoding), reads_may_answer=True)


@st.composite
def _broken(draw: st.DrawFn, op: str) -> dict[str, Any] | tuple[dict[str, Any], str]:
    """A valid body of `op` with one defect: a wrong value at a typed place, or a required field gone."""
    body = _valid(op)
    typed = {**_COMMON, **_TYPED.get(op, {})} if op != "sessions" else _TYPED["sessions"] | {("v",): "v"}
    choices = sorted(typed, key=repr)
    if op in _REQUIRED:
        choices.append(("-", _REQUIRED[op]))
    path = draw(st.sampled_from(choices))
    if path[0] == "-":
        del body[path[1]]
        return body
    if typed[path] in (_TEXT, _ID, "message") and draw(st.booleans()):
        _set(body, path, "ZZMARKZZ")
        return body, "not-utf8"
    _set(body, path, draw(_WRONG[typed[path]]))
    return body


@pytest.mark.parametrize("ops_of", [*_TYPED, "others"])
@given(data=st.data())
def test_valid_bodies_with_one_defect_get_a_typed_error(
    ops: ApiOperations, ops_of: str, data: st.DataObject
) -> None:
    """One wrong value anywhere a body of `op` has a type, or a required field missing: a typed error."""
    others = sorted(set(SESSION_OPS) - set(_TYPED))
    op = data.draw(st.sampled_from(others)) if ops_of == "others" else ops_of
    encoding = data.draw(st.sampled_from(["json", "msgpack"]))
    broken = data.draw(_broken(op))
    if isinstance(broken, tuple):  # a string whose bytes are not UTF-8
        payload = _encode(broken[0], encoding).replace(b"ZZMARKZZ", b"ZZ\xffARKZZ")
    else:
        payload = _encode(broken, encoding)
    _assert_refused(ops, op, payload)


@given(op=st.sampled_from(SESSION_OPS), encoding=st.sampled_from(["json", "msgpack"]), data=st.data())
def test_valid_bodies_cut_short_get_a_typed_error(
    ops: ApiOperations, op: str, encoding: str, data: st.DataObject
) -> None:
    """A valid body cut anywhere (a message lost in transit): a typed error naming the payload."""
    whole = _encode(_valid(op), encoding)
    cut = data.draw(st.integers(1, len(whole) - 1))
    _assert_refused(ops, op, whole[:cut])


@pytest.mark.parametrize(
    ("op", "body", "field"),
    [
        ("fork", {"to_session_id": "f", "at_time": 1e20}, "at_time"),
        ("fork", {"to_session_id": "f", "at_time": -1e20}, "at_time"),
        ("fork", {"to_session_id": "f", "at_time": math.nan}, "at_time"),
        ("fork", {"to_session_id": "f", "at_time": math.inf}, "at_time"),
        ("add_turn", {"turn": {**_TURN, "artifacts_shown": {"x": math.nan}}}, "artifacts_shown.x"),
        ("add_turn", {"turn": {**_TURN, "artifacts_shown": {"x": [-math.inf]}}}, "artifacts_shown.x[0]"),
        ("add_items", {"items": [{"role": "user", "content": "x", "extra": _DEEP}]}, "items[0].extra[0]"),
        ("add_items", {"items": [{"role": "user", "content": "x", "score": math.inf}]}, "items[0].score"),
        ("add_turn", {"turn": {**_TURN, "items": [{"kind": "other", "raw": "[" * 5_000}]}}, "raw"),
        ("restore", {"state": {"version": 1, "turns": _DEEP}}, "state.turns[0]"),
        ("flush", {"timeout": math.inf}, "timeout"),
    ],
)
def test_the_reported_requests_name_their_field(
    ops: ApiOperations, op: str, body: dict[str, Any], field: str
) -> None:
    """The requests that once got InternalError: each a typed error naming where it is wrong, in msgpack."""
    before = _stored(ops)
    error = _send(ops, op, _encode({**_IDS, **body}, "msgpack"))
    assert isinstance(error, InvalidInput)
    assert error.field.startswith(field), error
    assert _stored(ops) == before
