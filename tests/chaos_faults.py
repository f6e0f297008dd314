"""The chaos cases of bad input and exhausted limits: oversized turns, retries after the
duplicate window, foreign messages in a session, a full store.

Each returns a `Tally` (tests/chaos.py) like the process faults do, with the
case's own counts in its notes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path

import msgspec
import nats
from chaos import CONFIG, DEADLINE, Tally, ThreadLoad, keys_for, running_server, stored_texts

import convmem
from convmem import MemorySystem
from convmem.actors import load_state
from convmem.adapters import JetStreamBackend
from convmem.adapters.backends.jetstream._log import DEFAULT_PREFIX
from convmem.adapters.backends.jetstream._read import SEQ_HEADER
from convmem.errors import ConvmemError, InvalidTurn
from convmem.events import ConversationTurn, TurnAdded, decode_event, encode_event

__all__ = ["FOREIGN_KINDS", "duplicate_window_retries", "foreign_messages", "oversized_turns"]


# Oversized turns ------------------------------------------------------------------------


def oversized_turns(tmp: Path, *, sessions: int, turns: int) -> Tally:
    """Turns over the server's max_payload (a million 'é', a 5 MB artifact) sent beside a normal load.

    Each must be refused at once as `InvalidTurn` (never retried as an outage,
    never stored), and its session must take the next normal turn.
    """
    tally = Tally("oversized turns beside a load")
    keys = keys_for(sessions)
    big = [
        ConversationTurn(user_message="é" * 1_000_000, assistant_response="ok"),
        ConversationTurn(
            user_message="report", assistant_response="ok", artifacts_shown={"blob": "x" * 5_000_000}
        ),
    ]
    refused: list[str] = []
    misreported: list[str] = []
    with (
        running_server(tmp / "nats", "always") as server,
        convmem.connect(server.url, config=CONFIG) as memory,
    ):
        load = ThreadLoad(memory.session, tally, keys, turns)
        load.start()
        try:
            for n, key in enumerate(keys):
                turn = big[n % len(big)]
                try:
                    memory.session(key).add_turn(turn, timeout=10, idempotency_key=f"big-{n}")
                except InvalidTurn:
                    refused.append(key.session_id)
                except ConvmemError as exc:  # refused, but named as something it is not
                    misreported.append(f"{type(exc).__name__}: {exc}")
                else:
                    misreported.append(f"{key.session_id}: acknowledged")
        finally:
            load.join()
        tally.stored = stored_texts(server.url, {k.session_id: k for k in keys})
    tally.notes["oversized_sent"] = len(keys)
    tally.notes["refused_as_invalid_turn"] = len(refused)
    tally.notes["misreported"] = len(misreported)
    tally.notes["misreported_sample"] = misreported[:2]
    tally.notes["oversized_stored"] = sum(len(t) > 100 for texts in tally.stored.values() for t in texts)
    return tally


# Retries after the duplicate window -------------------------------------------------------


async def _until_forgotten(url: str, window: float) -> float:
    """Wait for the server to forget a message id published now: the fact a duplicate window passed.

    A scratch stream with the same window gets one message under an id, then
    the same id again until the server stores it instead of calling it a
    duplicate. Returns the seconds it took.
    """
    client = await nats.connect(url)
    try:
        js = client.jetstream()
        name = f"PROBE_{uuid.uuid4().hex[:8]}"
        await js.add_stream(name=name, subjects=[f"probe.{name}"], duplicate_window=window)
        began = time.monotonic()
        await js.publish(f"probe.{name}", b"1", headers={"Nats-Msg-Id": "probe"})
        pause = asyncio.Event()  # never set: a bounded pause between checks, not the thing waited on
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pause.wait(), window / 10)
            ack = await js.publish(f"probe.{name}", b"2", headers={"Nats-Msg-Id": "probe"})
            if not ack.duplicate:
                await js.delete_stream(name)
                return time.monotonic() - began
            if time.monotonic() - began > DEADLINE:
                raise AssertionError(f"the server still calls the id a duplicate after {DEADLINE:g}s")
    finally:
        await client.close()


def duplicate_window_retries(tmp: Path, *, sessions: int, turns: int, window: float = 1.0) -> Tally:
    """Every turn re-sent with its key after the stream's duplicate window: by the process that wrote it
    (sessions live) and by a new process (sessions rebuilt from the log). Nothing may be stored twice."""
    tally = Tally(f"retries after a {window:g} s duplicate window")
    keys = keys_for(sessions)
    resent: dict[str, int] = {"same process": 0, "new process": 0}
    with running_server(tmp / "nats", "always") as server:

        def system() -> tuple[JetStreamBackend, MemorySystem]:
            backend = JetStreamBackend.connect(server.url, duplicate_window=window)
            return backend, MemorySystem(CONFIG, log=backend.log, snapshots=backend.snapshots)

        first_backend, first = system()
        try:
            load = ThreadLoad(first.session, tally, keys, turns)
            load.start()
            load.join()
            tally.fault()  # the "fault": time passes beyond the window
            tally.notes["window_passed_after_s"] = round(asyncio.run(_until_forgotten(server.url, window)), 3)
            second_backend, second = system()
            try:
                for label, memory in (("same process", first), ("new process", second)):
                    for key in keys:
                        for n in range(turns):
                            text = f"{key.session_id}-{n}"
                            turn = ConversationTurn(user_message=text, assistant_response="ok")
                            memory.session(key).add_turn(turn, timeout=10, idempotency_key=text)
                            resent[label] += 1
            finally:
                second.close()
                second_backend.close()
        finally:
            first.close()
            first_backend.close()
        tally.stored = stored_texts(server.url, {k.session_id: k for k in keys}, duplicate_window=window)
    tally.notes["resent"] = resent
    return tally


# Foreign messages in a session ------------------------------------------------------------

FUTURE_EVENT = b"\x82\xa4type\xacfuture.thing\xa3seq\x03"
"""A msgpack event of a tag this version does not know, claiming seq 3."""


def _foreign(kind: str, last: TurnAdded) -> tuple[bytes, dict[str, str] | None]:
    """The body and headers of one kind of foreign message, after a session whose last turn is `last`."""

    def turn_at(seq: int) -> bytes:
        turn = ConversationTurn(user_message=f"foreign {kind}", assistant_response="?")
        return encode_event(msgspec.structs.replace(last, seq=seq, event_id=f"foreign/{kind}", turn=turn))

    if kind == "next seq in the body, no header":
        return turn_at(last.seq + 1), None
    if kind == "not an event, with a header":
        return b"\x00 not msgpack", {SEQ_HEADER: str(last.seq + 1)}
    if kind == "not an event, no header":
        return b"\x00 not msgpack", None
    if kind == "a valid event with a rewound seq":
        return turn_at(2), {SEQ_HEADER: "2"}
    assert kind == "an unknown tag sharing a valid seq", kind
    return FUTURE_EVENT, {SEQ_HEADER: "3"}


FOREIGN_KINDS = (
    "next seq in the body, no header",
    "not an event, with a header",
    "not an event, no header",
    "a valid event with a rewound seq",
    "an unknown tag sharing a valid seq",
)


async def _inject(url: str, messages: list[tuple[str, bytes, dict[str, str] | None]]) -> list[int]:
    client = await nats.connect(url)
    try:
        js = client.jetstream()
        return [
            int((await js.publish(subject, body, headers=headers)).seq) for subject, body, headers in messages
        ]
    finally:
        await client.close()


def foreign_messages(tmp: Path, *, sessions: int, turns: int, give_up: float = 20.0) -> Tally:
    """One foreign message of each kind published into a session of its own between two halves of a
    load; the load goes on in the same process, then a new process writes each session once more.

    Every session must stay writable (a write not acknowledged within `give_up`
    seconds fails the case), every foreign message must be reported with its
    position by a replay, and the replay must hold every acknowledged turn.
    """
    assert sessions >= len(FOREIGN_KINDS)
    tally = Tally("foreign messages, with and without headers")
    keys = keys_for(sessions)
    poisoned = dict(zip((k.session_id for k in keys), FOREIGN_KINDS, strict=False))
    with running_server(tmp / "nats", "always") as server:
        with convmem.connect(server.url, config=CONFIG, timeout=2.0) as memory:
            ThreadLoad(memory.session, tally, keys, turns // 2, give_up=give_up).start_and_join()
            messages = []
            with JetStreamBackend.connect(server.url) as backend:
                for key in keys[: len(FOREIGN_KINDS)]:
                    *_, last = (decode_event(r.data) for r in backend.log.read(key))
                    assert isinstance(last, TurnAdded)
                    body, headers = _foreign(poisoned[key.session_id], last)
                    messages.append((f"{DEFAULT_PREFIX}.{'.'.join(key.tokens())}", body, headers))
            tally.fault()
            positions = asyncio.run(_inject(server.url, messages))
            ThreadLoad(memory.session, tally, keys, turns, start=turns // 2, give_up=give_up).start_and_join()
        with convmem.connect(server.url, config=CONFIG, timeout=2.0) as fresh:  # a process that starts now
            ThreadLoad(fresh.session, tally, keys, turns + 1, start=turns, give_up=give_up).start_and_join()
            flagged, hidden = {}, 0
            for key in keys:
                state, report = load_state(fresh.log, None, key)  # a full replay, no snapshot
                flagged[key.session_id] = sorted(p.position for p in report.poison)
                shown = {r.turn.user_message for r in state.turns}
                hidden += len(set(tally.acked[key.session_id]) - shown)
        tally.stored = stored_texts(server.url, {k.session_id: k for k in keys})
    expected = dict(zip(poisoned, ([p] for p in positions), strict=True))
    tally.notes["foreign_reported"] = sum(flagged[s] == expected.get(s, []) for s in flagged)
    tally.notes["foreign_expected"] = len(flagged)
    tally.notes["unreported"] = {poisoned[s]: flagged[s] for s in poisoned if flagged[s] != expected[s]}
    tally.notes["hidden_from_replay"] = hidden
    return tally
