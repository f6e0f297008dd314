"""When a live session saves a snapshot: the pure rule (`snapshot_due`, `snapshot_offset`), no threads."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st
from strategies import SESSION_KEY, keys

from convmem.events import MemoryKey
from convmem.projections import LIVE_TURNS_PER_SAVE_EVENT, snapshot_due, snapshot_interval, snapshot_offset


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


def _points_with_live(key: MemoryKey, every: int, last: int, live: int) -> list[int]:
    return [v for v in range(1, last + 1) if snapshot_due(key, every, v - 1, v, live)]


def test_a_session_with_many_live_turns_saves_less_often() -> None:
    """Given 1,000 live turns and a cadence of 50, when the session grows one event at a time, then
    it saves every 400 events (50 doubled until a save comes at most once per 4 live turns), on
    points of its plain cadence; with 200 live turns or fewer the cadence is the plain one."""
    assert snapshot_interval(50, 1000) == 400
    assert snapshot_interval(50, 200) == 50
    assert snapshot_interval(50, 201) == 100
    assert LIVE_TURNS_PER_SAVE_EVENT == 4
    offset = snapshot_offset(SESSION_KEY, 50)
    points = _points_with_live(SESSION_KEY, 50, 2000, 1000)
    assert points == [v for v in range(1, 2001) if v % 400 == offset and v > 0]
    assert set(points) <= set(_points(SESSION_KEY, 50, 2000))
    assert _points_with_live(SESSION_KEY, 50, 600, 200) == _points(SESSION_KEY, 50, 600)


@given(keys, st.integers(1, 64), st.integers(0, 2000), st.integers(1, 3000))
def test_saves_are_never_further_apart_than_the_stretched_cadence(
    key: MemoryKey, every: int, live: int, last: int
) -> None:
    """For any key, cadence and live-turn count, saves are exactly `snapshot_interval` apart, that
    interval is under max(every, live / 2) events, and every save is a point of the plain cadence."""
    interval = snapshot_interval(every, live)
    assert interval * LIVE_TURNS_PER_SAVE_EVENT >= live
    assert interval == every or interval < max(every, live / 2) + 1
    points = _points_with_live(key, every, last, live)
    assert all(b - a == interval for a, b in itertools.pairwise(points))
    assert set(points) <= set(_points(key, every, last))


def test_live_turns_that_grow_keep_saves_on_the_plain_cadence() -> None:
    """A session whose live turns grow past the bound saves on points of its plain cadence, never
    more than the stretched interval apart."""
    every, saves, live = 10, [], 0
    for version in range(1, 1001):
        live = min(live + 1, 300)
        if snapshot_due(SESSION_KEY, every, version - 1, version, live):
            saves.append(version)
    plain = set(_points(SESSION_KEY, every, 1000))
    assert set(saves) <= plain
    assert all(b - a <= snapshot_interval(every, 300) for a, b in itertools.pairwise(saves))
    assert len(saves) < len(plain)
