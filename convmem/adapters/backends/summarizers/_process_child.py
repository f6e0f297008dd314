"""The child side of `ProcessSummarizer`: ``python -m convmem.adapters.backends.summarizers._process_child``.

Reads framed MessagePack messages on its standard input: first the
summarizer to build (``{"target": "module:attribute", "kwargs": {...}}``),
answered ``{"ready": true}`` or ``{"error": ...}``; then one request per
message, each answered ``{"result": ...}`` or ``{"error": ...}``. It ends
when its input closes. Anything the summarizer prints goes to standard
error, so it cannot break the replies.
"""

from __future__ import annotations

import importlib
import os
import struct
import sys
from typing import Any

import msgspec

_LENGTH = struct.Struct("!I")


def _read(fd: int, size: int) -> bytes | None:
    parts: list[bytes] = []
    while size:
        chunk = os.read(fd, size)
        if not chunk:
            return None
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)


def _receive(fd: int) -> Any:
    header = _read(fd, _LENGTH.size)
    if header is None:
        return None
    body = _read(fd, _LENGTH.unpack(header)[0])
    return None if body is None else msgspec.msgpack.decode(body)


def _send(fd: int, message: dict[str, Any]) -> None:
    data = msgspec.msgpack.encode(message)
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _build(spec: Any) -> Any:
    module, _, name = spec["target"].partition(":")
    factory = getattr(importlib.import_module(module), name)
    return factory(**spec.get("kwargs", {}))


def main() -> None:
    requests, replies = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a print in the summarizer must not reach the pipe
    spec = _receive(requests)
    if spec is None:
        return
    try:
        summarizer = _build(spec)
    except Exception as exc:
        _send(replies, {"error": f"{type(exc).__name__}: {exc}"})
        return
    _send(replies, {"ready": True})
    while (request := _receive(requests)) is not None:
        try:
            _send(replies, {"result": summarizer(request)})
        except Exception as exc:
            _send(replies, {"error": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    main()
