"""What a planner stores: a turn pair, its trajectory digest, its agent items, its entities.

A `ConversationTurn` is the seed's atomic unit (one user message, one final
assistant answer). It may also carry:

* `items`: the message items an agent run produced between the user message
  and the final answer (tool calls with call ids, tool results, reasoning,
  intermediate assistant text), so that the OpenAI-Agents strategies can be
  projected from the same log. A tool result must follow its call inside the
  same turn: a call is never separated from its result.
* `entities`: entity mentions with attributes, for the entity memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from convmem.errors import InvalidTurn
from convmem.events._checks import (
    MAX_TEXT_LENGTH,
    check_finite,
    check_items_of,
    check_json,
    check_strings,
    check_text,
    check_type,
    has_lone_surrogate,
    kind_of,
    optional_text,
    storing,
    text_tuple,
)
from convmem.events._dates import date_text

__all__ = [
    "ConversationTurn",
    "EntityMention",
    "ItemKind",
    "MessageItem",
    "TrajectoryDigest",
]

ItemKind = Literal["message", "function_call", "function_call_output", "reasoning", "other"]
_ITEM_KINDS: tuple[str, ...] = ("message", "function_call", "function_call_output", "reasoning", "other")
_ROLES: tuple[str, ...] = ("user", "assistant", "system", "developer")


_INF = math.inf


class TrajectoryDigest(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """Compressed record of the tools a turn used (the seed's fields)."""

    tools_invoked: tuple[str, ...] = ()
    observations_summary: str = ""
    reasoning_summary: str | None = None
    artifacts_refs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_text("trajectory_digest.observations_summary", self.observations_summary)
        if self.reasoning_summary is not None:
            check_text("trajectory_digest.reasoning_summary", self.reasoning_summary)
        text_tuple(self, "tools_invoked", "trajectory_digest.tools_invoked")
        for i, name in enumerate(self.tools_invoked):
            if not name:
                raise InvalidTurn(f"trajectory_digest.tools_invoked[{i}]", "must not be empty")
        text_tuple(self, "artifacts_refs", "trajectory_digest.artifacts_refs")

    def to_llm(self) -> dict[str, Any]:
        """The digest as the LLM sees it (empty fields left out)."""
        out: dict[str, Any] = {"tools_invoked": list(self.tools_invoked)}
        if self.observations_summary:
            out["observations_summary"] = self.observations_summary
        if self.reasoning_summary:
            out["reasoning_summary"] = self.reasoning_summary
        return out


class MessageItem(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """One agent-run item, in the OpenAI Responses item vocabulary.

    * ``message``: `role` and `content`.
    * ``function_call``: `call_id`, `name`, `arguments` (a JSON string).
    * ``function_call_output``: `call_id`, `output`; `name` is optional.
    * ``reasoning``: `content`.
    * ``other``: any other SDK item, kept verbatim in `raw`.

    `raw` is the JSON of the item as an agent SDK gave it, its keys in the
    order given (see `from_agents`; items stored before 0.2 have them
    sorted); when present, `to_agents` gives it back unchanged.
    """

    kind: ItemKind = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str = ""
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    raw: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in _ITEM_KINDS:
            raise InvalidTurn("kind", f"must be one of {', '.join(_ITEM_KINDS)}, got {kind_of(self.kind)}")
        if self.role is not None and self.role not in _ROLES:
            raise InvalidTurn("role", f"must be one of {', '.join(_ROLES)} or None, got {kind_of(self.role)}")
        check_text("content", self.content)
        for field in ("call_id", "name", "arguments", "output", "raw"):
            optional_text(field, getattr(self, field))
        if self.raw is not None and storing():
            _check_raw(self.raw)
        if self.kind == "other" and self.raw is None:
            raise InvalidTurn("raw", "an item of kind 'other' keeps the SDK item in raw")
        if self.kind == "message" and self.role is None:
            raise InvalidTurn("role", "a message item needs a role")
        if self.kind in ("function_call", "function_call_output") and not self.call_id:
            raise InvalidTurn("call_id", f"a {self.kind} item needs a call_id")
        if self.kind == "function_call" and not self.name:
            raise InvalidTurn("name", "a function_call item needs the tool name")
        if self.kind == "function_call_output" and self.output is None:
            raise InvalidTurn("output", "a function_call_output item needs an output")

    def to_agents(self) -> dict[str, Any]:
        """The item as an OpenAI-Agents session item (a plain dict)."""
        if self.raw is not None:
            item: dict[str, Any] = msgspec.json.decode(self.raw)
            return item
        if self.kind == "message":
            return {"role": self.role, "content": self.content}
        if self.kind == "function_call":
            return {
                "type": "function_call",
                "call_id": self.call_id,
                "name": self.name,
                "arguments": self.arguments if self.arguments is not None else "{}",
            }
        if self.kind == "function_call_output":
            return {"type": "function_call_output", "call_id": self.call_id, "output": self.output}
        return {"type": "reasoning", "content": self.content}

    @classmethod
    def from_agents(cls, item: Mapping[str, Any], *, field: str = "item") -> MessageItem:
        """Parse an OpenAI-Agents session item (a mapping), keeping it verbatim in `raw`.

        The keys keep the order the caller gave them, so the item reads back
        exactly as written (a byte-exact audit of what an SDK stored). A
        function call's `arguments` may be empty: the SDK's handoff calls carry
        ``""``.
        """
        if not isinstance(item, Mapping):
            raise InvalidTurn(field, f"must be a mapping, got {type(item).__name__}")
        check_finite(field, item)
        try:
            raw = msgspec.json.encode(item).decode()
        except (TypeError, msgspec.EncodeError) as exc:
            raise InvalidTurn(field, f"is not JSON-serialisable: {exc}") from None
        kind = item.get("type")
        if kind == "function_call":
            return cls(
                kind="function_call",
                call_id=_text_of(item.get("call_id"), f"{field}.call_id"),
                name=_text_of(item.get("name"), f"{field}.name"),
                arguments=_string_of(item.get("arguments", "{}"), f"{field}.arguments"),
                raw=raw,
            )
        if kind == "function_call_output":
            output = item.get("output")
            return cls(
                kind="function_call_output",
                call_id=_text_of(item.get("call_id"), f"{field}.call_id"),
                output=output if isinstance(output, str) else msgspec.json.encode(output).decode(),
                raw=raw,
            )
        role = item.get("role")
        if (kind in (None, "message")) and role in ("user", "assistant", "system", "developer"):
            return cls(kind="message", role=role, content=_content_text(item.get("content")), raw=raw)
        return cls(kind="other", raw=raw)


_raw_decoder = msgspec.json.Decoder(dict[str, Any])


def _check_raw(raw: str) -> None:
    """`raw` must be the JSON of an object, or `to_agents` could not give the item back."""
    try:
        _raw_decoder.decode(raw)
    except (msgspec.MsgspecError, RecursionError, ValueError) as exc:
        problem = "nests too deep to read" if isinstance(exc, RecursionError) else str(exc)
        raise InvalidTurn("raw", f"must be the JSON of an agent item (an object): {problem}") from None


def _text_of(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidTurn(field, f"must be a non-empty string, got {value!r}")
    return value


def _string_of(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidTurn(field, f"must be a string, got {value!r}")
    return value


def _content_text(content: object) -> str:
    """The text of a message's content: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


class EntityMention(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """An entity a turn mentions, with what the turn says about it."""

    name: str
    kind: str | None = None
    attributes: dict[str, str] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        check_type("entities.name", self.name, str, "a string")
        if not self.name.strip():
            raise InvalidTurn("entities.name", "must not be blank")
        check_strings("entities.name", self.name)
        optional_text("entities.kind", self.kind)
        check_type("entities.attributes", self.attributes, dict, "a dict of strings")
        for name, value in self.attributes.items():
            check_type("entities.attributes", name, str, "keyed by strings")
            check_type(f"entities.attributes.{name}", value, str, "a string")
        check_strings("entities.attributes", self.attributes)


class ConversationTurn(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """One completed user-assistant exchange (the seed's fields plus agent items and entities)."""

    user_message: str
    assistant_response: str
    trajectory_digest: TrajectoryDigest | None = None
    artifacts_shown: dict[str, Any] = msgspec.field(default_factory=dict)
    artifacts_hidden_refs: tuple[str, ...] = ()
    ts: float = 0.0
    items: tuple[MessageItem, ...] = ()
    entities: tuple[EntityMention, ...] = ()
    source: Literal["turn", "items"] = "turn"
    """``items``: built from agent items as they arrived; `items` then holds every item,
    the user message included, and a call's result may still be to come."""

    def __post_init__(self) -> None:
        # Every turn decoded from the log runs this, so the common turn (two texts of
        # at most MAX_TEXT_LENGTH characters with no NUL and no lone surrogate, a float
        # time, nothing else) is accepted inline, without a call per field. It accepts
        # only turns that `_check_turn` accepts; anything else is checked in full there.
        user = self.user_message
        answer = self.assistant_response
        ts = self.ts
        if (
            type(user) is str
            and type(answer) is str
            and (user or answer)
            and len(user) <= MAX_TEXT_LENGTH
            and len(answer) <= MAX_TEXT_LENGTH
            and "\x00" not in user
            and "\x00" not in answer
            and (user.isascii() or not has_lone_surrogate(user))
            and (answer.isascii() or not has_lone_surrogate(answer))
            and type(ts) is float
            and 0.0 <= ts < _INF
            and self.items == ()
            and self.entities == ()
            and type(self.artifacts_shown) is dict
            and not self.artifacts_shown
            and self.artifacts_hidden_refs == ()
            and (self.trajectory_digest is None or type(self.trajectory_digest) is TrajectoryDigest)
            and self.source == "turn"
        ):
            return
        _check_turn(self)

    def to_llm(self, *, include_digest: bool, include_date: bool = False) -> dict[str, Any]:
        """The turn as the PenguiFlow context shows it (with its UTC date, when asked and known)."""
        out: dict[str, Any] = {"user": self.user_message, "assistant": self.assistant_response}
        if include_date and self.ts > 0 and (date := date_text(self.ts)):
            out["date"] = date
        if include_digest and self.trajectory_digest is not None:
            out["trajectory_digest"] = self.trajectory_digest.to_llm()
        if self.artifacts_shown:
            out["artifacts"] = dict(self.artifacts_shown)  # never the stored turn's own dict
        return out

    def agent_items(self) -> list[dict[str, Any]]:
        """The user message, the run's items, then the final answer, as agents items."""
        if self.source == "items":
            return [item.to_agents() for item in self.items]
        out: list[dict[str, Any]] = []
        if self.user_message:
            out.append({"role": "user", "content": self.user_message})
        out.extend(item.to_agents() for item in self.items)
        if self.assistant_response:
            out.append({"role": "assistant", "content": self.assistant_response})
        return out


def _check_turn(turn: ConversationTurn) -> None:
    """Every rule of a turn, in order: the first one broken raises `InvalidTurn`."""
    check_text("user_message", turn.user_message)
    check_text("assistant_response", turn.assistant_response)
    check_items_of(turn, "items", MessageItem)
    check_items_of(turn, "entities", EntityMention)
    if not turn.user_message and not turn.assistant_response and not turn.items:
        raise InvalidTurn("turn", "has no user message, no assistant response and no items")
    if turn.trajectory_digest is not None:
        check_type(
            "trajectory_digest", turn.trajectory_digest, TrajectoryDigest, "a TrajectoryDigest or None"
        )
    check_type("artifacts_shown", turn.artifacts_shown, dict, "a dict of JSON values")
    if turn.artifacts_shown:
        check_json("artifacts_shown", turn.artifacts_shown)
    text_tuple(turn, "artifacts_hidden_refs", "artifacts_hidden_refs")
    if turn.source not in ("turn", "items"):
        raise InvalidTurn("source", f"must be 'turn' or 'items', got {kind_of(turn.source)}")
    check_type("ts", turn.ts, (int, float), "an epoch time in seconds (a float)")
    if isinstance(turn.ts, bool):
        raise InvalidTurn("ts", f"must be an epoch time in seconds (a float), got {kind_of(turn.ts)}")
    if isinstance(turn.ts, int):
        msgspec.structs.force_setattr(turn, "ts", float(turn.ts))
    if not math.isfinite(turn.ts) or turn.ts < 0:
        raise InvalidTurn("ts", f"must be a finite epoch time >= 0, got {turn.ts!r}")
    _check_items(turn.items, complete=turn.source == "turn")


def _check_items(items: tuple[MessageItem, ...], *, complete: bool) -> None:
    open_calls: dict[str, int] = {}
    for i, item in enumerate(items):
        if item.kind == "function_call":
            assert item.call_id is not None
            if item.call_id in open_calls:
                raise InvalidTurn(f"items[{i}].call_id", f"{item.call_id!r} is used twice")
            open_calls[item.call_id] = i
        elif item.kind == "function_call_output":
            assert item.call_id is not None
            if item.call_id not in open_calls:
                raise InvalidTurn(
                    f"items[{i}].call_id",
                    f"tool result {item.call_id!r} has no function_call before it in this turn",
                )
            del open_calls[item.call_id]
    if open_calls and complete:
        call_id, i = next(iter(open_calls.items()))
        raise InvalidTurn(
            f"items[{i}].call_id",
            f"function_call {call_id!r} has no result in this turn; a call and its result belong to one turn",
        )
