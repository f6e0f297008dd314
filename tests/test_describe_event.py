"""An event described for people (`describe_event`, pure): what a timeline row shows, no log, no threads."""

from __future__ import annotations

from hypothesis import given
from strategies import SESSION_KEY, Script, any_event, rolling

from convmem.events import AnyEvent, ConversationTurn, SessionErased, TurnAdded
from convmem.projections import describe_event


def test_a_turn_reads_as_its_number_and_its_user_text_cut_at_sixty_characters() -> None:
    """Given a turn whose user text is long and spread over lines, when it is described, then the
    text is one line cut to 60 characters with an ellipsis; `full` keeps it whole."""
    text = "word " * 30 + "\n  end"
    event = TurnAdded(
        seq=2,
        event_id="e2",
        at=1.0,
        index=7,
        turn=ConversationTurn(user_message=text, assistant_response="ok"),
    )
    kind, detail = describe_event(event)
    assert kind == "turn.added"
    assert detail.startswith("#7 user: word word")
    assert detail.endswith("…")
    assert len(detail) == len("#7 user: ") + 60
    assert describe_event(event, full=True) == ("turn.added", f"#7 user: {text}")


def test_a_start_and_an_erasure_read_as_their_own_types() -> None:
    script = Script()
    started = script.start(SESSION_KEY, rolling())
    assert describe_event(started) == ("session.started", "strategy=rolling_summary")
    fence = SessionErased(seq=3, event_id="erased/x", at=2.0, reason="asked by the user")
    assert describe_event(fence) == ("session.erased", "asked by the user")


@given(any_event)
def test_every_event_type_has_a_one_line_type_and_detail(event: AnyEvent) -> None:
    """No event falls through the description (a new event type must say how it reads)."""
    kind, detail = describe_event(event)
    assert "." in kind
    assert kind == kind.lower()
    assert isinstance(detail, str)
