"""The OpenAI-compatible summarizer, against a real HTTP server on loopback that plays scripted
replies; nothing inside httpx is replaced. (The extractive summarizer: tests/test_extractive.py.)
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from summaries import assert_accepted, assert_well_formed, request
from summary_samples import PRICING_TURNS

from convmem.adapters import OpenAIChatSummarizer
from convmem.errors import ConvmemError, InvalidConfig, SummarizerError
from convmem.events import ConversationTurn, MemoryHealth, MemoryKey, TrajectoryDigest
from convmem.projections import SummaryRequest, default_token_estimator

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


def test_the_prompt_asks_for_dated_specific_bullets_merged_with_the_previous_summary(
    chat_server: ChatServer, summarizer: OpenAIChatSummarizer
) -> None:
    """Who, what, when; names and numbers verbatim; relative dates made absolute; previous facts kept."""
    chat_server.answer(json.dumps({"summary": SUMMARY}))
    summarizer(request(PRICING_TURNS))
    prompt = chat_server.requests[0]["body"]["messages"][0]["content"]
    for asked in (
        "merges the previous summary",
        "Keep the\nprevious summary's facts",
        "who did or said what, and when",
        "verbatim",
        "Make relative dates absolute",
        "group key facts under the date",
        "8 May 2023:",
        "Drop greetings, thanks and small talk",
    ):
        assert asked in prompt, asked


def test_turns_reach_the_model_with_their_dates(
    chat_server: ChatServer, summarizer: OpenAIChatSummarizer
) -> None:
    """A turn's ts becomes "date": "8 May 2023" in the prompt; a turn with no known time has none."""
    ts = datetime(2023, 5, 8, 23, 30, tzinfo=UTC).timestamp()
    turns = [
        ConversationTurn(
            user_message="I went to a support group yesterday.", assistant_response="How was it?", ts=ts
        ),
        ConversationTurn(user_message="Undated.", assistant_response="ok"),
    ]
    summary_request = SummaryRequest(
        key=MemoryKey("t", "u", "s"),
        previous_summary="",
        covers_from=1,
        covers_through=2,
        turns=tuple(turns),
        health=MemoryHealth.HEALTHY,
        attempt=0,
        include_digest=False,
    )
    chat_server.answer(json.dumps({"summary": SUMMARY}))
    summarizer(summary_request.payload())
    sent = json.loads(chat_server.requests[0]["body"]["messages"][1]["content"])
    assert sent["turns"] == [
        {"user": "I went to a support group yesterday.", "assistant": "How was it?", "date": "8 May 2023"},
        {"user": "Undated.", "assistant": "ok"},
    ]


def test_a_model_summary_in_the_prompts_shape_rolls_on_in_the_extractive_summarizer(
    chat_server: ChatServer, summarizer: OpenAIChatSummarizer
) -> None:
    """What the prompt asks a model for is what the offline summarizer writes: each reads the other's."""
    from convmem.adapters import ExtractiveSummarizer  # noqa: PLC0415 - the other summarizer, here only

    dated = (
        "<session_summary>\nAna is choosing a plan.\n<key_facts>\n8 May 2023:\n"
        "- User: adopted a dog named Max on 7 May 2023.\n</key_facts>\n</session_summary>"
    )
    chat_server.answer(json.dumps({"summary": dated}))
    summary = summarizer(request(PRICING_TURNS))["summary"]
    assert_well_formed(summary)
    rolled = ExtractiveSummarizer()(request([], previous=summary))["summary"]
    assert "8 May 2023:\n- User: adopted a dog named Max on 7 May 2023." in rolled
