"""Faults to put into a log, for the reliability tests and the chaos suite.

* `wait_past_duplicate_window`: waits (on the fact, with a timeout) until a
  JetStream stream has forgotten the message ids it was sent before the call;
* `poison`: the bytes and header of each kind of message that does not fit a
  session's sequence, and `write_poison`, which stores one in a session's
  subject (JetStream or in-memory log alike).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Literal

import msgspec
import nats

from convmem.actors import EventLog
from convmem.events import ConversationTurn, MemoryKey, TurnAdded, encode_event

__all__ = ["POISON_KINDS", "PoisonKind", "poison", "wait_past_duplicate_window", "write_poison"]

PoisonKind = Literal["no-header", "rewound", "unknown-tag", "mismatch", "ahead", "garbage", "unfoldable"]
POISON_KINDS: tuple[PoisonKind, ...] = (
    "no-header",
    "rewound",
    "unknown-tag",
    "mismatch",
    "ahead",
    "garbage",
    "unfoldable",
)


def _turn_bytes(seq: int, index: int, text: str) -> bytes:
    turn = ConversationTurn(user_message=text, assistant_response="forged")
    return encode_event(
        TurnAdded(seq=seq, event_id=f"forged-{uuid.uuid4().hex}", at=1.0, index=index, turn=turn)
    )


def poison(kind: PoisonKind, version: int, *, index: int = 10_000) -> tuple[bytes, int | None]:
    """A message that does not fit a session at `version`: its bytes and its ``Convmem-Seq`` header.

    * ``no-header``: a valid event for the next seq, stored without the header;
    * ``rewound``: a valid event whose seq (header and body) the session already has;
    * ``unknown-tag``: an event of a type no convmem knows, claiming the next seq in its body only;
    * ``mismatch``: the header says the next seq, the body another;
    * ``ahead``: a valid event that skips seqs (header and body);
    * ``garbage``: bytes that are no event, without a header;
    * ``unfoldable``: a turn for the next seq (header and body) that reuses turn number 1.
    """
    match kind:
        case "no-header":
            return _turn_bytes(version + 1, index, "no header"), None
        case "rewound":
            seq = max(version - 1, 1)
            return _turn_bytes(seq, index, "rewound"), seq
        case "unknown-tag":
            body = {"type": "from.the.future", "seq": version + 1, "event_id": "future", "at": 1.0}
            return msgspec.msgpack.encode(body), None
        case "mismatch":
            return _turn_bytes(version + 3, index, "mismatch"), version + 1
        case "ahead":
            return _turn_bytes(version + 5, index, "ahead"), version + 5
        case "garbage":
            return b"\xc1 not an event", None
        case "unfoldable":
            return _turn_bytes(version + 1, 1, "unfoldable"), version + 1


def write_poison(log: EventLog, key: MemoryKey, kind: PoisonKind, version: int) -> int:
    """Store a `poison` message of `kind` in `key`'s subject (the session at `version`); its position."""
    data, seq = poison(kind, version)
    append_raw = getattr(log, "append_raw", None)
    assert append_raw is not None, f"{type(log).__name__} cannot store raw bytes"
    position: int = append_raw(key, data, seq=seq)
    return position


def wait_past_duplicate_window(url: str, subject: str, timeout: float = 30.0) -> None:
    """Until the stream holding `subject` has forgotten the message ids it was sent before this call.

    A probe message is published on `subject` under one id, then again under
    the same id until the server no longer calls it a duplicate: every id
    published before the first probe has left the duplicate window too.
    `subject` must be one of the stream's (a session subject no test reads).
    """

    async def probe() -> None:
        nc = await nats.connect(url)
        try:
            headers = {"Nats-Msg-Id": f"probe-{uuid.uuid4().hex}"}
            await nc.request(subject, b"probe", timeout=5, headers=headers)
            pause = threading.Event()  # never set: it paces the probes; the window's end is the fact
            deadline = time.monotonic() + timeout
            while True:
                reply = await nc.request(subject, b"probe", timeout=5, headers=headers)
                if not msgspec.json.decode(reply.data).get("duplicate"):
                    return
                assert time.monotonic() < deadline, (
                    f"the duplicate window of {subject} outlasted {timeout:g}s"
                )
                await asyncio.to_thread(pause.wait, 0.02)
        finally:
            await nc.close()

    asyncio.run(probe())
