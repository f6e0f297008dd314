"""Master keys: what wraps the data keys, from a file, an environment variable, or a `KeyProvider`.

A master key never encrypts an event; it wraps (AES-256-GCM) each data key
stored in the key store. `KeyProvider` is the protocol a KMS implements
(wrap and unwrap by the KMS, the key never leaving it); `LocalMasterKeys` is
the provider for keys held here: one that wraps now, and older ones that
still unwrap (during a rotation). Every key has an id (`master_id`), stored
beside each data key it wrapped, so a wrong key is told apart from damage.

A key is 32 random bytes written as base64 (or 64 hex digits), in a file or
an environment variable. The embedded default generates one in the data
folder (`embedded_master_key`) and says so, loudly, once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from convmem.adapters._files import read_limited
from convmem.errors import EncryptionKeyError, InvalidInput

__all__ = [
    "MASTER_KEY_ENV",
    "KeyProvider",
    "LocalMasterKeys",
    "embedded_master_key",
    "generate_key_text",
    "master_key_from_env",
    "master_key_from_file",
    "parse_master_key",
    "pending_key_file",
    "sync_dir",
    "write_key_file",
]

MASTER_KEY_ENV = "CONVMEM_MASTER_KEY"
MAX_KEY_FILE_BYTES = 64 << 10
"""A master key file holds at most this many bytes (a key is 44 characters of base64)."""
"""The environment variable a master key is read from by default (base64 of 32 bytes)."""

_NONCE = 12
_log = logging.getLogger("convmem.keys")


@runtime_checkable
class KeyProvider(Protocol):
    """Wraps and unwraps data keys with a master key it holds (or a KMS holds for it).

    `source` names where the master key lives, for errors. `master_id` is the
    id of the key that wraps now; `unwrap` is given the id a data key was
    wrapped under and raises `EncryptionKeyError` (naming `source`) when it
    does not hold that key or the wrapped bytes do not authenticate.
    `context` is bound to the wrapped bytes (associated data).
    """

    @property
    def source(self) -> str: ...

    @property
    def master_id(self) -> str: ...

    def knows(self, master_id: str) -> bool: ...

    def wrap(self, data_key: bytes, context: bytes) -> bytes: ...

    def unwrap(self, master_id: str, wrapped: bytes, context: bytes) -> bytes: ...


def _master_id(key: bytes) -> str:
    return hashlib.sha256(b"convmem-master-key-id\0" + key).hexdigest()[:16]


class LocalMasterKeys:
    """A `KeyProvider` on keys held in this process: the first wraps, every one unwraps."""

    def __init__(self, keys: Sequence[bytes], *, source: str) -> None:
        if not keys:
            raise EncryptionKeyError("no master key given", source=source)
        for key in keys:
            if len(key) != 32:
                raise EncryptionKeyError(f"a master key must be 32 bytes, got {len(key)}", source=source)
        self._source = source
        self._aeads = {_master_id(k): AESGCM(k) for k in keys}
        self._current = _master_id(keys[0])

    @property
    def source(self) -> str:
        return self._source

    @property
    def master_id(self) -> str:
        return self._current

    def knows(self, master_id: str) -> bool:
        return master_id in self._aeads

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        nonce = os.urandom(_NONCE)
        return nonce + self._aeads[self._current].encrypt(nonce, data_key, context)

    def unwrap(self, master_id: str, wrapped: bytes, context: bytes) -> bytes:
        aead = self._aeads.get(master_id)
        if aead is None:
            raise EncryptionKeyError(
                f"a data key is wrapped by master key {master_id}, which this source does not hold "
                f"(it holds {', '.join(self._aeads)}): the wrong master key, or a rotation was not finished",
                source=self._source,
            )
        try:
            return aead.decrypt(wrapped[:_NONCE], wrapped[_NONCE:], context)
        except (InvalidTag, ValueError):
            raise EncryptionKeyError(
                f"a data key wrapped by master key {master_id} does not unwrap with it (its stored bytes "
                "were damaged or tampered with)",
                source=self._source,
            ) from None

    def __repr__(self) -> str:
        return f"LocalMasterKeys({self._source!r}, master_id={self._current!r})"


def generate_key_text() -> str:
    """A new master key: 32 random bytes in base64, as a key file or variable holds it."""
    return base64.b64encode(os.urandom(32)).decode("ascii")


def parse_master_key(text: str, *, source: str) -> bytes:
    """32 bytes from base64 or hex text; `EncryptionKeyError` naming `source` otherwise."""
    value = text.strip()
    if not value:
        raise EncryptionKeyError("is empty; a master key is 32 random bytes in base64", source=source)
    if len(value) == 64:
        try:
            return bytes.fromhex(value)
        except ValueError:
            pass
    try:
        key = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise EncryptionKeyError(
            "is not a master key: expected 32 bytes in base64 (44 characters) or 64 hex digits "
            "(make one with `convmem keys generate`)",
            source=source,
        ) from None
    if len(key) != 32:
        raise EncryptionKeyError(f"holds {len(key)} bytes; a master key is 32 bytes", source=source)
    return key


def master_key_from_file(path: str | os.PathLike[str]) -> LocalMasterKeys:
    """The master key in the file at `path` (an unfinished rotation's ``.new`` key beside it first)."""
    file = Path(path)
    source = f"master key file {file}"
    keys = [parse_master_key(_key_text(file, source), source=source)]
    pending = pending_key_file(file)
    if pending.exists():
        _log.warning(
            "%s: a master key rotation was interrupted (%s is there); run `convmem keys rotate` to finish it",
            file,
            pending,
        )
        pending_source = f"master key file {pending}"
        keys.insert(0, parse_master_key(_key_text(pending, pending_source), source=pending_source))
    return LocalMasterKeys(keys, source=source)


def _key_text(file: Path, source: str) -> str:
    """The text of a key file; `EncryptionKeyError` naming `source` when it is missing or unreadable."""
    try:
        return read_limited(file, MAX_KEY_FILE_BYTES).decode("ascii")
    except FileNotFoundError:
        raise EncryptionKeyError(
            "does not exist: give the file that holds the master key this store was written with",
            source=source,
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EncryptionKeyError(f"cannot be read ({exc})", source=source) from None
    except InvalidInput as exc:
        raise EncryptionKeyError(f"cannot be read: it {exc.problem}", source=source) from None


def master_key_from_env(name: str = MASTER_KEY_ENV) -> LocalMasterKeys:
    """The master key in the environment variable `name`."""
    source = f"environment variable {name}"
    text = os.environ.get(name)
    if text is None:
        raise EncryptionKeyError(
            "is not set: set it to the store's master key (base64 of 32 bytes)", source=source
        )
    return LocalMasterKeys([parse_master_key(text, source=source)], source=source)


def pending_key_file(file: Path) -> Path:
    """Where a rotation of the key file `file` keeps the new key until it is done."""
    return file.with_name(file.name + ".new")


def write_key_file(path: Path, text: str) -> None:
    """Create `path` (readable by its owner only) holding `text`; never replaces an existing file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(text + "\n")
        out.flush()
        os.fsync(out.fileno())
    sync_dir(path.parent)


def sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def embedded_master_key(path: Path, *, may_create: bool) -> LocalMasterKeys:
    """The embedded default's master key at `path`, generated there when missing and `may_create`.

    `may_create` is False once the key store holds keys: a missing master key
    is then an error (a new one would read nothing), never silently replaced.
    """
    if path.exists() or not may_create:
        return master_key_from_file(path)
    try:
        write_key_file(path, generate_key_text())
    except FileExistsError:
        return master_key_from_file(path)  # another process made it first
    note = (
        f"convmem: generated a master key for encryption at rest at {path}. Back it up SEPARATELY "
        "from the data (never in the same backup as the event store): without it nothing stored can "
        "be read, and a copy kept beside the events defeats erasure by key deletion."
    )
    if _log.hasHandlers() and _log.isEnabledFor(logging.WARNING):
        _log.warning("%s", note)
    else:  # nobody configured logging: the note must still be seen
        print(note, file=sys.stderr, flush=True)
    return master_key_from_file(path)
