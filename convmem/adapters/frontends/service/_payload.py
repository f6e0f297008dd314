"""Where in a request payload the decoder gave up: the path of a too-deep value or a non-UTF-8 string.

msgspec refuses a payload nested deeper than Python's recursion limit with a
bare `RecursionError`, and a string that is not UTF-8 with a bare
`UnicodeDecodeError`; neither says where. `locate` walks the raw bytes (JSON
or msgpack) without recursion and names the first place that breaks either
rule (``items[0].extra[0][0]``), so the error a client gets names its field.
It runs only after a decode has failed, and stops at the first problem.
"""

from __future__ import annotations

import re
import struct

__all__ = ["MAX_DEPTH", "locate"]

MAX_DEPTH = 128
"""Nesting reported as too deep: past any value the protocol takes (a turn's artifacts nest at most 64)."""

_PATH_PARTS = 6
"""How many keys and indexes of a path an error shows (the rest of a deep path is ``...``)."""

_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]', re.S)


class _Frame:
    """One open list or object: its kind, the current index or key, what comes next."""

    __slots__ = ("expect_key", "index", "is_map", "key", "left")

    def __init__(self, is_map: bool, left: int = -1) -> None:
        self.is_map = is_map
        self.key = "?"
        self.index = 0
        self.expect_key = is_map
        self.left = left  # msgpack: elements still to read (keys and values counted apart)


def _path(stack: list[_Frame]) -> str:
    parts: list[str] = []
    for frame in stack[:_PATH_PARTS]:
        if frame.is_map:
            parts.append(("." if parts else "") + frame.key)
        else:
            parts.append(f"[{frame.index}]")
    if len(stack) > _PATH_PARTS:
        parts.append("...")
    return "".join(parts) or "payload"


def _too_deep(stack: list[_Frame]) -> tuple[str, str]:
    return _path(stack), f"nests lists and objects more than {MAX_DEPTH} levels deep"


def _not_utf8(stack: list[_Frame], is_key: bool) -> tuple[str, str]:
    what = "a key" if is_key else "a string"
    return _path(stack), f"holds {what} that is not valid UTF-8"


def locate(data: bytes, *, msgpack: bool) -> tuple[str, str] | None:
    """(path, problem) of the first value nested past `MAX_DEPTH` or string not UTF-8; None if neither."""
    try:
        return _locate_msgpack(data) if msgpack else _locate_json(data)
    except (IndexError, struct.error):  # truncated: the decoder's own error says so
        return None


def _locate_json(data: bytes) -> tuple[str, str] | None:
    stack: list[_Frame] = []
    for match in _JSON_TOKEN.finditer(data):
        token = match.group()
        top = stack[-1] if stack else None
        if token in (b"{", b"["):
            if len(stack) >= MAX_DEPTH:
                return _too_deep(stack)
            stack.append(_Frame(token == b"{"))
        elif token in (b"}", b"]"):
            if stack:
                stack.pop()
        elif token == b":":
            if top is not None:
                top.expect_key = False
        elif token == b",":
            if top is not None:
                top.index += 1
                top.expect_key = top.is_map
        else:  # a string
            try:
                text = token[1:-1].decode()
            except UnicodeDecodeError:
                return _not_utf8(stack, top is not None and top.expect_key)
            if top is not None and top.expect_key:
                top.key = text
    return None


_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_FIXED |= {0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}
_SIZED = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1)}
_STRINGS = {0xD9: 1, 0xDA: 2, 0xDB: 4}
_CONTAINERS = {0xDC: (2, False), 0xDD: (4, False), 0xDE: (2, True), 0xDF: (4, True)}
_WIDTH = {1: ">B", 2: ">H", 4: ">I"}


def _locate_msgpack(data: bytes) -> tuple[str, str] | None:
    stack: list[_Frame] = []
    pos, end = 0, len(data)
    while pos < end:
        byte = data[pos]
        pos += 1
        top = stack[-1] if stack else None
        is_key = top is not None and top.expect_key
        container: tuple[int, bool] | None = None
        if byte <= 0x7F or byte >= 0xE0:
            pass
        elif byte <= 0x8F:
            container = (byte & 0x0F, True)
        elif byte <= 0x9F:
            container = (byte & 0x0F, False)
        elif byte <= 0xBF or byte in _STRINGS:
            if byte <= 0xBF:
                size = byte & 0x1F
            else:
                width = _STRINGS[byte]
                (size,) = struct.unpack_from(_WIDTH[width], data, pos)
                pos += width
            raw = data[pos : pos + size]
            pos += size
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                return _not_utf8(stack, is_key)
            if is_key and top is not None:
                top.key = text
        elif byte in _FIXED:
            pos += _FIXED[byte]
        elif byte in _SIZED:
            width, extra = _SIZED[byte]
            (size,) = struct.unpack_from(_WIDTH[width], data, pos)
            pos += width + extra + size
        elif byte in _CONTAINERS:
            width, is_map = _CONTAINERS[byte]
            (count,) = struct.unpack_from(_WIDTH[width], data, pos)
            pos += width
            container = (count, is_map)
        else:
            return None  # 0xC1, never used: the decoder says so
        if container is not None:
            if len(stack) >= MAX_DEPTH:
                return _too_deep(stack)
            count, is_map = container
            if count:
                stack.append(_Frame(is_map, count * 2 if is_map else count))
                continue
        _advance(stack)
    return None


def _advance(stack: list[_Frame]) -> None:
    """One element of the innermost open container is read; close every container that is full."""
    while stack:
        top = stack[-1]
        top.left -= 1
        if top.is_map:
            top.expect_key = not top.expect_key
            if top.expect_key:
                top.index += 1
        else:
            top.index += 1
        if top.left > 0:
            return
        stack.pop()
