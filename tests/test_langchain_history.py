"""`ConvmemChatMessageHistory`: LangChain's chat history as a convmem session's log.

The rules run in process and through a real ``convmem serve`` process (the
`served` fixture of the Agents conformance tests); `RunnableWithMessageHistory`
drives a fake chat model from langchain-core.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from runtime_helpers import Harness, events_of, replay_log
from test_agents_conformance import in_process, served  # noqa: F401 (fixtures)

from convmem.adapters import ConvmemChatMessageHistory, ConvmemSession
from convmem.adapters.frontends.integrations.langchain import item_of, message_of
from convmem.errors import InvalidInput, InvalidTurn
from convmem.events import AgentsMemoryConfig, ItemsAdded, SessionCleared, ShortTermMemoryConfig

History = Callable[..., ConvmemChatMessageHistory]

# langchain-core 1.x marks RunnableWithMessageHistory deprecated (in favour of LangGraph) but ships
# and documents it; it is the integration point this history is built for.
USES_RUNNABLE_WITH_HISTORY = pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")


@pytest.fixture(params=["in_process", "remote"])
def history(request: pytest.FixtureRequest) -> History:
    """Builds histories of one backend; every test gets a tenant of its own."""
    memory = request.getfixturevalue("in_process" if request.param == "in_process" else "served")
    tenant = f"t-{uuid.uuid4().hex[:12]}"

    def build(session_id: str = "chat-1", **options: Any) -> ConvmemChatMessageHistory:
        return ConvmemChatMessageHistory(session_id, memory, tenant_id=tenant, user_id="alice", **options)

    return build


MESSAGES: list[BaseMessage] = [
    SystemMessage(content="Be brief."),
    HumanMessage(content=[{"type": "text", "text": "Weather in Oslo? ☂"}], id="h1"),
    AIMessage(
        content="",
        tool_calls=[{"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_1"}],
        usage_metadata={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
    ),
    ToolMessage(content="rain, 7°C", tool_call_id="call_1", name="get_weather"),
    AIMessage(content="Rain: take an umbrella.", response_metadata={"model": "fake"}),
    ChatMessage(role="user", content="thanks"),
]


def test_messages_read_back_equal_to_what_was_added(history: History) -> None:
    """Every kind of message, with ids, tool calls and metadata, reads back equal (sync and async)."""
    h = history()
    h.add_messages(MESSAGES[:3])
    asyncio.run(h.aadd_messages(MESSAGES[3:]))
    assert h.messages == MESSAGES
    assert asyncio.run(history().aget_messages()) == MESSAGES  # another instance, same session


def test_clear_empties_the_history_and_sessions_stay_apart(history: History) -> None:
    """clear (and aclear) leave no message; another session id keeps its own."""
    h, other = history("chat-1"), history("chat-2")
    h.add_user_message("mine")
    other.add_ai_message("theirs")
    h.clear()
    assert h.messages == []
    assert other.messages == [AIMessage(content="theirs")]
    other.add_messages([])
    asyncio.run(other.aclear())
    assert other.messages == []


def test_bad_messages_are_refused_by_name(history: History) -> None:
    """A non-message, or a lone message instead of a list, is an InvalidInput naming where."""
    h = history()
    with pytest.raises(InvalidTurn, match=r"messages\[1\]"):
        h.add_messages([HumanMessage(content="ok"), "not a message"])  # type: ignore[list-item]
    with pytest.raises(InvalidInput, match="messages"):
        h.add_messages(HumanMessage(content="lone"))  # type: ignore[arg-type]
    assert h.messages == []


def _chain(history: History, seen: list[list[str]]) -> RunnableWithMessageHistory:
    def record(prompt: Any) -> Any:
        seen.append([f"{m.type}: {m.content}" for m in prompt.to_messages()])
        return prompt

    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer briefly."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    model = FakeListChatModel(responses=["Hello Ada.", "You are Ada."])
    return RunnableWithMessageHistory(
        prompt | RunnableLambda(record) | model,
        lambda session_id: history(session_id),  # noqa: PLW0108 (it reads the parameter names)
        input_messages_key="question",
        history_messages_key="history",
    )


@USES_RUNNABLE_WITH_HISTORY
@pytest.mark.parametrize("asynchronous", [False, True], ids=["invoke", "ainvoke"])
def test_runnable_with_message_history_keeps_the_conversation(history: History, asynchronous: bool) -> None:
    """The second call's prompt holds the first exchange; the history holds both."""
    seen: list[list[str]] = []
    chain = _chain(history, seen)
    config: Any = {"configurable": {"session_id": "chat-9"}}
    for question in ("I am Ada.", "Who am I?"):
        if asynchronous:
            asyncio.run(chain.ainvoke({"question": question}, config=config))
        else:
            chain.invoke({"question": question}, config=config)
    assert seen[1] == ["system: Answer briefly.", "human: I am Ada.", "ai: Hello Ada.", "human: Who am I?"]
    assert [m.content for m in history("chat-9").messages] == [
        "I am Ada.",
        "Hello Ada.",
        "Who am I?",
        "You are Ada.",
    ]


def test_the_history_is_the_event_log(harness: Harness) -> None:
    """Each add is an ItemsAdded event; a clear is recorded and keeps the messages; replay equals live."""
    system = harness.system()
    h = ConvmemChatMessageHistory("chat-1", system, tenant_id="acme", user_id="alice")
    h.add_messages(MESSAGES[:2])
    h.add_messages(MESSAGES[2:])
    h.clear()
    key = h.key
    added = events_of(harness.log, key, ItemsAdded)
    assert [message_of(i.to_agents()) for event in added for i in event.items] == MESSAGES
    assert len(events_of(harness.log, key, SessionCleared)) == 1
    assert replay_log(harness.log, key) == system.session(key).snapshot_state()


def test_a_strategy_shapes_what_langchain_reads(harness: Harness) -> None:
    """With trimming, messages shows the last user turns; the log still holds every message."""
    system = harness.system()
    config = ShortTermMemoryConfig(
        agents=AgentsMemoryConfig(strategy="trimming", max_turns=2, keep_last_n_turns=1)
    )
    h = ConvmemChatMessageHistory("chat-1", system, tenant_id="acme", user_id="alice", config=config)
    for n in range(3):
        h.add_messages([HumanMessage(content=f"q{n}"), AIMessage(content=f"a{n}")])
    assert h.messages == [HumanMessage(content="q2"), AIMessage(content="a2")]
    assert sum(len(e.items) for e in events_of(harness.log, h.key, ItemsAdded)) == 6


def test_items_an_agents_session_stored_read_as_messages(harness: Harness) -> None:
    """Agents items under the same key read as LangChain messages; reasoning is left out."""
    system = harness.system()
    items = [
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": ""},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Rain."}]},
    ]
    asyncio.run(ConvmemSession("chat-1", system, tenant_id="acme", user_id="alice").add_items(items))
    h = ConvmemChatMessageHistory("chat-1", system, tenant_id="acme", user_id="alice")
    assert h.messages == [
        HumanMessage(content="Weather?"),
        AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {}, "id": "c1"}]),
        ToolMessage(content="rain", tool_call_id="c1"),
        AIMessage(content="Rain."),
    ]


def test_a_message_is_one_item_convmem_can_read() -> None:
    """Chat roles become message items with their text; other messages are kept verbatim."""
    item = item_of(HumanMessage(content="hi", id="h"))
    assert (item["role"], item["content"]) == ("user", "hi")
    assert item_of(ToolMessage(content="r", tool_call_id="c"))["type"] == "langchain"
    with pytest.raises(InvalidTurn, match="langchain"):
        message_of({"role": "user", "content": "x", "langchain": {"type": "human"}})


def test_convmem_imports_without_langchain() -> None:
    """convmem.adapters does not load langchain-core; the history without it names the extra."""
    code = (
        "import sys\n"
        "import convmem.adapters\n"
        "assert 'langchain_core' not in sys.modules, 'langchain-core was imported eagerly'\n"
        "sys.modules['langchain_core'] = None\n"
        "sys.modules['langchain_core.chat_history'] = None\n"
        "try:\n"
        "    convmem.adapters.ConvmemChatMessageHistory\n"
        "except ImportError as exc:\n"
        "    assert 'convmem[langchain]' in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
