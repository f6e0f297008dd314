"""The memory service: the session protocol over NATS request/reply, and its clients.

`_protocol` and `_errors` define subjects, payloads and the error wire form;
`_service` answers requests (a live session's ``add_turn`` in `_turn_lane`, from callbacks), each
handled by `_operations` against a `MemorySystem`, each tenant's share and quota kept by `_shares`, `_usage`
and `_quotas`; `_partitions` deals the session partitions over the
workers of `convmem serve --workers`; `_requests`, `_remote` and `_exchange` are the clients
(`AsyncRemoteSession`, and `RemoteSession` derived from its operations on a
`RemoteMemory`'s loop) that planners in other processes use.
"""

from convmem.adapters.frontends.service._errors import (
    InternalError,
    MalformedRequest,
    PermissionDenied,
    RemoteError,
    ServiceUnavailable,
    UnknownOperation,
    UnsupportedVersion,
)
from convmem.adapters.frontends.service._exchange import ClientOptions
from convmem.adapters.frontends.service._protocol import DEFAULT_API_PREFIX, operator_subject, session_subject
from convmem.adapters.frontends.service._quotas import Quotas, TenantLimits
from convmem.adapters.frontends.service._remote import AsyncRemoteSession, RemoteMemory, RemoteSession
from convmem.adapters.frontends.service._service import MemoryService

__all__ = [
    "DEFAULT_API_PREFIX",
    "AsyncRemoteSession",
    "ClientOptions",
    "InternalError",
    "MalformedRequest",
    "MemoryService",
    "PermissionDenied",
    "Quotas",
    "RemoteError",
    "RemoteMemory",
    "RemoteSession",
    "ServiceUnavailable",
    "TenantLimits",
    "UnknownOperation",
    "UnsupportedVersion",
    "operator_subject",
    "session_subject",
]
