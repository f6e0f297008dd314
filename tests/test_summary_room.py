"""The summary is written to the room it will really have in the view (issue 25).

`summary_due` puts in each request the tokens the summary will have beside the
turns the view shows with it (`summary_room`, the request's ``max_tokens``),
and the extractive summarizer keeps its summary's JSON string within it, so the
view shows the summary whole instead of cutting its newest lines to make room
for the verbatim turns.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from convmem.actors import MemorySystem
from convmem.adapters import ExtractiveSummarizer, InMemoryEventLog, recommended
from convmem.errors import SummarizerError
from convmem.events import ConversationTurn, MemoryKey
from convmem.projections import (
    AddTurn,
    SessionState,
    SummarySucceeded,
    TokenEstimator,
    decide,
    default_token_estimator,
    estimate_tokens,
    evolve,
    select_context,
    summary_due,
)

DAY = 1_709_283_600.0  # 1 March 2024, 09:00 UTC
KEY = MemoryKey("acme", "alice", "room")
PLACES = ["Porto", "Lyon", "Osaka", "Quito", "Hanoi", "Tromsø", "Cusco", "Zagreb", "Dakar", "Perth"]
THINGS = ["violin", "kayak", "sourdough", "chess club", "pottery", "marathon", "orchard", "telescope"]


def by_bytes(text: str) -> int:
    return len(text.encode()) // 3 + 1


def _turn(n: int) -> ConversationTurn:
    """Turns of varied lengths: some long enough that the two verbatim turns take far more than 100 tokens."""
    place, thing = PLACES[n % len(PLACES)], THINGS[(n * 3) % len(THINGS)]
    user = f"In {place} I took up the {thing} in {2000 + n}, and my cousin Ines{n} joined me there."
    if n % 3 == 0:
        user += f' She said: "the {thing} at {place} needs {n + 7} more weeks", so we stayed.' * (1 + n % 4)
    return ConversationTurn(
        user_message=user,
        assistant_response=f"Noted: the {thing} in {place}." + " Tell me more." * (n % 5),
        ts=DAY + 86_400 * (n // 4),
    )


def _play(
    total: int, estimator: TokenEstimator, request: Callable[[dict[str, Any]], dict[str, Any]] = dict
) -> tuple[int, int, int]:
    """(checkpoints, checkpoints whose view cut the summary, most tokens) of a conversation played
    through the pure core with `recommended(total)`, a summary after every evicted turn."""
    setup = recommended(total_tokens=total, estimator=estimator, worker_process=False)
    summarizer, config = setup.summarizer, setup.config
    state, cut, most = SessionState(), 0, 0
    for n in range(120):
        now = DAY + n
        for event in decide(
            state,
            AddTurn(turn=_turn(n)),
            now=now,
            command_id=f"t{n}",
            key=KEY,
            config=config,
            estimator=estimator,
        ):
            state = evolve(state, event)
        due = summary_due(state, now, estimator=estimator)
        if due is None:
            continue
        summary = summarizer(request(due.payload()))["summary"]
        for event in decide(
            state,
            SummarySucceeded(request=due, summary=summary),
            now=now,
            command_id=f"s{n}",
            key=KEY,
            config=config,
            estimator=estimator,
        ):
            state = evolve(state, event)
        assert state.summary == summary
        cut += select_context(state, estimator).summary != state.summary
        most = max(most, estimate_tokens(state, estimator))
    return 120, cut, most


def _without_room(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k != "max_tokens"}


@pytest.mark.parametrize("estimator", [default_token_estimator, by_bytes], ids=["estimate", "bytes"])
@pytest.mark.parametrize("total", [400, 1000])
def test_the_view_shows_every_summary_whole_within_the_budget(total: int, estimator: TokenEstimator) -> None:
    """With the room in the request no view cuts the summary; without it, the same play does."""
    _, cut, most = _play(total, estimator)
    assert cut == 0
    assert most <= total
    _, cut_blind, most_blind = _play(total, estimator, _without_room)
    assert cut_blind > 10, "the conversation must be one whose verbatim turns overflow the reserve"
    assert most_blind <= total


def test_the_room_is_what_the_budget_leaves_beside_the_turns_shown_with_the_summary() -> None:
    """Longer verbatim turns leave less room; the room is in the request only with an overall budget."""
    setup = recommended(total_tokens=1000, worker_process=False)
    rooms: list[int] = []
    state = SessionState()
    for n in range(12):
        for event in decide(
            state, AddTurn(turn=_turn(n)), now=DAY + n, command_id=f"t{n}", key=KEY, config=setup.config
        ):
            state = evolve(state, event)
        due = summary_due(state, DAY + n)
        if due is not None:
            rooms.append(due.payload()["max_tokens"])
            recent = sum(r.rendered_len for r in state.recent())
            assert due.max_tokens <= 1000 - recent // 4
            assert due.max_tokens >= 1000 - recent // 4 - 20
    assert len(set(rooms)) > 3
    config = msgspec.structs.replace(
        setup.config, budget=msgspec.structs.replace(setup.config.budget, total_max_tokens=0)
    )
    state = SessionState()
    for n in range(4):
        for event in decide(
            state, AddTurn(turn=_turn(n)), now=DAY + n, command_id=f"t{n}", key=KEY, config=config
        ):
            state = evolve(state, event)
    due = summary_due(state, DAY + 4)
    assert due is not None
    assert due.max_tokens == 0
    assert "max_tokens" not in due.payload()


def test_the_summarizer_keeps_its_json_string_within_the_room_and_checks_it() -> None:
    summarizer = ExtractiveSummarizer(max_tokens=2000)
    turns = [{"user": _turn(n).user_message, "assistant": "Sure.", "ts": DAY + 86_400 * n} for n in range(40)]
    whole = summarizer({"previous_summary": "", "turns": turns})["summary"]
    roomy = summarizer({"previous_summary": "", "turns": turns, "max_tokens": 5000})["summary"]
    assert roomy == whole
    tight = summarizer({"previous_summary": "", "turns": turns, "max_tokens": 300})["summary"]
    assert default_token_estimator(json.dumps(tight, ensure_ascii=False)) <= 300
    assert default_token_estimator(json.dumps(tight, ensure_ascii=False)) > 250, "it fills the room"
    for bad in (-1, 2.5, True, "300"):
        with pytest.raises(SummarizerError, match="max_tokens"):
            summarizer({"previous_summary": "", "turns": turns, "max_tokens": bad})


def test_a_running_session_sizes_its_summary_with_its_own_counter() -> None:
    """Through the actors, with a token counter unlike the default estimate: the context's summary is
    the summary the summarizer wrote, whole, and the context stays within the budget."""
    setup = recommended(total_tokens=500, token_counter=by_bytes, worker_process=False)
    written: list[str] = []
    inner = setup.summarizer

    def summarizer(request: dict[str, Any]) -> dict[str, str]:
        out = inner(request)
        written.append(out["summary"])
        return out

    with MemorySystem(
        config=setup.config, summarizer=summarizer, token_counter=by_bytes, log=InMemoryEventLog()
    ) as memory:
        session = memory.session(KEY)
        for n in range(30):
            session.add_turn(_turn(n), timeout=5)
        session.flush(timeout=10)
        context = session.get_llm_context()["conversation_memory"]
        tokens = session.estimate_tokens()
    assert written
    assert context["summary"] == written[-1]
    assert tokens <= 500
