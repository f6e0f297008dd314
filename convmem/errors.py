"""Every error convmem raises, under one root.

```
ConvmemError
├── InvalidInput (also ValueError)        a value from outside is wrong; names the field
│   ├── InvalidKey                         an id is empty, too long or has control characters
│   ├── InvalidTurn                        a turn or its items break a rule
│   └── InvalidConfig                      a configuration setting is out of range
│       └── UnknownSetting (also TypeError) a keyword that names no setting
├── EventDecodeError (also ValueError)    log bytes are not an event; names the bad field
│   ├── UnknownEventType                   a well-formed event of a tag this version does not know
│   └── SealBroken                         encrypted bytes failed authentication (damaged or tampered)
├── EncryptionKeyError                    a master key or data key is missing or wrong; names its source
├── ReplayError                           events do not fold: a gap, a foreign key
├── SessionLost                           the log lost events a snapshot covers, with no erasure record
├── MemoryBudgetExceeded                  policy "error": a turn would exceed the budget
├── ConcurrencyConflict                   the session's last sequence is not the expected one
├── SessionDamaged                        a stored event failed its check or is missing; names where
├── ErasureJournalDamaged (convmem.actors) erasure records the journal cannot read back; names each
├── LogUnavailable                        the event log cannot be reached or did not answer in time
│   └── StoreFull                          the JetStream store is full (disk, max_file_store, max_bytes)
├── StoreNotFound                         the event stream or snapshot bucket does not exist (read-only use)
├── PermissionDenied                      the NATS server refused a subject to these credentials; names it
├── TenantLimitReached                    a tenant is at one of its limits in the service; names it
│   ├── Busy                               the tenant has its most requests in flight: retry shortly
│   └── QuotaExceeded                      a write past the tenant's stored-bytes quota: nothing was stored
├── SessionClosed                         the memory system or session was closed
├── OperationTimeout (also TimeoutError)  a blocking call did not finish within its timeout
├── SummarizerError                       a summarizer failed: HTTP error, timeout, malformed reply
├── WrongThread (also RuntimeError)       a blocking call made on the event loop thread it would wait for
└── InternalError (also RuntimeError)     convmem broke one of its own rules (a bug): the log has the details
```

Messages say what happened, where, and what to do; the errors carry fields so
that callers need not parse messages.
"""

from __future__ import annotations

__all__ = [
    "Busy",
    "ConcurrencyConflict",
    "ConvmemError",
    "EncryptionKeyError",
    "EventDecodeError",
    "InternalError",
    "InvalidConfig",
    "InvalidInput",
    "InvalidKey",
    "InvalidTurn",
    "LogUnavailable",
    "MemoryBudgetExceeded",
    "OperationTimeout",
    "PermissionDenied",
    "QuotaExceeded",
    "ReplayError",
    "SealBroken",
    "SessionClosed",
    "SessionDamaged",
    "SessionLost",
    "StoreFull",
    "StoreLost",
    "StoreNotFound",
    "SummarizerError",
    "TenantLimitReached",
    "UnknownEventType",
    "UnknownSetting",
    "WrongThread",
]


class ConvmemError(Exception):
    """Root of every error convmem raises on purpose."""


class InvalidInput(ConvmemError, ValueError):
    """A value that came from outside is wrong.

    `field` names where the bad value sits (``turn.items[2].call_id``).
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class InvalidKey(InvalidInput):
    """A `MemoryKey` id is not usable."""


class InvalidTurn(InvalidInput):
    """A conversation turn breaks one of its rules."""


class InvalidConfig(InvalidInput):
    """A configuration setting is out of range or of the wrong kind."""


class UnknownSetting(InvalidConfig, TypeError):
    """A keyword names no setting (a `TypeError` too, as Python's own unexpected keyword is)."""


class EventDecodeError(ConvmemError, ValueError):
    """Bytes read from the log could not be decoded into an event.

    `path` is the JSON-path-like location of the bad field (``$.turn.ts``) when
    the decoder knows it; `seq` is the log sequence when the reader knows it.
    """

    def __init__(self, message: str, *, path: str | None = None, seq: int | None = None) -> None:
        self.path = path
        self.seq = seq
        where = f" at sequence {seq}" if seq is not None else ""
        super().__init__(f"cannot decode event{where}: {message}")


class UnknownEventType(EventDecodeError):
    """A well-formed event whose tag this version does not know (written by a newer convmem).

    A reader may skip it: `event_seq` is the event's own session sequence when
    the envelope carried one, so a replay can advance past it without a gap.
    """

    def __init__(self, tag: str, *, event_seq: int | None = None, seq: int | None = None) -> None:
        self.tag = tag
        self.event_seq = event_seq
        super().__init__(
            f"unknown event type {tag!r} (written by a newer convmem?); "
            "upgrade convmem or replay with unknown events skipped",
            path="$.type",
            seq=seq,
        )


class SealBroken(EventDecodeError):
    """Encrypted bytes (an event or a snapshot) failed authentication with their data key.

    The key is there, so the bytes were damaged or tampered with: nothing is
    guessed from them. `seq` is the log position when the reader knows it;
    `where` names what was read (``event at position 17 of acme/u1/s1``).
    """

    def __init__(self, where: str, *, seq: int | None = None) -> None:
        self.where = where
        super().__init__(
            f"{where}: its encrypted bytes fail authentication with their data key "
            "(damaged or tampered with); nothing was read from them",
            path="$",
            seq=seq,
        )


class EncryptionKeyError(ConvmemError):
    """A master key or a data key cannot be used: missing, wrong, or its store is unreadable.

    `source` names where the key was looked for (``file /data/master.key``,
    ``environment variable CONVMEM_MASTER_KEY``, ``key store /data/keys``).
    Never raised for the data key of an erased user: its events read as erased.
    """

    def __init__(self, message: str, *, source: str) -> None:
        self.source = source
        super().__init__(f"{source}: {message}")


class ReplayError(ConvmemError):
    """Events that do not fold into a state (a gap, a foreign key, a bad order)."""


class SessionLost(ConvmemError):
    """The log no longer holds events that the session's snapshot covers, and nothing erased them.

    The snapshot is kept (it is the last copy of those turns): restore it with
    `convmem.actors.restore_lost` or ``convmem restore KEY``. `key` is the
    session (``tenant:user:session``), `snapshot_seq` the snapshot's seq,
    `log_seq` the session's last seq in the log (0: none left).
    """

    def __init__(self, *, key: str, snapshot_seq: int, log_seq: int, problem: str) -> None:
        self.key = key
        self.snapshot_seq = snapshot_seq
        self.log_seq = log_seq
        self.problem = problem
        super().__init__(
            f"session {key} is lost from the log: its snapshot covers seq {snapshot_seq}, the log "
            f"has seq {log_seq} ({problem}); no erasure was recorded, so the snapshot is kept: restore "
            f"it with `convmem restore {key}` (or convmem.actors.restore_lost)"
        )


class MemoryBudgetExceeded(ConvmemError):
    """Raised by the ``error`` overflow policy before anything is stored."""

    def __init__(self, *, tokens: int, budget: int) -> None:
        self.tokens = tokens
        self.budget = budget
        super().__init__(
            f"memory context would need {tokens} tokens, over total_max_tokens={budget}; "
            "nothing was stored (raise the budget or use a truncate_* overflow policy)"
        )


class ConcurrencyConflict(ConvmemError):
    """Another writer appended to the session since we last read it."""

    def __init__(self, *, key: str, expected_seq: int, actual_seq: int) -> None:
        self.key = key
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq
        super().__init__(
            f"session {key}: expected last sequence {expected_seq}, log has {actual_seq}; "
            "reload the session and decide again"
        )


class SessionDamaged(ConvmemError):
    """A stored event of the session failed its check, is missing or cannot be read back.

    The session is neither read nor written until an operator repairs it
    (`convmem repair`, `repair_session`). `key` is the session's composite
    key, `seq` the session seq of the first damaged or missing event (None
    when unknown), `position` the log position it was read at (None when
    the store could not say), `problem` what failed.
    """

    def __init__(self, *, key: str, seq: int | None, position: int | None, problem: str) -> None:
        self.key = key
        self.seq = seq
        self.position = position
        self.problem = problem
        where = ", ".join(
            part
            for part in (
                f"seq {seq}" if seq is not None else "",
                f"log position {position}" if position is not None else "",
            )
            if part
        )
        super().__init__(
            f"session {key} is damaged{f' at {where}' if where else ''}: {problem}; "
            "see `convmem verify` and repair it with `convmem repair`"
        )


class LogUnavailable(ConvmemError):
    """The event log could not be reached, or did not answer within its timeout."""


class StoreFull(LogUnavailable):
    """The server refused a write because its store is full: nothing was stored.

    A `LogUnavailable`, since a retry succeeds once an operator makes room
    (purges or removes streams, raises ``max_file_store`` or the stream's
    ``max_bytes``, frees the disk); no restart of convmem is needed.
    `err_code` is JetStream's error code.
    """

    def __init__(self, message: str, *, err_code: int | None = None) -> None:
        self.err_code = err_code
        super().__init__(message)


class StoreNotFound(ConvmemError):
    """A reader asked for a stream or bucket the server does not have (readers never create one)."""

    def __init__(self, message: str, *, name: str) -> None:
        self.name = name
        super().__init__(message)


class StoreLost(ConvmemError):
    """A part of the store that held data is missing: a writer refuses to make it again, empty.

    `part` is which (``events stream`` or ``erasure journal``), `name` its stream or bucket on the
    server, `where` the server (its URL, credentials hidden). Made again silently, the lost events
    stream would let every session start over as new and the lost erasure journal would forget every
    erasure it held pending. An operator who accepts the loss opens the store once with
    ``accept_loss=True`` (``convmem repair --accept-loss``): the part is made again, empty.
    """

    def __init__(self, message: str, *, part: str, name: str, where: str) -> None:
        self.part = part
        self.name = name
        self.where = where
        super().__init__(message)


class PermissionDenied(ConvmemError):
    """The NATS server refused to let these credentials publish (or subscribe) on `subject`."""

    def __init__(self, message: str, *, subject: str | None = None) -> None:
        self.subject = subject
        super().__init__(message)


class TenantLimitReached(ConvmemError):
    """A tenant reached one of the limits the service keeps per tenant (see `Busy`, `QuotaExceeded`).

    `tenant_id` is the tenant; `limit` names the limit (``max_in_flight``,
    ``max_bytes``), `allowed` is its value for this tenant, and `usage` what the
    tenant uses now.
    """

    def __init__(self, message: str, *, tenant_id: str, limit: str, allowed: int, usage: int) -> None:
        self.tenant_id = tenant_id
        self.limit = limit
        self.allowed = allowed
        self.usage = usage
        super().__init__(message)


class Busy(TenantLimitReached):
    """The service already holds the tenant's most requests in flight; this one was refused at once.

    Nothing was done: retry after a short pause (the other requests finish
    first). Other tenants are served meanwhile.
    """

    def __init__(self, *, tenant_id: str, allowed: int, usage: int) -> None:
        super().__init__(
            f"tenant {tenant_id!r} has {usage} requests in flight in this service, its max_in_flight "
            f"is {allowed}; nothing was done: retry once some of them are answered",
            tenant_id=tenant_id,
            limit="max_in_flight",
            allowed=allowed,
            usage=usage,
        )


class QuotaExceeded(TenantLimitReached):
    """A write refused because the tenant's stored events reached its byte quota; nothing was stored.

    Reads and erasure still work: erasing sessions (or a larger quota from the
    operator) makes room.
    """

    def __init__(self, *, tenant_id: str, allowed: int, usage: int, adding: int = 0) -> None:
        """`adding`: what the refused write would have stored (a fork's copy), when it is known."""
        adds = f" and the fork asked for would store {adding:,} more" if adding else ""
        super().__init__(
            f"tenant {tenant_id!r} stores {usage:,} bytes of events{adds}, its max_bytes quota is "
            f"{allowed:,}; nothing was stored: erase sessions or ask the operator for a larger quota",
            tenant_id=tenant_id,
            limit="max_bytes",
            allowed=allowed,
            usage=usage,
        )


class SessionClosed(ConvmemError):
    """The memory system or the session handle has been closed."""


class OperationTimeout(ConvmemError, TimeoutError):
    """A blocking call did not finish within its timeout."""


class SummarizerError(ConvmemError):
    """A summarizer could not produce a summary: the service failed, timed out or answered badly.

    `status` is the HTTP status when the service answered with an error.
    The runtime treats it like any summarizer failure (retry, then degrade).
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class WrongThread(ConvmemError, RuntimeError):
    """A blocking call was made on the event loop thread that must run it, where it would deadlock.

    The message names the call and what to use there instead (the asyncio
    handle, or ``asyncio.to_thread``).
    """


class InternalError(ConvmemError, RuntimeError):
    """convmem failed in a way it did not expect: one of its own rules broke (a bug; please report it).

    The service answers any exception that is no `ConvmemError` as this type
    too, its traceback left in the service's log.
    """
