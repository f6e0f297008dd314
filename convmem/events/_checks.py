"""The checks every turn field goes through: types, text limits, UTF-8, JSON artifacts.

`ConversationTurn` and its parts (`_turn`) run them in ``__post_init__``, on
every turn a planner builds and every turn decoded from the log; a value that
breaks one raises `InvalidTurn` naming its field (``artifacts_shown.rows[0]``),
never a bare `TypeError` from deeper in.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

import msgspec

from convmem.errors import InvalidTurn

__all__ = [
    "MAX_TEXT_LENGTH",
    "MAX_TURN_ITEMS",
    "as_stored",
    "check_finite",
    "check_items_of",
    "check_json",
    "check_strings",
    "check_text",
    "check_type",
    "has_lone_surrogate",
    "kind_of",
    "optional_text",
    "storing",
    "text_tuple",
]

MAX_TEXT_LENGTH = 1_000_000
"""Longest single text field, in characters: a turn is memory, not a document store."""

MAX_TURN_ITEMS = 10_000
"""Most agent items one write may carry, and one turn built from items may hold (a user message
opens the next turn): a write is refused past it, so no request can make a turn of any size."""


def has_lone_surrogate(value: str) -> bool:
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


_STORED: ContextVar[bool] = ContextVar("convmem_stored_values", default=False)
"""True while decoding values already stored: rules added later than them are not applied (`as_stored`)."""


@contextmanager
def as_stored() -> Iterator[None]:
    """Decode values that were stored before a rule for new values existed.

    NaN and the infinities in a turn's artifacts, an item's `raw` that is not
    the JSON of an object, and a configuration's seconds over a day (or more
    back-off intervals than it may hold) are refused when a turn or a
    configuration is built; an event or a snapshot that a version before that
    rule stored holding one still decodes (replay never loses a stored
    session). The codecs use this only after a strict decode failed.
    """
    token = _STORED.set(True)
    try:
        yield
    finally:
        _STORED.reset(token)


def storing() -> bool:
    """Whether the rules for new values apply (False inside `as_stored`)."""
    return not _STORED.get()


_JSON_DEPTH = 64
"""Deepest nesting of lists and objects in an artifact (deeper is refused, not recursed into)."""

_INT_RANGE = (-(2**63), 2**64 - 1)
"""The integers MessagePack (the log's encoding) can store."""


def kind_of(value: object) -> str:
    """How an error names a value of the wrong type: its type and a short repr."""
    shown = repr(value)
    return f"{type(value).__name__} {shown[:60]}{'...' if len(shown) > 60 else ''}"


def check_type(field: str, value: object, kinds: type | tuple[type, ...], wanted: str) -> None:
    if not isinstance(value, kinds):
        raise InvalidTurn(field, f"must be {wanted}, got {kind_of(value)}")


def check_text(field: str, value: str) -> None:
    check_type(field, value, str, "a string")
    if len(value) > MAX_TEXT_LENGTH:
        raise InvalidTurn(field, f"is {len(value)} characters long, over {MAX_TEXT_LENGTH}")
    if "\x00" in value:
        raise InvalidTurn(field, "contains a NUL character")
    check_strings(field, value)


def check_strings(field: str, value: object) -> None:
    """Every string in `value` must be encodable as UTF-8 (no lone surrogate), or it cannot be stored."""
    if isinstance(value, str):
        if has_lone_surrogate(value):
            raise InvalidTurn(field, "contains a lone surrogate, which cannot be stored as UTF-8")
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            check_strings(field, key)
            check_strings(f"{field}.{key}", inner)
    elif isinstance(value, list | tuple):
        for i, inner in enumerate(value):
            check_strings(f"{field}[{i}]", inner)


def optional_text(field: str, value: str | None) -> None:
    if value is not None:
        check_type(field, value, str, "a string or None")
        check_strings(field, value)


def text_tuple(owner: msgspec.Struct, name: str, field: str) -> None:
    """`owner.name` must be a sequence of strings; a list is kept as the tuple a decode gives."""
    value = getattr(owner, name)
    check_type(field, value, (tuple, list), "a tuple of strings")
    for i, text in enumerate(value):
        check_type(f"{field}[{i}]", text, str, "a string")
    check_strings(field, value)
    if isinstance(value, list):
        msgspec.structs.force_setattr(owner, name, tuple(value))


def check_json(field: str, value: object, depth: int = 0) -> None:
    """`value` must be JSON the log can store: strings, finite numbers, booleans, null, lists, objects.

    NaN and the infinities are refused: JSON (the service's replies, `to_dict`, exports) cannot carry
    them, so a stored one would read back as ``null`` and a replay of an export would differ.
    """
    if isinstance(value, str):
        if has_lone_surrogate(value):
            raise InvalidTurn(field, "contains a lone surrogate, which cannot be stored as UTF-8")
    elif value is None or isinstance(value, bool):
        return
    elif isinstance(value, float):
        if not math.isfinite(value) and storing():
            raise InvalidTurn(
                field, f"is the number {value!r}, which JSON cannot carry (finite numbers only)"
            )
    elif isinstance(value, int):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise InvalidTurn(field, f"is the integer {value}, outside the 64-bit range the log stores")
    elif depth >= _JSON_DEPTH:
        raise InvalidTurn(field, f"nests lists and objects deeper than {_JSON_DEPTH} levels")
    elif isinstance(value, dict):
        for key, inner in value.items():
            if not isinstance(key, str):
                raise InvalidTurn(field, f"has the key {kind_of(key)}; JSON object keys are strings")
            check_json(field, key, depth)
            check_json(f"{field}.{key}", inner, depth + 1)
    elif isinstance(value, list | tuple):
        for i, inner in enumerate(value):
            check_json(f"{field}[{i}]", inner, depth + 1)
    else:
        raise InvalidTurn(
            field,
            f"holds {kind_of(value)}, which is not JSON (strings, numbers, booleans, None, lists and "
            "dicts with string keys)",
        )


def check_finite(field: str, value: object, depth: int = 0) -> None:
    """Every float in `value` must be finite and its lists and objects nest at most 64 levels.

    For values that are JSON by another check (an agent SDK's item, which msgspec encodes): NaN and
    the infinities would be written as ``null`` and read back changed, and a deeper value could not be
    read back at all.
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidTurn(
                field, f"is the number {value!r}, which JSON cannot carry (finite numbers only)"
            )
    elif isinstance(value, Mapping | list | tuple):
        if depth >= _JSON_DEPTH:
            raise InvalidTurn(field, f"nests lists and objects deeper than {_JSON_DEPTH} levels")
        if isinstance(value, Mapping):
            for key, inner in value.items():
                check_finite(f"{field}.{key}", inner, depth + 1)
        else:
            for i, inner in enumerate(value):
                check_finite(f"{field}[{i}]", inner, depth + 1)


def check_items_of(owner: msgspec.Struct, name: str, kind: type) -> None:
    """`owner.name` must be a sequence of `kind`; a list is kept as the tuple a decode gives."""
    value = getattr(owner, name)
    check_type(name, value, (tuple, list), f"a tuple of {kind.__name__}")
    for i, inner in enumerate(value):
        check_type(f"{name}[{i}]", inner, kind, f"a {kind.__name__}")
    if isinstance(value, list):
        msgspec.structs.force_setattr(owner, name, tuple(value))
