"""LangChain: `ConvmemChatMessageHistory`, a chat message history kept in a convmem session's log.

Needs ``langchain-core`` (``pip install "convmem[langchain]"``); importing
this package without it raises an `ImportError` that names the extra.
"""

import importlib

try:
    importlib.import_module("langchain_core.chat_history")
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        'ConvmemChatMessageHistory needs LangChain (package langchain-core): pip install "convmem[langchain]"'
    ) from exc

from convmem.adapters.frontends.integrations.langchain._history import ConvmemChatMessageHistory
from convmem.adapters.frontends.integrations.langchain._messages import item_of, message_of

__all__ = ["ConvmemChatMessageHistory", "item_of", "message_of"]
