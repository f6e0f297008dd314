"""The issue's end-to-end check, with real processes: PenguiFlow's ReactPlanner on the embedded default.

A first process installs the drop-in, runs a 20-turn conversation through a
ReactPlanner (scripted LLM, rolling summary by the planner's own summarizer)
and exits; a second process with a new planner on the same key sees the same
memory in its first prompt; then `convmem verify` audits the log. Each process
finds its log only through CONVMEM_DATA_DIR (a temporary folder): no setup.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

TIMEOUT = 120.0
"""Seconds a process may take before the test fails (a hang, not a timing check)."""

PLANNER = textwrap.dedent(
    """
    import asyncio, json, os, sys

    import convmem.penguiflow
    convmem.penguiflow.install()  # the one line a PenguiFlow user adds

    from penguiflow.planner import ReactPlanner
    from penguiflow.planner.memory import MemoryBudget, MemoryKey, ShortTermMemoryConfig
    from penguiflow.state import InMemoryStateStore

    OPEN, CLOSE = "<read_only_conversation_memory_json>", "</read_only_conversation_memory_json>"


    class ScriptedLLM:
        def __init__(self):
            self.memories = []
            self.summaries = 0

        async def complete(self, *, messages, response_format=None, **_):
            schema = ((response_format or {}).get("json_schema") or {}).get("name")
            if schema == "short_term_memory_summary":
                self.summaries += 1
                said = [m["content"] for m in messages if m.get("role") == "user"]
                facts = sorted(set(part for text in said for part in text.split('"') if "number is" in part))
                return json.dumps({"summary": "<session_summary>" + "; ".join(facts) + "</session_summary>"})
            memory = None
            for message in messages:
                content = message.get("content") or ""
                if message.get("role") == "system" and OPEN in content:
                    memory = json.loads(content[content.index(OPEN) + len(OPEN):content.index(CLOSE)])
            self.memories.append(memory)
            query = next(json.loads(m["content"])["query"] for m in messages if m.get("role") == "user")
            answer = {"raw_answer": "Noted: " + query}
            return json.dumps({"thought": "finish", "next_node": None, "args": answer})


    CONFIG = ShortTermMemoryConfig(
        strategy="rolling_summary", budget=MemoryBudget(full_zone_turns=4), retry_backoff_base_s=0.1
    )
    KEY = MemoryKey(tenant_id="acme", user_id="alice@example.com", session_id="chat-1")


    class FileStore(InMemoryStateStore):
        # A durable state store: the memory states outlive the process (the store decides what exists).

        def __init__(self, path):
            super().__init__()
            self.path = path

        def _states(self):
            if not os.path.exists(self.path):
                return {}
            with open(self.path, encoding="utf-8") as file:
                return json.load(file)

        async def save_memory_state(self, key, state):
            states = self._states()
            states[key] = state
            with open(self.path, "w", encoding="utf-8") as file:
                json.dump(states, file)

        async def load_memory_state(self, key):
            return self._states().get(key)


    async def main(turns):
        llm = ScriptedLLM()
        store = FileStore(sys.argv[2])
        planner = ReactPlanner(llm_client=llm, catalog=[], short_term_memory=CONFIG, state_store=store)
        for n in range(turns):
            await planner.run(f"Turn {n}: my number is {n}.", memory_key=KEY)
        memory = planner._memory_by_key[KEY.composite()]
        await memory.flush()
        final = (await memory.get_llm_context())["conversation_memory"]
        print(json.dumps({
            "first_prompt_memory": llm.memories[0],
            "final": final,
            "summaries": llm.summaries,
            "class": type(memory).__module__ + "." + type(memory).__name__,
        }))


    asyncio.run(main(int(sys.argv[1])))
    """
)


VERIFY = "import sys; from convmem.adapters.frontends.cli import main; sys.exit(main(sys.argv[1:]))"
"""The `convmem` command, run by this interpreter."""


def run_planner(data: Path, turns: int) -> dict[str, Any]:
    env = {**os.environ, "CONVMEM_DATA_DIR": str(data)}
    env.pop("CONVMEM_NATS_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", PLANNER, str(turns), str(data.parent / "memory-states.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow  # ~20 s: two fresh interpreters importing PenguiFlow (`.ci/run` runs it)
def test_a_20_turn_conversation_survives_the_process_and_verifies(tmp_path: Path) -> None:
    """Process 1 talks 20 turns; process 2 on the same key sees the same memory; convmem verify passes."""
    data = tmp_path / "convmem-data"
    first = run_planner(data, 20)
    assert (
        first["class"] == "convmem.adapters.frontends.integrations.penguiflow._memory.DefaultShortTermMemory"
    )
    assert first["first_prompt_memory"] == {"recent_turns": []}
    final = first["final"]
    recent = [t["user"] for t in final["recent_turns"]]
    assert recent == [f"Turn {n}: my number is {n}." for n in range(16, 20)]
    assert "pending_turns" not in final
    assert "my number is 15" in final["summary"]  # made by the planner's own (scripted) LLM
    assert first["summaries"] >= 1

    second = run_planner(data, 1)
    assert (
        second["first_prompt_memory"] == final
    )  # a new process, a new planner, the same store: the same memory

    audit = subprocess.run(
        [sys.executable, "-c", VERIFY, "--data-dir", str(data), "verify", "--all", "--json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert audit.returncode == 0, audit.stdout + audit.stderr
    report = json.loads(audit.stdout)
    assert report["failed"] == 0
    (check,) = report["checks"]  # one session: the planner's key (no private session was needed)
    assert (check["key"], check["ok"], check["turns"]) == ("acme:alice@example.com:chat-1", True, 21)
