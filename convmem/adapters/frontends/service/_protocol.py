"""The request/reply protocol of the convmem NATS service (version 1): subjects and schemas.

Subjects (``api_prefix`` defaults to ``convmem.api``)::

    {api_prefix}.v1.{tenant}.{op}         session operations; {tenant} is encode_token(tenant_id)
    {api_prefix}.v1.{tenant}.{op}.p{N}    the same, routed to the session's partition N (`slot_of`)
    {api_prefix}.ops.v1.{op}              operator requests: health, metrics

A client may name the session's partition as a fifth token (convmem's
clients do): a `convmem serve --workers` process that owns the partition
answers it, so one session is served by one process at a time. The service
reads the session from the payload either way; the token only routes.

The tenant is never read from a payload: a tenant's credentials that may only
publish on ``{api_prefix}.v1.{its token}.>`` cannot address another tenant.
Operator subjects sit outside ``v1.*`` so no tenant token (``ops`` included)
can reach them.

A payload is JSON, or msgpack when its first byte is 0x80 or above (a
msgpack map); the reply uses the request's encoding. Every reply is
``{"v": 1, "ok": true, "result": ...}`` or ``{"v": 1, "ok": false, "error":
{"type", "message", ...fields}}``, where ``type`` is the name of the
exception class and the other fields are its attributes, so a client raises
the same exception the session would have raised in process.

Version rules: inside v1 a request or reply only gains optional fields
(readers ignore unknown ones); a breaking change is a new subject token
(``v2``) served side by side. A request whose ``v`` is not 1 is refused.

The errors it adds live in `convmem.adapters.frontends.service._errors`.
"""

from __future__ import annotations

import math
import re
import zlib
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from convmem.adapters.frontends.service._errors import (
    ErrorInfo,
    MalformedRequest,
    RemoteError,
    UnknownOperation,
    UnsupportedVersion,
)
from convmem.adapters.frontends.service._payload import locate
from convmem.errors import InvalidInput, InvalidKey, InvalidTurn
from convmem.events import ConversationTurn, decode_token, encode_token
from convmem.projections import check_query

__all__ = [
    "API_VERSION",
    "DEFAULT_API_PREFIX",
    "MICRO_NAME",
    "OPERATOR_OPS",
    "SESSION_OPS",
    "SLOTS",
    "VIEWS",
    "AddItemsRequest",
    "AddTurnRequest",
    "AgentsItemsRequest",
    "ContextRequest",
    "EraseRequest",
    "ForkRequest",
    "OperatorRequest",
    "Reply",
    "Request",
    "RestoreRequest",
    "SessionCursor",
    "SessionsRequest",
    "ViewRequest",
    "check_api_prefix",
    "check_at_time",
    "decode_reply",
    "decode_request",
    "encode_error",
    "encode_ok",
    "operator_subject",
    "parse_subject",
    "partition_subject",
    "routed_subject",
    "session_subject",
    "slot_of",
    "slot_token",
    "status_subject",
    "unrouted",
    "wants_msgpack",
]

API_VERSION = 1
DEFAULT_API_PREFIX = "convmem.api"
MICRO_NAME = "convmem"
"""The NATS micro-service name every instance registers (``$SRV.PING.convmem`` finds them all)."""
SESSION_OPS = (
    "add_turn",
    "add_items",
    "pop_item",
    "context",
    "tokens",
    "views",
    "flush",
    "health",
    "clear",
    "erase",
    "export_state",
    "restore",
    "agents_start",
    "agents_items",
    "sessions",
    "fork",
)
OPERATOR_OPS = ("health", "metrics")
ViewName = Literal["agents", "buffer", "window", "summary", "entity"]
VIEWS: tuple[str, ...] = ("agents", "buffer", "window", "summary", "entity")
SLOTS = 64
"""Partitions of the session space: a session's requests are routed to the worker owning its slot."""

_VERSION_TOKEN = f"v{API_VERSION}"
_OPS_TOKEN = "ops"
_PREFIX_TOKEN = re.compile(r"^[A-Za-z0-9_\-]+$")
_SLOT_TOKENS = tuple(f"p{n}" for n in range(SLOTS))
_SLOT_TOKEN_SET = frozenset(_SLOT_TOKENS)


# Subjects ----------------------------------------------------------------------------


def check_api_prefix(api_prefix: str) -> str:
    """`api_prefix` as given when it is dot-separated plain tokens; `InvalidInput` otherwise."""
    if not isinstance(api_prefix, str) or not all(_PREFIX_TOKEN.match(t) for t in api_prefix.split(".")):
        raise InvalidInput(
            "api_prefix", f"{api_prefix!r} must be dot-separated tokens of letters, digits, _ and -"
        )
    return api_prefix


def session_subject(api_prefix: str, tenant_id: str, op: str) -> str:
    """The subject of a session operation of `tenant_id`."""
    return f"{api_prefix}.{_VERSION_TOKEN}.{encode_token(tenant_id)}.{op}"


def slot_of(tenant_id: str, user_id: str, session_id: str) -> int:
    """The partition (0 .. SLOTS - 1) of a session: a stable hash of its key, the same in every process."""
    return zlib.crc32(f"{tenant_id}\x00{user_id}\x00{session_id}".encode()) % SLOTS


def slot_token(slot: int) -> str:
    """The subject token of partition `slot` (``p0`` .. ``p63``)."""
    return _SLOT_TOKENS[slot]


def routed_subject(api_prefix: str, tenant_id: str, user_id: str, session_id: str, op: str) -> str:
    """The subject of a session operation routed to the session's partition."""
    slot = _SLOT_TOKENS[slot_of(tenant_id, user_id, session_id)]
    return f"{api_prefix}.{_VERSION_TOKEN}.{encode_token(tenant_id)}.{op}.{slot}"


def unrouted(subject: str) -> str | None:
    """A routed subject without its partition token (any worker answers it); None if not routed."""
    head, _, last = subject.rpartition(".")
    return head if last in _SLOT_TOKEN_SET else None


def partition_subject(api_prefix: str, slot: int) -> str:
    """What the owner of partition `slot` subscribes to: every tenant's operations routed there."""
    return f"{api_prefix}.{_VERSION_TOKEN}.*.*.{_SLOT_TOKENS[slot]}"


def operator_subject(api_prefix: str, op: str) -> str:
    """The subject of an operator request (``health``, ``metrics``)."""
    return f"{api_prefix}.{_OPS_TOKEN}.{_VERSION_TOKEN}.{op}"


def status_subject(api_prefix: str, instance: str) -> str:
    """Where one service instance answers for itself: its health and metrics together."""
    return f"{api_prefix}.{_OPS_TOKEN}.status.{instance}"


_PARSED: dict[tuple[str, str], tuple[str | None, str]] = {}
"""Subjects parsed already (a service sees few: one per tenant, op and partition); cleared when full."""
_PARSED_LIMIT = 4096


def parse_subject(api_prefix: str, subject: str) -> tuple[str | None, str]:
    """(tenant id, op) of a request subject; the tenant is None for an operator request.

    Raises `UnknownOperation` for a subject of no operation, `InvalidKey`
    (field ``tenant_id``) for a tenant token that `encode_token` cannot produce.
    (Each request's subject is parsed more than once on its way: what parsed is remembered.)
    """
    found = _PARSED.get((api_prefix, subject))
    if found is None:
        found = _parse_subject(api_prefix, subject)
        if len(_PARSED) >= _PARSED_LIMIT:
            _PARSED.clear()
        _PARSED[api_prefix, subject] = found
    return found


def _parse_subject(api_prefix: str, subject: str) -> tuple[str | None, str]:
    rest = subject[len(api_prefix) + 1 :].split(".") if subject.startswith(api_prefix + ".") else []
    if len(rest) == 3 and rest[:2] == [_OPS_TOKEN, _VERSION_TOKEN] and rest[2] in OPERATOR_OPS:
        return None, rest[2]
    if len(rest) == 4 and rest[3] in _SLOT_TOKEN_SET:
        rest = rest[:3]  # routed to a partition: the same operation
    if len(rest) == 3 and rest[0] == _VERSION_TOKEN and rest[2] in SESSION_OPS:
        try:
            return decode_token(rest[1]), rest[2]
        except InvalidKey as exc:
            raise InvalidKey("tenant_id", f"subject token {rest[1]!r}: {exc.problem}") from None
    raise UnknownOperation(
        "op",
        f"no operation at subject {subject!r}; session operations are {api_prefix}.{_VERSION_TOKEN}."
        f"<tenant>.<op>[.p<partition>] with op one of {', '.join(SESSION_OPS)}; operator requests are "
        f"{api_prefix}.{_OPS_TOKEN}.{_VERSION_TOKEN}.<op> with op one of {', '.join(OPERATOR_OPS)}",
    )


# Requests ----------------------------------------------------------------------------


class Request(msgspec.Struct, kw_only=True):
    """Fields every session request carries; the tenant comes from the subject.

    `timeout` is how many seconds the service may spend on a write or a
    flush (capped by the service); the client sends a little less than it
    waits itself, so a slow operation comes back as `OperationTimeout`.
    """

    v: int = API_VERSION
    user_id: str = ""
    session_id: str = ""
    timeout: float | None = None


class AddTurnRequest(Request, kw_only=True):
    """``add_turn``: a completed turn, retried safely under the same `idempotency_key`."""

    turn: ConversationTurn
    idempotency_key: str | None = None


class AddItemsRequest(Request, kw_only=True):
    """``add_items``: OpenAI-Agents session items, as the SDK gives them."""

    items: list[dict[str, Any]]


class ContextRequest(Request, kw_only=True):
    """``context``: the session's context view; with `query` (the planner's current message, at most
    `MAX_QUERY_CHARS` characters), also the session's earlier lines most relevant to it when the
    session's ``budget.recall_max_tokens`` is set."""

    query: str | None = None


class ViewRequest(Request, kw_only=True):
    """``views``: one of the conversation views of the session."""

    view: ViewName


class AgentsItemsRequest(Request, kw_only=True):
    """``agents_items``: the session's items as its agents strategy shows them (the last `limit`)."""

    limit: int | None = None


class EraseRequest(Request, kw_only=True):
    """``erase``: purge the session, or (scope ``user``) every session of the user."""

    scope: Literal["session", "user"] = "session"


class RestoreRequest(Request, kw_only=True):
    """``restore``: replace the session's content with a `to_dict()` export."""

    state: dict[str, Any]


class SessionCursor(msgspec.Struct, forbid_unknown_fields=True):
    """Where a page of ``sessions`` starts: after this session, in key order (the previous page's
    ``after``)."""

    user_id: str
    session_id: str


class SessionsRequest(Request, kw_only=True):
    """``sessions``: the tenant's sessions (of one user when `user_id` is given), at most `limit`.

    With `after` (null for the first page), a page: ``{sessions, more, after}``, the sessions past
    `after` in key order, `more` saying whether any are left, `after` the next page's cursor.
    """

    limit: int | None = None
    after: SessionCursor | msgspec.UnsetType | None = msgspec.UNSET


class ForkRequest(Request, kw_only=True):
    """``fork``: start session `to_session_id` (of `to_user_id`, default the same user) as this one was.

    As of log position `at_position`, or time `at_time` (epoch seconds), or now.
    """

    to_session_id: str
    to_user_id: str | None = None
    at_position: int | None = None
    at_time: float | None = None


class OperatorRequest(msgspec.Struct, kw_only=True):
    """``ops.v1.*``: no fields besides the version (an empty payload is fine)."""

    v: int = API_VERSION


_REQUEST_TYPES: dict[str, type[Request]] = {
    "add_turn": AddTurnRequest,
    "add_items": AddItemsRequest,
    "context": ContextRequest,
    "views": ViewRequest,
    "agents_items": AgentsItemsRequest,
    "erase": EraseRequest,
    "restore": RestoreRequest,
    "sessions": SessionsRequest,
    "fork": ForkRequest,
}
_json_decoders: dict[str, msgspec.json.Decoder[Any]] = {}
_msgpack_decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {}
for _op in (*SESSION_OPS, "ops"):
    _type: type[Any] = OperatorRequest if _op == "ops" else _REQUEST_TYPES.get(_op, Request)
    _json_decoders[_op] = msgspec.json.Decoder(_type)
    _msgpack_decoders[_op] = msgspec.msgpack.Decoder(_type)

_AT = re.compile(r" - at `\$([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def wants_msgpack(data: bytes) -> bool:
    """Whether a payload is msgpack (first byte 0x80 or above) rather than JSON."""
    return bool(data) and data[0] >= 0x80


def decode_request(op: str | None, data: bytes) -> Request | OperatorRequest:
    """The request of `op` (None: an operator request) from its payload.

    A turn or its items that break a rule raise the same `InvalidTurn` (same
    field) as building the turn in process; anything else that does not fit
    raises `MalformedRequest` naming the field: a string that is not UTF-8, a
    value nested too deep to decode, a number JSON cannot carry (NaN, an
    infinity) or a time no calendar holds. No payload raises anything else.
    """
    name = "ops" if op is None else op
    if not data.strip():
        data = b"{}"
    msgpack = wants_msgpack(data)
    decoder = _msgpack_decoders[name] if msgpack else _json_decoders[name]
    try:
        if not msgpack and not data.isascii():
            data.decode()  # JSON text is UTF-8 throughout, unknown fields too (msgspec skips those unread)
        request: Request | OperatorRequest = decoder.decode(data)
    except msgspec.ValidationError as exc:
        cause = exc.__cause__
        if isinstance(cause, InvalidInput):
            raise cause from None  # the turn's own rule, with its own field
        raise _malformed(str(exc)) from None
    except (RecursionError, UnicodeDecodeError) as exc:
        # msgspec says neither where nor, for a deep value, why: find the place in the bytes.
        found = locate(data, msgpack=msgpack)
        if found is None:
            kind = "msgpack" if msgpack else "JSON"
            raise MalformedRequest("payload", f"is not valid {kind} ({type(exc).__name__})") from None
        raise _field_error(*found) from None
    except (msgspec.DecodeError, ValueError, OverflowError) as exc:
        kind = "msgpack" if msgpack else "JSON"
        raise MalformedRequest("payload", f"is not valid {kind} ({exc})") from None
    if request.v != API_VERSION:
        raise UnsupportedVersion(
            "v", f"is {request.v}; this service speaks version {API_VERSION} (subject token v1)"
        )
    if isinstance(request, Request):
        _check_numbers(request)
    return request


_EARLIEST = datetime(1, 1, 2, tzinfo=UTC).timestamp()
_LATEST = datetime(9999, 12, 30, tzinfo=UTC).timestamp()


def _check_numbers(request: Request) -> None:
    """The request's own numbers: finite (JSON cannot carry the others), a time inside the calendar."""
    if request.timeout is not None and not math.isfinite(request.timeout):
        raise MalformedRequest("timeout", f"must be a finite number of seconds, got {request.timeout!r}")
    if isinstance(request, ForkRequest) and request.at_time is not None:
        check_at_time(request.at_time)
    if isinstance(request, ContextRequest):
        check_query(request.query, "query", MalformedRequest)


def check_at_time(at: object) -> None:
    """A fork's `at_time`: epoch seconds inside the calendar (years 1 to 9999); `MalformedRequest` else.

    The client checks it before sending too: JSON would carry NaN as ``null``, a fork as of now.
    """
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        ok = False
    else:
        ok = _EARLIEST <= at <= _LATEST
    if not ok:
        raise MalformedRequest(
            "at_time",
            f"must be a finite epoch time in seconds between {_EARLIEST:.0f} and {_LATEST:.0f} "
            f"(years 1 to 9999), got {at!r}",
        )


def _malformed(message: str) -> InvalidInput:
    match = _AT.search(message)
    path = match.group(1).lstrip(".") if match else ""
    problem = message[: match.start()] if match else message
    missing = _MISSING.search(problem)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    return _field_error(path or "payload", problem)


def _field_error(field: str, problem: str) -> InvalidInput:
    """`InvalidTurn` for a place inside a turn or its items, `MalformedRequest` for any other."""
    if field.startswith(("turn", "items")):
        return InvalidTurn(field, problem)
    return MalformedRequest(field, problem)


# Replies -----------------------------------------------------------------------------


class Reply(msgspec.Struct, kw_only=True):
    """Any reply: ``ok`` with a `result`, or not ``ok`` with an `error`."""

    v: int = API_VERSION
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None


class _Ok(msgspec.Struct, kw_only=True):
    v: int = API_VERSION
    ok: bool = True
    result: Any = None


class _Failed(msgspec.Struct, kw_only=True):
    v: int = API_VERSION
    ok: bool = False
    error: ErrorInfo


_json = msgspec.json.Encoder()
_msgpack = msgspec.msgpack.Encoder()
_json_reply = msgspec.json.Decoder(Reply)
_msgpack_reply = msgspec.msgpack.Decoder(Reply)


def encode_ok(result: Any, *, msgpack: bool) -> bytes:
    """An ``ok`` reply in the request's encoding."""
    return (_msgpack if msgpack else _json).encode(_Ok(result=result))


def encode_error(error: ErrorInfo, *, msgpack: bool) -> bytes:
    """An error reply in the request's encoding."""
    return (_msgpack if msgpack else _json).encode(_Failed(error=error))


def decode_reply(data: bytes) -> Reply:
    """A reply from its bytes; `RemoteError` when they are not one."""
    try:
        return (_msgpack_reply if wants_msgpack(data) else _json_reply).decode(data)
    except msgspec.MsgspecError as exc:
        raise RemoteError(f"the service sent an unreadable reply ({exc})", type="MalformedReply") from None
