"""The OpenAI Agents SDK: `ConvmemSession`, a `Session` whose history is a convmem session's log."""

from convmem.adapters.integrations.agents._session import ConvmemSession

__all__ = ["ConvmemSession"]
