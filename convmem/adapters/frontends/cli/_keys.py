"""`convmem keys`: the master key and data keys of encryption at rest (generate, status, rotate)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from convmem.adapters.backends.jetstream import NatsConnection, open_key_store
from convmem.adapters.backends.keys import (
    MASTER_KEY_ENV,
    MASTER_KEY_FILE,
    Keyring,
    KeySettings,
    KeyStore,
    LocalMasterKeys,
    generate_key_text,
    master_key_from_env,
    master_key_from_file,
    master_source,
    rotate_master,
    rotate_master_file,
    store_spec,
)
from convmem.adapters.frontends.cli._common import (
    EXIT_DAMAGED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    emit_json,
    key_settings,
    nats_url,
)

__all__ = ["add_keys_command"]


def add_keys_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register `keys` on the CLI's subparsers (`common`: the global options)."""
    p = commands.add_parser(
        "keys", parents=[common], help="encryption at rest: generate a master key, show the keys, rotate them"
    )
    actions = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    g = actions.add_parser("generate", parents=[common], help="print a new master key (base64 of 32 bytes)")
    g.set_defaults(run=cmd_keys_generate)
    s = actions.add_parser("status", parents=[common], help="where the master key and the data keys are")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(run=cmd_keys_status)
    r = actions.add_parser(
        "rotate",
        parents=[common],
        help="rewrap every data key with a new master key (stored events are not rewritten)",
    )
    target = r.add_mutually_exclusive_group()
    target.add_argument(
        "--new-master-key-file",
        metavar="FILE",
        help="rewrap with the key in FILE (then use it as the master key)",
    )
    target.add_argument(
        "--new-master-key-env", metavar="NAME", help="rewrap with the key in variable NAME (then use it)"
    )
    target.add_argument(
        "--data-keys",
        action="store_true",
        help="instead give every user a new data key for new writes (old events keep opening)",
    )
    r.add_argument("--json", action="store_true", help="machine-readable output")
    r.set_defaults(run=cmd_keys_rotate)


def cmd_keys_generate(args: argparse.Namespace) -> int:
    print(generate_key_text())
    return EXIT_OK


@contextmanager
def _key_store(args: argparse.Namespace, settings: KeySettings) -> Iterator[KeyStore]:
    """The key store the options name (a NATS bucket on the server they name)."""
    connection = None
    if store_spec(settings).startswith("nats:"):
        url = nats_url(args)
        if url is None:
            raise CliError("the key store is a NATS bucket: give --server URL (or NATS_URL)", EXIT_USAGE)
        connection = NatsConnection.connect(url, timeout=args.timeout, auth=args.auth)
    try:
        store = open_key_store(settings, connection)
        assert store is not None  # made when missing (only a reader's may be None)
        try:
            yield store
        finally:
            store.close()
    finally:
        if connection is not None:
            connection.release()


def _settings(args: argparse.Namespace) -> KeySettings:
    if args.nats and str(args.nats).startswith("memory://"):
        raise CliError("keys: the in-memory log keeps nothing at rest, so it has no keys", EXIT_USAGE)
    settings = key_settings(args)
    if settings.encrypt is False:
        raise CliError("keys: --no-encryption leaves nothing to show or rotate", EXIT_USAGE)
    return settings


def cmd_keys_status(args: argparse.Namespace) -> int:
    settings = _settings(args)
    with _key_store(args, settings) as store:
        provider = master_source(settings, may_create=False)
        if provider is None:
            raise CliError("no master key is given: set CONVMEM_MASTER_KEY or --master-key-file", EXIT_USAGE)
        # Checks the master key against the store, then reads and unwraps every data key.
        check = Keyring(provider, store).check()
        status: dict[str, Any] = {
            "master_key": provider.source,
            "master_id": provider.master_id,
            "key_store": store.source,
            "data_keys": check.data_keys,
            "users": check.users,
            # Wrapped by a master key this one is not (a writer that ran on the old key after a
            # rotation): they cannot be opened with this key; rotate from the old one to fix them.
            "data_keys_of_other_master_keys": check.of_other_master_keys,
            "damaged_data_keys": [msgspec.to_builtins(d) for d in check.damaged],
        }
    if args.json:
        emit_json(status)
    else:
        for name, value in status.items():
            print(f"{name}: {len(check.damaged) if name == 'damaged_data_keys' else value}")
    if not check.damaged:
        return EXIT_OK
    for damaged in check.damaged:
        print(f"{store.source}: DAMAGED {damaged.where}: {damaged.problem}", file=sys.stderr)
    if not args.json:
        print(
            f"{len(check.damaged)} data key(s) damaged: restore them from a backup of the key store. "
            "Until then the events they sealed do not open, and a user's erasure stops with an "
            "error (and stays pending) while a damaged key may be that user's",
            file=sys.stderr,
        )
    return EXIT_DAMAGED


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    with _key_store(args, settings) as store:
        if args.data_keys:
            provider = master_source(settings, may_create=False)
            if provider is None:
                raise CliError(
                    "no master key is given: set CONVMEM_MASTER_KEY or --master-key-file", EXIT_USAGE
                )
            users = Keyring(provider, store).rotate_data_keys()
            result: dict[str, Any] = {"data_keys_made": users, "master_id": provider.master_id}
            message = f"rotated data keys: {users} user(s) got a new data key; older events still open"
        elif args.new_master_key_file or args.new_master_key_env:
            old = master_source(settings, may_create=False)
            if old is None:
                raise CliError("no master key is given to rotate from", EXIT_USAGE)
            new: LocalMasterKeys = (
                master_key_from_file(args.new_master_key_file)
                if args.new_master_key_file
                else master_key_from_env(args.new_master_key_env)
            )
            count = rotate_master(old, new, store)
            result = {"rewrapped": count, "master_id": new.master_id, "master_key": new.source}
            message = (
                f"rewrapped {count} data key(s) with master key {new.master_id} ({new.source}); "
                "configure it as the master key from now on"
            )
        else:
            path = _key_file(settings)
            master_id, count = rotate_master_file(path, store)
            result = {"rewrapped": count, "master_id": master_id, "master_key": f"master key file {path}"}
            message = (
                f"rewrapped {count} data key(s) with a new master key {master_id}, now in {path}; "
                "back it up (separately from the data) and destroy the copies of the old one"
            )
    if args.json:
        emit_json(result)
    else:
        print(message)
    return EXIT_OK


def _key_file(settings: KeySettings) -> Path:
    """The master key file a rotation in place replaces (the embedded default's, or --master-key-file)."""
    if settings.master_key_file is not None:
        return Path(settings.master_key_file)
    if (
        settings.master_key_env is None
        and not os.environ.get(MASTER_KEY_ENV)
        and settings.data_dir is not None
    ):
        return Path(settings.data_dir) / MASTER_KEY_FILE
    raise CliError(
        "the master key is not in a file convmem can replace: give --new-master-key-file or "
        "--new-master-key-env to rewrap with another key",
        EXIT_USAGE,
    )
