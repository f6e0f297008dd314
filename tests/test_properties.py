"""The laws of the pure core, as hypothesis properties over generated events and histories."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import (
    ESTIMATORS,
    History,
    configs,
    events_by_type,
    histories,
    summaries,
    turns,
)

from convmem.events import (
    EVENT_TYPES,
    BacklogTrimmed,
    HealthChanged,
    MemoryHealth,
    SessionCleared,
    SessionErased,
    SessionRestored,
    TurnAdded,
    decode_event,
    decode_event_json,
    encode_event,
    encode_event_json,
)
from convmem.projections import (
    SessionState,
    compaction,
    decode_state,
    default_token_estimator,
    encode_state,
    estimate_tokens,
    evolve,
    full_tokens,
    live_horizon,
    llm_context,
    parse_export,
    replay,
    select_context,
    state_hash,
    to_dict,
    trim_summary,
    view_tokens,
)

# Codec ------------------------------------------------------------------------------


def test_every_event_type_has_a_strategy() -> None:
    """The codec law below covers every event type the codec knows."""
    assert set(events_by_type) == set(EVENT_TYPES)


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
@given(data=st.data())
def test_codec_round_trips_every_event_in_msgpack_and_json(cls: type, data: st.DataObject) -> None:
    """decode(encode(e)) == e for every event, in both encodings, and re-encoding is stable."""
    event = data.draw(events_by_type[cls])
    packed = encode_event(event)
    assert decode_event(packed) == event
    assert encode_event(decode_event(packed)) == packed
    text = encode_event_json(event)
    assert decode_event_json(text) == event
    assert encode_event_json(decode_event_json(text)) == text


# The fold ---------------------------------------------------------------------------


def fold(events: list[Any], state: SessionState | None = None) -> SessionState:
    current = state if state is not None else SessionState()
    for event in events:
        current = evolve(current, event)
    return current


@given(histories())
def test_replay_equals_the_incremental_fold(history: History) -> None:
    """replay(events) is the state the live session reached by evolving event after event."""
    assert replay(history.events) == history.state
    assert fold(history.events) == history.state
    for end in range(0, len(history.events) + 1, 5):
        assert replay(history.events[:end]) == fold(history.events[:end])


@given(histories())
def test_a_decision_folds_its_events_into_the_state_evolve_reaches(history: History) -> None:
    """decide_folded's state (what a write makes the session's on acknowledgement, without folding
    again) is the state its events reach evolved one by one, for every decision of a history."""
    assert history.folds
    for by_event, decided in history.folds:
        assert decided == by_event


@given(histories(), st.data())
def test_a_snapshot_plus_the_rest_equals_the_full_replay(history: History, data: st.DataObject) -> None:
    """decode_state(encode_state(prefix state)) + replay(rest) == replay(all), with equal hashes."""
    cut = data.draw(st.integers(0, len(history.events)))
    snapshot = decode_state(encode_state(replay(history.events[:cut])))
    resumed = replay(history.events[cut:], state=snapshot)
    assert resumed == history.state
    assert state_hash(resumed) == state_hash(history.state)


@given(histories(), st.data())
@settings(max_examples=30)
def test_a_compaction_that_keeps_every_turn_replays_to_the_same_state(
    history: History, data: st.DataObject
) -> None:
    """Compacting any started prefix to all its turns, then the rest (one seq later), replays to the
    full replay's state but for the version: the compaction carries everything the fold needs."""
    cut = data.draw(st.integers(0, len(history.events)))
    prefix = replay(history.events[:cut])
    assume(prefix.started)
    compacted = compaction(prefix, prefix.turns, event_id="retention/law", at=data.draw(st.floats(0, 4e9)))
    assert decode_event(encode_event(compacted)) == compacted
    rest = [msgspec.structs.replace(e, seq=e.seq + 1) for e in history.events[cut:]]
    resumed = replay([compacted, *rest])
    assert resumed == msgspec.structs.replace(history.state, version=history.state.version + 1)
    assert replay(rest, state=evolve(prefix, compacted)) == resumed


@given(histories())
def test_applying_an_event_twice_changes_nothing(history: History) -> None:
    """Redelivery is a no-op: evolve(s, e) after e is s itself, and a replay with duplicates is equal."""
    for event, state in zip(history.events, history.states, strict=True):
        assert evolve(state, event) is state
    doubled = [e for event in history.events for e in (event, event)]
    assert replay(doubled) == history.state
    if history.events:
        echoed = [*history.events, *history.events[: len(history.events) // 2]]
        assert replay(echoed) == history.state


# No turn is lost --------------------------------------------------------------------


@given(histories(items=False))
def test_every_turn_since_the_last_reset_is_in_the_state(history: History) -> None:
    """state.turns is the restored turns (if any) plus every TurnAdded since the last reset, less
    the oldest ones past the live horizon: never fewer than the horizon, never an unsummarized turn
    of a summarizing session (a turn leaves the live state, never the log)."""
    expected: list[Any] = []
    for event in history.events:
        match event:
            case TurnAdded():
                expected.append((event.index, event.turn))
            case SessionCleared() | SessionErased():
                expected = []
            case SessionRestored():
                expected = [(event.first_index + i, t) for i, t in enumerate(event.turns)]
    state = history.state
    kept = [(r.index, r.turn) for r in state.turns]
    assert kept == expected[len(expected) - len(kept) :]
    retired = expected[: len(expected) - len(kept)]
    horizon = live_horizon(state.config)
    if retired:
        assert horizon is not None
        assert len(kept) >= horizon
        assert all(index <= state.retired_through for index, _ in retired)
        if state.config.summarizes:
            assert all(index <= state.watermark for index, _ in retired)
    if horizon is not None and state.config.summarizes:
        assert len(kept) <= max(horizon, len(state.unsummarized()))
    elif horizon is not None:
        assert len(kept) <= horizon


def check_zones(state: SessionState) -> None:
    """Every live turn is summary-covered, backlog-dropped, pending or recent; pending is disjoint."""
    pending = {r.index for r in state.pending()}
    recent = {r.index for r in state.recent()}
    assert not pending & recent
    for record in state.turns:
        covered = record.index <= state.summary_through
        dropped = record.index <= state.dropped_through
        assert covered or dropped or record.index in pending or record.index in recent, record.index
        if record.index in pending:
            assert not covered
            assert not dropped


def visible_turns(state: SessionState) -> list[Any]:
    """What the seed's rules show before any budget: by strategy and health."""
    if state.config.strategy == "none":
        return []
    if state.config.strategy == "truncation" or state.health is MemoryHealth.DEGRADED:
        return list(state.recent())
    return [*state.pending(), *state.recent()]


# The exact invariant, after every event of every history:
#
# 1. Zones: every live turn (state.turns) is covered by the summary (number <= summary_through),
#    dropped from a DEGRADED backlog (number <= dropped_through), pending, or recent; pending and
#    recent are disjoint, and no pending turn is covered or dropped.
# 2. Drops: a BacklogTrimmed happens only in DEGRADED, so nothing leaves the zones unsummarized
#    because a summarizer was slow; between decisions a DEGRADED backlog holds at most
#    recovery_backlog_limit turns.
# 3. View: the visible turns are pending + recent (rolling_summary, not DEGRADED), recent only
#    (truncation, or DEGRADED), or none (strategy none). The view shows the newest n visible turns
#    for some n; when the unbudgeted view fits total_max_tokens it shows all of them, and the whole
#    summary wherever the summary is visible. Only the overflow policy may hide more.
@given(histories())
def test_every_live_turn_is_covered_pending_or_recent_and_shown_unless_a_rule_hides_it(
    history: History,
) -> None:
    """No turn is lost: the zone, drop and view invariant stated above holds after every event."""
    previous = SessionState()
    for i, (event, state) in enumerate(zip(history.events, history.states, strict=True)):
        check_zones(state)
        if isinstance(event, BacklogTrimmed):
            assert previous.health is MemoryHealth.DEGRADED
        if isinstance(event, HealthChanged):
            assert event.old is previous.health
        degraded = state.health is MemoryHealth.DEGRADED and state.config.summarizes
        if degraded and i in history.settled:
            assert len(state.pending()) <= state.config.recovery_backlog_limit
        previous = state
        if not state.started:
            continue
        visible = visible_turns(state)
        selection = select_context(state)
        shown = [*selection.pending, *selection.recent]
        assert shown == visible[len(visible) - len(shown) :]
        total = state.config.budget.total_max_tokens
        if not total or view_tokens(state) <= total:  # 0: no overall budget
            assert shown == visible
            showing_summary = (
                state.config.strategy == "rolling_summary" and state.health is not MemoryHealth.DEGRADED
            )
            assert selection.summary == (state.summary if showing_summary else "")


# Budgets ----------------------------------------------------------------------------


@pytest.mark.parametrize("estimator_name", sorted(ESTIMATORS))
@pytest.mark.parametrize("policy", ["truncate_oldest", "truncate_summary"])
@given(data=st.data())
@settings(max_examples=40)
def test_budgets_hold_for_every_sequence_of_turns_and_summaries(
    estimator_name: str, policy: str, data: st.DataObject
) -> None:
    """Under the truncate policies the view never exceeds total_max_tokens, unless it is empty."""
    estimator = ESTIMATORS[estimator_name]
    history = data.draw(
        histories(
            config_strategy=configs(strategies=("rolling_summary", "truncation"), policies=(policy,)),
            estimator=estimator,
        )
    )
    budget = history.config.budget.total_max_tokens
    for state in history.states:
        if not state.started:
            continue
        selection = select_context(state, estimator)
        empty = not (selection.summary or selection.pending or selection.recent)
        assert not budget or estimate_tokens(state, estimator) <= budget or empty


@pytest.mark.parametrize("estimator_name", sorted(ESTIMATORS))
@given(data=st.data())
@settings(max_examples=40)
def test_the_error_policy_never_stores_a_state_over_budget(estimator_name: str, data: st.DataObject) -> None:
    """Under the error policy no stored state's summary + pending + recent exceeds the budget."""
    # The one exception is a session holding nothing: its empty skeleton may not fit a tiny budget.
    estimator = ESTIMATORS[estimator_name]
    history = data.draw(
        histories(
            config_strategy=configs(strategies=("rolling_summary", "truncation"), policies=("error",)),
            estimator=estimator,
        )
    )
    for state in history.states:
        empty = not state.turns and not state.summary
        budget = history.config.budget.total_max_tokens
        assert not budget or full_tokens(state, estimator) <= budget or empty


@given(histories(turn_strategy=turns, max_size=20))
@settings(max_examples=40)
def test_estimate_tokens_is_exactly_the_estimator_over_the_rendered_view(history: History) -> None:
    """estimate_tokens == default_token_estimator(json.dumps(memory, ensure_ascii=False, sort_keys=True))."""
    for state in history.states:
        view = llm_context(state)
        if not view:
            assert estimate_tokens(state) == 0
            continue
        rendered = json.dumps(view["conversation_memory"], ensure_ascii=False, sort_keys=True)
        assert estimate_tokens(state) == default_token_estimator(rendered)


@given(summaries, st.integers(0, 400))
def test_trim_summary_keeps_tags_removes_whole_lines_and_fits(summary: str, limit: int) -> None:
    """trim_summary gives '' or the summary minus some tag-free lines, and what it gives fits."""

    def fits(text: str) -> bool:
        return len(text) <= limit

    trimmed = trim_summary(summary, fits)
    if not trimmed:
        return
    assert fits(trimmed)
    kept = trimmed.split("\n")
    lines = summary.split("\n")
    it = iter(lines)
    assert all(line in it for line in kept)  # a subsequence of the original lines
    for line in lines:
        if "<" in line and ">" in line and line.strip().startswith("<"):
            assert line in kept


# Export -----------------------------------------------------------------------------


@given(histories(turn_strategy=turns, max_size=20))
@settings(max_examples=40)
def test_an_export_carries_the_summary_and_every_unsummarized_turn(history: History) -> None:
    """parse_export(to_dict(s)) gives back the summary and the pending (or backlog) and recent turns.

    Only a summarizing session has pending turns; a truncation session exports its recent ones.
    """
    state = history.state
    exported = json.loads(json.dumps(to_dict(state)))
    assert exported == to_dict(state)
    summary, health, restored = parse_export(exported)
    assert summary == state.summary
    assert health is state.health
    pending = state.pending() if state.config.summarizes else ()
    assert restored == tuple(r.turn for r in (*pending, *state.recent()))
