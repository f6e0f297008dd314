"""`SnapshotStore` on a JetStream key-value bucket: one key per session.

The key is the session's three subject tokens joined by dots (always a valid
KV key, and never another session's); the value is the msgpack of
`Snapshot`. A save reads the stored snapshot and writes only if it is older;
it erases the older one, then writes on the emptied key only (a conditional
publish; over the snapshot this store saved there last it need not read
it, so it erases and writes at once, and a store that saved none there yet
first tries the emptied-key write alone; a key taken meanwhile by another
saver sends either the full way), so two savers racing never put an older
snapshot over a newer one, and no superseded snapshot stays in the bucket's files (a plain put would
leave the replaced bytes there until NATS compacts the block).

A snapshot larger than one message (the server's ``max_payload``, 1 MiB by
default) is split, never refused: its bytes go in parts on the key's own
subjects ``<key>.part.0``, ``<key>.part.1``... (five tokens, so never another
session's key), written first, and the message on the key holds the snapshot
without its bytes and a ``Convmem-Parts`` header saying how many parts to
read. A load joins them; the loader checks the joined bytes against the
snapshot's hash, so parts mixed by racing savers only cost a longer replay.
Parts are numbered from 0 without a gap, so saving erases every part it finds
from its own count on; deleting lists the key's part subjects and erases every
one, so a part left by a crashed save or a killed delete (a gap) goes too.
`keys` lists sessions from the bucket's subjects, heads and parts alike.
A message of the key the bucket still counts after that (damaged on disk:
nats-server can neither read it back nor erase it) goes with a purge of the
whole bucket, every snapshot it can read written back; a delete that still
leaves one raises `SnapshotNotErased` (a `SessionDamaged`), so an erasure
stays pending rather than being reported done.

nats-server never acknowledges a write on a subject whose last message it counts but cannot read
back (the expected-last-subject-sequence check cannot read it; the write may even be stored, and
after an erase in the same block the whole bucket stops answering). So a load that finds no
snapshot asks whether the bucket counts one on the key (one ``STREAM.INFO`` of that subject, only
when there is none to read: a session's first load, never a save), and a key it counts but cannot
read is marked unsavable for this store: its saves return at once without a request (said once,
with ``convmem repair KEY`` to do), until a delete of the key (an erasure, a repair) removes the
damage, or a load reads a snapshot there again.

With a keyring (encryption at rest), the snapshot's state bytes are sealed
with the data key of the session's user before they are split, so every part
holds ciphertext; the key, seq and state hash stay in clear. A snapshot
whose key was shredded, or whose sealed bytes fail authentication, loads as
None: the session is rebuilt from the log (where such events read as erased).

Every message (the snapshot and each part) carries a ``Convmem-Sum`` header,
the CRC-32 of its subject and bytes (`convmem.adapters.backends._checksum`), checked
on every load: a snapshot whose message or part fails it, or that the server
counts but cannot serve (damaged on disk), loads as None (a longer replay)
and `check` says what failed, for `verify`. Snapshots saved before the
header existed are loaded unchecked (their state hash still guards them).
"""

from __future__ import annotations

import logging
import threading

import msgspec
import nats.js.errors

from convmem.actors import Snapshot
from convmem.adapters.backends._checksum import SUM_HEADER, seal
from convmem.adapters.backends.jetstream._connection import (
    DEFAULT_MAX_CONTROL_LINE,
    NatsConnection,
    StoredMessage,
)
from convmem.adapters.backends.jetstream._read import SubjectKeys, list_subjects
from convmem.adapters.backends.jetstream._setup import check_names, open_bucket
from convmem.adapters.backends.keys import Keyring, is_sealed
from convmem.errors import (
    ConvmemError,
    InvalidConfig,
    InvalidInput,
    LogUnavailable,
    PermissionDenied,
    SealBroken,
    SessionClosed,
    SessionDamaged,
)
from convmem.events import MemoryKey

__all__ = ["DEFAULT_BUCKET", "JetStreamSnapshotStore"]

DEFAULT_BUCKET = "CONVMEM_SNAPSHOTS"
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Snapshot)
_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_PARTS = "Convmem-Parts"
_HEADROOM = 4096
"""Bytes of a message left for its subject and headers when a snapshot is split."""
_OPERATION = "KV-Operation"
_GONE = (10057, 10043)  # "no message found", "sequence not found": erased already
_log = logging.getLogger("convmem.jetstream")


class SnapshotNotErased(SessionDamaged):
    """A delete left messages of the snapshot that nats-server can neither read back nor erase (its
    `SessionDamaged` fields: no seq, no position, `problem` naming them); nothing says it was erased."""

    def __init__(self, key: MemoryKey, stream: str, left: list[str], refused: str | None) -> None:
        self.key = key.composite()
        self.seq = self.position = None
        self.problem = (
            f"{' and '.join(left)} of its snapshot stay in stream {stream}: nats-server can neither read "
            f"them back (damaged on disk) nor erase them ({refused or 'a purge of the bucket left them'})"
        )
        ConvmemError.__init__(
            self,
            f"the snapshot of session {self.key} was not erased: {self.problem}; they go when the "
            "bucket is purged (convmem purges it and writes back every snapshot it can read), which "
            f"needs credentials that may publish to $JS.API.STREAM.PURGE.{stream}",
        )


class JetStreamSnapshotStore:
    """The durable `SnapshotStore`: latest snapshot per session in a KV bucket."""

    def __init__(
        self,
        connection: NatsConnection,
        *,
        bucket: str = DEFAULT_BUCKET,
        replicas: int = 1,
        create: bool = True,
        part_bytes: int | None = None,
        keyring: Keyring | None = None,
    ) -> None:
        """Use an open connection (leased until `close`); creates or checks the bucket.

        With `create` False the bucket is never created or checked; a missing one is `StoreNotFound`.
        `part_bytes` is the most snapshot bytes one message holds (None: the server's
        ``max_payload`` less 4 KiB for the subject and headers).
        """
        check_names(bucket=bucket)
        if replicas < 1:
            raise InvalidConfig("replicas", f"is {replicas}, must be 1 or more")
        if part_bytes is not None and (isinstance(part_bytes, bool) or part_bytes < 1):
            raise InvalidConfig("part_bytes", f"is {part_bytes!r}, must be a positive number of bytes")
        self._part_bytes = part_bytes
        self._keyring = keyring
        connection.lease()
        self._conn = connection
        self._bucket = bucket
        self._stream = f"KV_{bucket}"
        self._keys = SubjectKeys(f"$KV.{bucket}")
        self._closed = False
        self._close_lock = threading.Lock()
        self._saved: dict[str, tuple[int, int]] = {}
        """Per key subject, the stream position and session seq of the snapshot (in one message, no
        parts) this store saved there last: its next save erases it and writes at once (touched on
        the connection's loop only)."""
        self._unsavable: set[str] = set()
        """Key subjects whose snapshot (or a part of it) the bucket counts but nats-server cannot
        read back: never written to, since the server never acknowledges a write there (touched on
        the connection's loop only)."""
        try:
            open_bucket(
                connection,
                bucket,
                replicas=replicas,
                create=create,
                what="bucket",
                missing="key-value bucket",
            )
        except BaseException:
            self.close()
            raise

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        bucket: str = DEFAULT_BUCKET,
        replicas: int = 1,
        timeout: float = 5.0,
        max_control_line: int = DEFAULT_MAX_CONTROL_LINE,
    ) -> JetStreamSnapshotStore:
        """Connect to the NATS server at `url`; the store owns the connection and closes it."""
        connection = NatsConnection.connect(url, timeout=timeout, max_control_line=max_control_line)
        try:
            return cls(connection, bucket=bucket, replicas=replicas)
        finally:
            connection.release()

    @property
    def bucket(self) -> str:
        return self._bucket

    def subject(self, key: MemoryKey) -> str:
        """The bucket subject that holds `key`'s snapshot."""
        return f"$KV.{self._bucket}.{'.'.join(key.tokens())}"

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed("the JetStream snapshot store is closed")

    def load(self, key: MemoryKey) -> Snapshot | None:
        """See `SnapshotStore.load`: None when missing, deleted, undecodable or another key's."""
        self._check_open()
        subject = self.subject(key)
        message = self._conn.call(lambda: self._read(subject, key), what=f"load snapshot of {key}")
        snapshot = _decode(message)
        if snapshot is None or snapshot.key != key:
            return None
        return self._opened(snapshot)

    def _context(self, snapshot: Snapshot) -> bytes:
        assert self._keyring is not None
        return b"snapshot\0" + self._keyring.context(snapshot.key) + str(snapshot.seq).encode()

    def _opened(self, snapshot: Snapshot) -> Snapshot | None:
        """`snapshot` with its state bytes opened; None when they cannot be (shredded, damaged, no key)."""
        if not is_sealed(snapshot.data):
            return snapshot
        if self._keyring is None:
            _log.warning(
                "the snapshot of %s is encrypted and no master key was given: not used", snapshot.key
            )
            return None
        try:
            data = self._keyring.open(
                snapshot.data,
                self._context(snapshot),
                where=f"snapshot of {snapshot.key} at seq {snapshot.seq}",
                tenant=snapshot.key.tenant_id,
            )
        except SealBroken as exc:
            _log.warning("%s: the session is rebuilt from the log", exc)
            return None
        return None if data is None else msgspec.structs.replace(snapshot, data=data)

    async def _read(self, subject: str, key: MemoryKey | None = None) -> StoredMessage | None:
        """The key's message, with the bytes of a split snapshot joined back (None if a part is missing
        or a message fails its checksum). With `key` (a load), a message the bucket counts and
        cannot serve marks the key unsavable, and one served clears the mark."""
        head = await self._get(subject)
        if head is None and key is not None:
            await self._mark_if_unreadable(subject, subject, key)
            return None
        if head is not None and _damaged(head) is not None:
            return None
        count = _part_count(head)
        if head is None or not count:
            if key is not None:
                self._unsavable.discard(subject)
            return head
        snapshot = _decode(head)
        if snapshot is None:
            return None
        parts = []
        for i in range(count):
            part = await self._get(f"{subject}.part.{i}")
            if part is None and key is not None:
                await self._mark_if_unreadable(subject, f"{subject}.part.{i}", key)
            if part is None or _damaged(part) is not None:
                return None
            parts.append(part.data)
        if key is not None:
            self._unsavable.discard(subject)
        whole = msgspec.structs.replace(snapshot, data=b"".join(parts))
        return StoredMessage(subject=head.subject, seq=head.seq, headers={}, data=_encoder.encode(whole))

    async def _mark_if_unreadable(self, subject: str, name: str, key: MemoryKey) -> None:
        """Mark `subject` (the key's) unsavable when the bucket counts a message on `name` (its own
        subject or a part's) that the server just answered it does not have (damaged on disk); else
        clear the mark. One ``STREAM.INFO`` of that one subject."""
        if not (await self._subjects(name)).get(name):
            self._unsavable.discard(subject)
            return
        if subject not in self._unsavable:
            self._unsavable.add(subject)
            what = "its snapshot" if name == subject else f"part {name.rsplit('.', 1)[-1]} of its snapshot"
            _log.warning(
                "session %s: %s is stored but nats-server cannot read it back (damaged on disk), and "
                "it never acknowledges a write there: no snapshot of the session is saved until "
                "`convmem repair %s` replaces it (its loads replay the log; nothing stored is lost)",
                key,
                what,
                key.composite(),
            )

    def _limit(self) -> int:
        if self._part_bytes is not None:
            return self._part_bytes
        return max(self._conn.nc.max_payload - _HEADROOM, 1)

    def save(self, snapshot: Snapshot) -> None:
        """See `SnapshotStore.save`.

        The stored snapshot it replaces is erased first (its bytes
        overwritten), and the new one is written only on the emptied key
        (expected last subject sequence 0): the bucket's history limit never
        drops a snapshot by itself, which would leave its bytes on disk.
        """
        self._check_open()
        subject = self.subject(snapshot.key)
        self._conn.check_subject(subject, snapshot.key)
        if self._keyring is not None:
            sealed = self._keyring.seal(snapshot.key, snapshot.data, self._context(snapshot))
            snapshot = msgspec.structs.replace(snapshot, data=sealed)
        data = _encoder.encode(snapshot)
        limit = self._limit()
        parts: list[bytes] = []
        headers = {_EXPECTED: "0"}
        if len(data) > limit:
            parts = [snapshot.data[i : i + limit] for i in range(0, len(snapshot.data), limit)]
            data = _encoder.encode(msgspec.structs.replace(snapshot, data=b""))
            headers[_PARTS] = str(len(parts))
        headers[SUM_HEADER] = seal("", subject, data)

        async def put() -> None:
            if subject in self._unsavable:  # a write there would wait out the timeout, unanswered
                return
            known = self._saved.pop(subject, None)
            if known is not None and known[1] < snapshot.seq and not parts:
                written = await self._replace(subject, known[0], data, headers)
                if written is not None:
                    self._saved[subject] = (written, snapshot.seq)
                    return
            elif known is None and not parts:  # most likely the session's first: try the empty key
                written = await self._publish_if_empty(subject, data, headers)
                if written is not None:
                    await self._erase_parts(subject)  # a crashed save's parts, if any
                    self._saved[subject] = (written, snapshot.seq)
                    return
            for _ in range(10):
                current = await self._get(subject)
                stored = _decode(current)
                if stored is not None and stored.key == snapshot.key and stored.seq >= snapshot.seq:
                    return
                for i, part in enumerate(parts):
                    await self._put_alone(f"{subject}.part.{i}", part, snapshot.key)
                if current is not None:
                    await self._erase(current.seq)
                try:
                    ack = await self._conn.js.publish(subject, data, headers=headers)
                except nats.js.errors.APIError as exc:
                    if exc.err_code not in (10071, 10164):
                        raise
                    continue
                await self._erase_parts(subject, first=len(parts))
                if not parts:
                    self._saved[subject] = (ack.seq, snapshot.seq)
                return
            raise LogUnavailable(f"saving the snapshot of {snapshot.key} kept racing other savers")

        self._conn.call(put, what=f"save snapshot of {snapshot.key}")

    async def _replace(self, subject: str, position: int, data: bytes, headers: dict[str, str]) -> int | None:
        """Save over this store's own last snapshot of `subject` (at stream `position`, one message,
        no parts either side): erase it, write on the emptied key; two requests where the full way
        takes four, and the old snapshot is not read. The new one's stream position, or None (nothing
        written) when the key holds another saver's snapshot: then the full way decides."""
        await self._erase(position)
        return await self._publish_if_empty(subject, data, headers)

    async def _publish_if_empty(self, subject: str, data: bytes, headers: dict[str, str]) -> int | None:
        """Write the snapshot message if `subject` holds none (`headers` expect that): its stream
        position, or None when the key holds a snapshot (nothing written)."""
        try:
            ack = await self._conn.js.publish(subject, data, headers=headers)
        except nats.js.errors.APIError as exc:
            if exc.err_code not in (10071, 10164):
                raise
            return None
        return int(ack.seq)

    async def _put_alone(self, subject: str, data: bytes, key: MemoryKey) -> None:
        """Write `data` as the only message on `subject`, erasing the one it replaces."""
        for _ in range(10):
            current = await self._get(subject)
            if current is not None:
                await self._erase(current.seq)
            try:
                await self._conn.js.publish(
                    subject, data, headers={_EXPECTED: "0", SUM_HEADER: seal("", subject, data)}
                )
                return
            except nats.js.errors.APIError as exc:
                if exc.err_code not in (10071, 10164):
                    raise
        raise LogUnavailable(f"saving a part of the snapshot of {key} kept racing other savers")

    async def _erase_parts(self, subject: str, *, first: int = 0) -> None:
        """Erase the parts numbered from `first` on (up to the first one missing)."""
        i = first
        while (part := await self._get(f"{subject}.part.{i}")) is not None:
            await self._erase(part.seq)
            i += 1

    def delete(self, key: MemoryKey) -> None:
        """See `SnapshotStore.delete`. Erases the stored snapshot's bytes and every part; leaves no marker."""
        self._check_open()
        subject = self.subject(key)
        self._conn.check_subject(subject, key)

        async def erase() -> None:
            self._saved.pop(subject, None)
            for _ in range(10):
                current = await self._get(subject)
                if current is None:
                    break
                await self._erase(current.seq)
            for part in sorted(await list_subjects(self._conn, self._stream, f"{subject}.part.*")):
                while (message := await self._get(part)) is not None:
                    await self._erase(message.seq)
            if await self._unreadable(subject):  # held, but the server can neither read nor erase it
                refused = await self._compact(subject)
                left = await self._unreadable(subject)
                if left:
                    self._unsavable.add(subject)  # still there: a write on it would go unanswered
                    raise SnapshotNotErased(key, self._stream, left, refused)
            self._unsavable.discard(subject)

        self._conn.call(erase, what=f"delete snapshot of {key}")

    async def _unreadable(self, subject: str) -> list[str]:
        """The messages of `subject` (the key's message, its parts) the bucket still counts: after a
        delete, those the server could not read back, so not erase ("the snapshot message", "part 2")."""
        held = await self._subjects(f"{subject}.part.*")
        held.update(await self._subjects(subject))
        return [
            "the snapshot message" if name == subject else f"part {name.rsplit('.', 1)[-1]}"
            for name, count in sorted(held.items())
            if count
        ]

    async def _compact(self, subject: str) -> str | None:
        """Remove every message of the bucket the server holds but cannot read back (a block damaged
        on disk): nats-server refuses to erase one (``STREAM.MSG.DELETE``: "malformed or corrupt
        message"), a purge filtered by its subject passes over it, and a purge up to a sequence inside
        its block leaves the block's accounting wrong; a whole purge removes every block file, unread.
        So every message it can read (other sessions' snapshots and parts) is read first, the stream is
        purged, and each is written back only on a subject still empty (one saved meanwhile is newer
        and stays). `subject`'s own messages (the key being deleted) are not written back. Reads the
        whole bucket: only for a damage on disk, never on a healthy delete. A snapshot saved between the
        read and the purge is lost (a longer load); one erased in that window comes back, and its next
        load deletes it as erased (its erasure record). None, or why the server refused the purge."""
        kept: list[StoredMessage] = []
        dropped = 0
        for name in sorted(await self._subjects(f"$KV.{self._bucket}.>")):
            if name == subject or name.startswith(f"{subject}.part."):
                continue
            message = await self._get(name)
            if message is None:
                dropped += 1
            else:
                kept.append(message)
        try:
            await self._conn.api(f"$JS.API.STREAM.PURGE.{self._stream}", {})
        except nats.js.errors.APIError as exc:  # nothing purged, nothing lost
            return f"nats-server refused to purge the bucket: {exc.description}"
        except PermissionDenied as exc:  # credentials without the purge: nothing purged
            return f"these credentials may not purge the bucket: {exc}"
        self._saved.clear()  # every position this store knew is gone
        self._unsavable.clear()  # and every message it could not read
        for message in kept:
            try:
                await self._conn.js.publish(
                    message.subject, message.data, headers={**message.headers, _EXPECTED: "0"}
                )
            except nats.js.errors.APIError as exc:
                if exc.err_code not in (10071, 10164):
                    raise
        _log.warning(
            "the snapshot bucket %r held messages nats-server cannot read back (damaged on disk): "
            "purged, its %d readable message(s) written back; %d other unreadable subject(s) dropped",
            self._bucket,
            len(kept),
            dropped,
        )
        return None

    def keys(self, *, tenant_id: str | None = None, user_id: str | None = None) -> list[MemoryKey]:
        """See `SnapshotStore.keys`. From the bucket's subjects (snapshots and parts); none is read."""
        self._check_open()
        if user_id is not None and tenant_id is None:
            raise InvalidInput("user_id", "listing one user's snapshots needs tenant_id too")
        session_filter = self._keys.filter(tenant_id, user_id)
        if session_filter is None:
            return []
        subject_filter = session_filter[: -len(".*")] + ".>"
        subjects = self._conn.call(
            lambda: list_subjects(self._conn, self._stream, subject_filter), what="list snapshot subjects"
        )
        keys = {self._keys.key(".".join(s.split(".")[:5])) for s in subjects}
        return sorted((k for k in keys if k is not None), key=MemoryKey.composite)

    async def _erase(self, position: int) -> None:
        """Erase one message of the bucket's stream (``STREAM.MSG.DELETE`` overwrites its bytes)."""
        try:
            await self._conn.api(f"$JS.API.STREAM.MSG.DELETE.{self._stream}", {"seq": position})
        except nats.js.errors.APIError as exc:
            if exc.err_code not in _GONE:  # gone already: another saver or eraser got there first
                raise

    async def _get(self, subject: str) -> StoredMessage | None:
        return await self._conn.get_message(self._stream, {"last_by_subj": subject})

    async def _subjects(self, subject_filter: str) -> dict[str, int]:
        subjects: dict[str, int] = {}
        while True:
            info = await self._conn.api(
                f"$JS.API.STREAM.INFO.{self._stream}",
                {"subjects_filter": subject_filter, "offset": len(subjects)},
            )
            page = info["state"].get("subjects") or {}
            subjects.update(page)
            if not page or len(subjects) >= int(info.get("total", 0)):
                return subjects

    def check(self, key: MemoryKey) -> str | None:
        """Why the session's stored snapshot cannot be read back whole (a message or part fails its
        checksum, is held but unreadable, or is missing), or None: what `verify` reports as damage.
        (Whether its state matches its hash and the log, `verify` checks itself.)"""
        self._check_open()
        subject = self.subject(key)
        return self._conn.call(lambda: self._check(subject), what=f"check snapshot of {key}")

    async def _check(self, subject: str) -> str | None:
        held = await self._subjects(subject + ".>")
        held.update(await self._subjects(subject))
        head = await self._get(subject)
        if head is None:
            if held.get(subject):
                return "the snapshot is stored but the server cannot read it back (damaged on disk)"
            return None
        problem = _damaged(head)
        if problem is not None:
            return f"the snapshot message {problem}"
        snapshot = _decode(head)
        if snapshot is None:
            return (
                None if head.headers.get(_OPERATION) in ("DEL", "PURGE") else "the snapshot does not decode"
            )
        count = _part_count(head)
        for i in range(count):
            name = f"{subject}.part.{i}"
            part = await self._get(name)
            if part is None:
                if held.get(name):
                    return (
                        f"part {i} of {count} is stored but the server cannot read it back (damaged on disk)"
                    )
                return f"part {i} of {count} is missing"
            problem = _damaged(part)
            if problem is not None:
                return f"part {i} of {count} {problem}"
        return None

    def close(self) -> None:
        """See `SnapshotStore.close`. Releases this store's share of the connection."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._conn.release()


def _part_count(message: StoredMessage | None) -> int:
    """How many parts hold the bytes of the snapshot in `message` (0: it holds them itself)."""
    value = message.headers.get(_PARTS) if message is not None else None
    return int(value) if value is not None and value.isdigit() else 0


def _damaged(message: StoredMessage) -> str | None:
    """Why `message` fails its checksum, or None (also for messages saved before it existed)."""
    stored = message.headers.get(SUM_HEADER)
    if stored is None:
        return None
    computed = seal("", message.subject, message.data)
    if stored == computed:
        return None
    return f"fails its checksum (stored {stored[:16]!r}, the bytes read give {computed})"


def _decode(message: StoredMessage | None) -> Snapshot | None:
    if message is None or message.headers.get(_OPERATION) in ("DEL", "PURGE") or not message.data:
        return None
    try:
        return _decoder.decode(message.data)
    except (msgspec.MsgspecError, ValueError, TypeError):
        return None
