"""The write protocol as a pure step machine, given/when/then: every rule of a write without threads or a
server, and a hypothesis state machine that drives it against a model log with conflicts, doubts and
retries."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from strategies import SESSION_KEY as KEY
from strategies import History, configs, histories, rolling, turn

from convmem.errors import ConcurrencyConflict, ConvmemError, InvalidInput, LogUnavailable, SessionClosed
from convmem.events import AnyEvent, MemoryHealth, SessionStarted, TurnAdded
from convmem.projections import (
    AddItems,
    AddTurn,
    Clear,
    Command,
    Decision,
    PopItem,
    SessionState,
    StartSession,
    command_id_for,
    decide,
    decide_folded,
    next_due_at,
    replay,
    summary_due,
    summary_plan,
)
from convmem.projections._health import summarizable
from convmem.projections._write_protocol import (
    DOUBTS_KEPT,
    MAX_CONFLICT_RETRIES,
    NO_DOUBTS,
    Append,
    Done,
    Doubts,
    Effect,
    PendingWrite,
    Published,
    ReadLog,
    Reason,
    _begin_general,
    acknowledged,
    begin,
    failed,
    reread,
)

CONFIG = rolling()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def decide(self, state: SessionState, command: Command, command_id: str) -> list[AnyEvent]:
        self.now += 1.0
        return decide(state, command, now=self.now, command_id=command_id, key=KEY, config=CONFIG)

    def decider(self, state: SessionState, command: Command, command_id: str) -> Decision:
        """The write protocol's decider: the events with the state they fold `state` into."""
        self.now += 1.0
        return decide_folded(state, command, now=self.now, command_id=command_id, key=KEY, config=CONFIG)


def opening() -> StartSession:
    return StartSession(key=KEY, config=CONFIG)


def start(
    state: SessionState,
    command: Command,
    command_id: str = "c1",
    *,
    doubts: Doubts = NO_DOUBTS,
    decider: Callable[[SessionState, Command, str], Decision] | None = None,
) -> tuple[PendingWrite, Effect]:
    return begin(
        state,
        command,
        key=KEY,
        command_id=command_id,
        decide=decider or Clock().decider,
        opening=opening,
        doubts=doubts,
    )


def opened(turns: int = 0) -> tuple[SessionState, list[AnyEvent]]:
    """A started session with `turns` turns, and its log."""
    clock = Clock()
    log = clock.decide(SessionState(), StartSession(key=KEY, config=CONFIG), "open")
    for n in range(turns):
        log += clock.decide(replay(log), AddTurn(turn=turn(n)), f"t{n}")
    return replay(log), log


def add(n: int = 9) -> AddTurn:
    return AddTurn(turn=turn(n))


# Decide, append after the expected sequence, evolve on acknowledgement ----------------------------


def test_a_write_on_a_started_session_appends_its_decision_after_the_states_version() -> None:
    """Given a started session, when a turn is written, then its events are appended after its version."""
    state, _ = opened(2)
    _pending, effect = start(state, add())
    assert isinstance(effect, Append)
    assert effect.after == state.version
    assert [type(e) for e in effect.events] == [TurnAdded]
    assert effect.events[0].seq == state.version + 1
    assert effect.published is None


def test_an_acknowledged_append_is_folded_published_and_answered() -> None:
    """Given an append under way, when the log acknowledges it, then the state is the fold; done."""
    state, _ = opened(1)
    pending, effect = start(state, add())
    assert isinstance(effect, Append)
    _, done = acknowledged(pending, effect.events[-1].seq)
    assert isinstance(done, Done)
    assert done.answer == effect.events
    assert done.state == replay(effect.events, state=state)
    assert done.published is not None
    assert done.published.old == state
    assert done.published.new == done.state
    assert done.grew


def test_a_write_that_decides_nothing_is_done_without_an_append() -> None:
    """Given a keyed turn the session remembers, when it is written again, then nothing is appended."""
    state, log = opened(0)
    clock = Clock()
    key = command_id_for(KEY, "k")
    log += clock.decide(state, add(), key)
    _, effect = start(replay(log), add(), key)
    assert isinstance(effect, Done)
    assert effect.answer == []
    assert not effect.grew


# Reread on conflict, up to 20 attempts -----------------------------------------------------------


def test_a_conflict_rereads_the_log_and_decides_again_on_it() -> None:
    """Given an append that conflicts, when the log is read, then the command is decided on it."""
    state, log = opened(1)
    pending, _effect = start(state, add())
    pending, read = failed(pending, ConcurrencyConflict(key="k", expected_seq=state.version, actual_seq=9))
    assert isinstance(read, ReadLog)
    assert read.reason is Reason.CONFLICT
    log += Clock().decide(state, add(5), "other")
    pending, again = reread(pending, replay(log), None)
    assert isinstance(again, Append)
    assert again.after == len(log)
    assert again.state == replay(log)


def test_conflicts_end_the_write_after_the_twentieth_attempt() -> None:
    """Given a log that always conflicts, when the write keeps trying, then its answer is a conflict."""
    state, log = opened(0)
    pending, effect = start(state, add())
    attempts = 0
    while isinstance(effect, Append):
        attempts += 1
        pending, effect = failed(pending, ConcurrencyConflict(key="k", expected_seq=0, actual_seq=0))
        if isinstance(effect, ReadLog):
            log += Clock().decide(replay(log), add(attempts), f"other{attempts}")
            pending, effect = reread(pending, replay(log), None)
    assert attempts == MAX_CONFLICT_RETRIES
    assert isinstance(effect, Done)
    assert isinstance(effect.answer, ConcurrencyConflict)
    assert effect.answer.expected_seq == len(log)
    assert effect.answer.actual_seq == -1


def test_a_conflict_on_an_unmoved_log_asks_which_of_our_ids_it_holds() -> None:
    """Given a conflict on an unmoved log, when it holds one of our ids, then nothing new is stored."""
    state, log = opened(1)
    pending, effect = start(state, add())
    assert isinstance(effect, Append)
    pending, _read = failed(pending, ConcurrencyConflict(key="k", expected_seq=0, actual_seq=0))
    pending, ids = reread(pending, replay(log), None)
    assert isinstance(ids, ReadLog)
    assert ids.reason is Reason.STORED_IDS
    assert ids.ids == frozenset(e.event_id for e in effect.events)
    _, done = reread(pending, None, frozenset({effect.events[0].event_id}))
    assert isinstance(done, Done)
    assert done.answer == []


def test_a_conflict_on_an_unmoved_log_without_our_ids_decides_again() -> None:
    """Given a conflict on an unmoved log, when it holds none of our ids, then the write appends again."""
    state, log = opened(1)
    pending, _effect = start(state, add())
    pending, _ = failed(pending, ConcurrencyConflict(key="k", expected_seq=0, actual_seq=0))
    pending, _ = reread(pending, replay(log), None)
    _, again = reread(pending, None, frozenset())
    assert isinstance(again, Append)
    assert again.after == state.version


# Recheck when the log held our ids -------------------------------------------------------------


def test_an_acknowledgement_of_other_events_rechecks_and_answers_nothing_stored() -> None:
    """Given an append, when the log answers a last seq not ours, then it is reread; nothing stored."""
    state, log = opened(1)
    pending, _effect = start(state, add())
    pending, read = acknowledged(pending, state.version + 5)
    assert isinstance(read, ReadLog)
    assert read.reason is Reason.RECHECK
    _, done = reread(pending, replay(log), None)
    assert isinstance(done, Done)
    assert done.answer == []
    assert done.state == replay(log)


# Confirm a refusal against the newest log --------------------------------------------------------


def refuse_before(version: int) -> Callable[[SessionState, Command, str], Decision]:
    clock = Clock()

    def decider(state: SessionState, command: Command, command_id: str) -> Decision:
        if isinstance(command, AddTurn) and state.version < version:
            raise InvalidInput("turn", f"refused below version {version}")
        return clock.decider(state, command, command_id)

    return decider


def test_a_refusal_is_confirmed_once_against_the_log_and_then_stands() -> None:
    """Given a refused command, when the log has not moved, then the refusal is the answer."""
    state, _ = opened(1)
    pending, read = start(state, add(), decider=refuse_before(99))
    assert isinstance(read, ReadLog)
    assert read.reason is Reason.CONFIRM
    assert read.unless_at == state.version  # the carrier may skip the read while the log is unmoved
    _, done = reread(pending, state, None)
    assert isinstance(done, Done)
    assert isinstance(done.answer, InvalidInput)


def test_a_refusal_is_lifted_by_another_writers_newer_log() -> None:
    """Given a refused command, when the log moved on to where it is allowed, then it is appended there."""
    state, log = opened(1)
    pending, _read = start(state, add(), decider=refuse_before(len(log) + 1))
    log += Clock().decide(state, add(5), "other")
    _, effect = reread(pending, replay(log), None)
    assert isinstance(effect, Append)
    assert effect.after == len(log)


def test_a_refusal_in_doubt_must_read_the_log() -> None:
    """Given an uncertain session, when the command is refused, then the confirming read is not skippable."""
    state, log = opened(1)
    pending, read = start(state, add(), doubts=Doubts(True, ()), decider=refuse_before(99))
    assert isinstance(read, ReadLog)
    assert read.reason is Reason.DOUBT
    pending, confirm = reread(pending, replay(log), None)
    assert isinstance(confirm, ReadLog)
    assert confirm.reason is Reason.CONFIRM
    assert confirm.unless_at == len(log)


# Doubt, and verify a retried command that was in doubt -----------------------------------------


def test_an_append_that_fails_without_an_answer_leaves_the_session_in_doubt() -> None:
    """Given an append, when it fails without an answer, then that is the answer, and the attempt in doubt."""
    state, _ = opened(1)
    pending, _effect = start(state, add(), "k1")
    _, done = failed(pending, LogUnavailable("no answer"))
    assert isinstance(done, Done)
    assert isinstance(done.answer, LogUnavailable)
    assert done.doubts == Doubts(True, ("k1",))
    assert done.state == state


def test_an_uncertain_session_reads_the_log_before_deciding() -> None:
    """Given a session in doubt, when a write begins, then it reads the log first and decides on it."""
    state, log = opened(1)
    pending, read = start(state, add(), doubts=Doubts(True, ("x",)))
    assert isinstance(read, ReadLog)
    assert read.reason is Reason.DOUBT
    log += Clock().decide(state, add(3), "x")  # the doubtful append was stored after all
    pending, effect = reread(pending, replay(log), None)
    assert isinstance(effect, Append)
    assert effect.after == len(log)
    assert not pending.doubts.uncertain
    assert pending.doubts.ids == ("x",)


@pytest.mark.parametrize("earlier_stored", [True, False])
def test_a_retried_command_in_doubt_is_verified_against_the_log(earlier_stored: bool) -> None:
    """Given a retry of a command in doubt, when it is acknowledged, then the log's state is the truth."""
    state, log = opened(1)
    pending, effect = start(state, add(), "k1", doubts=Doubts(False, ("k1",)))
    assert isinstance(effect, Append)
    pending, verify = acknowledged(pending, effect.events[-1].seq)
    assert isinstance(verify, ReadLog)
    assert verify.reason is Reason.VERIFY
    assert pending.doubts.ids == ()
    if earlier_stored:  # the log holds the earlier attempt's events (its turn differs), not ours
        log += Clock().decide(state, add(7), "k1")
    else:
        log += effect.events
    _, done = reread(pending, replay(log), None)
    assert isinstance(done, Done)
    assert done.state == replay(log)
    assert done.answer == ([] if earlier_stored else effect.events)
    assert (done.published is None) is earlier_stored


def test_doubts_keep_the_newest_attempts_only() -> None:
    """Given many attempts in doubt, when one more is, then the oldest is forgotten."""
    doubts = Doubts()
    for n in range(DOUBTS_KEPT + 3):
        doubts = doubts.doubt(f"a{n}")
    assert len(doubts.ids) == DOUBTS_KEPT
    assert doubts.ids[-1] == f"a{DOUBTS_KEPT + 2}"
    assert "a0" not in doubts.ids


def test_a_cut_short_append_fails_as_a_closed_session() -> None:
    """Given an append, when it is cut short by an interrupt, then the answer is `SessionClosed`."""
    state, _ = opened(1)
    pending, _ = start(state, add())
    _, done = failed(pending, KeyboardInterrupt())
    assert isinstance(done, Done)
    assert isinstance(done.answer, SessionClosed)


# Open a new session first ------------------------------------------------------------------------


def test_a_first_write_opens_the_session_then_appends_the_command() -> None:
    """Given a session not started, when a turn is written, then two appends: its opening, then the turn."""
    pending, first = start(SessionState(), add(), "c1")
    assert isinstance(first, Append)
    assert first.after == 0
    assert [type(e) for e in first.events] == [SessionStarted]
    assert first.events[0].event_id.startswith("c1.start")
    pending, second = acknowledged(pending, 1)
    assert isinstance(second, Append)
    assert second.after == 1
    assert [type(e) for e in second.events] == [TurnAdded]
    assert second.published is not None
    assert second.published.events == first.events
    _, done = acknowledged(pending, second.events[-1].seq)
    assert isinstance(done, Done)
    assert done.answer == second.events
    assert done.state == replay(first.events + second.events)


def test_a_first_write_that_is_refused_stores_nothing_not_even_the_opening() -> None:
    """Given a session not started, when the command is refused, then nothing is appended."""
    pending, read = start(SessionState(), add(), decider=refuse_before(99))
    assert isinstance(read, ReadLog)
    assert read.reason is Reason.CONFIRM
    _, done = reread(pending, SessionState(), None)
    assert isinstance(done, Done)
    assert isinstance(done.answer, InvalidInput)


def test_an_opening_that_conflicts_goes_on_with_the_session_another_writer_opened() -> None:
    """Given an opening that conflicts, when the log shows the session open, then the command is appended."""
    pending, _first = start(SessionState(), add())
    pending, _read = failed(pending, ConcurrencyConflict(key="k", expected_seq=0, actual_seq=1))
    state, log = opened(0)
    _, effect = reread(pending, state, None)
    assert isinstance(effect, Append)
    assert effect.after == len(log)
    assert [type(e) for e in effect.events] == [TurnAdded]


def test_a_start_session_command_is_its_own_opening() -> None:
    """Given a session not started, when `StartSession` is written, then it is one append."""
    pending, effect = start(SessionState(), opening())
    assert isinstance(effect, Append)
    assert not pending.opens
    _, done = acknowledged(pending, effect.events[-1].seq)
    assert isinstance(done, Done)
    assert done.answer == effect.events


# The step machine against a model log ------------------------------------------------------------


class ModelLog:
    """The log's contract, plainly: optimistic concurrency, exactly-once by event id."""

    def __init__(self) -> None:
        self.events: list[AnyEvent] = []

    def append(self, events: list[AnyEvent], after: int) -> int:
        seen = {e.event_id for e in self.events}
        fresh = [e for e in events if e.event_id not in seen]
        if not fresh:
            return len(self.events)
        if len(self.events) != after + len(events) - len(fresh):
            raise ConcurrencyConflict(key="model", expected_seq=after, actual_seq=len(self.events))
        self.events.extend(fresh)
        return len(self.events)


OUTCOMES = st.sampled_from(["ack", "ack", "ack", "conflict", "lost", "stored-unanswered"])


class WriteMachine(RuleBasedStateMachine):
    """Writes (keyed, some retried) meet other writers, lost acknowledgements and failed appends."""

    def __init__(self) -> None:
        super().__init__()
        self.log = ModelLog()
        self.clock = Clock()
        self.state = SessionState()
        self.doubts = Doubts()
        self.others = itertools.count()
        self.answered: dict[str, list[AnyEvent]] = {}

    def other_writer(self) -> None:
        state = replay(self.log.events)
        command: Command = add(100) if state.started else opening()
        events = self.clock.decide(state, command, f"other{next(self.others)}")
        self.log.append(events, state.version)

    @rule(key=st.sampled_from(["k1", "k2", "k3", "k4"]), data=st.data())
    def write(self, key: str, data: st.DataObject) -> None:
        command_id = command_id_for(KEY, key)
        now = self.clock.now
        general = _begin_general(
            self.state, add(int(key[1:])), KEY, command_id, self.clock.decider, opening, self.doubts
        )
        self.clock.now = now  # the same clock reading for the fast lane
        pending, effect = begin(
            self.state,
            add(int(key[1:])),
            key=KEY,
            command_id=command_id,
            decide=self.clock.decider,
            opening=opening,
            doubts=self.doubts,
        )
        assert (pending, effect) == general, "the fast lane begins the write as the general path does"
        for _ in range(200):
            if isinstance(effect, Done):
                break
            if isinstance(effect, ReadLog):
                if effect.ids is not None:
                    stored = frozenset(e.event_id for e in self.log.events) & effect.ids
                    pending, effect = reread(pending, None, stored)
                else:
                    pending, effect = reread(pending, replay(self.log.events), None)
                continue
            outcome = data.draw(OUTCOMES)
            if outcome == "conflict":
                self.other_writer()
            try:
                if outcome == "lost":
                    raise LogUnavailable("the append was lost")
                last = self.log.append(effect.events, effect.after)
                if outcome == "stored-unanswered":
                    raise LogUnavailable("stored, but the acknowledgement was lost")
            except Exception as exc:
                pending, effect = failed(pending, exc)
            else:
                pending, effect = acknowledged(pending, last)
        assert isinstance(effect, Done), "a write ends"
        self.state, self.doubts = effect.state, effect.doubts
        if isinstance(effect.answer, list) and effect.answer:
            logged = {e.event_id for e in self.log.events}
            assert all(e.event_id in logged for e in effect.answer), "an answer names stored events only"
            assert effect.state == replay(self.log.events), "an answered write leaves the state the log's"
            self.answered[key] = effect.answer

    @rule()
    def another_process_writes(self) -> None:
        self.other_writer()

    @invariant()
    def the_state_is_a_replay_of_a_prefix_of_the_log(self) -> None:
        assert self.state == replay(self.log.events[: self.state.version])

    @invariant()
    def every_keyed_turn_is_stored_at_most_once(self) -> None:
        turns = [
            e for e in self.log.events if isinstance(e, TurnAdded) and not e.event_id.startswith("other")
        ]
        stems = [e.event_id.rpartition("/")[0].rpartition("/")[0] for e in turns]
        assert len(stems) == len(set(stems)), stems

    @invariant()
    def the_log_is_one_session(self) -> None:
        assert [e.seq for e in self.log.events] == list(range(1, len(self.log.events) + 1))
        assert sum(isinstance(e, SessionStarted) for e in self.log.events) <= 1


TestWriteMachine = WriteMachine.TestCase


# The fast lane: the common write begun by the same step as the general path ----------------------


FAST_COMMANDS = st.sampled_from(["turn", "keyed turn", "repeated keyed turn", "no items", "pop", "clear"])


def _fast_command(kind: str) -> Command:
    match kind:
        case "no items":
            return AddItems(items=())  # refused: a refusal begins the same way on both paths
        case "pop":
            return PopItem()
        case "clear":
            return Clear()
        case _:
            return add(7)


@given(
    history=histories(max_size=15),
    pick=st.integers(0, 1000),
    kind=FAST_COMMANDS,
    doubts=st.sampled_from([NO_DOUBTS, Doubts(False, ("c9",)), Doubts(True, ("c9",))]),
)
def test_the_fast_lane_begins_a_write_as_the_general_path_does(
    history: History, pick: int, kind: str, doubts: Doubts
) -> None:
    """Given any state of a random history and a command, when a write begins, then `begin` (the
    fast lane where the session started and nothing is uncertain) gives the very write and effect
    the general path gives, and an acknowledged append ends as the fold of its events."""
    state = history.states[pick % len(history.states)]
    config = history.config

    def decider(state: SessionState, command: Command, command_id: str) -> Decision:
        return decide_folded(
            state, command, now=5000.0, command_id=command_id, key=history.key, config=config
        )

    def opens() -> StartSession:
        return StartSession(key=history.key, config=config)

    command = _fast_command(kind)
    command_id = command_id_for(history.key, "k") if "keyed" in kind else "c-fresh"
    if kind == "repeated keyed turn" and state.started:  # the session remembers the key: nothing to decide
        with contextlib.suppress(ConvmemError):
            state = decider(state, command, command_id).state
    fast = begin(
        state, command, key=history.key, command_id=command_id, decide=decider, opening=opens, doubts=doubts
    )
    general = _begin_general(state, command, history.key, command_id, decider, opens, doubts)
    assert fast == general
    pending, effect = fast
    if isinstance(effect, Append) and not pending.opens:
        _, done = acknowledged(pending, effect.events[-1].seq)
        assert isinstance(done, Done)
        assert done.answer == effect.events
        assert done.state == replay(effect.events, state=state)
        assert done.published == Published(state, done.state, effect.events)


@given(
    history=histories(config_strategy=configs(strategies=("none", "truncation")), max_size=15),
    pick=st.integers(0, 1000),
    health=st.sampled_from(list(MemoryHealth)),
    turn_added=st.booleans(),
)
def test_a_session_that_never_summarizes_has_no_summary_due_ever(
    history: History, pick: int, health: MemoryHealth, turn_added: bool
) -> None:
    """Given any state of a configuration that does not summarize (in any health), then no summary
    is ever due nor a time to ask for one: what lets a write's end skip those checks (`_end`)."""
    state = msgspec.structs.replace(history.states[pick % len(history.states)], health=health)
    assert not state.config.summarizes
    for now in (0.0, state.health_since, state.health_since + 1e6):
        assert summary_due(state, now, turn_added=turn_added) is None
    assert next_due_at(state) is None


@given(
    history=histories(config_strategy=configs(strategies=("rolling_summary", "truncation")), max_size=15),
    pick=st.integers(0, 1000),
    health=st.sampled_from(list(MemoryHealth)),
    turn_added=st.booleans(),
    degraded_retry=st.sampled_from([0.0, 30.0]),
)
def test_a_write_ends_with_the_summary_the_health_rules_ask_for_or_the_time_they_name(
    history: History, pick: int, health: MemoryHealth, turn_added: bool, degraded_retry: float
) -> None:
    """Given any state (any health, with or without probes in DEGRADED), then `summary_plan` (what a
    write's end works out in one pass) asks for a summary exactly when the rules say one is due at
    `now`, covering every summarizable turn, and otherwise names `next_due_at` for the timer."""
    state = history.states[pick % len(history.states)]
    health_policy = msgspec.structs.replace(state.config.health, degraded_retry_seconds=degraded_retry)
    config = msgspec.structs.replace(state.config, health=health_policy)
    state = msgspec.structs.replace(state, health=health, config=config)
    turns = summarizable(state) if state.config.summarizes else ()
    for now in (0.0, state.health_since, state.health_since + 3.0, state.health_since + 1e6):
        request, due = summary_plan(state, now, turn_added=turn_added)
        asked = next_due_at(state)
        if asked is None and turn_added and health is MemoryHealth.DEGRADED and not degraded_retry and turns:
            asked = now  # a DEGRADED session with no probe interval probes when a turn arrives
        if asked is not None and asked <= now and state.key is not None:
            assert request is not None
            assert due is None
            assert request.turns == tuple(r.turn for r in turns)
            assert (request.covers_from, request.covers_through) == (turns[0].index, turns[-1].index)
            assert request == summary_due(state, now, turn_added=turn_added)
        else:
            assert request is None
            assert due == next_due_at(state)
