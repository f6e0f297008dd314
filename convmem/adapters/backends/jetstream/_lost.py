"""A reader's question when the events stream is missing: was nothing stored there yet, or was it lost?

convmem never deletes its events stream. A store without it that still holds
what sessions leave beside their events (snapshots, erasure-journal records,
users' data keys, tenants' byte tallies) lost its whole history: the
stream's folder was deleted or lost from the server's store, or the stream
was deleted by hand. `history_lost` says so, and what is left; a store that
holds none of that (nothing was stored yet), or whose events live in
another stream under the same subjects (a mistyped ``--stream``), is not
damage.
"""

from __future__ import annotations

import functools

import nats.js.errors

from convmem.actors import ErasureJournalDamaged
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.backends.jetstream._journal import JetStreamErasureJournal
from convmem.adapters.backends.jetstream._read import list_subjects
from convmem.adapters.backends.jetstream._setup import check_exists, setup_request, subject_pattern
from convmem.adapters.backends.jetstream._snapshots import JetStreamSnapshotStore
from convmem.adapters.backends.jetstream._usage import _PROBE, usage_bucket
from convmem.adapters.backends.keys import Keyring
from convmem.errors import ConvmemError
from convmem.events import encode_token

__all__ = ["history_lost", "journal_lost"]


def history_lost(
    connection: NatsConnection,
    stream: str,
    prefix: str,
    *,
    snapshots: JetStreamSnapshotStore | None,
    journal: JetStreamErasureJournal | None,
    keyring: Keyring | None,
) -> str | None:
    """Why a store whose events `stream` (on subjects `prefix`.>) is missing lost its history, naming
    what its sessions left; None when nothing says sessions were stored (see the module's doc)."""
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
    if not found:
        return None
    named = (
        "each session with a snapshot is named lost: `convmem repair tenant:user:session` writes its "
        "snapshot back (a writer makes the stream again); the events of sessions"
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

    A writer (`JetStreamBackend`) makes the journal beside the events stream and the snapshot
    bucket: a store whose stream and snapshot bucket both hold messages but whose journal bucket
    is missing lost it (its folder deleted or lost from the server's store, or the bucket deleted),
    and with it any erasure that was pending: nothing else records that one was asked for. Call it
    before the journal is made again (a writer's), or when a reader found it missing."""
    journal = f"KV_{journal_bucket}"
    counts: dict[str, int | None] = {}
    for name in (journal, stream, f"KV_{snapshot_bucket}"):  # the journal first: it is usually there
        try:
            counts[name] = connection.call(
                functools.partial(_messages, connection, name), what=f"finding {name!r}"
            )
        except ConvmemError:  # these credentials may not ask: nothing known
            return None
        if (counts[name] is not None) if name == journal else not counts[name]:
            return None  # the journal is there, or the stream or the snapshot bucket holds nothing
    return (
        f"the NATS server has no erasure-journal bucket {journal_bucket!r}, though the events stream "
        f"{stream!r} holds {counts[stream]} message(s) and the snapshot bucket {snapshot_bucket!r} "
        f"{counts[f'KV_{snapshot_bucket}']}: the journal was lost (its folder deleted or lost from the "
        "server's store, or the bucket deleted), and with it every erasure it held pending: run "
        "`convmem erase` again for each erasure asked for and not confirmed done"
    )


async def _messages(connection: NatsConnection, name: str) -> int | None:
    """The messages the stream `name` holds; None when it does not exist."""
    try:
        info = await setup_request(connection, f"$JS.API.STREAM.INFO.{name}")
    except nats.js.errors.APIError as exc:
        if exc.err_code == 10059:  # stream not found
            return None
        raise
    return int(info.get("state", {}).get("messages", 0))
