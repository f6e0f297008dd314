"""A stateful machine over one session: random turns, summarizer outcomes, clock jumps and clears
drive `decide`/`evolve`, and after every step the state is compared with a plain model."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from strategies import Session, light_turns

from convmem.events import (
    ConversationTurn,
    HealthPolicy,
    MemoryBudget,
    MemoryHealth,
    ShortTermMemoryConfig,
)
from convmem.projections import (
    AddTurn,
    Clear,
    StartSession,
    SummaryFailed,
    SummaryRequest,
    SummarySucceeded,
    llm_context,
    next_due_at,
    summary_due,
)

SUMMARY_MAX_TOKENS = 30

outcomes = st.one_of(
    st.text(st.sampled_from("ab <>/\n"), min_size=1, max_size=40),  # mostly good, some blank or too long
    st.none(),
    st.sampled_from(["", "  \n", "nul\x00", "x" * 200]),
)


@dataclass
class InFlight:
    """The model's idea of the summary call in flight."""

    first: int
    last: int
    stale: bool = False


@dataclass
class Model:
    """The RFC's rules, written plainly: live turns, the summary, the health machine, the zones."""

    zone: int
    retries: int
    backoff: tuple[float, ...]
    degraded_every: float
    backlog_limit: int
    now: float
    since: float
    live: list[tuple[int, ConversationTurn]] = field(default_factory=list)
    next_number: int = 1
    summary: str = ""
    covered: int = 0
    dropped: int = 0
    health: str = "healthy"
    attempt: int = 0

    def pending(self) -> list[int]:
        older = self.live[: -self.zone] if len(self.live) > self.zone else []
        return [n for n, _ in older if n > self.covered and n > self.dropped]

    def recent(self) -> list[int]:
        return [n for n, _ in self.live[-self.zone :]]

    def due_at(self) -> float | None:
        if not self.pending():
            return None
        if self.health in ("healthy", "recovering"):
            return self.since
        if self.health == "retry":
            return self.since + self.backoff[min(self.attempt, len(self.backoff)) - 1]
        return self.since + self.degraded_every

    def move(self, health: str, attempt: int) -> None:
        self.health, self.attempt, self.since = health, attempt, self.now
        self.trim()

    def trim(self) -> None:
        if self.health == "degraded":
            backlog = self.pending()
            if len(backlog) > self.backlog_limit:
                self.dropped = backlog[len(backlog) - self.backlog_limit - 1]

    def add(self, turn: ConversationTurn) -> None:
        self.live.append((self.next_number, turn))
        self.next_number += 1
        self.trim()

    def failed(self) -> None:
        if self.health == "healthy":
            self.move("retry", 1) if self.retries else self.move("degraded", 1)
        elif self.health == "retry":
            self.move("retry", self.attempt + 1) if self.attempt < self.retries else self.move("degraded", 1)
        elif self.health == "degraded":
            self.move("degraded", self.attempt + 1)
        else:
            self.move("degraded", 1)

    def succeeded(self, text: str, last: int) -> None:
        self.summary = text
        self.covered = max(self.covered, last)
        if self.health == "retry":
            self.move("healthy", 0)
        elif self.health == "degraded":
            self.move("recovering", 0)
        if self.health == "recovering" and not self.pending():
            self.move("healthy", 0)

    def clear(self) -> None:
        if self.health != "healthy":
            self.move("healthy", 0)
        self.live = []
        self.summary = ""
        self.covered = self.dropped = self.next_number - 1


def acceptable(text: str | None) -> bool:
    """The model's rule for a summary it may store (the default estimator: len // 4 + 1)."""
    return (
        text is not None
        and bool(text.strip())
        and "\x00" not in text
        and len(text) // 4 + 1 <= SUMMARY_MAX_TOKENS
    )


class SessionMachine(RuleBasedStateMachine):
    """Drives the pure core like the runtime does (one summary in flight) beside the plain model."""

    session: Session
    model: Model
    in_flight: SummaryRequest | None
    model_flight: InFlight | None
    last_result: SummarySucceeded | SummaryFailed | None

    @initialize(
        zone=st.integers(1, 3),
        retries=st.integers(0, 3),
        backoff=st.sampled_from([(2.0, 4.0, 8.0), (1.0, 3.0), (4.0, 1.0), (1.0,)]),
        degraded_every=st.sampled_from([3.0, 30.0]),
        backlog_limit=st.integers(1, 3),
    )
    def start(
        self, zone: int, retries: int, backoff: tuple[float, ...], degraded_every: float, backlog_limit: int
    ) -> None:
        config = ShortTermMemoryConfig(
            strategy="rolling_summary",
            budget=MemoryBudget(
                full_zone_turns=zone, summary_max_tokens=SUMMARY_MAX_TOKENS, total_max_tokens=1_000_000
            ),
            retry_attempts=retries,
            recovery_backlog_limit=backlog_limit,
            health=HealthPolicy(retry_backoff_seconds=backoff, degraded_retry_seconds=degraded_every),
        )
        self.session = Session(config)
        self.session.do(StartSession(key=self.session.key, config=config))
        self.model = Model(
            zone=zone,
            retries=retries,
            backoff=backoff,
            degraded_every=degraded_every,
            backlog_limit=backlog_limit,
            now=self.session.now,
            since=self.session.now,
        )
        self.in_flight = None
        self.model_flight = None
        self.last_result = None

    # Commands ------------------------------------------------------------------------

    @rule(turn=light_turns)
    def add_turn(self, turn: ConversationTurn) -> None:
        self.session.do(AddTurn(turn=turn))
        self.model.add(turn)

    @precondition(lambda self: self.in_flight is None)
    @rule()
    def begin_summary(self) -> None:
        request = summary_due(self.session.state, self.session.now)
        due = self.model.due_at()
        if due is None or due > self.model.now:
            assert request is None
            return
        pending = self.model.pending()
        assert request is not None
        assert (request.covers_from, request.covers_through) == (pending[0], pending[-1])
        assert request.previous_summary == self.model.summary
        assert (request.health.value, request.attempt) == (self.model.health, self.model.attempt)
        self.in_flight = request
        self.model_flight = InFlight(first=pending[0], last=pending[-1])

    @precondition(lambda self: self.in_flight is None)
    @rule(outcome=outcomes)
    def summarize_at_once(self, outcome: str | None) -> None:
        self.begin_summary()
        if self.in_flight is not None:
            self.finish_summary(outcome)

    @precondition(lambda self: self.in_flight is None)
    @rule(turn=light_turns, outcome=outcomes)
    def a_turn_arrives_while_summarizing(self, turn: ConversationTurn, outcome: str | None) -> None:
        self.begin_summary()
        self.add_turn(turn)
        if self.in_flight is not None:
            self.finish_summary(outcome)

    @precondition(lambda self: self.in_flight is not None)
    @rule(outcome=outcomes)
    def finish_summary(self, outcome: str | None) -> None:
        assert self.in_flight is not None
        assert self.model_flight is not None
        command: SummarySucceeded | SummaryFailed
        if outcome is None:
            command = SummaryFailed(request=self.in_flight, reason="summarizer failed")
        else:
            command = SummarySucceeded(request=self.in_flight, summary=outcome)
        events = self.session.do(command)
        flight, self.in_flight, self.model_flight = self.model_flight, None, None
        self.last_result = command
        if flight.stale:
            assert events == []
        elif acceptable(outcome):
            assert outcome is not None
            self.model.succeeded(outcome, flight.last)
        else:
            self.model.failed()

    @precondition(lambda self: self.last_result is not None and self.in_flight is None)
    @rule()
    def redeliver_the_last_result(self) -> None:
        assert self.last_result is not None
        before = self.session.state
        if isinstance(self.last_result, SummaryFailed) or not acceptable(self.last_result.summary):
            assert self.session.do(self.last_result) == []
            assert self.session.state is before

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0, 30.0]))
    def advance_clock(self, seconds: float) -> None:
        self.session.now += seconds
        self.model.now += seconds

    @rule(dice=st.integers(0, 5))
    def clear(self, dice: int) -> None:
        if dice:  # clears are rare, so that the zones fill and the health machine goes deep
            return
        self.session.do(Clear())
        self.model.clear()
        if self.model_flight is not None:
            self.model_flight.stale = True

    # Comparison ----------------------------------------------------------------------

    @invariant()
    def live_turns_match(self) -> None:
        state = self.session.state
        assert [(r.index, r.turn) for r in state.turns] == self.model.live

    @invariant()
    def summary_and_health_match(self) -> None:
        state = self.session.state
        assert state.summary == self.model.summary
        assert (state.health, state.attempt) == (MemoryHealth(self.model.health), self.model.attempt)

    @invariant()
    def zones_match(self) -> None:
        assert self.session.pending() == self.model.pending()
        assert self.session.recent() == self.model.recent()

    @invariant()
    def the_next_summary_is_due_when_the_model_says(self) -> None:
        assert next_due_at(self.session.state) == self.model.due_at()

    @invariant()
    def the_view_shows_what_the_health_allows(self) -> None:
        memory = llm_context(self.session.state)["conversation_memory"]
        by_number = dict(self.model.live)
        recent = [by_number[n].to_llm(include_digest=True) for n in self.model.recent()]
        assert memory["recent_turns"] == recent
        if self.model.health == "degraded":
            assert set(memory) == {"recent_turns"}
        else:
            pending = [by_number[n].to_llm(include_digest=True) for n in self.model.pending()]
            assert memory.get("pending_turns", []) == pending
            assert memory.get("summary", "") == self.model.summary


SessionMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=50)
TestSessionMachine = SessionMachine.TestCase
TestSessionMachine.__doc__ = "The session's decide/evolve agree with the plain model after every step."
