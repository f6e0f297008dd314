"""Encryption at the JetStream boundary: events sealed as they are encoded, opened as they are read.

Each event's whole encoded payload is sealed (payload-level, not field by
field: every user-originated field, present and future, is covered, and
sealing costs one AES-GCM call per event). What stays in clear is what the
log needs without the key: the subject (the session's ids, as before), the
``Nats-Msg-Id`` and ``Convmem-Seq`` headers, and the erasure fence (it holds
no user data). The associated data binds each event to its session and seq.

Reading, `Sealing` turns each stored message back into the plain bytes the
runtime decodes, so nothing above the adapters knows of keys:

* a sealed event whose user's data key was shredded (the user was erased,
  and this is a copy that erasure did not reach) becomes a `SessionErased`
  at its seq, with the reason `SHREDDED`: replays, verify, export and the
  timeline show it as erased;
* sealed bytes that fail authentication are damage, as a failed checksum
  is (`LoggedEvent.damage`): readers refuse the session with
  `SessionDamaged` naming the position, `verify` lists it, and a repair
  cuts or restores past it; bytes met elsewhere (a writer's walk) are
  passed on, and the decoder reports them as `SealBroken`;
* sealed bytes read without a keyring raise `EncryptionKeyError` (the store
  needs its master key), never garbage.

Plain (unsealed) events, written before encryption or with it off, are read
as they are: a log may mix both.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from convmem.actors import LoggedEvent
from convmem.adapters.backends._checksum import SUM_HEADER, check
from convmem.adapters.backends.jetstream._connection import StoredMessage
from convmem.adapters.backends.jetstream._read import MSG_ID, SEQ_HEADER, session_seq, to_logged
from convmem.adapters.backends.keys import MASTER_KEY_ENV, Keyring
from convmem.errors import EncryptionKeyError, SealBroken
from convmem.events import Event, MemoryKey, SessionErased, encode_event

__all__ = ["BROKEN_SEAL", "SHREDDED", "Sealing"]

SHREDDED = "crypto-shredded: the data key of this user was deleted by an erasure"
"""The reason of the `SessionErased` shown for an event whose data key is gone."""

BROKEN_SEAL = (
    "its encrypted bytes fail authentication with their data key (damaged, or tampered with by a "
    "writer that recomputed the checksum); nothing was read from them"
)
"""The `LoggedEvent.damage` of a sealed event that does not open."""


class Sealing:
    """Seals and opens one log's events with a `Keyring` (None: events are stored plain)."""

    __slots__ = ("keyring", "missing")

    def __init__(self, keyring: Keyring | None, missing: str | None = None) -> None:
        self.keyring = keyring
        self.missing = missing
        """Why there is no keyring although a master key is given (its key store is gone), if so."""

    def payloads(self, key: MemoryKey, events: Sequence[Event]) -> tuple[bytes, ...]:
        """The stored bytes of `events` of `key`: sealed when there is a keyring."""
        keyring = self.keyring
        if keyring is None:
            return tuple(encode_event(e) for e in events)
        context = keyring.context(key)
        seal = keyring.seal
        return tuple(seal(key, encode_event(e), context + str(e.seq).encode()) for e in events)

    def record(self, message: StoredMessage, key: MemoryKey) -> LoggedEvent:
        """A stored message as the port returns it, its checksum checked and its bytes opened.

        Sealed bytes that fail authentication (while their checksum, if any,
        matched: a writer that recomputed it) are damage, as a failed checksum
        is: the record keeps its bytes and says so in `damage`, so readers
        refuse the session with `SessionDamaged` naming the position, and
        `verify` lists it. (One record is made per message: this runs for
        every event read.)
        """
        data = message.data
        if data[:1] != b"\xc1" or SUM_HEADER not in message.headers:
            return to_logged(message, key)  # plain, or bytes no convmem sealed (each sealed one has a sum)
        headers = message.headers
        seq = session_seq(headers)
        # The checksum covers the bytes as stored (sealed).
        intact, damage = check(headers, data, seq_header=SEQ_HEADER, id_header=MSG_ID)
        keyring = self.keyring
        if damage is None and keyring is not None and seq is not None:
            try:
                # (`where` is not formatted per event: a failure is reported as damage, by position.)
                plain = keyring.open(
                    data,
                    keyring.context(key) + b"%d" % seq,
                    where="an event",
                    position=message.seq,
                    tenant=key.tenant_id,
                )
            except SealBroken:
                intact, damage = False, BROKEN_SEAL
            else:
                data = self._erased(message, seq) if plain is None else plain
        elif damage is None:
            data = self.plain(message, key, seq)  # without a keyring: EncryptionKeyError
        return LoggedEvent(
            key=key,
            seq=seq,
            position=message.seq,
            data=data,
            event_id=headers.get(MSG_ID),
            intact=intact,
            damage=damage,
        )

    def message_data(self, message: StoredMessage, key: MemoryKey | None) -> bytes:
        """The plain bytes of a stored message (as they are when plain, or of no session)."""
        if key is None or message.data[:1] != b"\xc1":
            return message.data
        return self.plain(message, key, session_seq(message.headers))

    def plain(
        self, message: StoredMessage, key: MemoryKey, seq: int | None, *, broken: bool = False
    ) -> bytes:
        """The plain bytes of sealed `message` (a `SessionErased` for a shredded key).

        Bytes that fail authentication are returned as they are (the decoder
        reports them), or raise `SealBroken` with `broken`.
        """
        if seq is None or SUM_HEADER not in message.headers:
            return message.data  # not written by convmem: the reader reports it as poison
        keyring = self.keyring
        if keyring is None:
            if self.missing is not None:
                raise EncryptionKeyError(
                    f"the event at position {message.seq} of {key} is encrypted, and its data keys "
                    f"cannot be read: {self.missing}",
                    source=self.missing,
                )
            raise EncryptionKeyError(
                f"the event at position {message.seq} of {key} is encrypted, and this log was opened "
                "without a master key: give the one it was written with (--master-key-file, "
                "--master-key-env, or the data folder of the embedded server)",
                source=f"no master key given ({MASTER_KEY_ENV} is not set)",
            )
        try:
            # (`where` is not formatted per event: a failure is reported by the decoder, by position.)
            plain = keyring.open(
                message.data,
                keyring.context(key) + str(seq).encode(),
                where="an event",
                position=message.seq,
                tenant=key.tenant_id,
            )
        except SealBroken:
            if broken:
                raise
            return message.data  # the decoder reports it as SealBroken at its position
        return self._erased(message, seq) if plain is None else plain

    @staticmethod
    def _erased(message: StoredMessage, seq: int) -> bytes:
        """What an event whose data key was shredded reads as: a `SessionErased` at its seq."""
        erased = SessionErased(
            seq=seq,
            event_id=message.headers.get(MSG_ID) or f"erased/{message.seq}",
            at=_stamp(message.headers.get("Nats-Time-Stamp")),
            reason=SHREDDED,
        )
        return encode_event(erased)


def _stamp(text: str | None) -> float:
    """Epoch seconds of a stored message's RFC 3339 time stamp (0.0 when absent or unreadable)."""
    if not text:
        return 0.0
    value = text.replace("Z", "+00:00")
    head, dot, rest = value.partition(".")
    if dot:  # nanoseconds: Python reads six digits
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits) :]
        value = f"{head}.{digits[:6]}{zone}"
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return 0.0
