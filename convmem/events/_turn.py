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
from convmem.events._dates import date_text

__all__ = [
    "ConversationTurn",
    "EntityMention",
    "ItemKind",
    "MessageItem",
    "TrajectoryDigest",
]

MAX_TEXT_LENGTH = 1_000_000
"""Longest single text field, in characters: a turn is memory, not a document store."""

ItemKind = Literal["message", "function_call", "function_call_output", "reasoning", "other"]
_ITEM_KINDS: tuple[str, ...] = ("message", "function_call", "function_call_output", "reasoning", "other")
_ROLES: tuple[str, ...] = ("user", "assistant", "system", "developer")


_INF = math.inf


def _has_lone_surrogate(value: str) -> bool:
    """True when `value` holds a lone surrogate, so it cannot be encoded as UTF-8 (nor stored).

    Strict UTF-8 encoding fails exactly on the code points U+D800..U+DFFF, and
    it runs in C several times faster than a regular-expression scan; ASCII
    text, the common case, cannot hold one and is not encoded at all.
    """
    if value.isascii():
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return True
    return False


_JSON_DEPTH = 64
"""Deepest nesting of lists and objects in an artifact (deeper is refused, not recursed into)."""

_INT_RANGE = (-(2**63), 2**64 - 1)
"""The integers MessagePack (the log's encoding) can store."""


def _kind(value: object) -> str:
    """How an error names a value of the wrong type: its type and a short repr."""
    shown = repr(value)
    return f"{type(value).__name__} {shown[:60]}{'...' if len(shown) > 60 else ''}"


def _check_type(field: str, value: object, kinds: type | tuple[type, ...], wanted: str) -> None:
    if not isinstance(value, kinds):
        raise InvalidTurn(field, f"must be {wanted}, got {_kind(value)}")


def _check_text(field: str, value: str) -> None:
    _check_type(field, value, str, "a string")
    if len(value) > MAX_TEXT_LENGTH:
        raise InvalidTurn(field, f"is {len(value)} characters long, over {MAX_TEXT_LENGTH}")
    if "\x00" in value:
        raise InvalidTurn(field, "contains a NUL character")
    _check_strings(field, value)


def _check_strings(field: str, value: object) -> None:
    """Every string in `value` must be encodable as UTF-8 (no lone surrogate), or it cannot be stored."""
    if isinstance(value, str):
        if _has_lone_surrogate(value):
            raise InvalidTurn(field, "contains a lone surrogate, which cannot be stored as UTF-8")
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            _check_strings(field, key)
            _check_strings(f"{field}.{key}", inner)
    elif isinstance(value, list | tuple):
        for i, inner in enumerate(value):
            _check_strings(f"{field}[{i}]", inner)


def _optional_text(field: str, value: str | None) -> None:
    if value is not None:
        _check_type(field, value, str, "a string or None")
        _check_strings(field, value)


def _text_tuple(owner: msgspec.Struct, name: str, field: str) -> None:
    """`owner.name` must be a sequence of strings; a list is kept as the tuple a decode gives."""
    value = getattr(owner, name)
    _check_type(field, value, (tuple, list), "a tuple of strings")
    for i, text in enumerate(value):
        _check_type(f"{field}[{i}]", text, str, "a string")
    _check_strings(field, value)
    if isinstance(value, list):
        msgspec.structs.force_setattr(owner, name, tuple(value))


def _check_json(field: str, value: object, depth: int = 0) -> None:
    """`value` must be JSON the log can store: strings, numbers, booleans, null, lists, objects."""
    if isinstance(value, str):
        if _has_lone_surrogate(value):
            raise InvalidTurn(field, "contains a lone surrogate, which cannot be stored as UTF-8")
    elif value is None or isinstance(value, bool | float):
        return
    elif isinstance(value, int):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise InvalidTurn(field, f"is the integer {value}, outside the 64-bit range the log stores")
    elif depth >= _JSON_DEPTH:
        raise InvalidTurn(field, f"nests lists and objects deeper than {_JSON_DEPTH} levels")
    elif isinstance(value, dict):
        for key, inner in value.items():
            if not isinstance(key, str):
                raise InvalidTurn(field, f"has the key {_kind(key)}; JSON object keys are strings")
            _check_json(field, key, depth)
            _check_json(f"{field}.{key}", inner, depth + 1)
    elif isinstance(value, list | tuple):
        for i, inner in enumerate(value):
            _check_json(f"{field}[{i}]", inner, depth + 1)
    else:
        raise InvalidTurn(
            field,
            f"holds {_kind(value)}, which is not JSON (strings, numbers, booleans, None, lists and "
            "dicts with string keys)",
        )


def _check_items_of(owner: msgspec.Struct, name: str, kind: type) -> None:
    """`owner.name` must be a sequence of `kind`; a list is kept as the tuple a decode gives."""
    value = getattr(owner, name)
    _check_type(name, value, (tuple, list), f"a tuple of {kind.__name__}")
    for i, inner in enumerate(value):
        _check_type(f"{name}[{i}]", inner, kind, f"a {kind.__name__}")
    if isinstance(value, list):
        msgspec.structs.force_setattr(owner, name, tuple(value))


class TrajectoryDigest(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """Compressed record of the tools a turn used (the seed's fields)."""

    tools_invoked: tuple[str, ...] = ()
    observations_summary: str = ""
    reasoning_summary: str | None = None
    artifacts_refs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_text("trajectory_digest.observations_summary", self.observations_summary)
        if self.reasoning_summary is not None:
            _check_text("trajectory_digest.reasoning_summary", self.reasoning_summary)
        _text_tuple(self, "tools_invoked", "trajectory_digest.tools_invoked")
        for i, name in enumerate(self.tools_invoked):
            if not name:
                raise InvalidTurn(f"trajectory_digest.tools_invoked[{i}]", "must not be empty")
        _text_tuple(self, "artifacts_refs", "trajectory_digest.artifacts_refs")

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
            raise InvalidTurn("kind", f"must be one of {', '.join(_ITEM_KINDS)}, got {_kind(self.kind)}")
        if self.role is not None and self.role not in _ROLES:
            raise InvalidTurn("role", f"must be one of {', '.join(_ROLES)} or None, got {_kind(self.role)}")
        _check_text("content", self.content)
        for field in ("call_id", "name", "arguments", "output", "raw"):
            _optional_text(field, getattr(self, field))
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
        _check_type("entities.name", self.name, str, "a string")
        if not self.name.strip():
            raise InvalidTurn("entities.name", "must not be blank")
        _check_strings("entities.name", self.name)
        _optional_text("entities.kind", self.kind)
        _check_type("entities.attributes", self.attributes, dict, "a dict of strings")
        for name, value in self.attributes.items():
            _check_type("entities.attributes", name, str, "keyed by strings")
            _check_type(f"entities.attributes.{name}", value, str, "a string")
        _check_strings("entities.attributes", self.attributes)


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
            and (user.isascii() or not _has_lone_surrogate(user))
            and (answer.isascii() or not _has_lone_surrogate(answer))
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
    _check_text("user_message", turn.user_message)
    _check_text("assistant_response", turn.assistant_response)
    _check_items_of(turn, "items", MessageItem)
    _check_items_of(turn, "entities", EntityMention)
    if not turn.user_message and not turn.assistant_response and not turn.items:
        raise InvalidTurn("turn", "has no user message, no assistant response and no items")
    if turn.trajectory_digest is not None:
        _check_type(
            "trajectory_digest", turn.trajectory_digest, TrajectoryDigest, "a TrajectoryDigest or None"
        )
    _check_type("artifacts_shown", turn.artifacts_shown, dict, "a dict of JSON values")
    if turn.artifacts_shown:
        _check_json("artifacts_shown", turn.artifacts_shown)
    _text_tuple(turn, "artifacts_hidden_refs", "artifacts_hidden_refs")
    if turn.source not in ("turn", "items"):
        raise InvalidTurn("source", f"must be 'turn' or 'items', got {_kind(turn.source)}")
    _check_type("ts", turn.ts, (int, float), "an epoch time in seconds (a float)")
    if isinstance(turn.ts, bool):
        raise InvalidTurn("ts", f"must be an epoch time in seconds (a float), got {_kind(turn.ts)}")
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
