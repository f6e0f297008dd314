"""The timeline page in a real headless Chromium: the context shown at a position is `replay --position`'s.

Chromium is Debian's (`.ci/run` installs it with apt-get), driven by
Playwright; the page is opened from a file with every network request
recorded, and none may leave the file.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

import convmem
from convmem.actors import replay_session, timeline
from convmem.adapters import EmbeddedNatsServer
from convmem.adapters.frontends.cli._main import main
from convmem.adapters.frontends.cli._readable import readable
from convmem.adapters.frontends.cli._timeline import timeline_page
from convmem.events import ConversationTurn, HealthPolicy, MemoryBudget, MemoryKey, ShortTermMemoryConfig
from convmem.projections import llm_context

KEY = MemoryKey("acme", "alice@example.com", "trip-planning")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TURNS = [
    ("Hi, I'm Alice. I want to plan a trip to Lisbon in May.", "Lovely! How many days?"),
    ("Five days, budget about 1,200 euros.", "Noted: 5 days, EUR 1,200."),
    ("I prefer small hotels near Alfama.", "I'll look near Alfama."),
    ("Vegetarian food, please.", "I'll keep restaurants vegetarian."),
    ("Can we add a day trip to Sintra?", "Yes, day 3 works for Sintra."),
    ("My sister Ines joins on day 4.", "Great, two travellers from day 4."),
    ("What's the total so far?", "About EUR 1,050 with the Sintra trip."),
]


class FlakySummarizer:
    """Fails its first two calls (the health machine at work), then summarizes the user lines."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, request: Mapping[str, Any]) -> dict[str, str]:
        with self.lock:
            self.calls += 1
            if self.calls <= 2:
                raise ConnectionError("summarizer endpoint unreachable")
        said = "\n".join(f"- {t['user']}" for t in request["turns"])
        return {
            "summary": f"<session_summary>\n{request['previous_summary'][-300:]}\n{said}\n</session_summary>"
        }


@pytest.fixture
def session_log(nats_server: EmbeddedNatsServer) -> str:
    """A session with summaries, health transitions and a clear, on a real server."""
    config = ShortTermMemoryConfig(
        strategy="rolling_summary",
        budget=MemoryBudget(full_zone_turns=2),
        health=HealthPolicy(retry_backoff_seconds=(0.05, 0.05, 0.05), degraded_retry_seconds=0.2),
    )
    with convmem.connect(nats_server.url, config=config, summarizer=FlakySummarizer()) as memory:
        session = memory.session(KEY)
        for user, assistant in TURNS:
            session.add_turn(ConversationTurn(user_message=user, assistant_response=assistant))
            session.flush(timeout=30)
    return nats_server.url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(
            "the timeline page test needs Debian's chromium: apt-get install chromium (README, 'the tests')"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


def replay_context(url: str, position: int, capsys: pytest.CaptureFixture[str]) -> str:
    """`replay --position`'s context as the page shows it: readable text."""
    assert main(["-s", url, "replay", KEY.composite(), "--position", str(position), "--json"]) == 0
    return readable(json.loads(capsys.readouterr()[0])["context"])


def shown(page: Page) -> tuple[int, str]:
    return int(page.get_attribute("body", "data-position") or 0), page.text_content("#context") or ""


def test_the_page_shows_the_context_replay_gives_at_each_position(
    session_log: str, browser: Browser, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Click an event, move the slider, step with the keys: the context shown is replay --position's."""
    page_file = tmp_path / "timeline.html"
    assert main(["-s", session_log, "timeline", KEY.composite(), "-o", str(page_file)]) == 0
    capsys.readouterr()
    requests: list[str] = []
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("request", lambda request: requests.append(request.url))
    page.goto(page_file.as_uri())
    marks = page.locator(".mark")
    count = marks.count()
    assert count >= len(TURNS) + 3  # started, turns, summaries, health changes
    kinds = page.evaluate("Array.from(document.querySelectorAll('.mark')).map(m => m.className)")
    assert any("retry" in k for k in kinds)
    assert any("summary" in k for k in kinds)

    marks.nth(4).click()  # a click on an event
    position, context = shown(page)
    assert context == replay_context(session_log, position, capsys)

    page.locator("#slider").fill(str(count // 2))  # the slider
    position, context = shown(page)
    assert context == replay_context(session_log, position, capsys)

    page.locator("#slider").focus()
    page.keyboard.press("ArrowRight")  # a step with the keys
    stepped, context = shown(page)
    assert stepped > position
    assert context == replay_context(session_log, stepped, capsys)
    assert page.inner_text("#diff").strip()

    page.screenshot(path=str(tmp_path / "timeline.png"), full_page=True)
    assert requests == [page_file.as_uri()]  # nothing but the file itself
    page.close()


def test_timeline_of_an_unknown_key_is_exit_3(nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    """No events: no page, exit 3."""
    with convmem.connect(nats_server.url) as memory:
        memory.session(MemoryKey("a", "b", "c")).add_turn(
            ConversationTurn(user_message="x", assistant_response="y")
        )
    assert main(["-s", nats_server.url, "timeline", "a:b:nobody", "-o", str(tmp_path / "p.html")]) == 3
    assert not (tmp_path / "p.html").exists()


HOSTILE_KEY = MemoryKey(
    "acme", 'mallory<b>&"__DATA__', "s</title><script>window.pwned='title'</script>__TITLE__"
)
HOSTILE_TURNS = [
    ("<!-- a comment opens here", "and stays open"),
    ("<script>window.pwned = 'script'</script>", "later, a script element"),
    ("</script><script>window.pwned = 'closed'</script>", "closes the data element"),
    ("<img src=x onerror=\"window.pwned = 'img'\">", "<svg onload=\"window.pwned='svg'\">"),
    ("<!--<script>", "</script>-->"),
    ("line\u2028separator\u2029 and ]]> <![CDATA[ x", "&lt;b&gt; &amp; __DATA__ __TITLE__"),
]


def test_no_stored_text_can_break_the_page_or_run_a_script(
    nats_server: EmbeddedNatsServer, browser: Browser, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hostile turns and ids: every event drawn, the text shown as text, no injected script run."""
    config = ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=10))
    with convmem.connect(nats_server.url, config=config) as memory:
        session = memory.session(HOSTILE_KEY)
        for user, assistant in HOSTILE_TURNS:
            session.add_turn(ConversationTurn(user_message=user, assistant_response=assistant))
        events = memory.log.last_seq(HOSTILE_KEY)
    page_file = tmp_path / "hostile.html"
    assert main(["-s", nats_server.url, "timeline", HOSTILE_KEY.composite(), "-o", str(page_file)]) == 0
    capsys.readouterr()
    html = page_file.read_text(encoding="utf-8")
    assert html.count("<script") == 2  # the data element and the page's own script, nothing stored
    assert "<!--" not in html

    problems: list[str] = []
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("dialog", lambda dialog: problems.append(dialog.message))
    page.goto(page_file.as_uri())
    assert page.locator(".mark").count() == events  # every event drawn: the page's script ran to the end
    assert page.evaluate("window.pwned") is None
    assert page.locator("img, svg, body script:not(#data) ~ script").count() == 0
    assert page.inner_text("#key") == HOSTILE_KEY.composite()
    assert HOSTILE_KEY.composite() in page.title()
    position, context = shown(page)
    assert (
        main(
            ["-s", nats_server.url, "replay", HOSTILE_KEY.composite(), "--position", str(position), "--json"]
        )
        == 0
    )
    assert context == readable(json.loads(capsys.readouterr()[0])["context"])
    for user, assistant in HOSTILE_TURNS:  # shown as the very text stored
        for said in (*user.split("\n"), *assistant.split("\n")):
            assert said in context
    for i in range(events):
        page.locator(".mark").nth(i).click()
        assert page.evaluate("window.pwned") is None
    page.locator(".mark").nth(1).click()  # the first turn's event
    assert HOSTILE_TURNS[0][0] in page.inner_text("#event")
    page.screenshot(path=str(tmp_path / "hostile.png"), full_page=True)
    assert problems == []
    page.close()


LONG_KEY = MemoryKey("acme", "auditor", "a-thousand-turns")


def rolling_summarizer(request: Mapping[str, Any]) -> dict[str, str]:
    """Keeps the last 12 lines of the summary before and adds a line per turn: lines kept, added, dropped."""
    before = request["previous_summary"].split("\n")[1:-1][-12:]
    said = [f"- asked: {t['user'][:50]}" for t in request["turns"]]
    return {"summary": "\n".join(["<session_summary>", *before, *said, "</session_summary>"])}


@pytest.fixture(scope="module")
def long_session() -> list[Any]:
    """1,000 turns with rolling summaries, on the in-memory log (no server needed)."""
    config = ShortTermMemoryConfig(strategy="rolling_summary")
    with convmem.connect("memory://", config=config, summarizer=rolling_summarizer) as memory:
        session = memory.session(LONG_KEY)
        for i in range(1000):
            session.add_turn(
                ConversationTurn(
                    user_message=f"Turn {i}: what about day {i % 9} of the trip?\nAnd the budget for it?",
                    assistant_response=f"Day {i % 9} (turn {i}): a walk in Alfama.\nBudget: EUR {100 + i}.",
                )
            )
            if i % 10 == 9:  # the summaries keep up: a summary at about every tenth turn
                session.flush(timeout=60)
        return list(memory.log.read(LONG_KEY))


def test_a_thousand_turn_page_is_small_and_shows_each_context_and_summary_diff(
    long_session: list[Any], browser: Browser, tmp_path: Path
) -> None:
    """Under 2 MB; any event picked shows replay's context as text and the summary's line diff."""
    page_file = tmp_path / "long.html"
    page_file.write_text(timeline_page(long_session, LONG_KEY), encoding="utf-8")
    assert page_file.stat().st_size < 2_000_000
    rows = timeline(long_session)
    summaries = [i for i, row in enumerate(rows) if row.type == "summary.produced"]
    assert len(summaries) > 100

    def expected(index: int) -> str:
        state, _ = replay_session(long_session, LONG_KEY, until_position=rows[index].position)
        return readable(llm_context(state))

    problems: list[str] = []
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(page_file.as_uri())
    assert page.locator(".mark").count() == len(rows)
    assert shown(page) == (rows[-1].position, expected(len(rows) - 1))  # the last event, shown first

    picked = summaries[len(summaries) // 2]  # far from a stored whole context: rebuilt from changes
    page.locator("#slider").fill(str(picked))
    assert shown(page) == (rows[picked].position, expected(picked))
    note = page.inner_text("#summary-note")
    for said in ("lines added", "kept", "dropped"):
        assert said in note
    diff = page.locator("#summary-diff")
    assert diff.locator(".add").count() >= 1
    assert diff.locator(".same").count() >= 1
    assert diff.locator(".del").count() >= 1
    assert "\\n" not in (diff.text_content() or "")  # lines, not an escaped JSON string
    assert "- asked: Turn" in (diff.locator(".add").first.text_content() or "")
    assert page.locator("#diff .add").count() >= 1  # the context's change from the event before

    page.locator("#slider").focus()
    for step in ("ArrowLeft", "ArrowLeft", "ArrowRight"):  # back past the cached one, then on
        page.keyboard.press(step)
    assert shown(page) == (rows[picked - 1].position, expected(picked - 1))
    assert "unchanged since position" in page.inner_text("#summary-note") or picked - 1 in summaries

    page.screenshot(path=str(tmp_path / "timeline.png"))
    assert problems == []
    page.close()


def test_replay_shows_the_summary_as_its_lines(session_log: str, capsys: pytest.CaptureFixture[str]) -> None:
    """replay without --json: the context as readable text, the summary line by line, no JSON escapes."""
    assert main(["-s", session_log, "replay", KEY.composite()]) == 0
    out = capsys.readouterr()[0]
    shown_lines = out.splitlines()
    assert "\\n" not in out
    assert any(line.strip() == "<session_summary>" for line in shown_lines)
    assert any(line.strip() == f"- {TURNS[0][0]}" for line in shown_lines)
    assert main(["-s", session_log, "replay", KEY.composite(), "--json"]) == 0
    context = json.loads(capsys.readouterr()[0])["context"]
    assert readable(context) in out


def test_readable_text_keeps_every_line_and_names_each_value() -> None:
    """Nested values indented under their names; a many-line string as its lines; empties named."""
    text = readable({"b": {"summary": "one\ntwo", "turns": [{"user": "hi"}], "none": [], "n": 3}, "a": None})
    assert text.splitlines() == [
        "a: null",
        "b:",
        "  n: 3",
        "  none: []",
        "  summary: |",
        "    one",
        "    two",
        "  turns:",
        "    -",
        "      user: hi",
    ]
