"""Export, import and snapshots of a session state.

* `to_dict` / `parse_export`: the RFC's ``to_dict()`` shape (version 1):
  ``{"version", "health", "summary", "turns", "pending", "backlog",
  "config_snapshot"}``, readable by PenguiFlow's `from_dict`. Anything
  invalid raises `InvalidInput` (a `ValueError`) naming the field.
* `encode_state` / `decode_state` / `state_hash`: a snapshot is the msgpack
  encoding of the state plus the SHA-256 of those bytes; a snapshot is simply
  the first input of the fold.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import msgspec

from convmem.errors import EventDecodeError, InvalidInput
from convmem.events import ConversationTurn, MemoryHealth
from convmem.events._checks import as_stored
from convmem.projections._state import SessionState, TurnRecord

__all__ = [
    "EXPORT_VERSION",
    "decode_state",
    "encode_state",
    "parse_export",
    "state_hash",
    "to_dict",
]

EXPORT_VERSION = 1
_state_encoder = msgspec.msgpack.Encoder(order="deterministic")  # equal states, equal bytes
_state_decoder = msgspec.msgpack.Decoder(SessionState)


def _plain(value: Any) -> Any:
    """Plain JSON data (lists, not tuples), so that an export equals its own JSON round trip."""
    return msgspec.json.decode(msgspec.json.encode(value))


def _dump_turn(record: TurnRecord) -> dict[str, Any]:
    turn = record.turn
    digest = turn.trajectory_digest
    out: dict[str, Any] = {
        "user_message": turn.user_message,
        "assistant_response": turn.assistant_response,
        "trajectory_digest": (
            {
                "tools_invoked": list(digest.tools_invoked),
                "observations_summary": digest.observations_summary,
                "reasoning_summary": digest.reasoning_summary,
                "artifacts_refs": list(digest.artifacts_refs),
            }
            if digest is not None
            else None
        ),
        "artifacts_shown": _plain(turn.artifacts_shown),
        "artifacts_hidden_refs": list(turn.artifacts_hidden_refs),
        "ts": turn.ts,
    }
    if turn.items:
        out["items"] = _plain(turn.items)
    if turn.entities:
        out["entities"] = _plain(turn.entities)
    if turn.source != "turn":
        out["source"] = turn.source
    return out


def to_dict(state: SessionState) -> dict[str, Any]:
    """The RFC's export of the session's memory (JSON-serialisable)."""
    # Only a summarizing session has pending turns; truncation has dropped them (PenguiFlow's shape).
    pending = [_dump_turn(r) for r in state.pending()] if state.config.summarizes else []
    degraded = state.health is MemoryHealth.DEGRADED
    return {
        "version": EXPORT_VERSION,
        "health": state.health.value,
        "summary": state.summary,
        "turns": [_dump_turn(r) for r in state.recent()],
        "pending": [] if degraded else pending,
        "backlog": pending if degraded else [],
        "config_snapshot": _plain(state.config),
    }


def _turns(state: Mapping[str, Any], field: str) -> tuple[ConversationTurn, ...]:
    value = state.get(field)
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidInput(field, f"must be a list of turns, got {type(value).__name__}")
    turns = []
    for i, payload in enumerate(value):
        if not isinstance(payload, Mapping):
            raise InvalidInput(f"{field}[{i}]", f"must be a mapping, got {type(payload).__name__}")
        cleaned = {k: v for k, v in payload.items() if v is not None or k != "trajectory_digest"}
        try:
            turns.append(msgspec.convert(cleaned, ConversationTurn, strict=False))
        except (msgspec.ValidationError, ValueError) as exc:
            raise InvalidInput(f"{field}[{i}]", str(exc)) from None
    return tuple(turns)


def parse_export(state: object) -> tuple[str, MemoryHealth, tuple[ConversationTurn, ...]]:
    """Validate a `to_dict()` mapping: (summary, health, turns oldest first)."""
    if not isinstance(state, Mapping):
        raise InvalidInput("state", f"must be a mapping, got {type(state).__name__}")
    if state.get("version") != EXPORT_VERSION:
        raise InvalidInput("version", f"unsupported memory state version {state.get('version')!r}")
    health = state.get("health")
    if health not in {h.value for h in MemoryHealth}:
        raise InvalidInput("health", f"invalid health value {health!r}")
    summary = state.get("summary")
    if summary is None:
        summary = ""
    if not isinstance(summary, str):
        raise InvalidInput("summary", f"must be a string, got {type(summary).__name__}")
    if "\x00" in summary:
        raise InvalidInput("summary", "contains a NUL character")
    snapshot = state.get("config_snapshot")
    if snapshot is not None and not isinstance(snapshot, Mapping):
        raise InvalidInput("config_snapshot", "must be a mapping")
    turns = _turns(state, "backlog") + _turns(state, "pending") + _turns(state, "turns")
    return summary, MemoryHealth(health), turns


def encode_state(state: SessionState) -> bytes:
    """Snapshot bytes of a state."""
    return _state_encoder.encode(state)


def decode_state(data: bytes) -> SessionState:
    """A state from snapshot bytes; raises `EventDecodeError` with the bad field's path."""
    try:
        return _state_decoder.decode(data)
    except (msgspec.MsgspecError, UnicodeDecodeError, ValueError, OverflowError, RecursionError) as exc:
        # Bad UTF-8 in a string and nesting deeper than msgspec reads are not MsgspecErrors.
        error = exc
    try:  # saved before a rule on new values existed (a configuration's day-long bound): still read
        with as_stored():
            return _state_decoder.decode(data)
    except (msgspec.MsgspecError, UnicodeDecodeError, ValueError, OverflowError, RecursionError):
        pass
    raise EventDecodeError(f"not a session snapshot: {error}") from None


def state_hash(state: SessionState) -> str:
    """SHA-256 (hex) of the state's snapshot bytes: equal states, equal hashes."""
    return hashlib.sha256(encode_state(state)).hexdigest()
