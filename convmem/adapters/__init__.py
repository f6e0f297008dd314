"""The edges: logs, snapshot stores, summarizers, integrations, service and CLI."""

from convmem.adapters._agents_session import ConvmemSession
from convmem.adapters._connect import MEMORY_URL, connect, connect_here, open_backend, open_backend_here
from convmem.adapters._embedded import EmbeddedNatsServer
from convmem.adapters._extractive import ExtractiveSummarizer
from convmem.adapters._jetstream import JetStreamBackend
from convmem.adapters._jetstream_log import JetStreamEventLog
from convmem.adapters._jetstream_snapshots import JetStreamSnapshotStore
from convmem.adapters._memory import InMemoryEventLog, InMemorySnapshotStore
from convmem.adapters._openai import OpenAIChatSummarizer
from convmem.adapters._penguiflow import ConvmemShortTermMemory, config_from_penguiflow, turn_from_penguiflow
from convmem.adapters._protocol import DEFAULT_API_PREFIX, operator_subject, session_subject
from convmem.adapters._protocol_errors import (
    InternalError,
    MalformedRequest,
    PermissionDenied,
    RemoteError,
    ServiceUnavailable,
    UnknownOperation,
    UnsupportedVersion,
)
from convmem.adapters._remote import AsyncRemoteSession, RemoteMemory, RemoteSession
from convmem.adapters._service import MemoryService

__all__ = [
    "DEFAULT_API_PREFIX",
    "MEMORY_URL",
    "AsyncRemoteSession",
    "ConvmemSession",
    "ConvmemShortTermMemory",
    "EmbeddedNatsServer",
    "ExtractiveSummarizer",
    "InMemoryEventLog",
    "InMemorySnapshotStore",
    "InternalError",
    "JetStreamBackend",
    "JetStreamEventLog",
    "JetStreamSnapshotStore",
    "MalformedRequest",
    "MemoryService",
    "OpenAIChatSummarizer",
    "PermissionDenied",
    "RemoteError",
    "RemoteMemory",
    "RemoteSession",
    "ServiceUnavailable",
    "UnknownOperation",
    "UnsupportedVersion",
    "config_from_penguiflow",
    "connect",
    "connect_here",
    "open_backend",
    "open_backend_here",
    "operator_subject",
    "session_subject",
    "turn_from_penguiflow",
]
