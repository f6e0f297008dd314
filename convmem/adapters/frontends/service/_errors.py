"""The errors the convmem service protocol adds, and their structured form on the wire.

An error reply carries the exception's class name as ``type``, its message
and its fields; `exception_of` rebuilds the very exception (same class, same
message, same fields) on the client, so remote and local callers catch the
same things. A non-convmem exception in the service goes out as an
`InternalError` whose message hides the details (the service logs them).

The errors added to the tree of `convmem.errors`::

    ConvmemError
    ├── InvalidInput
    │   ├── MalformedRequest      the payload does not decode or does not fit the op's schema
    │   ├── UnknownOperation      the subject names no operation
    │   └── UnsupportedVersion    the request's ``v`` is not one this service speaks
    ├── OperationTimeout
    │   └── ServiceUnavailable    no service answered (none subscribed, or none in time)
    ├── PermissionDenied          (defined in convmem.errors) a subject refused to these credentials
    ├── TenantLimitReached        (defined in convmem.errors) Busy, QuotaExceeded: a tenant's limit
    ├── InternalError             (defined in convmem.errors) the service failed unexpectedly
    └── RemoteError               an error reply of a type this client does not know
"""

from __future__ import annotations

import msgspec

from convmem.errors import (
    Busy,
    ConcurrencyConflict,
    ConvmemError,
    EventDecodeError,
    InternalError,
    InvalidConfig,
    InvalidInput,
    InvalidKey,
    InvalidTurn,
    LogUnavailable,
    MemoryBudgetExceeded,
    OperationTimeout,
    PermissionDenied,
    QuotaExceeded,
    ReplayError,
    SessionClosed,
    SessionDamaged,
    StoreFull,
    SummarizerError,
    TenantLimitReached,
    UnknownEventType,
    WrongThread,
)

__all__ = [
    "ErrorInfo",
    "InternalError",
    "MalformedRequest",
    "PermissionDenied",
    "RemoteError",
    "ServiceUnavailable",
    "UnknownOperation",
    "UnsupportedVersion",
    "error_info",
    "exception_of",
]


class MalformedRequest(InvalidInput):
    """The payload is not JSON or msgpack, or does not fit the operation's schema."""


class UnknownOperation(InvalidInput):
    """The request subject names no operation of this API version."""


class UnsupportedVersion(InvalidInput):
    """The request's ``v`` field is not a version this service speaks."""


class ServiceUnavailable(OperationTimeout):
    """No convmem service answered: none is subscribed, or none replied in time."""


class RemoteError(ConvmemError):
    """An error reply whose type this client does not know (a newer service?)."""

    def __init__(self, message: str, *, type: str) -> None:
        self.type = type
        super().__init__(message)


class ErrorInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A structured error: the exception's class name, message and fields."""

    type: str
    message: str
    field: str | None = None
    problem: str | None = None
    tokens: int | None = None
    budget: int | None = None
    key: str | None = None
    expected_seq: int | None = None
    actual_seq: int | None = None
    path: str | None = None
    seq: int | None = None
    tag: str | None = None
    event_seq: int | None = None
    status: int | None = None
    subject: str | None = None
    err_code: int | None = None
    position: int | None = None
    tenant_id: str | None = None
    limit: str | None = None
    allowed: int | None = None
    usage: int | None = None


_KNOWN: dict[str, type[ConvmemError]] = {
    cls.__name__: cls
    for cls in (
        ConvmemError,
        InvalidInput,
        InvalidKey,
        InvalidTurn,
        InvalidConfig,
        EventDecodeError,
        UnknownEventType,
        ReplayError,
        MemoryBudgetExceeded,
        ConcurrencyConflict,
        LogUnavailable,
        StoreFull,
        SessionClosed,
        SessionDamaged,
        OperationTimeout,
        SummarizerError,
        WrongThread,
        MalformedRequest,
        UnknownOperation,
        UnsupportedVersion,
        ServiceUnavailable,
        PermissionDenied,
        InternalError,
        TenantLimitReached,
        Busy,
        QuotaExceeded,
    )
}
_FIELDS = tuple(f for f in ErrorInfo.__struct_fields__ if f not in ("type", "message"))
_ATTRIBUTES: dict[type[ConvmemError], tuple[str, ...]] = {
    InvalidInput: ("field", "problem"),
    EventDecodeError: ("path", "seq"),
    UnknownEventType: ("tag", "event_seq"),
    MemoryBudgetExceeded: ("tokens", "budget"),
    ConcurrencyConflict: ("key", "expected_seq", "actual_seq"),
    SummarizerError: ("status",),
    PermissionDenied: ("subject",),
    StoreFull: ("err_code",),
    SessionDamaged: ("key", "seq", "position", "problem"),
    TenantLimitReached: ("tenant_id", "limit", "allowed", "usage"),
}


def error_info(exc: BaseException) -> ErrorInfo:
    """The structured form of `exc`; anything not a `ConvmemError` is an `InternalError`."""
    if not isinstance(exc, ConvmemError) or isinstance(exc, InternalError):  # a bug's details stay here
        return ErrorInfo(
            type="InternalError",
            message=f"the service failed unexpectedly ({type(exc).__name__}); its log has the details",
        )
    name = type(exc).__name__
    if name not in _KNOWN:  # a subclass this protocol does not name: send its nearest known base
        name = next(c.__name__ for c in type(exc).__mro__ if c.__name__ in _KNOWN)
    values = {f: getattr(exc, f) for f in _FIELDS if isinstance(getattr(exc, f, None), int | str)}
    return ErrorInfo(type=name, message=str(exc), **values)


def exception_of(error: ErrorInfo) -> ConvmemError:
    """The exception an error reply stands for: same class, same message, same fields."""
    cls = _KNOWN.get(error.type)
    if cls is None:
        return RemoteError(f"{error.type}: {error.message}", type=error.type)
    exc = cls.__new__(cls)
    Exception.__init__(exc, error.message)
    for base in cls.__mro__:
        for name in _ATTRIBUTES.get(base, ()):
            setattr(exc, name, getattr(error, name))
    if isinstance(exc, InvalidInput):  # never None on these
        exc.field = error.field or ""
        exc.problem = error.problem or error.message
    return exc
