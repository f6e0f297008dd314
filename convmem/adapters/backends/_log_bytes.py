"""What both event logs (in memory and JetStream) decide the same way about stored event bytes."""

from __future__ import annotations

from convmem.errors import EventDecodeError
from convmem.events import HistoryCompacted, SessionErased, decode_event

__all__ = ["opens_history"]


def opens_history(data: bytes, seq: int) -> bool:
    """Whether `data` is a `HistoryCompacted` or a `SessionErased` fence at `seq` (see `drop_before`)."""
    try:
        event = decode_event(data)
    except EventDecodeError:
        return False
    return isinstance(event, HistoryCompacted | SessionErased) and event.seq == seq
