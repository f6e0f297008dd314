"""The fold: evolve and replay, redelivery, gaps, tombstones, unknown events, the fast path."""

from __future__ import annotations

import pytest
from strategies import Script, turn

from convmem.errors import EventDecodeError, ReplayError, UnknownEventType
from convmem.events import (
    BacklogTrimmed,
    ConversationTurn,
    HealthChanged,
    ItemPopped,
    ItemsAdded,
    MemoryBudget,
    MemoryHealth,
    MemoryKey,
    MessageItem,
    SessionCleared,
    SessionErased,
    SessionRestored,
    SessionStarted,
    ShortTermMemoryConfig,
    SummaryProduced,
    TrajectoryDigest,
    TurnAdded,
)
from convmem.projections import (
    SessionState,
    SkippedEvent,
    decode_state,
    encode_state,
    evolve,
    rendered_turn_length,
    replay,
    skipped_from_error,
    state_hash,
)

KEY = MemoryKey("acme", "alice@example.com", "chat.1")
CONFIG = ShortTermMemoryConfig(strategy="rolling_summary", budget=MemoryBudget(full_zone_turns=2))


def fold(events: list) -> SessionState:
    """The plain fold, one evolve at a time."""
    state = SessionState()
    for event in events:
        state = evolve(state, event)
    return state


def started() -> Script:
    script = Script()
    script.start(KEY, CONFIG)
    return script


def test_session_started_records_key_config_and_time() -> None:
    """The first event opens the session with its key and configuration."""
    script = started()
    state = fold(script.events)
    assert state.started
    assert (state.key, state.config, state.version) == (KEY, CONFIG, 1)
    assert state.health_since == 1000.0
    assert state.health is MemoryHealth.HEALTHY


def test_turns_are_kept_in_order_with_their_numbers() -> None:
    """Each TurnAdded appends a record with its number, time and rendered length."""
    script = started()
    script.turns(1, 2, 3)
    state = fold(script.events)
    assert [r.index for r in state.turns] == [1, 2, 3]
    assert [r.turn for r in state.turns] == [turn(1), turn(2), turn(3)]
    assert state.next_index == 4
    assert all(r.rendered_len == rendered_turn_length(r.turn, include_digest=True) for r in state.turns)


def test_an_already_applied_event_changes_nothing() -> None:
    """Redelivery of an event whose seq was applied returns the very same state."""
    script = started()
    script.turns(1, 2)
    state = fold(script.events)
    for event in script.events:
        assert evolve(state, event) is state


def test_a_gap_in_seqs_raises_replay_error() -> None:
    """An event that skips a seq cannot be folded: a history with a hole is not trusted."""
    script = started()
    first, _, third = script.turns(1, 2, 3)
    state = fold([script.events[0], first])
    with pytest.raises(ReplayError, match="1 event\\(s\\) missing"):
        evolve(state, third)
    with pytest.raises(ReplayError, match="missing"):
        replay([script.events[0], first, third])


def test_events_before_the_session_started_raise() -> None:
    """Only SessionStarted (or a tombstone) may open a history."""
    event = TurnAdded(seq=1, event_id="e1", at=1.0, index=1, turn=turn(1))
    with pytest.raises(ReplayError, match="before the session started"):
        evolve(SessionState(), event)


def test_a_session_cannot_start_twice() -> None:
    """A second SessionStarted is a broken history."""
    script = started()
    script.start(KEY, CONFIG)
    with pytest.raises(ReplayError, match="started twice"):
        fold(script.events)


def test_turn_numbers_must_increase() -> None:
    """A TurnAdded whose number is not above the last one is refused."""
    script = started()
    script.turns(1)
    script.emit(TurnAdded, index=1, turn=turn(2))
    with pytest.raises(ReplayError, match="turn number 1"):
        fold(script.events)


def test_a_summary_replaces_the_previous_and_moves_the_watermark() -> None:
    """SummaryProduced sets the summary text and the last turn number it covers."""
    script = started()
    script.turns(1, 2, 3, 4)
    script.emit(SummaryProduced, summary="s1", covers_from=1, covers_through=1)
    script.emit(SummaryProduced, summary="s2", covers_from=2, covers_through=2)
    state = fold(script.events)
    assert (state.summary, state.summary_through) == ("s2", 2)
    assert [r.index for r in state.turns] == [1, 2, 3, 4]
    assert [r.index for r in state.pending()] == []
    assert [r.index for r in state.recent()] == [3, 4]


def test_health_changes_record_state_attempt_and_time() -> None:
    """HealthChanged sets the health, the attempt and when the state began."""
    script = started()
    script.at = 1005.0
    script.emit(HealthChanged, old=MemoryHealth.HEALTHY, new=MemoryHealth.RETRY, reason="boom", attempt=1)
    state = fold(script.events)
    assert (state.health, state.attempt, state.health_since) == (MemoryHealth.RETRY, 1, 1005.0)


def test_backlog_trim_only_moves_its_watermark_forward() -> None:
    """BacklogTrimmed drops turns up to its number from the zones; an older trim does not undo it."""
    script = started()
    script.turns(1, 2, 3, 4, 5)
    script.emit(BacklogTrimmed, dropped_through=2)
    script.emit(BacklogTrimmed, dropped_through=1)
    state = fold(script.events)
    assert state.dropped_through == 2
    assert [r.index for r in state.pending()] == [3]
    assert len(state.turns) == 5  # the log-derived turns are all still there


def test_a_clear_forgets_turns_and_summary_but_never_reuses_numbers() -> None:
    """After SessionCleared no turn or summary is live and numbering continues."""
    script = started()
    script.turns(1, 2, 3)
    script.emit(SummaryProduced, summary="s", covers_from=1, covers_through=1)
    script.emit(SessionCleared, cleared_through=3)
    script.turns(4)
    state = fold(script.events)
    assert state.summary == ""
    assert [r.index for r in state.turns] == [4]
    assert state.watermark == 3


def test_a_clear_covers_turns_it_did_not_name() -> None:
    """A clear's watermark is at least the last stored turn, so nothing older comes back."""
    script = started()
    script.turns(1, 2, 3)
    script.emit(SessionCleared, cleared_through=1)
    state = fold(script.events)
    assert state.turns == ()
    assert state.next_index == 4


def test_a_restore_replaces_content_with_fresh_numbers() -> None:
    """SessionRestored numbers its turns from first_index; its summary covers none of them."""
    script = started()
    script.turns(1, 2)
    script.emit(SessionRestored, summary="old", turns=(turn("a"), turn("b"), turn("c")), first_index=3)
    state = fold(script.events)
    assert state.summary == "old"
    assert [(r.index, r.turn) for r in state.turns] == [(3, turn("a")), (4, turn("b")), (5, turn("c"))]
    assert state.summary_through == 2
    assert [r.index for r in state.pending()] == [3]
    assert state.next_index == 6


def test_an_erasure_leaves_only_the_key_and_the_version() -> None:
    """SessionErased resets the state; only the key and the seq survive."""
    script = started()
    script.turns(1, 2)
    script.emit(SessionErased, reason="gdpr")
    state = fold(script.events)
    assert state == SessionState(key=KEY, version=4, last_at=1000.0)
    assert not state.started


def test_a_tombstone_may_open_a_history_at_any_seq() -> None:
    """The events before a tombstone were purged, so it folds from any seq."""
    tomb = SessionErased(seq=41, event_id="erased", at=7.0)
    state = replay([tomb])
    assert (state.version, state.started, state.turns) == (41, False, ())
    restarted = SessionStarted(seq=42, event_id="s", at=8.0, key=KEY, config=CONFIG)
    state = replay([tomb, restarted])
    assert (state.started, state.key, state.version) == (True, KEY, 42)


def test_a_tombstone_jumps_over_a_gap_after_a_live_history() -> None:
    """A tombstone's seq may be far above the last applied one."""
    script = started()
    script.turns(1)
    state = fold([*script.events, SessionErased(seq=10, event_id="x", at=1.0)])
    assert state.version == 10


def test_a_stale_writer_cannot_write_below_a_tombstone() -> None:
    """Events at or below the tombstone's seq are ignored as already applied."""
    script = started()
    script.turns(1, 2)
    erased = replay([*script.events, SessionErased(seq=10, event_id="x", at=1.0)])
    for event in script.events:
        assert evolve(erased, event) is erased


def test_a_restarted_session_must_keep_its_key() -> None:
    """After an erasure the history may only restart the same key."""
    stranger = MemoryKey("acme", "mallory", "chat.1")
    state = replay([*started().events, SessionErased(seq=2, event_id="t", at=1.0)])
    with pytest.raises(ReplayError, match="starts session"):
        evolve(state, SessionStarted(seq=3, event_id="s", at=1.0, key=stranger, config=CONFIG))


def test_unknown_events_can_be_skipped_without_a_gap() -> None:
    """A SkippedEvent stand-in advances the version and is reported to on_skipped."""
    script = started()
    first, _, third = script.turns(1, 2, 3)
    error = UnknownEventType("turn.edited", event_seq=3)
    skipped = skipped_from_error(error)
    seen: list[SkippedEvent] = []
    state = replay([script.events[0], first, skipped, third], on_skipped=seen.append)
    assert [r.index for r in state.turns] == [1, 3]
    assert state.version == 4
    assert [s.seq for s in seen] == [3]
    assert "turn.edited" in seen[0].reason


def test_an_unknown_event_without_a_seq_cannot_be_skipped() -> None:
    """Skipping needs the event's own seq, else the gap could not be told from a loss."""
    with pytest.raises(ReplayError, match="no seq"):
        skipped_from_error(UnknownEventType("x.y"))


def test_replay_continues_from_a_snapshot_state() -> None:
    """replay(rest, state=snapshot) equals the full replay."""
    script = started()
    script.turns(1, 2, 3, 4)
    middle = replay(script.events[:3])
    assert replay(script.events[3:], state=middle) == replay(script.events)


def test_replay_fast_path_equals_the_plain_fold() -> None:
    """Runs of TurnAdded, broken by summaries, health, trims, clears, restores and erasures, fold alike."""
    script = started()
    script.turns(1, 2, 3)
    script.emit(SummaryProduced, summary="s", covers_from=1, covers_through=1)
    script.turns(4)
    script.emit(HealthChanged, old=MemoryHealth.HEALTHY, new=MemoryHealth.DEGRADED, reason="x", attempt=1)
    script.turns(5, 6)
    script.emit(BacklogTrimmed, dropped_through=3)
    script.turns(7)
    script.emit(SessionCleared, cleared_through=7)
    script.turns(8, 9)
    script.emit(SessionRestored, summary="r", turns=(turn("a"),), first_index=10)
    script.next_index = 11
    script.turns(11, 12)
    script.emit(SessionErased)
    script.start(KEY, CONFIG)
    script.next_index = 1
    script.turns(1, 2)
    events = script.events
    expected = fold(events)
    for end in range(len(events) + 1):
        assert replay(events[:end]) == fold(events[:end]), end
    assert replay(events) == expected
    assert [r.index for r in expected.turns] == [1, 2]


def test_replay_ignores_redelivered_turns_inside_a_run() -> None:
    """A TurnAdded delivered twice inside a run of turns is applied once."""
    script = started()
    first, second, third = script.turns(1, 2, 3)
    events = [script.events[0], first, second, first, second, third, third]
    assert replay(events) == fold(script.events)


def test_replay_refuses_a_gap_inside_a_run_of_turns() -> None:
    """The fast path checks seqs like evolve does."""
    script = started()
    first, _, third = script.turns(1, 2, 3)
    with pytest.raises(ReplayError, match="missing"):
        replay([script.events[0], first, third])


def test_last_at_is_the_latest_event_time() -> None:
    """last_at never moves backwards, whatever the event times."""
    script = started()
    script.at = 2000.0
    script.turns(1)
    script.at = 1500.0
    script.turns(2)
    assert replay(script.events).last_at == 2000.0
    assert fold(script.events).last_at == 2000.0


def test_rendered_lengths_follow_the_digest_setting() -> None:
    """A record's rendered length is measured with or without the digest, as configured."""
    with_digest = ConversationTurn(
        user_message="q", assistant_response="a", trajectory_digest=TrajectoryDigest(tools_invoked=("t",))
    )
    off = ShortTermMemoryConfig(strategy="truncation", include_trajectory_digest=False)
    for config, include in ((CONFIG, True), (off, False)):
        script = Script()
        script.start(KEY, config)
        script.emit(TurnAdded, index=1, turn=with_digest)
        (record,) = replay(script.events).turns
        assert record.rendered_len == rendered_turn_length(with_digest, include_digest=include)
    assert rendered_turn_length(with_digest, include_digest=True) > rendered_turn_length(
        with_digest, include_digest=False
    )


def test_replay_fast_path_keeps_item_events_in_order() -> None:
    """Items added or popped right after a run of turns fold exactly as the plain fold does."""
    script = started()
    script.turns(1, 2)
    script.emit(
        ItemsAdded,
        items=(
            MessageItem(kind="message", role="assistant", content="joins nothing: opens a turn"),
            MessageItem(kind="message", role="user", content="new question"),
        ),
        first_index=3,
    )
    script.next_index = 5
    script.turns(5)
    script.emit(ItemPopped, item=MessageItem(kind="message", role="assistant", content="answer 5"))
    script.turns(6)
    script.emit(
        ItemsAdded, items=(MessageItem(kind="message", role="assistant", content="more"),), first_index=7
    )
    events = script.events
    for end in range(len(events) + 1):
        assert replay(events[:end]) == fold(events[:end]), end


# Snapshots ----------------------------------------------------------------------------


def test_a_snapshot_decodes_to_the_same_state() -> None:
    """decode_state(encode_state(s)) == s, and the hash is of those bytes."""
    script = started()
    script.turns(1, 2, 3)
    script.emit(SummaryProduced, summary="s", covers_from=1, covers_through=1)
    state = replay(script.events)
    assert decode_state(encode_state(state)) == state
    assert state_hash(decode_state(encode_state(state))) == state_hash(state)


def test_equal_states_have_equal_hashes_whatever_dict_order() -> None:
    """Two equal states hash equally even when their dicts were built in another order."""
    one = ConversationTurn(
        user_message="q", assistant_response="a", artifacts_shown={"a": 1, "b": {"x": 1, "y": 2}}
    )
    two = ConversationTurn(
        user_message="q", assistant_response="a", artifacts_shown={"b": {"y": 2, "x": 1}, "a": 1}
    )
    states = []
    for shown in (one, two):
        script = started()
        script.emit(TurnAdded, index=1, turn=shown)
        states.append(replay(script.events))
    assert states[0] == states[1]
    assert state_hash(states[0]) == state_hash(states[1])


def test_a_corrupt_snapshot_raises_a_decode_error() -> None:
    """Bytes that are not a snapshot raise EventDecodeError, so the caller replays from the start."""
    data = encode_state(replay(started().events))
    for bad in (b"", b"\x00garbage", data[:-3]):
        with pytest.raises(EventDecodeError):
            decode_state(bad)
