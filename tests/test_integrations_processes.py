"""Framework sessions across real processes: what one planner process stored, a fresh one reads back.

Each scenario runs `tests/integrations_worker.py` as separate processes on
one nats-server, with the memory in the planner's process (a JetStream log)
or behind a real ``convmem serve`` process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_serve import Serve

from convmem.actors import load_state
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend
from convmem.events import MemoryKey

pytestmark = pytest.mark.slow  # ~15 s a case: fresh interpreters importing the SDKs (`.ci/run` runs them)

WORKER = Path(__file__).resolve().parent / "integrations_worker.py"
WAIT = 120.0


@pytest.fixture(params=["in_process", "remote"])
def mode(request: pytest.FixtureRequest, nats_server: EmbeddedNatsServer, tmp_path: Path) -> Iterator[str]:
    """Where the memory lives; for ``remote``, a `convmem serve` process answers."""
    if request.param == "remote":
        serve = Serve(nats_server.url, tmp_path)
        try:
            yield "remote"
        finally:
            serve.stop()
    else:
        yield "in_process"


def worker(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(WORKER), *args], capture_output=True, text=True, timeout=WAIT, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_fresh_process_reads_back_a_runners_items_byte_equal(
    mode: str, nats_server: EmbeddedNatsServer
) -> None:
    """Three Runner.run turns with a handoff, written by one process, read back byte-equal by another."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    written = worker("agents-write", mode, nats_server.url, tenant)
    read = worker("agents-read", mode, nats_server.url, tenant)
    assert read == written
    items = json.loads(read)
    handoff = [i for i in items if i.get("type") == "function_call" and i["name"] == "transfer_to_billing"]
    assert [h["arguments"] for h in handoff] == [""]
    assert [i["content"] for i in items if i.get("role") == "user"] == [
        "I have a billing question",
        "What is my May invoice?",
        "What did I ask?",
    ]
    with JetStreamBackend.connect(nats_server.url) as backend:  # the log holds exactly those items
        state, _ = load_state(backend.log, None, MemoryKey(tenant, "alice", "chat-1"))
    stored = [item for record in state.turns for item in record.turn.agent_items()]
    assert json.dumps(stored) == written


def test_a_langchain_history_carries_across_processes(mode: str, nats_server: EmbeddedNatsServer) -> None:
    """RunnableWithMessageHistory in a second process shows the model the first process's exchange."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    first = json.loads(worker("langchain-turn", mode, nats_server.url, tenant, "My name is Ada."))
    second = json.loads(worker("langchain-turn", mode, nats_server.url, tenant, "What is my name?"))
    assert first["prompt"] == ["system: Answer briefly.", "human: My name is Ada."]
    assert second["prompt"] == [
        "system: Answer briefly.",
        "human: My name is Ada.",
        "ai: Noted: My name is Ada.",
        "human: What is my name?",
    ]
    assert second["answer"] == "Noted: What is my name?"
