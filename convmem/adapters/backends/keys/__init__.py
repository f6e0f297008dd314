"""Encryption at rest: master keys, key stores and the keyring that seals stored bytes per user.

`_master` holds the master key providers (`KeyProvider`, the protocol a KMS
implements; `LocalMasterKeys` from a file or an environment variable; the
embedded default's generated key), `_stores` the key stores (`KeyStore`,
`DirKeyStore`, `MemoryKeyStore`; the NATS one is `NatsKeyStore` in
`convmem.adapters.backends.jetstream`), `_keyring` the `Keyring` that seals events
and snapshots with a data key per (tenant, user) and shreds a user's keys on
erasure, `_rotate` master key rotation, and `_settings` the `KeySettings`
every entry point takes.
"""

from convmem.adapters.backends.keys._keyring import SEAL_MAGIC, KeyCheck, Keyring, is_sealed, subject_of
from convmem.adapters.backends.keys._master import (
    MASTER_KEY_ENV,
    KeyProvider,
    LocalMasterKeys,
    embedded_master_key,
    generate_key_text,
    master_key_from_env,
    master_key_from_file,
    parse_master_key,
)
from convmem.adapters.backends.keys._rotate import rotate_master, rotate_master_file
from convmem.adapters.backends.keys._settings import MASTER_KEY_FILE, KeySettings, master_source, store_spec
from convmem.adapters.backends.keys._stores import (
    DamagedKey,
    DirKeyStore,
    KeyScan,
    KeyStore,
    MemoryKeyStore,
    WrappedKey,
    check_hex,
    is_hex_id,
    parse_key,
    shred_plan,
    shred_uncertain,
    sorted_keys,
)

__all__ = [
    "MASTER_KEY_ENV",
    "MASTER_KEY_FILE",
    "SEAL_MAGIC",
    "DamagedKey",
    "DirKeyStore",
    "KeyCheck",
    "KeyProvider",
    "KeyScan",
    "KeySettings",
    "KeyStore",
    "Keyring",
    "LocalMasterKeys",
    "MemoryKeyStore",
    "WrappedKey",
    "check_hex",
    "embedded_master_key",
    "generate_key_text",
    "is_hex_id",
    "is_sealed",
    "master_key_from_env",
    "master_key_from_file",
    "master_source",
    "parse_key",
    "parse_master_key",
    "rotate_master",
    "rotate_master_file",
    "shred_plan",
    "shred_uncertain",
    "sorted_keys",
    "store_spec",
    "subject_of",
]
