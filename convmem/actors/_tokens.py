"""Token counters: the default estimate, a caller's callable, or a tiktoken encoding loaded by name.

The pure core (`convmem.projections`) only calls the counter it is handed;
loading an encoding reads files, so it happens here. tiktoken is optional
(``pip install 'convmem[tokens]'``); its encoding files come from its cache
(``TIKTOKEN_CACHE_DIR``) or, where the machine may reach it, its download.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from convmem.errors import InvalidConfig
from convmem.projections import TokenEstimator

__all__ = ["TokenCounter", "encoding_counter", "token_counter_of"]

TokenCounter = TokenEstimator | str
"""A `token_counter` setting: a callable ``str -> int``, or the name of a tiktoken encoding."""

_lock = threading.Lock()


@functools.cache
def _encoding(name: str) -> Any:
    try:
        import tiktoken  # noqa: PLC0415 - optional extra, loaded on use
    except ImportError:
        raise InvalidConfig(
            "token_counter",
            f"{name!r} needs tiktoken, which is not installed (pip install 'convmem[tokens]')",
        ) from None
    try:
        return tiktoken.get_encoding(name)
    except ValueError as exc:
        raise InvalidConfig("token_counter", f"tiktoken has no encoding {name!r}: {exc}") from None
    except Exception as exc:
        raise InvalidConfig(
            "token_counter",
            f"tiktoken could not load encoding {name!r} (its files are neither in TIKTOKEN_CACHE_DIR "
            f"nor downloadable here): {type(exc).__name__}: {exc}",
        ) from None


class _EncodingCounter:
    """Counts with a tiktoken encoding; special-token text counts as plain text, never refused."""

    __slots__ = ("_encode", "name")

    def __init__(self, name: str) -> None:
        with _lock:  # one load per name, whichever thread asks first
            encoding = _encoding(name)
        self.name = name
        self._encode = encoding.encode_ordinary

    def __call__(self, text: str) -> int:
        return len(self._encode(text))

    def __repr__(self) -> str:
        return f"<token counter {self.name}>"


@functools.cache
def encoding_counter(name: str) -> TokenEstimator:
    """The counter of tiktoken encoding `name` (`InvalidConfig` when it cannot be loaded)."""
    return _EncodingCounter(name)


def token_counter_of(value: object, field: str = "token_counter") -> TokenEstimator | None:
    """A `token_counter` setting as a callable: None stays None, a name loads its encoding."""
    if value is None or (callable(value) and not isinstance(value, str)):
        return value
    if isinstance(value, str):
        return encoding_counter(value)
    raise InvalidConfig(
        field, f"must be a callable str -> int or a tiktoken encoding name, got {type(value).__name__}"
    )
