"""`MemoryKey`: the isolation boundary of every session.

Ids are arbitrary strings (e-mail addresses, dotted ids, unicode) so the key
needs two encodings that no id can escape:

* `composite()` gives the seeds' ``tenant:user:session`` with ``\\`` and ``:``
  escaped, so that ``MemoryKey("a:b", "c", "d")`` and ``MemoryKey("a", "b:c", "d")``
  never share a composite.
* `tokens()` gives one log-subject token per id. Letters, digits, ``_`` and
  ``-`` stand for themselves; every other character becomes ``=XX`` per UTF-8
  byte (``=`` itself included). The result never holds ``.``, ``*``, ``>``,
  ``:`` or whitespace, is a valid NATS subject token and JetStream KV key
  token, reads well for ordinary ids (``acme_corp``) and is injective.
"""

from __future__ import annotations

import re

import msgspec

from convmem.errors import InvalidKey

__all__ = ["MAX_ID_LENGTH", "MemoryKey", "decode_token", "encode_token"]

MAX_ID_LENGTH = 256
"""Longest id, in characters, that a key accepts."""

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_HEX = "0123456789ABCDEF"
_PLAIN = re.compile(r"[A-Za-z0-9_\-]+")
"""An id (or token) of safe characters only: its token is itself (the common case, checked in C)."""


def _check_id(field: str, value: object) -> None:
    if not isinstance(value, str):
        raise InvalidKey(field, f"must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidKey(field, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidKey(field, f"is {len(value)} characters long, over the limit of {MAX_ID_LENGTH}")
    if value.isascii() and value.isprintable():  # only U+0020..U+007E: nothing below can refuse it
        return
    for position, char in enumerate(value):
        code = ord(char)
        if code < 0x20 or 0x7F <= code < 0xA0 or 0xD800 <= code <= 0xDFFF:
            raise InvalidKey(
                field, f"has a control or surrogate character U+{code:04X} at position {position}"
            )


def encode_token(value: str) -> str:
    """Encode one id as a subject token that cannot address another id."""
    if _PLAIN.fullmatch(value):
        return value
    out: list[str] = []
    for char in value:
        if char in _SAFE:
            out.append(char)
        else:
            for byte in char.encode("utf-8"):
                out.append("=" + _HEX[byte >> 4] + _HEX[byte & 0xF])
    return "".join(out)


def decode_token(token: str) -> str:
    """Invert `encode_token`; raises `InvalidKey` for a token it could not have made."""
    if _PLAIN.fullmatch(token):
        return token  # no escapes: the id itself, in canonical form
    raw = bytearray()
    i = 0
    while i < len(token):
        char = token[i]
        if char == "=":
            pair = token[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in _HEX for c in pair):
                raise InvalidKey("token", f"bad escape {token[i : i + 3]!r} at position {i}")
            raw.append(int(pair, 16))
            i += 3
        elif char in _SAFE:
            raw.extend(char.encode("ascii"))
            i += 1
        else:
            raise InvalidKey("token", f"character {char!r} at position {i} is never produced")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidKey("token", f"escapes are not UTF-8: {exc.reason}") from None
    if encode_token(text) != token:
        raise InvalidKey("token", "is not in canonical form")
    return text


def _escape_composite(value: str) -> str:
    return value.replace("\\", "\\\\").replace(":", "\\:")


class MemoryKey(msgspec.Struct, frozen=True, gc=False, kw_only=False):
    """Composite key for memory isolation: one session of one user of one tenant."""

    tenant_id: str
    user_id: str
    session_id: str

    def __post_init__(self) -> None:
        _check_id("tenant_id", self.tenant_id)
        _check_id("user_id", self.user_id)
        _check_id("session_id", self.session_id)

    def composite(self) -> str:
        """``tenant:user:session``, with ``\\`` and ``:`` inside ids escaped."""
        return ":".join(_escape_composite(v) for v in (self.tenant_id, self.user_id, self.session_id))

    @classmethod
    def from_composite(cls, composite: str) -> MemoryKey:
        """Parse what `composite()` produced."""
        parts: list[str] = []
        current: list[str] = []
        chars = iter(composite)
        for char in chars:
            if char == "\\":
                nxt = next(chars, None)
                if nxt not in ("\\", ":"):
                    raise InvalidKey("composite", f"bad escape in {composite!r}")
                current.append(nxt)
            elif char == ":":
                parts.append("".join(current))
                current = []
            else:
                current.append(char)
        parts.append("".join(current))
        if len(parts) != 3:
            raise InvalidKey(
                "composite", f"{composite!r} has {len(parts)} parts, expected tenant:user:session"
            )
        return cls(parts[0], parts[1], parts[2])

    def tokens(self) -> tuple[str, str, str]:
        """The key's three subject tokens (tenant, user, session), safely encoded."""
        return (
            encode_token(self.tenant_id),
            encode_token(self.user_id),
            encode_token(self.session_id),
        )

    @classmethod
    def from_tokens(cls, tenant: str, user: str, session: str) -> MemoryKey:
        """Rebuild a key from the tokens `tokens()` gave."""
        return cls(decode_token(tenant), decode_token(user), decode_token(session))

    def __str__(self) -> str:
        return self.composite()
