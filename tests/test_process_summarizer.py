"""`ProcessSummarizer`: a CPU-bound summarizer in a warm child process, killed and replaced past its limit."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime_helpers import WAIT, key, summarizing_config, turn, wait_until

from convmem.actors import MemorySystem
from convmem.adapters import ExtractiveSummarizer, InMemoryEventLog, ProcessSummarizer
from convmem.errors import InvalidConfig, SummarizerError

SCRIPTED = "summarizer_targets:Scripted"


@pytest.fixture(autouse=True)
def _targets_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The children import the test helpers from this folder."""
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))


@pytest.fixture
def scripted() -> Iterator[ProcessSummarizer]:
    with ProcessSummarizer(SCRIPTED, timeout=WAIT, prefix="said: ") as summarizer:
        yield summarizer


def ask(summarizer: ProcessSummarizer, said: str) -> str:
    reply = summarizer({"previous_summary": "", "turns": [{"user": said, "assistant": "ok"}]})
    return str(reply["summary"])


def test_it_answers_from_a_child_built_before_the_first_call(scripted: ProcessSummarizer) -> None:
    """The child is running once the constructor returns; calls are answered there, not in this process."""
    child = scripted.pid
    assert child is not None
    assert child != os.getpid()
    assert ask(scripted, "hello") == f"said: hello (pid {child})"
    assert ask(scripted, "print") == f"said: print (pid {child})"  # a print cannot break the pipe
    assert scripted.restarts == 0


def test_the_extractive_summarizer_gives_the_same_bytes_in_its_process() -> None:
    """A rolling sequence of calls gives byte-equal summaries in the child and in this process."""
    local = ExtractiveSummarizer(max_tokens=300)
    with ProcessSummarizer(
        "convmem.adapters.backends.summarizers:ExtractiveSummarizer", max_tokens=300
    ) as apart:
        ours = theirs = ""
        for n in range(12):
            turns = [
                {"user": f"I moved to Lyon in {2000 + n} and adopted cat number {n}.", "assistant": "Noted."}
            ]
            ours = local({"previous_summary": ours, "turns": turns})["summary"]
            theirs = apart({"previous_summary": theirs, "turns": turns})["summary"]
            assert theirs == ours


def test_a_call_past_its_limit_kills_the_child_and_the_next_call_gets_a_fresh_one() -> None:
    """The hung child is killed (not left running); a new one, warmed, answers the next call."""
    with ProcessSummarizer(SCRIPTED, timeout=0.5) as summarizer:
        first = summarizer.pid
        assert first is not None
        with pytest.raises(SummarizerError, match=r"did not answer within 0\.5s"):
            ask(summarizer, "hang")
        assert summarizer.restarts == 1
        assert summarizer.pid not in (None, first)
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)  # gone: killed and reaped
        assert ask(summarizer, "again").startswith("again (pid ")


def test_a_child_that_died_is_replaced_on_the_next_call(scripted: ProcessSummarizer) -> None:
    """Killed from outside, the child is started again before the next call, which it answers."""
    first = scripted.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    assert ask(scripted, "after").startswith("said: after (pid ")
    assert scripted.pid != first


def test_a_summarizer_error_in_the_child_is_a_summarizer_error_here(scripted: ProcessSummarizer) -> None:
    """The child's exception comes back by name; the child lives on."""
    child = scripted.pid
    with pytest.raises(SummarizerError, match="RuntimeError: the summarizer failed on purpose"):
        ask(scripted, "boom")
    assert scripted.pid == child
    assert ask(scripted, "fine").startswith("said: fine")


@pytest.mark.parametrize(
    ("target", "kwargs", "field"),
    [
        ("no_colon", {}, "target"),
        ("summarizer_targets:broken", {}, "target"),
        ("summarizer_targets:Missing", {}, "target"),
        (SCRIPTED, {"prefix": object()}, "kwargs"),
    ],
)
def test_a_summarizer_that_cannot_be_built_is_invalid_config(target: str, kwargs: dict, field: str) -> None:
    """A bad import path, a factory that raises, or kwargs that cannot travel: InvalidConfig naming it."""
    with pytest.raises(InvalidConfig) as raised:
        ProcessSummarizer(target, **kwargs)
    assert raised.value.field == field


def test_a_session_summarizes_through_the_child() -> None:
    """Plugged into a MemorySystem like any summarizer: the summary the child made is stored."""
    with ProcessSummarizer(SCRIPTED, timeout=WAIT, prefix="<session_summary>\n") as summarizer:
        config = summarizing_config(full_zone_turns=1)
        with MemorySystem(config, log=InMemoryEventLog(), summarizer=summarizer) as memory:
            session = memory.session(key("apart"))
            for n in range(3):
                session.add_turn(turn(f"t{n}"), timeout=WAIT)
            session.flush(timeout=WAIT)
            wait_until(lambda: "(pid " in session.get_llm_context()["conversation_memory"]["summary"])


def _ended(pid: int) -> bool:
    """The process is gone, or a zombie waiting for whoever adopted it to reap it."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in status)
    except FileNotFoundError:
        return True


def test_the_child_ends_when_its_parent_process_dies() -> None:
    """A parent killed without closing it leaves no summarizer process behind (its pipe closes)."""
    program = (
        "import os, sys\n"
        "from convmem.adapters import ProcessSummarizer\n"
        f"s = ProcessSummarizer({SCRIPTED!r})\n"
        "print(s.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    command = [sys.executable, "-c", program]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=WAIT * 4)
    assert done.returncode == 0, done.stderr
    child = int(done.stdout.split()[0])
    wait_until(lambda: _ended(child), message=f"summarizer process {child} outlived its parent")


def test_a_lazy_one_starts_its_child_on_the_first_call() -> None:
    """With start=False nothing runs until a summary is asked for; then one child, not a restart."""
    with ProcessSummarizer(SCRIPTED, start=False, timeout=WAIT) as summarizer:
        assert summarizer.pid is None
        assert ask(summarizer, "first").startswith("first (pid ")
        assert summarizer.pid is not None
        assert summarizer.restarts == 0


def test_one_never_closed_stops_its_child_when_collected() -> None:
    """Dropped without close() (inside a reference cycle, say), its child is killed and its pipes closed."""
    summarizer = ProcessSummarizer(SCRIPTED, timeout=WAIT)
    child = summarizer.pid
    assert child is not None
    cycle: list[object] = [summarizer]
    cycle.append(cycle)
    del summarizer, cycle
    gc.collect()  # warnings are errors here: an unclosed pipe or a running Popen would fail the test
    assert _ended(child)
