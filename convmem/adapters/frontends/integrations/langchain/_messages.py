"""LangChain messages as convmem items, and back.

A message is stored as one agent item, so convmem's views, summaries and
audit tools read a LangChain history like any other session:

* a human, AI or system message (or a chat message with one of those roles)
  becomes a message item, ``{"role", "content", "langchain"}``: convmem sees
  the role and the text, and ``langchain`` keeps the rest of the message
  (its type and every other field, from `message_to_dict`) so it reads back
  equal to what was added;
* any other message (a tool result, a function message, a custom type)
  becomes ``{"type": "langchain", "langchain": ...}``, kept verbatim.

Items that LangChain did not write (a strategy's summary lines, items an
Agents session stored under the same key) read back as the nearest
messages: user, assistant and system text as `HumanMessage`, `AIMessage`
and `SystemMessage`, a function call as an `AIMessage` with its tool call,
a function call's output as a `ToolMessage`. Other items (reasoning, hosted
tool calls) are not chat messages and are left out; the log keeps them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)

from convmem.errors import InvalidTurn

__all__ = ["item_of", "message_of"]

_ROLES = {"human": "user", "ai": "assistant", "system": "system"}
_CHAT_ROLES = ("user", "assistant", "system", "developer")


def item_of(message: BaseMessage, *, field: str = "message") -> dict[str, Any]:
    """The item that stores `message` (see the module docstring)."""
    if not isinstance(message, BaseMessage):
        raise InvalidTurn(field, f"must be a LangChain BaseMessage, got {type(message).__name__}")
    stored = message_to_dict(message)
    role = _ROLES.get(message.type)
    if role is None and message.type == "chat":
        chat_role = getattr(message, "role", None)
        role = chat_role if chat_role in _CHAT_ROLES else None
    if role is None:
        return {"type": "langchain", "langchain": stored}
    data = dict(stored["data"])
    content = data.pop("content")
    return {"role": role, "content": content, "langchain": {"type": stored["type"], "data": data}}


def message_of(item: Mapping[str, Any], *, field: str = "item") -> BaseMessage | None:
    """The message an item stands for; None for an item that is no chat message."""
    stored = item.get("langchain")
    if stored is not None:
        return _stored_message(item, stored, field)
    role, kind = item.get("role"), item.get("type")
    if role is not None and kind in (None, "message"):
        text = _text(item.get("content"))
        if role == "user":
            return HumanMessage(content=text)
        if role == "assistant":
            return AIMessage(content=text)
        if role in ("system", "developer"):
            return SystemMessage(content=text)
        return None
    if kind == "function_call":
        return AIMessage(
            content="",
            tool_calls=[
                {
                    "name": str(item.get("name")),
                    "args": _arguments(item.get("arguments")),
                    "id": item.get("call_id"),
                }
            ],
        )
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
        return ToolMessage(content=text, tool_call_id=str(item.get("call_id")))
    return None


def _stored_message(item: Mapping[str, Any], stored: object, field: str) -> BaseMessage:
    if (
        not isinstance(stored, Mapping)
        or not isinstance(stored.get("type"), str)
        or not isinstance(stored.get("data"), Mapping)
    ):
        raise InvalidTurn(f"{field}.langchain", "must be {'type': str, 'data': {...}} as LangChain stores it")
    data = dict(stored["data"])
    if "role" in item:
        data["content"] = item.get("content", "")
    try:
        return messages_from_dict([{"type": stored["type"], "data": data}])[0]
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidTurn(f"{field}.langchain", f"is not a LangChain message ({exc})") from None


def _text(content: object) -> str:
    """A message's text: a string, or the text parts of a list joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, Mapping)]
        return "\n".join(part for part in parts if isinstance(part, str))
    return ""


def _arguments(arguments: object) -> dict[str, Any]:
    """A call's arguments as LangChain wants them: a dict (empty for ``""``, wrapped if not an object)."""
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}
