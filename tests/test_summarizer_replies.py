"""Whatever a user's summarizer answers or raises, its session says why in its health and serves on.

The pool's own tests (`test_pool.py`) turn each reply into an outcome; these run it through a live
session on a manual clock: the session goes to RETRY with a `HealthChanged` naming the problem,
nothing of the reply is stored, the session's actor takes the next write, and once the summarizer
answers well the session is HEALTHY again.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from typing import Any

import pytest
from runtime_helpers import Harness, events_of, key, summarizing_config, turn, wait_until

from convmem.adapters.frontends.cli._safe import visible
from convmem.adapters.frontends.cli._timeline import timeline_page
from convmem.events import HealthChanged, MemoryHealth, SummaryProduced

_HUGE = "x" * 10_000_000


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (_HUGE, "over summary_max_tokens=200"),
        ("ok \ud800", "lone surrogate"),
        ("a\x00b", "NUL"),
        (b"bytes", "not a string"),
        ({"summary": None}, "not a string"),
        (SystemExit(3), "SystemExit: 3"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (GeneratorExit(), "GeneratorExit"),
    ],
    ids=["10MB", "surrogate", "nul", "bytes", "none", "system-exit", "keyboard-interrupt", "generator-exit"],
)
def test_a_summarizer_s_bad_reply_is_a_named_retry_and_the_session_serves_on(
    harness: Harness, reply: object, reason: str
) -> None:
    answers = [reply]
    lock = threading.Lock()

    def summarizer(request: Mapping[str, Any]) -> object:
        with lock:
            answer = answers.pop(0) if answers else "the gist"
        if isinstance(answer, BaseException):
            raise answer
        return answer

    system = harness.system(summarizing_config(), summarizer=summarizer)
    session = system.session(key())
    for n in range(3):  # full zone 2: the third turn makes the first one due for a summary
        session.add_turn(turn(f"t{n}"))
    wait_until(lambda: session.health is MemoryHealth.RETRY, message="the session retries")
    (changed,) = events_of(harness.log, key(), HealthChanged)
    assert reason in changed.reason
    assert len(changed.reason) < 1_000  # the reply is named, never echoed
    assert not events_of(harness.log, key(), SummaryProduced)
    assert session.add_turn(turn("t3")) == 4  # the actor lives
    harness.clock.advance(2.0)  # the retry's back-off: the summarizer now answers well
    wait_until(lambda: session.health is MemoryHealth.HEALTHY, message="the session heals")
    assert [e.summary for e in events_of(harness.log, key(), SummaryProduced)] == ["the gist"]


def test_a_summary_answered_after_a_clear_and_a_fork_is_not_stored_in_either(harness: Harness) -> None:
    """The summarizer answers after its session was forked, then cleared: the summary of the cleared
    turns is stored nowhere (not in the cleared session, not in the fork, which asks for its own)."""
    gate = threading.Event()
    entered = threading.Event()

    def summarizer(request: Mapping[str, Any]) -> str:
        first = not entered.is_set()
        entered.set()
        if first:
            assert gate.wait(30), "the test never let the summary answer"
            return "summary of the cleared turns"
        return "the fork's own"

    system = harness.system(summarizing_config(), summarizer=summarizer)
    source, fork = key("source"), key("fork")
    session = system.session(source)
    for n in range(3):
        session.add_turn(turn(f"t{n}"))
    assert entered.wait(30)
    system.fork(source, to=fork)
    session.clear()
    gate.set()
    session.refresh(timeout=10)

    def handled() -> bool:
        activity = system.activity(source)
        return activity is not None and not activity.summarizing

    wait_until(handled, message="the late answer is handled")
    assert not events_of(harness.log, source, SummaryProduced)
    assert session.health is MemoryHealth.HEALTHY
    assert "summary" not in session.get_llm_context()["conversation_memory"]
    assert all(
        e.summary != "summary of the cleared turns" for e in events_of(harness.log, fork, SummaryProduced)
    )


_EVIL = "sum \x1b[2J\x1b]0;owned\x07 \x9b31m \u202e reversed \r over \u2066 end"
_RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def test_a_summary_of_terminal_escapes_and_bidi_overrides_is_shown_escaped_on_the_timeline_page(
    harness: Harness,
) -> None:
    """The page shows text with `textContent`, so markup cannot run; a raw U+202E would still turn
    the rest of a line around in the browser and a C1 control reach a terminal that prints the file:
    the page shows every control character as a visible escape, as the CLI prints it."""
    system = harness.system(summarizing_config(), summarizer=lambda request: {"summary": _EVIL})
    session = system.session(key())
    for n in range(3):
        session.add_turn(turn(f"t{n} \u202e"))
    session.flush(timeout=10)
    assert session.get_llm_context()["conversation_memory"]["summary"] == _EVIL  # stored as given
    page = timeline_page(harness.log.read(key()), key())
    assert _RAW.findall(page) == []
    assert (
        visible(_EVIL)
        in json.loads(page.split('type="application/json">', 1)[1].split("</script>", 1)[0])["lines"]
    )
