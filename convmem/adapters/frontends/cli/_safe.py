"""Output that cannot attack its reader: control characters of stored or given text shown as escapes.

A turn, an id or an error may hold ESC sequences (clear the screen, set the
window title, OSC 52 clipboard writes, OSC 8 links), C1 controls, carriage
returns that overwrite a line, or bidi overrides that reorder what a reader
sees. `visible` is the one function that shows them as escapes (``\\x1b``,
``\\u202e``); `json_text` escapes the same characters the JSON way
(``\\u001b``), which JSON decoders read back unchanged. `SafeStream` wraps
stdout and stderr for the whole command (`guarded`), so no path, even one
that forgot to call `visible`, writes a raw control character; on stderr it
also hides credentials (`scrub`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from convmem.adapters._auth import scrub

__all__ = ["SafeStream", "guarded", "json_text", "visible"]

_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[{_CONTROLS}\t\n]")
"""C0 (tab and newline too: one cell, one line), DEL, C1, the bidi controls and the line separators."""
_UNSAFE_IN_LINES = re.compile(f"[{_CONTROLS}]")
"""The same, less newline and tab: what a stream of lines may carry."""
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object, *, lines: bool = False) -> str:
    """`text` with every control character as a visible escape; `lines` keeps newlines and tabs."""
    shown = text if isinstance(text, str) else str(text)
    return (_UNSAFE_IN_LINES if lines else _UNSAFE).sub(_escape, shown)


def json_text(text: str) -> str:
    """JSON `text` with the control characters a JSON encoder leaves raw as ``\\uXXXX`` escapes."""
    return _UNSAFE_IN_LINES.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class SafeStream:
    """A text stream that writes through `visible` (lines kept), and through `scrub` when `secret_free`."""

    def __init__(self, stream: TextIO, *, secret_free: bool = False) -> None:
        self.raw = stream
        self._scrub = secret_free

    def write(self, text: str) -> int:
        shown = visible(text, lines=True)
        if self._scrub:
            shown = scrub(shown)
        self.raw.write(shown)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding...
        return getattr(self.raw, name)


def raw_stream(stream: TextIO) -> TextIO:
    """The stream under a `SafeStream` (for a progress bar's own escape codes), else `stream`."""
    return stream.raw if isinstance(stream, SafeStream) else stream


@contextmanager
def guarded() -> Iterator[None]:
    """stdout and stderr as `SafeStream`s until the block ends."""
    out, err = sys.stdout, sys.stderr
    sys.stdout = SafeStream(out)
    sys.stderr = SafeStream(err, secret_free=True)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
