"""A summarizer backed by any OpenAI-compatible chat-completions endpoint.

It asks for the RFC's JSON-only output, ``{"summary": "<session_summary>...</session_summary>"}``,
and repairs what models commonly wrap around it (code fences, a sentence
before or after the object) or rejects it with a `SummarizerError`. It is a
plain blocking callable: the runtime's summarizer pool runs it in a worker
thread with a timeout of its own, and the HTTP client has one too.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

import httpx

from convmem.actors._bounds import check_count, check_seconds
from convmem.adapters._auth import redact_url, scrub, url_secrets
from convmem.errors import InvalidConfig, SummarizerError
from convmem.events import date_text
from convmem.projections import TokenEstimator, default_token_estimator, trim_summary

__all__ = ["OpenAIChatSummarizer"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
_SNIPPET = 200
_MAX_OBJECT_STARTS = 64
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")  # NUL and lone surrogates (from "\\ud800" escapes)
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)

_SYSTEM_PROMPT = """\
You maintain the short-term memory of a conversation between a user and an AI assistant.
The user message is JSON with "previous_summary" (the summary so far, possibly empty) and
"turns" (newer turns, oldest first; each has "user" and "assistant", "date" when the day it was
said is known (UTC), and sometimes "trajectory_digest" with the tools the assistant invoked and
what they returned), and "speaker_names" when the speakers' names are known (then write
"Alice: ..." rather than "User: ...").

Write ONE updated summary that merges the previous summary with the new turns. Keep the
previous summary's facts (drop one only when a new turn contradicts it or space runs out, and
then drop small details before names, numbers and dates), and add what the new turns tell.
Write specific bullets: who did or said what, and when. Copy names, numbers, amounts, places,
titles and e-mail addresses verbatim. Make relative dates absolute from the turn's date
("yesterday" said on 8 May 2023 is 7 May 2023; "last month" is April 2023). Keep preferences,
decisions, commitments, plans and open questions. Drop greetings, thanks and small talk.
Never invent facts.

Write prose, optionally tagged like this (omit empty sections; group key facts under the date
they were said, undated ones first):
<session_summary>
One sentence of context.
<key_facts>
8 May 2023:
- User: adopted a dog named Max on 7 May 2023.
- Assistant: recommended the vet on Rue Garibaldi, open until 7 pm.
</key_facts>
<tools_used>
- tool_name: what it returned
</tools_used>
<pending>
- what is still open
</pending>
</session_summary>

Keep the summary under {max_tokens} tokens (about {max_chars} characters).
Reply with JSON only, one object and nothing else: {{"summary": "<the summary>"}}"""


def _is_loopback(url: httpx.URL) -> bool:
    host = url.host
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OpenAIChatSummarizer:
    """The RFC's summarizer over ``POST {base_url}/chat/completions``.

    Settings left out come from the environment: ``CONVMEM_SUMMARIZER_BASE_URL``
    (or ``OPENAI_BASE_URL``), ``CONVMEM_SUMMARIZER_MODEL`` and
    ``CONVMEM_SUMMARIZER_API_KEY`` (or ``OPENAI_API_KEY``). A key is required
    unless the endpoint is on loopback (a local model server). Close it, or
    use it as a context manager, to release its connections.
    """

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_tokens: int = 1000,
        transport: httpx.BaseTransport | None = None,
        *,
        estimator: TokenEstimator = default_token_estimator,
    ) -> None:
        base = (
            base_url
            or os.environ.get("CONVMEM_SUMMARIZER_BASE_URL")
            or os.environ.get("OPENAI_BASE_URL")
            or DEFAULT_BASE_URL
        )
        self.model = model or os.environ.get("CONVMEM_SUMMARIZER_MODEL") or DEFAULT_MODEL
        key = api_key or os.environ.get("CONVMEM_SUMMARIZER_API_KEY") or os.environ.get("OPENAI_API_KEY")
        try:
            url = httpx.URL(base.rstrip("/"))
        except httpx.InvalidURL as exc:
            raise InvalidConfig("base_url", f"{base!r} is not a URL: {exc}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise InvalidConfig("base_url", f"{base!r} must be an http:// or https:// URL with a host")
        timeout = check_seconds("timeout", timeout)  # at most a day: 1e12 overflowed the socket's wait
        check_count("max_tokens", max_tokens, most=2**63 - 1)
        if not key and not _is_loopback(url):
            raise SummarizerError(
                f"no API key for the summarizer at {url}: set CONVMEM_SUMMARIZER_API_KEY "
                "(or OPENAI_API_KEY), or pass api_key="
            )
        self.base_url = str(url)
        self.timeout = timeout
        self.max_tokens = max_tokens
        self._endpoint = f"{self.base_url}/chat/completions"
        self._key = key or ""
        self._secrets = (self._key, *url_secrets(self.base_url))
        self._shown = redact_url(self.base_url)  # what messages show: never a password in the URL
        self._shown_endpoint = f"{self._shown}/chat/completions"
        self._estimator = estimator
        self._system_prompt = _SYSTEM_PROMPT.format(max_tokens=max_tokens, max_chars=max_tokens * 4)
        headers = {"Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(timeout=timeout, headers=headers, transport=transport)

    def __repr__(self) -> str:
        return f"OpenAIChatSummarizer(base_url={self._shown!r}, model={self.model!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the HTTP connections; later calls raise `SummarizerError`."""
        self._client.close()

    def request_body(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The chat-completions request for one summarizer request."""
        payload = {
            "previous_summary": request.get("previous_summary") or "",
            "turns": [_dated(turn) for turn in request.get("turns") or ()],
        }
        if request.get("speaker_names"):
            payload["speaker_names"] = request["speaker_names"]
        try:
            turns_json = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise SummarizerError(f"summarizer request is not JSON-serializable: {exc}") from None
        return {
            "model": self.model,
            "messages": [
                {"role": "system", "content": self._system_prompt},
                {"role": "user", "content": turns_json},
            ],
            "response_format": {"type": "json_object"},
            "temperature": 0,
            # Headroom for the JSON wrapping; the text itself is held to max_tokens below.
            "max_tokens": 2 * self.max_tokens + 100,
        }

    def __call__(self, request: Mapping[str, Any], /) -> dict[str, str]:
        if self._client.is_closed:
            raise SummarizerError(f"summarizer for {self._shown} is closed")
        body = self.request_body(request)
        try:
            response = self._client.post(self._endpoint, json=body)
        except httpx.TimeoutException:
            raise SummarizerError(
                f"summarizer at {self._shown_endpoint} did not answer within {self.timeout}s"
            ) from None
        except httpx.HTTPError as exc:
            raise SummarizerError(
                f"cannot reach the summarizer at {self._shown_endpoint}: {self._redact(str(exc))}"
            ) from None
        if response.status_code >= 400:
            raise SummarizerError(
                f"summarizer at {self._shown_endpoint} answered HTTP {response.status_code}: "
                f"{self._snippet(response.text)}",
                status=response.status_code,
            )
        return {"summary": self._fit(self._summary(response))}

    def _summary(self, response: httpx.Response) -> str:
        """The ``summary`` string of a chat-completions reply, repaired or rejected."""
        try:
            data = response.json()
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise SummarizerError(
                "summarizer reply is not a chat completion (no choices[0].message.content): "
                f"{self._snippet(response.text)}"
            ) from None
        if not isinstance(content, str):
            raise SummarizerError(f"summarizer reply content is {type(content).__name__}, not text")
        found = _first_object(content)
        if found is None:
            raise SummarizerError(f"summarizer reply holds no JSON object: {self._snippet(content)}")
        if "summary" not in found:
            raise SummarizerError(f"summarizer reply has no 'summary' field: {self._snippet(content)}")
        summary = found["summary"]
        if not isinstance(summary, str):
            raise SummarizerError(f"summarizer reply 'summary' is {type(summary).__name__}, not a string")
        summary = _UNSTORABLE.sub("\ufffd", summary).strip()
        if not summary:
            raise SummarizerError("summarizer reply 'summary' is empty")
        return summary

    def _fit(self, summary: str) -> str:
        """Hold the summary to `max_tokens` by dropping whole lines from its end, never a tag."""
        if self._estimator(summary) <= self.max_tokens:
            return summary
        trimmed = trim_summary(summary, lambda s: self._estimator(s) <= self.max_tokens)
        if not trimmed:
            raise SummarizerError(
                f"summarizer reply is {self._estimator(summary)} tokens, over max_tokens={self.max_tokens}, "
                "and no whole-line trim fits"
            )
        return trimmed

    def _redact(self, text: str) -> str:
        return scrub(text, self._secrets)

    def _snippet(self, text: str) -> str:
        text = self._redact(" ".join(text.split()))
        return repr(text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…")


def _dated(turn: Any) -> Any:
    """The turn as the model reads it: its ``ts`` (epoch seconds) becomes ``date`` (``8 May 2023``)."""
    if not isinstance(turn, Mapping) or "ts" not in turn:
        return turn
    shown = {k: v for k, v in turn.items() if k != "ts"}
    ts = turn["ts"]
    if isinstance(ts, int | float) and not isinstance(ts, bool) and (date := date_text(float(ts))):
        shown["date"] = date
    return shown


def _first_object(content: str) -> dict[str, Any] | None:
    """The first JSON object in `content`: bare, in a ```json fence, or inside prose."""
    candidates = [m.group(1) for m in _FENCE.finditer(content)]
    candidates.append(content)
    decoder = json.JSONDecoder()
    for text in candidates:
        start = text.find("{")
        for _ in range(_MAX_OBJECT_STARTS):
            if start < 0:
                break
            try:
                value, _end = decoder.raw_decode(text, start)
            except ValueError:
                start = text.find("{", start + 1)
                continue
            if isinstance(value, dict):
                return value
            start = text.find("{", start + 1)
    return None
