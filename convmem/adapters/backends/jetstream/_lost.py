"""A reader's question when the events stream is missing: was nothing stored there yet, or was it lost?

convmem never deletes its events stream. A store without it that still holds
what sessions leave beside their events (snapshots, erasure-journal records,
users' data keys, tenants' byte tallies) lost its whole history: the
stream's folder was deleted or lost from the server's store, or the stream
was deleted by hand. `history_lost` says so, and what is left; a store that
holds none of that (nothing was stored yet), or whose events live in
another stream under the same subjects (a mistyped ``--stream``), is not
damage.

A writer asks before it makes anything (`lost_parts`): the events stream or the
erasure journal's bucket missing while the store shows it existed is refused
(`StoreLost`) unless the operator accepts the loss (``accept_loss``). So the
answer is exact, not a guess from what else the store holds, each of the two
carries a mark of the other once both exist (`mark_store`, the streams'
metadata): the events stream names its journal bucket (`STREAM_MARK`), the
journal's bucket its events stream (`JOURNAL_MARK`). A store made by an older
convmem has no mark until a writer opens it; until then the evidence of what
sessions leave (`history_lost`, `journal_lost`) answers.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import nats.js.errors

from convmem.actors import ErasureJournalDamaged
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.backends.jetstream._journal import JetStreamErasureJournal
from convmem.adapters.backends.jetstream._read import list_subjects
from convmem.adapters.backends.jetstream._setup import (
    check_exists,
    setup_request,
    setup_wait,
    stream_config_of,
    stream_info_of,
    subject_pattern,
)
from convmem.adapters.backends.jetstream._snapshots import JetStreamSnapshotStore
from convmem.adapters.backends.jetstream._usage import _PROBE, usage_bucket
from convmem.adapters.backends.keys import Keyring
from convmem.errors import ConvmemError, PermissionDenied, StoreNotFound
from convmem.events import encode_token

__all__ = [
    "JOURNAL_MARK",
    "STREAM_MARK",
    "history_lost",
    "journal_lost",
    "lost_parts",
    "mark_store",
    "part_configs",
    "refusal",
]

_log = logging.getLogger("convmem.jetstream")

STREAM_MARK = "convmem.erasure_journal"
"""The events stream's metadata key naming the erasure journal's bucket made beside it."""
JOURNAL_MARK = "convmem.events_stream"
"""The erasure journal bucket's metadata key naming the events stream whose erasures it records."""

_ACCEPT = (
    "a writer makes it again, empty, only once an operator accepts the loss: `convmem repair "
    "--accept-loss` (in Python: accept_loss=True)"
)


def history_lost(
    connection: NatsConnection,
    stream: str,
    prefix: str,
    *,
    snapshots: JetStreamSnapshotStore | None,
    journal: JetStreamErasureJournal | None,
    keyring: Keyring | None,
    journal_bucket: str | None = None,
) -> str | None:
    """Why a store whose events `stream` (on subjects `prefix`.>) is missing lost its history, naming
    what its sessions left; None when nothing says sessions were stored (see the module's doc).
    `journal_bucket`: the erasure journal's bucket, whose mark (`JOURNAL_MARK`) names the stream
    made beside it."""
    if _streams_on(connection, subject_pattern(prefix)):
        return None  # the subjects are another stream's: a name given wrong, not a loss
    found = []
    held = len(snapshots.keys()) if snapshots is not None else 0
    if held:
        found.append(f"snapshots of {held} session(s)")
    records = _journal_records(journal) if journal is not None else 0
    if records:
        found.append(f"{records} erasure-journal record(s)")
    users = _users_with_keys(keyring) if keyring is not None else 0
    if users:
        found.append(f"data keys of {users} user(s)")
    tenants = _tenants_tallied(connection, usage_bucket(stream))
    if tenants:
        found.append(f"byte tallies of {tenants} tenant(s)")
    if (
        not found
        and journal_bucket is not None
        and _marked(connection, f"KV_{journal_bucket}", JOURNAL_MARK) == stream
    ):  # what sessions leave is gone too (none stored one), but the journal says the stream was made
        found.append(f"its erasure-journal bucket {journal_bucket!r}, marked as made beside it")
    if not found:
        return None
    named = (
        "each session with a snapshot is named lost: `convmem repair --accept-loss` makes the stream "
        "again, then `convmem repair tenant:user:session` writes each snapshot back; the events of sessions"
        if held
        else "no snapshot is left to name a session by: the events of every session"
    )
    return (
        f"the NATS server has no events stream {stream!r}, though the store holds {', '.join(found)}: "
        "every event the stream held is lost (its folder deleted or lost from the server's store, or "
        f"the stream deleted); {named} without a snapshot are gone unless a backup of the store or an "
        "export holds them"
    )


def _streams_on(connection: NatsConnection, subjects: str) -> list[str]:
    """The streams that take `subjects` (none known when these credentials may not ask)."""
    try:
        reply = connection.call(
            lambda: connection.api("$JS.API.STREAM.NAMES", {"subject": subjects}),
            what=f"finding the stream of {subjects!r}",
        )
    except ConvmemError:
        return []
    return list(reply.get("streams") or [])


def _journal_records(journal: JetStreamErasureJournal) -> int:
    """The erasure journal's records, pending and receipts, readable or not."""
    count = 0
    for read in (journal.pending, journal.receipts):
        try:
            count += len(read())
        except ErasureJournalDamaged as exc:
            count += len(exc.readable) + len(exc.damaged)
    return count


def _users_with_keys(keyring: Keyring) -> int:
    """How many users the key store holds data keys of (each damaged key counts as one more)."""
    scan = keyring.store.scan()
    return len({k.subject for k in scan.keys}) + len(scan.damaged)


def _tenants_tallied(connection: NatsConnection, bucket: str) -> int:
    """How many tenants the byte-tally bucket beside the stream counts (a service's: 0 when none)."""
    stream = f"KV_{bucket}"
    try:
        if not connection.call(lambda: check_exists(connection, stream), what=f"finding bucket {bucket!r}"):
            return 0
        subjects = connection.call(
            lambda: list_subjects(connection, stream, f"$KV.{bucket}.>"), what=f"list the keys of {bucket!r}"
        )
    except ConvmemError:  # these credentials may not see it: no tally known
        return 0
    return len(set(subjects) - {f"$KV.{bucket}.{encode_token(_PROBE)}"})


def journal_lost(
    connection: NatsConnection, stream: str, journal_bucket: str, snapshot_bucket: str
) -> str | None:
    """Why the erasure journal's bucket, missing, was lost, or None when nothing says it existed.

    A writer (`JetStreamBackend`) makes the journal beside the events stream and marks the stream
    with its name (`mark_store`): a marked stream whose journal bucket is missing lost it (its
    folder deleted or lost from the server's store, or the bucket deleted), and with it any erasure
    that was pending: nothing else records that one was asked for. A stream an older convmem made
    carries no mark: then a store whose stream and snapshot bucket both hold messages lost it. Call
    it before the journal is made again, or when a reader found it missing."""
    journal = f"KV_{journal_bucket}"
    try:
        if (
            connection.call(functools.partial(_messages, connection, journal), what=f"finding {journal!r}")
            is not None
        ):
            return None  # the journal is there
        stream_config = connection.call(
            lambda: stream_config_of(connection, stream), what=f"finding {stream!r}"
        )
    except ConvmemError:  # these credentials may not ask: nothing known
        return None
    return _journal_gone(connection, stream, journal_bucket, snapshot_bucket, stream_config)


def _journal_gone(
    connection: NatsConnection,
    stream: str,
    journal_bucket: str,
    snapshot_bucket: str,
    stream_config: dict[str, Any] | None,
) -> str | None:
    """`journal_lost`, the journal's bucket known missing and the events stream's config read."""
    if stream_config is None:
        return None  # no stream: `history_lost` is the question
    marked = _metadata(stream_config).get(STREAM_MARK)
    if marked == journal_bucket:
        return (
            f"the NATS server has no erasure-journal bucket {journal_bucket!r}, though the events stream "
            f"{stream!r} is marked as having it (convmem marks the stream once both exist): the journal "
            "was lost (its folder deleted or lost from the server's store, or the bucket deleted), and "
            "with it every erasure it held pending: run `convmem erase` again for each erasure asked "
            "for and not confirmed done"
        )
    if marked is not None:
        return None  # the stream's journal is another bucket: this one is new
    counts: dict[str, int | None] = {}
    for name in (stream, f"KV_{snapshot_bucket}"):  # an older store, unmarked: what it holds says
        try:
            counts[name] = connection.call(
                functools.partial(_messages, connection, name), what=f"finding {name!r}"
            )
        except ConvmemError:  # these credentials may not ask: nothing known
            return None
        if not counts[name]:
            return None  # the stream or the snapshot bucket holds nothing
    return (
        f"the NATS server has no erasure-journal bucket {journal_bucket!r}, though the events stream "
        f"{stream!r} holds {counts[stream]} message(s) and the snapshot bucket {snapshot_bucket!r} "
        f"{counts[f'KV_{snapshot_bucket}']}: the journal was lost (its folder deleted or lost from the "
        "server's store, or the bucket deleted), and with it every erasure it held pending: run "
        "`convmem erase` again for each erasure asked for and not confirmed done"
    )


def part_configs(
    connection: NatsConnection, stream: str, journal_bucket: str
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The configs of the events stream and of the erasure journal's bucket (None: missing)."""

    async def both() -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        return (
            await stream_config_of(connection, stream),
            await stream_config_of(connection, f"KV_{journal_bucket}"),
        )

    return connection.call(
        both, what=f"finding {stream!r} and its erasure journal", timeout=setup_wait(connection)
    )


def lost_parts(
    connection: NatsConnection,
    *,
    stream: str,
    prefix: str,
    journal_bucket: str,
    snapshot_bucket: str,
    keyring: Keyring | None,
    found: tuple[dict[str, Any] | None, dict[str, Any] | None],
) -> list[tuple[str, str, str]]:
    """What a writer would make again, empty, though the store shows it existed: (part, name, why).

    `found` is `part_configs`, read before anything is made. The events stream is lost when the
    journal's bucket names it (`JOURNAL_MARK`), or else when the store holds what sessions leave
    (`history_lost`); the journal's bucket when the stream names it (`STREAM_MARK`), or else, the
    stream unmarked (an older store), when the stream and the snapshot bucket both hold messages.
    A store that holds none of it (a new one) lost nothing: everything is made, silently."""
    stream_config, journal_config = found
    losses: list[tuple[str, str, str]] = []
    if stream_config is None:
        why = _history_evidence(
            connection,
            stream,
            prefix,
            journal_bucket=journal_bucket if journal_config is not None else None,
            snapshot_bucket=snapshot_bucket,
            keyring=keyring,
        )
        if why is not None:
            losses.append(("events stream", stream, why))
    elif journal_config is None:
        why = _journal_gone(connection, stream, journal_bucket, snapshot_bucket, stream_config)
        if why is not None:
            losses.append(("erasure journal", journal_bucket, why))
    return losses


def refusal(part: str, why: str) -> str:
    """What `StoreLost` says: the part, why it is lost, and how an operator accepts the loss."""
    return f"{part}: DAMAGED: {why}; {_ACCEPT}"


def _history_evidence(
    connection: NatsConnection,
    stream: str,
    prefix: str,
    *,
    journal_bucket: str | None,
    snapshot_bucket: str,
    keyring: Keyring | None,
) -> str | None:
    """`history_lost`, asked before a writer makes anything: the snapshots and journal opened to read."""
    snapshots: JetStreamSnapshotStore | None = None
    journal: JetStreamErasureJournal | None = None
    try:
        try:
            snapshots = JetStreamSnapshotStore(
                connection, bucket=snapshot_bucket, create=False, keyring=keyring
            )
        except (StoreNotFound, PermissionDenied):
            snapshots = None
        if journal_bucket is not None:
            try:
                journal = JetStreamErasureJournal(connection, bucket=journal_bucket, create=False)
            except (StoreNotFound, PermissionDenied):
                journal = None
        return history_lost(
            connection,
            stream,
            prefix,
            snapshots=snapshots,
            journal=journal,
            keyring=keyring,
            journal_bucket=journal_bucket,
        )
    finally:
        for part in (snapshots, journal):
            if part is not None:
                part.close()


def mark_store(
    connection: NatsConnection,
    stream: str,
    journal_bucket: str,
    found: tuple[dict[str, Any] | None, dict[str, Any] | None],
) -> None:
    """Mark the events stream and the journal's bucket, both made, each with the other's name.

    Only metadata changes (a stream's settings stay as they were); once per store (`found`, the
    configs as read before: already marked, nothing is asked). A server or credentials that refuse
    leave the store unmarked: `lost_parts` then asks what the store holds, as for an older store."""
    stream_config, journal_config = found
    if (
        stream_config is not None
        and journal_config is not None
        and _metadata(stream_config).get(STREAM_MARK) is not None
        and _metadata(journal_config).get(JOURNAL_MARK) is not None
    ):
        return
    try:
        connection.call(
            lambda: _mark(connection, stream, journal_bucket),
            what=f"marking {stream!r} and its erasure journal",
            timeout=setup_wait(connection),
        )
    except (ConvmemError, nats.js.errors.Error) as exc:
        _log.info(
            "stream %r and its erasure journal not marked (%s): loss is judged by what they hold", stream, exc
        )


async def _mark(connection: NatsConnection, stream: str, journal_bucket: str) -> None:
    marks = ((stream, STREAM_MARK, journal_bucket), (f"KV_{journal_bucket}", JOURNAL_MARK, stream))
    configs = [await stream_config_of(connection, name) for name, _, _ in marks]
    if None in configs:
        return  # not both there: no mark may say the other exists
    for (name, key, value), config in zip(marks, configs, strict=True):
        assert config is not None
        metadata = _metadata(config)
        if key in metadata:
            continue  # marked already (a stream keeps the first journal it was marked with)
        user = {k: v for k, v in metadata.items() if not k.startswith("_nats.")}  # the server's own keys
        await setup_request(
            connection, f"$JS.API.STREAM.UPDATE.{name}", {**config, "metadata": {**user, key: value}}
        )


def _marked(connection: NatsConnection, name: str, key: str) -> str | None:
    """The mark `key` of the stream `name` (None: none, no such stream, or these credentials may not ask)."""
    try:
        config = connection.call(lambda: stream_config_of(connection, name), what=f"finding {name!r}")
    except ConvmemError:
        return None
    return _metadata(config).get(key)


def _metadata(config: dict[str, Any] | None) -> dict[str, str]:
    """A stream config's metadata (none when missing)."""
    metadata = (config or {}).get("metadata") or {}
    return dict(metadata) if isinstance(metadata, dict) else {}


async def _messages(connection: NatsConnection, name: str) -> int | None:
    """The messages the stream `name` holds; None when it does not exist."""
    info = await stream_info_of(connection, name)
    return None if info is None else int(info.get("state", {}).get("messages", 0))
