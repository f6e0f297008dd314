"""When a live session saves a snapshot: the pure rule (`snapshot_due`, `snapshot_offset`), no threads."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st
from strategies import SESSION_KEY, keys

from convmem.events import MemoryKey
from convmem.projections import snapshot_due, snapshot_offset


def _points(key: MemoryKey, every: int, last: int) -> list[int]:
    """The versions at which a session writing one event at a time saves, up to `last`."""
    return [v for v in range(1, last + 1) if snapshot_due(key, every, v - 1, v)]


def test_a_session_saves_at_its_offset_and_then_every_n_events() -> None:
    """Given a cadence of 4 and a key's offset, when the session grows one event at a time, then it
    saves at each version that is its offset plus a multiple of 4 (4 itself when the offset is 0)."""
    offset = snapshot_offset(SESSION_KEY, 4)
    assert 0 <= offset < 4
    first = offset if offset > 0 else 4
    assert _points(SESSION_KEY, 4, 17) == list(range(first, 18, 4))


def test_a_write_of_many_events_that_passes_a_point_saves_once() -> None:
    """Given a point inside a batch of events, when the session jumps past it, then a save is due;
    a jump that stays between two points is not."""
    offset = snapshot_offset(SESSION_KEY, 10)
    point = offset if offset > 0 else 10
    assert snapshot_due(SESSION_KEY, 10, point - 1, point + 3)
    assert not snapshot_due(SESSION_KEY, 10, point, point + 9)


def test_a_cadence_of_one_saves_after_every_event() -> None:
    assert snapshot_offset(SESSION_KEY, 1) == 0
    assert _points(SESSION_KEY, 1, 5) == [1, 2, 3, 4, 5]


def test_the_offset_is_a_stable_hash_of_the_key_not_pythons_hash() -> None:
    """The same in every process and run (BLAKE2b of the key's parts): pinned, so a change shows."""
    assert snapshot_offset(MemoryKey("t", "u", "s"), 1_000_003) == snapshot_offset(
        MemoryKey("t", "u", "s"), 1_000_003
    )
    assert snapshot_offset(MemoryKey("t", "u", "s"), 1_000_003) == 872_106
    assert snapshot_offset(MemoryKey("t", "u", "s1"), 1_000_003) != snapshot_offset(
        MemoryKey("t", "us", "1"), 1_000_003
    )  # the parts are kept apart, not run together


@given(keys, st.integers(1, 64), st.integers(1, 300))
def test_saves_are_never_more_than_n_events_apart(key: MemoryKey, every: int, last: int) -> None:
    """For any key and cadence, the saves of a session growing one event at a time are exactly
    `every` apart, the first within the first `every` events."""
    points = _points(key, every, last)
    assert all(b - a == every for a, b in itertools.pairwise(points))
    assert len(points) == last // every or len(points) == last // every + 1
    if points:
        assert points[0] <= every
