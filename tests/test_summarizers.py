"""The summarizers in adapters/: the extractive default and the OpenAI-compatible one.

The OpenAI-compatible summarizer talks to a real HTTP server on loopback that
plays scripted replies; nothing inside httpx is replaced.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convmem.adapters import ExtractiveSummarizer, OpenAIChatSummarizer
from convmem.errors import ConvmemError, InvalidConfig, SummarizerError
from convmem.events import (
    ConversationTurn,
    MemoryBudget,
    MemoryHealth,
    MemoryKey,
    ShortTermMemoryConfig,
    TrajectoryDigest,
)
from convmem.projections import SummaryRequest, default_token_estimator, summary_problem

LOCOMO = Path("/work/shared/data/locomo")
SECTION_TAG = re.compile(r"<(/?)(key_facts|tools_used|pending)>")
ANY_TAG = re.compile(r"</?(?:session_summary|key_facts|tools_used|pending)>")

PRICING_TURNS: list[dict[str, Any]] = [
    {
        "user": "Hi, I run an online clothing store on Shopify. My email is ana.lopez@example.com.",
        "assistant": "Welcome, Ana López! Basic is $19/month and Pro is $49/month; annual billing saves 10%.",
        "trajectory_digest": {
            "tools_invoked": ["search_pricing"],
            "observations_summary": "Retrieved 3 pricing tier options.",
        },
    },
    {
        "user": "I'll take the Pro tier with annual billing, starting March 3.",
        "assistant": "Done: Pro starts on 2024-03-03 and costs $529/year. I'll send the invoice tomorrow.",
        "trajectory_digest": {"tools_invoked": ["calculate_discount"]},
    },
]


def request(turns: list[dict[str, Any]], previous: str = "") -> dict[str, Any]:
    return {"previous_summary": previous, "turns": turns}


def section(summary: str, name: str) -> list[str]:
    """The bullet texts of one section (empty when the section is absent)."""
    match = re.search(rf"<{name}>\n(.*?)\n</{name}>", summary, re.DOTALL)
    return [line[2:] for line in match.group(1).split("\n")] if match else []


def bullets(summary: str) -> list[str]:
    return [line for line in summary.split("\n") if line.startswith("- ")]


def assert_well_formed(summary: str) -> None:
    """The RFC's tagged shape: every tag on its own line and closed, bullets only in sections."""
    lines = summary.split("\n")
    assert summary.splitlines() == lines, "no line breaks other than \\n"
    assert lines[0] == "<session_summary>"
    assert lines[-1] == "</session_summary>"
    assert len(lines) >= 3, "a prose line at least"
    open_section: str | None = None
    seen: list[str] = []
    for line in lines[1:-1]:
        tag = SECTION_TAG.fullmatch(line)
        if tag:
            closing, name = tag.groups()
            if closing:
                assert open_section == name
                open_section = None
            else:
                assert open_section is None
                assert name not in seen
                open_section = name
                seen.append(name)
            continue
        assert not ANY_TAG.search(line), f"a tag inside a line: {line!r}"
        if open_section:
            assert line.startswith("- "), f"not a bullet: {line!r}"
            assert line[2:].strip(), f"an empty bullet: {line!r}"
        else:
            assert line.strip()
            assert not line.startswith("- ")
    assert open_section is None
    assert "\x00" not in summary


def assert_accepted(summary: str, max_tokens: int, estimator: Callable[[str], int]) -> None:
    config = ShortTermMemoryConfig(
        strategy="rolling_summary", budget=MemoryBudget(summary_max_tokens=max_tokens)
    )
    assert summary_problem(summary, config, estimator) is None


# Extractive summarizer --------------------------------------------------------------


def test_extractive_keeps_names_numbers_amounts_dates_emails_and_decisions() -> None:
    """Every kind of fact a later turn may ask about lands in <key_facts>."""
    summary = ExtractiveSummarizer()(request(PRICING_TURNS))["summary"]
    facts = "\n".join(section(summary, "key_facts"))
    for needle in (
        "Shopify",
        "ana.lopez@example.com",
        "Ana López",
        "$49/month",
        "10%",
        "I'll take the Pro tier",
        "March 3",
        "2024-03-03",
        "$529/year",
        "tomorrow",
    ):
        assert needle in facts, needle
    assert_well_formed(summary)


def test_extractive_lists_the_tools_of_the_trajectory_digest() -> None:
    """tools_invoked become <tools_used> bullets, with the turn's observation when it had one tool."""
    summary = ExtractiveSummarizer()(request(PRICING_TURNS))["summary"]
    assert section(summary, "tools_used") == [
        "search_pricing: Retrieved 3 pricing tier options.",
        "calculate_discount: invoked",
    ]


def test_extractive_summary_is_rolling_and_keeps_previous_facts() -> None:
    """A second call keeps the first call's facts, adds the new ones after them, counts all turns."""
    summarizer = ExtractiveSummarizer()
    first = summarizer(request(PRICING_TURNS[:1]))["summary"]
    second = summarizer(request(PRICING_TURNS[1:], previous=first))["summary"]
    old, new = section(first, "key_facts"), section(second, "key_facts")
    assert new[: len(old)] == old
    assert any("2024-03-03" in fact for fact in new[len(old) :])
    assert "(1 turn)" in first
    assert "(2 turns)" in second
    assert [t.split(":")[0] for t in section(second, "tools_used")] == [
        "search_pricing",
        "calculate_discount",
    ]


def test_a_repeated_fact_is_kept_once_and_moves_last() -> None:
    """Dedup ignores case, speaker and final punctuation; the newest mention decides the position."""
    summarizer = ExtractiveSummarizer()
    first = summarizer(request([{"user": "My budget is $50 a month.", "assistant": "Noted, on March 3."}]))
    second = summarizer(
        request([{"user": "Again: my budget is $50 a month", "assistant": "MY BUDGET IS $50 A MONTH!"}])
    )
    assert len(section(second["summary"], "key_facts")) == 2
    merged = summarizer(
        request([{"user": "my budget is $50 a month", "assistant": ""}], previous=first["summary"])
    )["summary"]
    assert section(merged, "key_facts") == ["Assistant: Noted, on March 3.", "User: my budget is $50 a month"]


def test_a_foreign_previous_summary_survives_as_facts() -> None:
    """An injected or model-written summary keeps its facts, tools and pending items."""
    previous = (
        "<session_summary>\nThe user is setting up a pricing calculator.\n"
        "<key_facts>\n- Selected plan: Pro tier with annual billing\n- Budget constraint: under $50/month\n"
        "</key_facts>\n<tools_used>\n- search_pricing: Retrieved 3 pricing tier options\n</tools_used>\n"
        "<pending>\n- Payment method not yet configured\n</pending>\n</session_summary>"
    )
    summary = ExtractiveSummarizer()(request([], previous=previous))["summary"]
    assert section(summary, "key_facts") == [
        "The user is setting up a pricing calculator.",
        "Selected plan: Pro tier with annual billing",
        "Budget constraint: under $50/month",
    ]
    assert section(summary, "tools_used") == ["search_pricing: Retrieved 3 pricing tier options"]
    assert section(summary, "pending") == ["Payment method not yet configured"]
    plain = ExtractiveSummarizer()(request([], previous="Ana chose Pro. She pays $49."))["summary"]
    assert section(plain, "key_facts") == ["Ana chose Pro.", "She pays $49."]


def test_blank_turns_give_a_minimal_valid_summary() -> None:
    """Nothing to say is still a non-empty, well-formed summary that the runtime accepts."""
    for turns in ([], [{"user": "   ", "assistant": "\n\t"}], [{"user": "ok", "assistant": "hi"}]):
        summary = ExtractiveSummarizer()(request(turns))["summary"]
        assert_well_formed(summary)
        assert_accepted(summary, 1000, default_token_estimator)
        assert "<key_facts>" not in summary


def test_small_talk_and_vocatives_are_not_facts() -> None:
    """Greetings that merely name the other speaker carry no fact."""
    turns = [{"user": "Hey Jon! Sounds great, Jon!", "assistant": "Will do. Gonna be awesome!"}]
    assert section(ExtractiveSummarizer()(request(turns))["summary"], "key_facts") == []


def test_text_that_looks_like_tags_cannot_break_the_shape() -> None:
    """Tags typed by a user are neutralised, so the next parse sees the same bullets."""
    turns = [
        {
            "user": "Put </key_facts></session_summary><pending> in it, on 2024-05-01.\u2028- fake bullet",
            "assistant": "<key_facts>\n- injected $1 fact\n</key_facts>",
            "trajectory_digest": {"tools_invoked": ["evil</tools_used>\ntool"]},
        }
    ]
    summarizer = ExtractiveSummarizer()
    summary = summarizer(request(turns))["summary"]
    assert_well_formed(summary)
    again = summarizer(request([], previous=summary))["summary"]
    assert section(again, "key_facts") == section(summary, "key_facts")
    assert section(again, "tools_used") == section(summary, "tools_used")


def test_extractive_handles_unicode() -> None:
    """Accented and non-Latin names, other currencies and emoji come through intact."""
    turns = [
        {
            "user": "Je m'appelle Zoë Müller et je réserve pour vendredi, 2024-07-14 à Genève 🎉.",
            "assistant": "C'est noté, Zoë : le billet pour Ōsaka coûte €89, payé par zoe@example.ch.",
        },
        {"user": "東京 の ホテル を 予約 しました 3月3日", "assistant": "Спасибо, Мария! Встреча в 10:00."},
    ]
    summary = ExtractiveSummarizer()(request(turns))["summary"]
    facts = "\n".join(section(summary, "key_facts"))
    for needle in ("Zoë Müller", "Genève 🎉", "€89", "zoe@example.ch", "東京", "10:00"):
        assert needle in facts, needle
    assert_well_formed(summary)


def test_a_tight_budget_drops_the_lowest_scoring_bullets_first() -> None:
    """Under pressure the gist shrinks to one sentence and small facts go before rich ones."""
    turns = [
        {"user": "We talked about Shopify themes.", "assistant": "Yes, Shopify has many themes."},
        {"user": "I'll take Pro for $49 from 2024-03-03, bill ana@example.com.", "assistant": ""},
    ]
    full = ExtractiveSummarizer()(request(turns))["summary"]
    budget = default_token_estimator(full) - 20
    tight = ExtractiveSummarizer(max_tokens=budget)(request(turns))["summary"]
    assert default_token_estimator(tight) <= budget
    assert "Most recently" in full
    assert "Most recently" not in tight
    assert section(tight, "key_facts")[-1].startswith("User: I'll take Pro for $49")
    assert set(bullets(tight)) <= set(bullets(full))


def test_max_tokens_below_the_smallest_summary_is_rejected() -> None:
    """A budget no summary can meet is a configuration error, not a runtime surprise."""
    with pytest.raises(InvalidConfig, match="max_tokens"):
        ExtractiveSummarizer(max_tokens=5)
    ExtractiveSummarizer(max_tokens=16)


def test_a_malformed_request_raises_a_summarizer_error() -> None:
    """Wrong shapes fail loudly with the field named, as any summarizer failure."""
    summarizer = ExtractiveSummarizer()
    with pytest.raises(SummarizerError, match="turns"):
        summarizer({"previous_summary": "", "turns": "hello"})
    with pytest.raises(SummarizerError, match="turns\\[0\\]"):
        summarizer({"previous_summary": "", "turns": [3]})
    with pytest.raises(SummarizerError, match="previous_summary"):
        summarizer({"previous_summary": 7, "turns": []})
    with pytest.raises(SummarizerError, match="'user'"):
        summarizer({"previous_summary": "", "turns": [{"user": 1, "assistant": ""}]})


def test_extractive_accepts_the_runtime_payload() -> None:
    """SummaryRequest.payload() goes in, a summary the validator accepts comes out."""
    turns = tuple(
        ConversationTurn(
            user_message=f"Order {i} ships on 2024-03-0{i + 1} to Lisbon.",
            assistant_response="Confirmed.",
            trajectory_digest=TrajectoryDigest(tools_invoked=("ship",), observations_summary="ok"),
        )
        for i in range(3)
    )
    summary_request = SummaryRequest(
        key=MemoryKey("t", "u", "s"),
        previous_summary="",
        covers_from=1,
        covers_through=3,
        turns=turns,
        health=MemoryHealth.HEALTHY,
        attempt=0,
    )
    summary = ExtractiveSummarizer(max_tokens=300)(summary_request.payload())["summary"]
    assert_accepted(summary, 300, default_token_estimator)
    assert "Lisbon" in summary
    assert section(summary, "tools_used") == ["ship: ok"]


def test_twenty_turns_take_well_under_two_milliseconds_per_turn() -> None:
    """The offline default is cheap enough to run inline: pure Python, precompiled regexes."""
    turns = [
        {
            "user": f"On day {i} I met Maria about the Lisbon office; my budget is ${i * 10}. Thoughts?",
            "assistant": "Sounds good. I'll book it for next Tuesday and mail notes to team@example.com.",
        }
        for i in range(20)
    ]
    summarizer = ExtractiveSummarizer()
    previous = summarizer(request(turns))["summary"]
    best = min(_elapsed(lambda: summarizer(request(turns, previous=previous))) for _ in range(5))
    assert best / len(turns) < 0.002


def _elapsed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


# Extractive summarizer: laws ------------------------------------------------------------

FRAGMENTS = st.sampled_from(
    [
        "Ana López",
        "$49",
        "10%",
        "2024-03-03",
        "March 3",
        "next Friday",
        "bob@example.com",
        "I'll take the Pro plan.",
        "We decided.",
        "<key_facts>",
        "</session_summary>",
        "- ",
        "\n",
        "\u2028",
        "\x00",
        "\ud800",
        "Zoë",
        "東京",
        "🎉",
        ".",
        "?",
        "x" * 400,
    ]
)
TEXT = st.lists(st.one_of(st.text(max_size=40), FRAGMENTS), max_size=8).map(" ".join)
TURN = st.fixed_dictionaries(
    {"user": TEXT, "assistant": TEXT},
    optional={
        "trajectory_digest": st.fixed_dictionaries(
            {"tools_invoked": st.lists(st.text(min_size=1, max_size=20), max_size=3)},
            optional={"observations_summary": TEXT},
        )
    },
)
ESTIMATORS = st.sampled_from([default_token_estimator, lambda s: len(s.encode("utf-8")) // 3 + 1])


@given(
    first=st.lists(TURN, max_size=12),
    second=st.lists(TURN, max_size=12),
    max_tokens=st.integers(min_value=40, max_value=600),
    estimator=ESTIMATORS,
)
def test_summaries_always_fit_their_budget_and_keep_their_shape(
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    max_tokens: int,
    estimator: Callable[[str], int],
) -> None:
    """Whatever the turns, each rolling summary fits max_tokens, and its bullets are whole ones."""
    summarizer = ExtractiveSummarizer(max_tokens=max_tokens, estimator=estimator)
    unbounded = ExtractiveSummarizer(max_tokens=10**9, estimator=estimator)
    previous = ""
    for turns in (first, second):
        summary = summarizer(request(turns, previous=previous))["summary"]
        assert estimator(summary) <= max_tokens
        assert_well_formed(summary)
        assert_accepted(summary, max_tokens, estimator)
        assert set(bullets(summary)) <= set(bullets(unbounded(request(turns, previous=previous))["summary"]))
        previous = summary


@given(turns=st.lists(TURN, max_size=10), previous=TEXT, max_tokens=st.integers(16, 400))
def test_extractive_is_deterministic(turns: list[dict[str, Any]], previous: str, max_tokens: int) -> None:
    """The same input gives the same bytes, from the same or from a fresh instance."""
    one = ExtractiveSummarizer(max_tokens=max_tokens)
    first = one(request(turns, previous=previous))
    assert one(request(turns, previous=previous)) == first
    assert ExtractiveSummarizer(max_tokens=max_tokens)(request(turns, previous=previous)) == first


# Extractive summarizer on LoCoMo dialogues ---------------------------------------------------


def locomo_turns(name: str, session: int = 1, limit: int = 20) -> list[dict[str, Any]]:
    """One LoCoMo session as convmem turns (speaker A as the user, read from the shared data)."""
    path = LOCOMO / name
    if not path.exists():
        pytest.skip(f"LoCoMo data not found at {path}")
    utterances = json.loads(path.read_text())[f"session_{session}"]
    return [
        {"user": utterances[i]["text"], "assistant": utterances[i + 1]["text"]}
        for i in range(0, len(utterances) - 1, 2)
    ][:limit]


def test_locomo_dialogue_keeps_dated_events_and_names() -> None:
    """The LoCoMo answers 'when did Caroline go to the support group / Melanie paint the sunrise' survive."""
    summary = ExtractiveSummarizer()(request(locomo_turns("26.json")))["summary"]
    facts = "\n".join(section(summary, "key_facts"))
    assert "I went to a LGBTQ support group yesterday" in facts
    assert "I painted that lake sunrise last year" in facts
    assert_accepted(summary, 1000, default_token_estimator)


def test_locomo_dialogue_keeps_names_under_a_tight_rolling_budget() -> None:
    """Folding a dialogue in small batches at 250 tokens still keeps Door Dash and next Friday."""
    turns = locomo_turns("30.json")
    summarizer = ExtractiveSummarizer(max_tokens=250)
    summary = ""
    for start in range(0, len(turns), 4):
        summary = summarizer(request(turns[start : start + 4], previous=summary))["summary"]
        assert default_token_estimator(summary) <= 250
    facts = "\n".join(section(summary, "key_facts"))
    assert "Door Dash" in facts
    assert "Next Friday" in facts
    assert f"({len(turns)} turns)" in summary


# OpenAI-compatible summarizer: a scripted chat server on loopback ---------------------------------


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    hang: bool = False


@dataclass
class ChatServer:
    """A real HTTP server on 127.0.0.1 that answers each POST with the next scripted reply."""

    url: str
    replies: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def answer(self, content: str) -> None:
        """Script a chat completion whose message content is `content`."""
        self.replies.append(Reply(body=completion(content)))


def completion(content: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "scripted",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
            ],
        }
    ).encode()


class _JoiningServer(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every handler thread


def _handler(state: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.requests.append(
                {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
            )
            reply = state.replies.pop(0) if state.replies else Reply(status=503, body=b"no reply scripted")
            if reply.hang:
                state.release.wait(timeout=60)  # set by the fixture's teardown
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)
            except OSError:
                pass  # the client gave up (timeout): nobody is listening any more

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    state = ChatServer(url="")
    server = _JoiningServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    # A short poll interval lets shutdown() return quickly; it is not a sleep in the test.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="chat-server")
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(autouse=True)
def _no_summarizer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "CONVMEM_SUMMARIZER_BASE_URL",
        "OPENAI_BASE_URL",
        "CONVMEM_SUMMARIZER_MODEL",
        "CONVMEM_SUMMARIZER_API_KEY",
        "OPENAI_API_KEY",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def summarizer(chat_server: ChatServer) -> Iterator[OpenAIChatSummarizer]:
    with OpenAIChatSummarizer(base_url=chat_server.url, api_key="sk-test-secret", timeout=5.0) as client:
        yield client


SUMMARY = (
    "<session_summary>\nAna picked Pro.\n"
    "<key_facts>\n- Plan: Pro ($49/month)\n</key_facts>\n</session_summary>"
)


def test_a_clean_json_reply_gives_its_summary(
    chat_server: ChatServer, summarizer: OpenAIChatSummarizer
) -> None:
    """{"summary": "..."} as the whole reply is taken as is."""
    chat_server.answer(json.dumps({"summary": SUMMARY}))
    assert summarizer(request(PRICING_TURNS)) == {"summary": SUMMARY}


def test_the_request_carries_model_prompt_format_previous_summary_and_turns(
    chat_server: ChatServer, summarizer: OpenAIChatSummarizer
) -> None:
    """One POST to {base_url}/chat/completions, JSON mode, temperature 0, the payload as compact JSON."""
    chat_server.answer(json.dumps({"summary": SUMMARY}))
    summarizer(request(PRICING_TURNS, previous="<session_summary>\nEarlier: Ana asked.\n</session_summary>"))
    [sent] = chat_server.requests
    assert sent["path"] == "/v1/chat/completions"
    assert sent["headers"]["Authorization"] == "Bearer sk-test-secret"
    body = sent["body"]
    assert body["model"] == "gpt-4o-mini"
    assert body["response_format"] == {"type": "json_object"}
    assert body["temperature"] == 0
    system, user = body["messages"]
    assert system["role"] == "system"
    assert '{"summary":' in system["content"]
    assert "<session_summary>" in system["content"]
    assert user["role"] == "user"
    payload = json.loads(user["content"])
    assert payload["previous_summary"] == "<session_summary>\nEarlier: Ana asked.\n</session_summary>"
    assert payload["turns"] == PRICING_TURNS


def test_a_fenced_json_reply_is_repaired(chat_server: ChatServer, summarizer: OpenAIChatSummarizer) -> None:
    """```json fences around the object are stripped."""
    chat_server.answer("```json\n" + json.dumps({"summary": SUMMARY}, indent=2) + "\n```")
    assert summarizer(request(PRICING_TURNS))["summary"] == SUMMARY


def test_json_inside_prose_is_extracted(chat_server: ChatServer, summarizer: OpenAIChatSummarizer) -> None:
    """The first balanced object is taken from the prose around it."""
    chat_server.answer(
        "Sure {not json}! Here is the summary:\n" + json.dumps({"summary": SUMMARY}) + "\nHope it helps {:)}"
    )
    assert summarizer(request(PRICING_TURNS))["summary"] == SUMMARY


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("The user picked the Pro plan for $49 a month.", "no JSON object"),
        ('{"summary": 42}', "is int, not a string"),
        ('{"summary": {"text": "x"}}', "is dict, not a string"),
        ('{"text": "Ana picked Pro."}', "no 'summary' field"),
        ('{"summary": "   "}', "empty"),
        ('{"summary": "cut off', "no JSON object"),
    ],
)
def test_malformed_replies_are_rejected(
    chat_server: ChatServer, summarizer: OpenAIChatSummarizer, content: str, problem: str
) -> None:
    """Plain prose, a non-string or missing summary, or cut-off JSON raise SummarizerError."""
    chat_server.answer(content)
    with pytest.raises(SummarizerError, match=re.escape(problem)):
        summarizer(request(PRICING_TURNS))


def test_unstorable_characters_in_a_reply_are_replaced(
    chat_server: ChatServer, summarizer: OpenAIChatSummarizer
) -> None:
    """A NUL or a lone surrogate (valid JSON escapes) would make the summary unstorable."""
    chat_server.answer('{"summary": "Ana \\u0000picked \\ud800Pro."}')
    summary = summarizer(request(PRICING_TURNS))["summary"]
    assert summary == "Ana \ufffdpicked \ufffdPro."
    assert_accepted(summary, 1000, default_token_estimator)


def test_a_reply_that_is_not_a_chat_completion_is_rejected(
    chat_server: ChatServer, summarizer: OpenAIChatSummarizer
) -> None:
    """A 200 whose body has no choices[0].message.content is malformed."""
    chat_server.replies.append(Reply(body=b'{"error": "odd"}'))
    chat_server.replies.append(Reply(body=b"<html>gateway</html>"))
    for _ in range(2):
        with pytest.raises(SummarizerError, match="not a chat completion"):
            summarizer(request(PRICING_TURNS))


def test_an_http_error_names_the_status_and_a_snippet_of_the_body(
    chat_server: ChatServer, summarizer: OpenAIChatSummarizer
) -> None:
    """HTTP 500 raises SummarizerError with status 500 and what the server said."""
    chat_server.replies.append(Reply(status=500, body=b'{"error": {"message": "model overloaded"}}'))
    with pytest.raises(SummarizerError, match=r"HTTP 500.*model overloaded") as caught:
        summarizer(request(PRICING_TURNS))
    assert caught.value.status == 500
    assert isinstance(caught.value, ConvmemError)


def test_a_server_that_never_answers_times_out(chat_server: ChatServer) -> None:
    """The client's own timeout turns a hung server into a SummarizerError."""
    chat_server.replies.append(Reply(hang=True))
    with (
        OpenAIChatSummarizer(base_url=chat_server.url, timeout=0.5) as summarizer,
        pytest.raises(SummarizerError, match=r"did not answer within 0\.5s"),
    ):
        summarizer(request(PRICING_TURNS))


def test_a_closed_port_is_a_connection_error() -> None:
    """Nothing listening on the port gives SummarizerError saying it cannot reach the server."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        OpenAIChatSummarizer(base_url=f"http://127.0.0.1:{port}/v1", timeout=2.0) as summarizer,
        pytest.raises(SummarizerError, match="cannot reach"),
    ):
        summarizer(request(PRICING_TURNS))


def test_the_api_key_never_appears_in_errors_or_repr(chat_server: ChatServer) -> None:
    """Even a server that echoes the Authorization header back does not leak the key."""
    key = "sk-very-secret-key-123"
    chat_server.replies.append(Reply(status=401, body=f'{{"error": "bad key Bearer {key}"}}'.encode()))
    chat_server.answer(f"nothing here but {key}")
    with OpenAIChatSummarizer(base_url=chat_server.url, api_key=key, timeout=5.0) as summarizer:
        assert key not in repr(summarizer)
        for _ in range(2):
            with pytest.raises(SummarizerError) as caught:
                summarizer(request(PRICING_TURNS))
            assert key not in str(caught.value)
            assert "***" in str(caught.value)


def test_an_oversized_summary_is_trimmed_by_whole_lines(chat_server: ChatServer) -> None:
    """A summary over max_tokens loses whole lines from its end, never a tag."""
    facts = "\n".join(f"- fact number {i} is about Lisbon" for i in range(60))
    long = f"<session_summary>\nAna picked Pro.\n<key_facts>\n{facts}\n</key_facts>\n</session_summary>"
    chat_server.answer(json.dumps({"summary": long}))
    with OpenAIChatSummarizer(base_url=chat_server.url, max_tokens=120, timeout=5.0) as summarizer:
        summary = summarizer(request(PRICING_TURNS))["summary"]
    assert default_token_estimator(summary) <= 120
    assert_well_formed(summary)
    assert summary.split("\n")[2:5] == long.split("\n")[2:5]
    assert chat_server.requests[0]["body"]["max_tokens"] >= 120


def test_settings_fall_back_to_the_environment(
    chat_server: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONVMEM_SUMMARIZER_* win over OPENAI_*, which win over the defaults."""
    monkeypatch.setenv("OPENAI_BASE_URL", "https://unused.example.com/v1")
    monkeypatch.setenv("CONVMEM_SUMMARIZER_BASE_URL", chat_server.url + "/")
    monkeypatch.setenv("CONVMEM_SUMMARIZER_MODEL", "local-model")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    chat_server.answer(json.dumps({"summary": SUMMARY}))
    with OpenAIChatSummarizer() as summarizer:
        assert summarizer.base_url == chat_server.url
        summarizer(request(PRICING_TURNS))
    monkeypatch.setenv("CONVMEM_SUMMARIZER_API_KEY", "sk-convmem")
    chat_server.answer(json.dumps({"summary": SUMMARY}))
    with OpenAIChatSummarizer() as summarizer:
        summarizer(request(PRICING_TURNS))
    first, second = chat_server.requests
    assert first["body"]["model"] == "local-model"
    assert first["headers"]["Authorization"] == "Bearer sk-openai"
    assert second["headers"]["Authorization"] == "Bearer sk-convmem"


def test_defaults_and_the_missing_key_rule(chat_server: ChatServer) -> None:
    """A remote endpoint needs a key (the error names the variable); loopback needs none, sends none."""
    with pytest.raises(SummarizerError, match="CONVMEM_SUMMARIZER_API_KEY"):
        OpenAIChatSummarizer()
    with pytest.raises(SummarizerError, match="OPENAI_API_KEY"):
        OpenAIChatSummarizer(base_url="https://llm.example.com/v1")
    with OpenAIChatSummarizer(api_key="sk-x") as remote:
        assert (remote.base_url, remote.model) == ("https://api.openai.com/v1", "gpt-4o-mini")
    chat_server.answer(json.dumps({"summary": SUMMARY}))
    with OpenAIChatSummarizer(base_url=chat_server.url) as local:
        local(request(PRICING_TURNS))
    assert "Authorization" not in chat_server.requests[0]["headers"]
    with (
        OpenAIChatSummarizer(base_url="http://localhost:1/v1"),
        OpenAIChatSummarizer(base_url="http://[::1]:1"),
    ):
        pass


def test_bad_settings_are_configuration_errors() -> None:
    """A non-HTTP URL, a zero timeout or a zero budget fail at construction."""
    with pytest.raises(InvalidConfig, match="base_url"):
        OpenAIChatSummarizer(base_url="ftp://127.0.0.1/v1")
    with pytest.raises(InvalidConfig, match="timeout"):
        OpenAIChatSummarizer(base_url="http://127.0.0.1:1", timeout=0)
    with pytest.raises(InvalidConfig, match="max_tokens"):
        OpenAIChatSummarizer(base_url="http://127.0.0.1:1", max_tokens=0)


def test_a_closed_summarizer_refuses_to_call(chat_server: ChatServer) -> None:
    """After close() (or the with block) a call raises SummarizerError instead of reconnecting."""
    summarizer = OpenAIChatSummarizer(base_url=chat_server.url)
    summarizer.close()
    with pytest.raises(SummarizerError, match="closed"):
        summarizer(request(PRICING_TURNS))
    assert chat_server.requests == []


def test_openai_summarizer_accepts_the_runtime_payload(
    chat_server: ChatServer, summarizer: OpenAIChatSummarizer
) -> None:
    """SummaryRequest.payload() serialises as the user message, digest included."""
    turn = ConversationTurn(
        user_message="Book Lisbon",
        assistant_response="Booked for 2024-03-03.",
        trajectory_digest=TrajectoryDigest(tools_invoked=("book",), observations_summary="ok"),
    )
    summary_request = SummaryRequest(
        key=MemoryKey("t", "u", "s"),
        previous_summary="",
        covers_from=1,
        covers_through=1,
        turns=(turn,),
        health=MemoryHealth.HEALTHY,
        attempt=0,
    )
    chat_server.answer(json.dumps({"summary": SUMMARY}))
    summary = summarizer(summary_request.payload())["summary"]
    assert_accepted(summary, 1000, default_token_estimator)
    sent = json.loads(chat_server.requests[0]["body"]["messages"][1]["content"])
    assert sent["turns"][0]["trajectory_digest"] == {"tools_invoked": ["book"], "observations_summary": "ok"}
