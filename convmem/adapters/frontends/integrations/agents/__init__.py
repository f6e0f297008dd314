"""The OpenAI Agents SDK: `ConvmemSession`, a `Session` whose history is a convmem session's log.

In process (on a `MemorySystem`) or through a convmem service (on a
`RemoteMemory` from `convmem.connect_remote`); the SDK is imported lazily,
when a session is built.
"""

from convmem.adapters.frontends.integrations.agents._sdk_session import ConvmemSession

__all__ = ["ConvmemSession"]
