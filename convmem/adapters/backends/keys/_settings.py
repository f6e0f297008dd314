"""`KeySettings`: where the master key and the key store are, as every entry point takes them.

Resolution, first match wins:

* the master key: `master_key_file`; else the environment variable
  `master_key_env`; else ``CONVMEM_MASTER_KEY`` when it is set; else, for the
  embedded default (a data folder), ``<data folder>/master.key``, generated
  on first use; else there is no encryption (a NATS URL with no key given:
  events are stored as before, and a store that holds sealed events needs
  its key to be read);
* the key store: `key_store` (a folder path, or ``nats`` / ``nats:BUCKET``
  for a key-value bucket on the events' server); else ``<data folder>/keys``
  for the embedded default; else the NATS bucket ``CONVMEM_KEYS``.

``encrypt=False`` turns encryption off whatever is found (sealed events
already stored still open when a key is given; without one they are errors).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from convmem.adapters.backends.keys._master import (
    MASTER_KEY_ENV,
    KeyProvider,
    embedded_master_key,
    master_key_from_env,
    master_key_from_file,
)
from convmem.errors import InvalidConfig

__all__ = ["MASTER_KEY_FILE", "KeySettings", "master_source", "store_spec"]

MASTER_KEY_FILE = "master.key"
KEYS_DIR = "keys"


class KeySettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where the master key and the data keys are (each optional; see the module's rules)."""

    encrypt: bool | None = None
    """False: store events unencrypted. True: refuse to run without a master key. None: as found."""
    master_key_file: str | None = None
    """A file holding the master key (base64 of 32 bytes)."""
    master_key_env: str | None = None
    """The name of an environment variable holding the master key."""
    key_store: str | None = None
    """A folder for the data keys, or ``nats`` / ``nats:BUCKET`` (a key-value bucket on the server)."""
    data_dir: str | None = None
    """The embedded default's data folder: ``master.key`` and ``keys/`` there when nothing else is given."""

    def with_data_dir(self, data_dir: str | os.PathLike[str] | None) -> KeySettings:
        """These settings, falling back on the embedded default of `data_dir` (unless they name one)."""
        if self.data_dir is not None or data_dir is None:
            return self
        return msgspec.structs.replace(self, data_dir=os.fspath(data_dir))


def master_source(settings: KeySettings, *, may_create: bool) -> KeyProvider | None:
    """The master key the settings name (None: no encryption)."""
    if settings.encrypt is False:
        return None
    if settings.master_key_file is not None:
        return master_key_from_file(settings.master_key_file)
    if settings.master_key_env is not None:
        return master_key_from_env(settings.master_key_env)
    if os.environ.get(MASTER_KEY_ENV):
        return master_key_from_env(MASTER_KEY_ENV)
    if settings.data_dir is not None:
        return embedded_master_key(Path(settings.data_dir) / MASTER_KEY_FILE, may_create=may_create)
    if settings.encrypt:
        raise InvalidConfig(
            "encrypt",
            f"is on but no master key is given: set {MASTER_KEY_ENV}, or give master_key_file / "
            "master_key_env (--master-key-file / --master-key-env)",
        )
    return None


def store_spec(settings: KeySettings) -> str:
    """The key store the settings name: a folder path, or ``nats:BUCKET``."""
    spec = settings.key_store
    if spec is None:
        if settings.data_dir is not None:
            return str(Path(settings.data_dir) / KEYS_DIR)
        return "nats:CONVMEM_KEYS"
    if spec == "nats":
        return "nats:CONVMEM_KEYS"
    if not spec.strip():
        raise InvalidConfig("key_store", "is empty: give a folder, or nats / nats:BUCKET")
    return spec
