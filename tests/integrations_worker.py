"""A planner process for the cross-process integration tests (run by tests, never collected).

    python tests/integrations_worker.py COMMAND MODE URL TENANT [TEXT]

MODE ``in_process`` opens a `MemorySystem` on the JetStream log at URL;
``remote`` connects to the convmem service there. Commands (output: JSON on
stdout):

* ``agents-write``: three `Runner.run` calls of a scripted triage agent that
  hands off to a billing agent (a handoff call with empty arguments) on the
  session ``chat-1``; prints every item the SDK gave `add_items`, as given.
* ``agents-read``: prints the items of session ``chat-1`` as `get_items` returns them.
* ``langchain-turn``: one `RunnableWithMessageHistory` call with TEXT on
  session ``chat-1`` and a fake chat model; prints the messages the model saw
  and its answer.
"""

from __future__ import annotations

import asyncio
import json
import sys
from contextlib import AbstractContextManager
from typing import Any

import convmem
from convmem.adapters import ConvmemSession

USER = "alice"


def open_memory(mode: str, url: str) -> AbstractContextManager[Any]:
    if mode == "in_process":
        return convmem.connect(url)
    if mode == "remote":
        return convmem.connect_remote(url, timeout=30.0)
    raise SystemExit(f"unknown mode {mode!r}: in_process or remote")


class RecordingSession(ConvmemSession):
    """Keeps the JSON of every item exactly as the SDK handed it to `add_items`."""

    written: list[str]

    async def add_items(self, items: list[Any]) -> None:
        self.written.extend(json.dumps(item) for item in items)
        await super().add_items(items)


def agents_write(memory: Any, tenant: str) -> str:
    from agents import Agent, RunConfig, Runner, function_tool  # noqa: PLC0415
    from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: PLC0415

    model = ScriptedModel(
        [
            [function_call("transfer_to_billing", "", call_id="call_handoff")],
            [assistant_message("Billing here: what can I do?", item_id="msg_1")],
            [function_call("lookup_invoice", '{"month": "May"}', call_id="call_lookup")],
            [assistant_message("Your May invoice is $42.", item_id="msg_2")],
            [assistant_message("You asked about your May invoice.", item_id="msg_3")],
        ]
    )

    @function_tool
    def lookup_invoice(month: str) -> str:
        """The invoice of a month."""
        return f"{month}: $42"

    billing = Agent(name="billing", instructions="Bill.", model=model, tools=[lookup_invoice])
    triage = Agent(name="triage", instructions="Route.", model=model, handoffs=[billing])
    session = RecordingSession("chat-1", memory, tenant_id=tenant, user_id=USER)
    session.written = []
    config = RunConfig(tracing_disabled=True)

    async def turns() -> None:
        agent: Agent[Any] = triage
        for text in ("I have a billing question", "What is my May invoice?", "What did I ask?"):
            result = await Runner.run(agent, text, session=session, run_config=config)
            agent = result.last_agent

    asyncio.run(turns())
    return "[" + ", ".join(session.written) + "]"


def agents_read(memory: Any, tenant: str) -> str:
    session = ConvmemSession("chat-1", memory, tenant_id=tenant, user_id=USER)
    return json.dumps(asyncio.run(session.get_items()))


def langchain_turn(memory: Any, tenant: str, text: str) -> str:
    from langchain_core.language_models.fake_chat_models import FakeListChatModel  # noqa: PLC0415
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder  # noqa: PLC0415
    from langchain_core.runnables import RunnableLambda  # noqa: PLC0415
    from langchain_core.runnables.history import RunnableWithMessageHistory  # noqa: PLC0415

    from convmem.adapters import ConvmemChatMessageHistory  # noqa: PLC0415

    seen: list[list[str]] = []

    def record(prompt: Any) -> Any:
        seen.append([f"{m.type}: {m.content}" for m in prompt.to_messages()])
        return prompt

    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer briefly."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    model = FakeListChatModel(responses=[f"Noted: {text}"])
    chain = RunnableWithMessageHistory(
        prompt | RunnableLambda(record) | model,
        lambda session_id: ConvmemChatMessageHistory(session_id, memory, tenant_id=tenant, user_id=USER),
        input_messages_key="question",
        history_messages_key="history",
    )
    answer = chain.invoke({"question": text}, config={"configurable": {"session_id": "chat-1"}})
    return json.dumps({"prompt": seen[-1], "answer": answer.content})


def main(argv: list[str]) -> int:
    command, mode, url, tenant, *rest = argv
    with open_memory(mode, url) as memory:
        if command == "agents-write":
            out = agents_write(memory, tenant)
        elif command == "agents-read":
            out = agents_read(memory, tenant)
        elif command == "langchain-turn":
            out = langchain_turn(memory, tenant, rest[0])
        else:
            raise SystemExit(f"unknown command {command!r}")
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
