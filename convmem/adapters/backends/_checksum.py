"""The checksum every stored event carries, and its check on every read.

A log seals each event it stores with a CRC-32 of its session seq, its event
id and its bytes as stored (after any encryption), written beside it as the
``Convmem-Sum`` header (eight hex digits). Every read checks it: a record
whose checksum matches is *intact* (`LoggedEvent.intact`); one whose
checksum does not is *damaged* (`LoggedEvent.damage` says what failed). A
record without the header was stored before convmem checksummed events (or not
by convmem): it is read as before, unchecked. CRC-32 finds every flipped bit
and every burst of up to 32 bits, at a small fraction of the cost of
encoding the event; it guards against damage, not against a writer that may
publish on the subject (those are kept out by the server's permissions).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

__all__ = ["SUM_HEADER", "check", "seal"]

SUM_HEADER = "Convmem-Sum"


def seal(seq: int | str, event_id: str, data: bytes) -> str:
    """The checksum of an event stored at session seq `seq` with id `event_id` and bytes `data`."""
    return "%08x" % zlib.crc32(data, zlib.crc32(f"{seq}/{event_id}".encode()))  # noqa: UP031


def check(
    headers: Mapping[str, str], data: bytes, *, seq_header: str, id_header: str
) -> tuple[bool, str | None]:
    """(intact, damage) of a stored message: whether its checksum matched, and if not, why."""
    stored = headers.get(SUM_HEADER)
    if stored is None:
        return False, None
    seq, event_id = headers.get(seq_header, ""), headers.get(id_header, "")
    computed = seal(seq, event_id, data)
    if stored == computed:
        return True, None
    return False, (
        f"its checksum does not match: stored {stored[:16]!r}, the bytes read give {computed} "
        "(the stored bytes, seq or event id changed since they were written)"
    )
