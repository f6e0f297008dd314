"""Rotating keys without rewriting history: master keys rewrap data keys; data keys get new versions.

Stored events and snapshots are never touched. Each sealed payload names the
data key that sealed it, and each data key names the master key that wraps
it, so after a rotation old bytes open exactly as before.

* `rotate_master_file(path, store)`: a new master key is written beside the
  old one (``master.key.new``), every data key is rewrapped with it, then it
  replaces the old file. Interrupted, the next open holds both keys (nothing
  is unreadable) and running it again finishes it.
* `rotate_master(old, new, store)`: the same toward any other `KeyProvider`
  (a key from another file, a variable, a KMS); switch the configuration to
  the new source afterwards.
* `Keyring.rotate_data_keys()`: every user gets a new data key for new bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from convmem.adapters.backends.keys._keyring import Keyring
from convmem.adapters.backends.keys._master import (
    KeyProvider,
    LocalMasterKeys,
    _key_text,
    generate_key_text,
    parse_master_key,
    pending_key_file,
    sync_dir,
    write_key_file,
)
from convmem.adapters.backends.keys._stores import KeyStore
from convmem.errors import EncryptionKeyError

__all__ = ["rotate_master", "rotate_master_file"]


def rotate_master_file(path: str | os.PathLike[str], store: KeyStore) -> tuple[str, int]:
    """Replace the master key in the file at `path` by a new one; (its id, data keys rewrapped)."""
    file = Path(path)
    source = f"master key file {file}"
    if not file.exists():
        raise EncryptionKeyError("does not exist: nothing to rotate", source=source)
    old = parse_master_key(_key_text(file, source), source=source)
    pending = pending_key_file(file)
    if not pending.exists():
        write_key_file(pending, generate_key_text())
    new_source = f"master key file {pending}"
    new = parse_master_key(_key_text(pending, new_source), source=new_source)
    provider = LocalMasterKeys([new, old], source=source)
    keyring = Keyring(provider, store)
    rewrapped = keyring.rotate_master(provider)
    os.replace(pending, file)
    sync_dir(file.parent)
    return provider.master_id, rewrapped


def rotate_master(old: KeyProvider, new: KeyProvider, store: KeyStore) -> int:
    """Rewrap every data key in `store` from `old`'s master key to `new`'s; how many were rewrapped.

    The store may be mid-way (some keys under `new` already, its check too): running it
    again finishes a rotation, and rewraps keys a process still running on `old` made after it.
    """
    both = _Both(old, new)
    return Keyring(both, store).rotate_master(both)


class _Both:
    """A `KeyProvider` that wraps with `new` and unwraps with whichever of the two holds the key."""

    def __init__(self, old: KeyProvider, new: KeyProvider) -> None:
        self._old, self._new = old, new

    @property
    def source(self) -> str:
        return self._new.source

    @property
    def master_id(self) -> str:
        return self._new.master_id

    def knows(self, master_id: str) -> bool:
        return self._new.knows(master_id) or self._old.knows(master_id)

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        return self._new.wrap(data_key, context)

    def unwrap(self, master_id: str, wrapped: bytes, context: bytes) -> bytes:
        holder = self._new if self._new.knows(master_id) else self._old
        return holder.unwrap(master_id, wrapped, context)
