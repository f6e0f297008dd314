"""3. `get_llm_context` latency against PenguiFlow's `DefaultShortTermMemory`.

Both hold the same N turns in their window: ``strategy="truncation"`` with
``full_zone_turns=N`` and a total budget far above the turns' size, so the
whole window is shown and no budget cuts it. PenguiFlow's memory is awaited
in an event loop (its method is a coroutine behind an asyncio lock); convmem
is measured through the blocking `SessionHandle` (the API a threaded planner
uses), the awaitable `AsyncSessionHandle`, and the pure `llm_context(state)`
function the handles call. Each figure is the best time per call over a few
rounds, the rounds of all of them interleaved. `estimate_tokens` is measured
beside it: PenguiFlow re-serialises the
whole payload for it, convmem adds up per-turn lengths kept in the state.

When the handle misses its target at the largest window, the handle's calls
are profiled with pyinstrument and the profile is written beside the JSON.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path

from penguiflow.planner import memory as pf

from bench._common import Figure, Result, Sizes, Target, async_batch, compare, sample_turn, sync_batch
from convmem.actors import MemorySystem, SessionHandle
from convmem.adapters import InMemoryEventLog
from convmem.events import ConversationTurn, MemoryBudget, MemoryKey, ShortTermMemoryConfig
from convmem.projections import estimate_tokens, llm_context

__all__ = ["run"]

_BIG_BUDGET = 100_000_000


def _penguiflow(window: int, turns: list[ConversationTurn]) -> pf.DefaultShortTermMemory:
    config = pf.ShortTermMemoryConfig(
        strategy="truncation",
        budget=pf.MemoryBudget(full_zone_turns=window, total_max_tokens=_BIG_BUDGET),
    )
    memory = pf.DefaultShortTermMemory(config=config)

    async def fill() -> None:
        for turn in turns:
            await memory.add_turn(
                pf.ConversationTurn(
                    user_message=turn.user_message, assistant_response=turn.assistant_response
                )
            )

    asyncio.run(fill())
    return memory


def _convmem(system: MemorySystem, window: int, turns: list[ConversationTurn]) -> SessionHandle:
    config = ShortTermMemoryConfig(
        strategy="truncation", budget=MemoryBudget(full_zone_turns=window, total_max_tokens=_BIG_BUDGET)
    )
    handle = system.session(MemoryKey("bench", "ctx", f"window-{window}"), config=config)
    for turn in turns:
        handle.add_turn(turn, timeout=30)
    return handle


def _profile(handle: SessionHandle, window: int, sizes: Sizes, result: Result) -> None:
    try:
        from pyinstrument import Profiler  # noqa: PLC0415 (optional: only needed when a target is missed)
    except ImportError:
        result.notes.append("pyinstrument is not installed: no profile taken (pip install pyinstrument)")
        return
    profiler = Profiler(interval=0.0001)
    profiler.start()
    deadline = time.perf_counter() + (0.2 if sizes.smoke else 2.0)
    while time.perf_counter() < deadline:
        handle.get_llm_context()
    profiler.stop()
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    out = Path(sizes.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"profile-context-{window}.txt"
    path.write_text(text, encoding="utf-8")
    result.details[f"profile_{window}"] = {"file": str(path), "top": text.splitlines()[:40]}


def run(sizes: Sizes) -> Result:
    result = Result()
    seconds = sizes.ctx_seconds
    with MemorySystem(ShortTermMemoryConfig(strategy="truncation"), log=InMemoryEventLog()) as system:
        for window in sizes.ctx_windows:
            turns = [sample_turn(n) for n in range(window)]
            reference = _penguiflow(window, turns)
            handle = _convmem(system, window, turns)
            state = handle.snapshot_state()
            aio = handle.aio
            ours = handle.get_llm_context()["conversation_memory"]["recent_turns"]
            theirs = asyncio.run(reference.get_llm_context())["conversation_memory"]["recent_turns"]
            if ours != theirs:
                raise AssertionError(f"the two memories show different windows at {window} turns")

            loop = asyncio.new_event_loop()
            try:
                best = compare(
                    {
                        "penguiflow": async_batch(loop, reference.get_llm_context),
                        "handle": sync_batch(handle.get_llm_context),
                        "aio": async_batch(loop, aio.get_llm_context),
                        "pure": sync_batch(partial(llm_context, state)),
                        "penguiflow_tokens": sync_batch(reference.estimate_tokens),
                        "tokens": sync_batch(handle.estimate_tokens),
                        "pure_tokens": sync_batch(partial(estimate_tokens, state)),
                    },
                    seconds=seconds,
                    rounds=3 if sizes.smoke else 7,
                )
            finally:
                loop.close()
            ref_s, handle_s, aio_s, pure_s = best["penguiflow"], best["handle"], best["aio"], best["pure"]
            ref_tokens_s, tokens_s, pure_tokens_s = (
                best["penguiflow_tokens"],
                best["tokens"],
                best["pure_tokens"],
            )
            # The targets: no slower with the fewest turns, 10x faster with the most (5 and 500).
            speedup = {
                min(sizes.ctx_windows): Target("ratio", ">=", 1.0),
                max(sizes.ctx_windows): Target("ratio", ">=", 10.0),
            }.get(window)
            for label, value, target in (
                ("SessionHandle.get_llm_context", handle_s, speedup),
                ("AsyncSessionHandle.get_llm_context", aio_s, speedup),
                ("llm_context(state), pure", pure_s, None),
            ):
                result.add(
                    Figure(
                        f"{label} @ {window} turns",
                        value * 1e6,
                        "us/call",
                        reference=ref_s * 1e6,
                        reference_label="PenguiFlow DefaultShortTermMemory.get_llm_context (awaited)",
                        ratio_is="reference/value",
                        target=target,
                    )
                )
            for label, value in (
                ("SessionHandle.estimate_tokens", tokens_s),
                ("estimate_tokens(state), pure", pure_tokens_s),
            ):
                result.add(
                    Figure(
                        f"{label} @ {window} turns",
                        value * 1e6,
                        "us/call",
                        reference=ref_tokens_s * 1e6,
                        reference_label="PenguiFlow DefaultShortTermMemory.estimate_tokens",
                        ratio_is="reference/value",
                    )
                )
            missed = any(f.met is False for f in result.figures if f.name.endswith(f"@ {window} turns"))
            if missed and sizes.profile and window == max(sizes.ctx_windows):
                _profile(handle, window, sizes, result)
    result.notes.append(
        "ratio = PenguiFlow time / convmem time (a speed-up: > 1 is faster); strategy truncation, "
        "full_zone_turns = N, budget far above the window so nothing is cut; best of 7 interleaved rounds"
    )
    return result
