"""`ConvmemChatMessageHistory`: LangChain's chat history, stored as a convmem session's log.

`RunnableWithMessageHistory`, the usual way a LangChain app keeps history,
asks a factory for the history of a session id, reads its messages before a
call and adds the call's input and output after it. Here each added message
is an item of an `ItemsAdded` event (see `_messages`), so the history is
convmem's event log: replay, verify, inspect and export work on it, a clear
is a `SessionCleared` event that keeps what was cleared, and the messages
read back are the view of the session's `agents.strategy` (every message by
default; trimmed, summarized or compacted if the configuration says so).

As `ConvmemSession` does for the Agents SDK, it is built from the caller's
`session_id`, then where the memory lives (a `MemorySystem` in this process
or a `RemoteMemory` for a convmem service), then the tenant and user, which
are always explicit.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage

from convmem.actors import MemorySystem
from convmem.adapters.frontends.integrations._items import Items, items_of
from convmem.adapters.frontends.integrations.langchain._messages import item_of, message_of
from convmem.adapters.frontends.service._remote import RemoteMemory
from convmem.errors import InvalidInput
from convmem.events import MemoryKey, ShortTermMemoryConfig

__all__ = ["ConvmemChatMessageHistory"]


class ConvmemChatMessageHistory(BaseChatMessageHistory):
    """A LangChain `BaseChatMessageHistory` whose messages live in convmem.

    `memory` is a `MemorySystem` (in this process; never closed here) or a
    `RemoteMemory` (a convmem service). `config` applies when the session
    starts, in process only; `timeout` bounds every call.
    """

    def __init__(
        self,
        session_id: str,
        memory: MemorySystem | RemoteMemory,
        *,
        tenant_id: str,
        user_id: str,
        config: ShortTermMemoryConfig | None = None,
        timeout: float | None = None,
    ) -> None:
        if not isinstance(session_id, str):
            raise InvalidInput("session_id", f"must be a string, got {type(session_id).__name__}")
        self.session_id = session_id
        self.key = MemoryKey(tenant_id, user_id, session_id)
        self._items: Items = items_of(
            memory, self.key, config=config, timeout=timeout, owner="ConvmemChatMessageHistory"
        )

    def __repr__(self) -> str:
        key = self.key
        return (
            f"ConvmemChatMessageHistory({self.session_id!r}, tenant_id={key.tenant_id!r}, "
            f"user_id={key.user_id!r})"
        )

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The session's messages, oldest first, as its strategy shows them.

        LangChain declares `messages` as a plain attribute; its histories are
        only ever read through it (writes go through `add_messages`), so a
        read-only property keeps the contract (hence the override ignore).
        """
        return _messages(self._items.items(None))

    async def aget_messages(self) -> list[BaseMessage]:
        """`messages`, without blocking the event loop."""
        return _messages(await self._items.aitems(None))

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Store `messages` in one `ItemsAdded` event (nothing for an empty sequence)."""
        items = _items(messages)
        if items:
            self._items.add(items)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """`add_messages`, without blocking the event loop."""
        items = _items(messages)
        if items:
            await self._items.aadd(items)

    def clear(self) -> None:
        """Forget the messages (a `SessionCleared` event; the log keeps them for audit)."""
        self._items.clear()

    async def aclear(self) -> None:
        """`clear`, without blocking the event loop."""
        await self._items.aclear()


def _items(messages: Sequence[BaseMessage]) -> list[dict[str, object]]:
    if isinstance(messages, BaseMessage) or not isinstance(messages, Sequence):
        raise InvalidInput("messages", f"must be a sequence of messages, got {type(messages).__name__}")
    return [item_of(message, field=f"messages[{i}]") for i, message in enumerate(messages)]


def _messages(items: list[dict[str, object]]) -> list[BaseMessage]:
    found = (message_of(item, field=f"items[{i}]") for i, item in enumerate(items))
    return [message for message in found if message is not None]
