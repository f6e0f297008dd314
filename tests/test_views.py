"""The PenguiFlow view: shape per strategy and health, token estimates, budgets, export and import."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from strategies import Session, degraded, rolling, turn, words

from convmem.errors import InvalidInput
from convmem.events import (
    ConversationTurn,
    MemoryBudget,
    MemoryHealth,
    ShortTermMemoryConfig,
    TrajectoryDigest,
)
from convmem.projections import (
    EXPORT_VERSION,
    AddTurn,
    Restore,
    SessionState,
    StartSession,
    default_token_estimator,
    estimate_tokens,
    llm_context,
    parse_export,
    select_context,
    to_dict,
    trim_summary,
    view_tokens,
)


def memory(state: SessionState, estimator: Any = default_token_estimator) -> dict[str, Any]:
    """The ``conversation_memory`` object of the view."""
    view = llm_context(state, estimator)
    return view["conversation_memory"]  # type: ignore[no-any-return]


def rendered_tokens(state: SessionState, estimator: Any = default_token_estimator) -> int:
    """PenguiFlow's measure: the estimator over the canonical JSON of the memory object."""
    return estimator(json.dumps(memory(state, estimator), ensure_ascii=False, sort_keys=True))  # type: ignore[no-any-return]


def llm(n: int | str) -> dict[str, str]:
    return {"user": f"question {n}", "assistant": f"answer {n}"}


def summarized_session(**settings: Any) -> Session:
    """Turns 1..5, zone 2, a summary of turn 1: summary + pending [2, 3] + recent [4, 5]."""
    session = Session(rolling(**settings))
    session.add(1, 2, 3)
    session.succeed(session.request(), "<session_summary>\nturn one\n</session_summary>")
    session.add(4, 5)
    return session


# Shape per strategy -----------------------------------------------------------------


def test_strategy_none_shows_nothing() -> None:
    """strategy none gives an empty mapping and zero tokens, whatever was stored."""
    session = Session(ShortTermMemoryConfig(strategy="none"))
    session.add(1, 2)
    assert llm_context(session.state) == {}
    assert estimate_tokens(session.state) == 0
    assert len(session.state.turns) == 2


def test_truncation_shows_the_last_full_zone_turns_only() -> None:
    """truncation keeps the last full_zone_turns turns: no summary, no pending block."""
    session = Session(ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=3)))
    session.add(*range(1, 11))
    assert llm_context(session.state) == {"conversation_memory": {"recent_turns": [llm(8), llm(9), llm(10)]}}


def test_an_empty_session_shows_empty_recent_turns() -> None:
    """recent_turns is always present; pending_turns and summary only when non-empty."""
    session = Session()
    session.do(StartSession(key=session.key, config=session.config))
    assert memory(session.state) == {"recent_turns": []}
    session.add(1)
    assert memory(session.state) == {"recent_turns": [llm(1)]}


def test_rolling_summary_shows_summary_pending_and_recent() -> None:
    """rolling_summary: the last good summary, the pending turns, the full zone."""
    session = summarized_session()
    assert memory(session.state) == {
        "summary": "<session_summary>\nturn one\n</session_summary>",
        "pending_turns": [llm(2), llm(3)],
        "recent_turns": [llm(4), llm(5)],
    }


def test_a_turn_moves_to_pending_when_it_leaves_the_full_zone() -> None:
    """The watermark pattern: the evicted turn stays visible in pending_turns (no forget gap)."""
    session = Session()
    session.add(1, 2)
    assert memory(session.state) == {"recent_turns": [llm(1), llm(2)]}
    session.add(3)
    assert memory(session.state) == {"pending_turns": [llm(1)], "recent_turns": [llm(2), llm(3)]}


@pytest.mark.parametrize("health", [MemoryHealth.RETRY, MemoryHealth.RECOVERING])
def test_retry_and_recovering_show_the_last_good_summary_and_pending(health: MemoryHealth) -> None:
    """RETRY and RECOVERING show what HEALTHY shows."""
    session = summarized_session()
    healthy = memory(session.state)
    state = msgspec.structs.replace(session.state, health=health, attempt=1)
    assert memory(state) == healthy


def test_degraded_shows_recent_turns_only() -> None:
    """DEGRADED falls back to truncation: no summary, no pending turns."""
    session = degraded()
    session.add(4, 5)
    assert session.state.health is MemoryHealth.DEGRADED
    assert session.pending()
    assert memory(session.state) == {"recent_turns": [llm(4), llm(5)]}


def test_the_trajectory_digest_shows_only_when_configured() -> None:
    """include_trajectory_digest decides whether a turn's digest is in the view."""
    digest = TrajectoryDigest(
        tools_invoked=("search",), observations_summary="found 3", reasoning_summary="r"
    )
    with_digest = ConversationTurn(user_message="q", assistant_response="a", trajectory_digest=digest)
    shown = {"tools_invoked": ["search"], "observations_summary": "found 3", "reasoning_summary": "r"}
    for include, expected in (
        (True, {"user": "q", "assistant": "a", "trajectory_digest": shown}),
        (False, {"user": "q", "assistant": "a"}),
    ):
        session = Session(rolling(include_trajectory_digest=include))
        session.do(AddTurn(turn=with_digest))
        assert memory(session.state) == {"recent_turns": [expected]}
        assert estimate_tokens(session.state) == rendered_tokens(session.state)


def test_shown_artifacts_are_in_the_view_and_hidden_ones_are_not() -> None:
    """artifacts_shown reach the LLM; artifacts_hidden_refs never do."""
    shown = ConversationTurn(
        user_message="q",
        assistant_response="a",
        artifacts_shown={"chart": [1, 2]},
        artifacts_hidden_refs=("secret",),
    )
    session = Session()
    session.do(AddTurn(turn=shown))
    assert memory(session.state) == {
        "recent_turns": [{"user": "q", "assistant": "a", "artifacts": {"chart": [1, 2]}}]
    }
    assert "secret" not in json.dumps(llm_context(session.state))


# Token estimates --------------------------------------------------------------------

TRICKY = [
    ConversationTurn(user_message='quote " backslash \\ newline \n tab \t', assistant_response="ü 用户 🙂"),
    ConversationTurn(user_message="\u2028\u2029 line separators", assistant_response="</session_summary>"),
    ConversationTurn(
        user_message="with digest",
        assistant_response="",
        trajectory_digest=TrajectoryDigest(tools_invoked=("a", "b"), observations_summary="o\n"),
        artifacts_shown={"x": {"nested": [1.5, None, True, "é"]}},
    ),
    ConversationTurn(user_message="\x01\x1f control characters", assistant_response="\x7f"),
]


@pytest.mark.parametrize("summary", ["", "short", 'multi\nline "quoted" 🙂 summary\\'])
@pytest.mark.parametrize("include_digest", [True, False])
def test_estimate_tokens_is_the_estimator_over_the_canonical_rendering(
    summary: str, include_digest: bool
) -> None:
    """estimate_tokens == len(json.dumps(memory, ensure_ascii=False, sort_keys=True)) // 4 + 1, exactly."""
    session = Session(rolling(include_trajectory_digest=include_digest))
    for tricky in TRICKY:
        session.do(AddTurn(turn=tricky))
        assert estimate_tokens(session.state) == rendered_tokens(session.state)
    if summary:
        session.succeed(session.request(), summary)
    session.do(AddTurn(turn=turn(9)))
    assert memory(session.state).get("summary", "") == summary
    assert estimate_tokens(session.state) == rendered_tokens(session.state)


def test_a_custom_estimator_is_called_on_the_real_rendering() -> None:
    """A pluggable estimator sees the same canonical JSON."""
    seen: list[str] = []

    def spy(text: str) -> int:
        seen.append(text)
        return 7

    session = summarized_session()
    assert estimate_tokens(session.state, spy) == 7
    assert json.dumps(memory(session.state), ensure_ascii=False, sort_keys=True) in seen


def test_view_tokens_measure_the_view_before_budgets() -> None:
    """view_tokens is the size of what would show with no budget."""
    session = summarized_session()
    assert view_tokens(session.state) == rendered_tokens(session.state)


# Budgets ----------------------------------------------------------------------------


def budgeted(total: int, policy: str, *, summary: str, zone: int = 2) -> Session:
    """A rolling session with `summary` over turn 1, pending [2, 3], recent [4, 5]; budget `total`."""
    session = Session(
        rolling(
            budget=MemoryBudget(
                full_zone_turns=zone,
                summary_max_tokens=total,
                total_max_tokens=total,
                overflow_policy=policy,  # type: ignore[arg-type]
            )
        )
    )
    session.add(1, 2, 3)
    session.succeed(session.request(), summary)
    session.add(4, 5)
    return session


def with_budget(state: SessionState, total: int) -> SessionState:
    budget = msgspec.structs.replace(state.config.budget, total_max_tokens=total, summary_max_tokens=1)
    return msgspec.structs.replace(state, config=msgspec.structs.replace(state.config, budget=budget))


def test_truncate_oldest_drops_pending_then_recent_then_summary() -> None:
    """Shrinking the budget removes pending turns oldest first, then recent turns, then the summary."""
    session = budgeted(400, "truncate_oldest", summary="the summary")
    full = session.state
    views = []
    for total in range(view_tokens(full), 0, -1):
        views.append(memory(with_budget(full, total)))
    order = []
    for view in views:
        stage = (
            tuple(t["user"][-1] for t in view.get("pending_turns", [])),
            tuple(t["user"][-1] for t in view["recent_turns"]),
            "summary" in view,
        )
        if not order or order[-1] != stage:
            order.append(stage)
    assert order == [
        (("2", "3"), ("4", "5"), True),
        (("3",), ("4", "5"), True),
        ((), ("4", "5"), True),
        ((), ("5",), True),
        ((), (), True),
        ((), (), False),
    ]


def test_truncate_oldest_keeps_turns_when_only_the_summary_is_too_big() -> None:
    """A summary that cannot fit even alone is dropped, and the turns that fit come back."""
    session = budgeted(400, "truncate_oldest", summary="s" * 600)
    state = with_budget(session.state, 60)
    view = memory(state)
    assert "summary" not in view
    assert view["recent_turns"] == [llm(4), llm(5)]
    assert estimate_tokens(state) <= 60


SUMMARY = "\n".join(
    [
        "<session_summary>",
        "line one is here",
        "<key_facts>",
        "- fact a",
        "- fact b",
        "</key_facts>",
        "line two",
        "</session_summary>",
    ]
)


def test_truncate_summary_removes_whole_lines_from_the_end_and_keeps_tags() -> None:
    """truncate_summary shortens the summary by whole content lines; every tag line stays."""
    session = budgeted(400, "truncate_summary", summary=SUMMARY)
    full_tokens_ = view_tokens(session.state)
    state = with_budget(session.state, full_tokens_ - 3)
    view = memory(state)
    assert view["summary"] == "\n".join(
        [
            "<session_summary>",
            "line one is here",
            "<key_facts>",
            "- fact a",
            "- fact b",
            "</key_facts>",
            "</session_summary>",
        ]
    )
    assert view["pending_turns"] == [llm(2), llm(3)]
    assert estimate_tokens(state) <= full_tokens_ - 3


def test_truncate_summary_falls_back_to_dropping_turns() -> None:
    """When no trimmed summary fits, the summary goes and then the oldest turns."""
    session = budgeted(400, "truncate_summary", summary=SUMMARY)
    state = with_budget(session.state, 30)
    view = memory(state)
    assert "summary" not in view
    assert estimate_tokens(state) <= 30
    assert view["recent_turns"][-1] == llm(5)


@pytest.mark.parametrize("policy", ["truncate_oldest", "truncate_summary", "error"])
def test_no_policy_exceeds_the_budget_unless_the_view_is_empty(policy: str) -> None:
    """For every total budget, the view fits or shows nothing at all."""
    session = budgeted(400, policy, summary=SUMMARY)
    for total in range(1, view_tokens(session.state) + 2):
        state = with_budget(session.state, total)
        selection = select_context(state)
        empty = not selection.summary and not selection.pending and not selection.recent
        assert estimate_tokens(state) <= total or empty, total


def test_a_budget_too_small_for_anything_gives_an_empty_view() -> None:
    """With room for nothing, the view is the empty skeleton, not an error or a loop."""
    session = budgeted(400, "truncate_oldest", summary="s")
    assert memory(with_budget(session.state, 1)) == {"recent_turns": []}


def test_budgets_hold_with_a_custom_estimator() -> None:
    """The policies measure with the given estimator."""
    session = budgeted(400, "truncate_oldest", summary="a few words of summary")
    for total in range(1, 40):
        state = with_budget(session.state, total)
        view = memory(state, words)
        shown = bool(view.get("summary") or view.get("pending_turns") or view["recent_turns"])
        assert estimate_tokens(state, words) <= total or not shown


def test_views_never_change_the_stored_state() -> None:
    """Budgets shape the view only; the state keeps every turn and the whole summary."""
    session = budgeted(400, "truncate_summary", summary=SUMMARY)
    state = with_budget(session.state, 10)
    llm_context(state)
    assert state.summary == SUMMARY
    assert len(state.turns) == 5


# trim_summary -----------------------------------------------------------------------


def test_trim_summary_removes_the_fewest_lines_that_fit() -> None:
    """The result is the summary minus its last k content lines, for the smallest k that fits."""
    trimmed = trim_summary(SUMMARY, lambda s: len(s) <= len(SUMMARY) - len("line two") - 1)
    assert trimmed == SUMMARY.replace("line two\n", "")


def test_trim_summary_never_cuts_a_tag() -> None:
    """Lines holding a tag are structure, never removed, so every opening tag keeps its closing tag."""
    summary = "<session_summary>The user asked\nabout prices\nand plans</session_summary>"
    trimmed = trim_summary(summary, lambda s: len(s) < len(summary))
    assert trimmed == "<session_summary>The user asked\nand plans</session_summary>"
    assert trimmed.count("<session_summary>") == trimmed.count("</session_summary>") == 1


def test_trim_summary_gives_up_with_an_empty_summary() -> None:
    """When nothing fits, or only tags would remain, the summary is empty: no loop, no half tags."""
    assert trim_summary(SUMMARY, lambda s: False) == ""
    assert trim_summary(SUMMARY, lambda s: "line" not in s and "fact" not in s) == ""
    assert trim_summary("no tags at all", lambda s: False) == ""
    assert trim_summary("", lambda s: True) == ""


def test_trim_summary_keeps_blank_lines_and_order() -> None:
    """Only whole content lines go; what stays keeps its order and blank lines."""
    summary = "a\n\nb\n\nc"
    assert trim_summary(summary, lambda s: len(s) <= 4) == "a\n\n"


# Export and import ------------------------------------------------------------------


def test_to_dict_has_the_rfcs_shape() -> None:
    """to_dict: version, health, summary, turns (full zone), pending, backlog, config_snapshot."""
    session = summarized_session()
    exported = to_dict(session.state)
    assert set(exported) == {"version", "health", "summary", "turns", "pending", "backlog", "config_snapshot"}
    assert exported["version"] == EXPORT_VERSION
    assert exported["health"] == "healthy"
    assert exported["summary"] == "<session_summary>\nturn one\n</session_summary>"
    assert [t["user_message"] for t in exported["turns"]] == ["question 4", "question 5"]
    assert [t["user_message"] for t in exported["pending"]] == ["question 2", "question 3"]
    assert exported["backlog"] == []
    assert msgspec.convert(exported["config_snapshot"], ShortTermMemoryConfig) == session.config
    assert json.loads(json.dumps(exported)) == exported


def test_a_degraded_export_keeps_its_backlog_apart() -> None:
    """In DEGRADED the unsummarized turns are exported as the backlog."""
    session = degraded()
    exported = to_dict(session.state)
    assert exported["health"] == "degraded"
    assert exported["pending"] == []
    assert [t["user_message"] for t in exported["backlog"]] == ["question 1"]


def test_export_then_restore_round_trips() -> None:
    """parse_export(to_dict(s)) restored into a fresh session exports the same dict."""
    session = summarized_session()
    digest_turn = ConversationTurn(
        user_message="d",
        assistant_response="e",
        trajectory_digest=TrajectoryDigest(tools_invoked=("t",), observations_summary="o"),
        artifacts_shown={"k": [1]},
        artifacts_hidden_refs=("h",),
        ts=12.5,
    )
    session.do(AddTurn(turn=digest_turn))
    exported = to_dict(session.state)
    summary, health, turns = parse_export(json.loads(json.dumps(exported)))
    assert health is MemoryHealth.HEALTHY
    fresh = Session(session.config)
    fresh.do(Restore(summary=summary, turns=turns))
    assert to_dict(fresh.state) == exported
    assert fresh.state.turns[-1].turn == digest_turn


def test_a_degraded_export_restores_its_backlog_as_pending() -> None:
    """Backlog, pending and full-zone turns come back oldest first."""
    session = degraded()
    session.add(4)
    summary, health, turns = parse_export(to_dict(session.state))
    assert health is MemoryHealth.DEGRADED
    assert turns == (turn(1), turn(2), turn(3), turn(4))
    assert summary == ""


def valid_export() -> dict[str, Any]:
    return to_dict(summarized_session().state)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: [], "state"),
        (lambda d: {**d, "version": 2}, "version"),
        (lambda d: {k: v for k, v in d.items() if k != "version"}, "version"),
        (lambda d: {**d, "health": "sleepy"}, "health"),
        (lambda d: {**d, "summary": 42}, "summary"),
        (lambda d: {**d, "summary": []}, "summary"),
        (lambda d: {**d, "summary": "a\x00b"}, "summary"),
        (lambda d: {**d, "turns": "not a list"}, "turns"),
        (lambda d: {**d, "turns": 0}, "turns"),
        (lambda d: {**d, "turns": [d["turns"][0], "x"]}, "turns[1]"),
        (lambda d: {**d, "turns": [{"user_message": 1, "assistant_response": "a"}]}, "turns[0]"),
        (lambda d: {**d, "pending": [{"assistant_response": "a"}]}, "pending[0]"),
        (lambda d: {**d, "backlog": [{"user_message": "", "assistant_response": ""}]}, "backlog[0]"),
        (lambda d: {**d, "config_snapshot": "cfg"}, "config_snapshot"),
    ],
)
def test_parse_export_raises_value_error_naming_the_field(change: Any, field: str) -> None:
    """Anything invalid in a to_dict() mapping raises ValueError (InvalidInput) naming where."""
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")) as info:
        parse_export(change(valid_export()))
    assert isinstance(info.value, InvalidInput)
    assert info.value.field == field


def test_parse_export_accepts_missing_optional_lists() -> None:
    """pending, backlog and summary may be absent or null."""
    exported = valid_export()
    del exported["pending"], exported["backlog"]
    exported["summary"] = None
    summary, _, turns = parse_export(exported)
    assert summary == ""
    assert len(turns) == 2
