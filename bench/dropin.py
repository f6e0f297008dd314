"""9. The PenguiFlow drop-in beside PenguiFlow's own class: `get_llm_context` and `add_turn`.

Both are PenguiFlow's API, awaited on one event loop, as ReactPlanner calls
them: `convmem.penguiflow.DefaultShortTermMemory` on its process-wide system
(the embedded default: a private nats-server, fsync before every
acknowledgement, in a temporary folder) and `penguiflow.planner.memory.
DefaultShortTermMemory` (a list in the process). Context: ``truncation``
with ``full_zone_turns = N`` and a budget far above the window, as in
measure 3. add_turn: ``truncation`` with a window of 5 (PenguiFlow then
re-renders and measures 5 turns per call; convmem appends one durable
event). Best time per call over interleaved rounds.
"""

from __future__ import annotations

import asyncio
import tempfile

from penguiflow.planner import memory as pf

import convmem.penguiflow
from bench._common import Figure, Result, Sizes, Target, async_batch, compare, sample_turn

__all__ = ["run"]

_BIG_BUDGET = 100_000_000


def _config(window: int) -> pf.ShortTermMemoryConfig:
    return pf.ShortTermMemoryConfig(
        strategy="truncation", budget=pf.MemoryBudget(full_zone_turns=window, total_max_tokens=_BIG_BUDGET)
    )


def _turn(n: int) -> pf.ConversationTurn:
    turn = sample_turn(n)
    return pf.ConversationTurn(user_message=turn.user_message, assistant_response=turn.assistant_response)


def _adder(memory: object, start: int) -> object:
    counter = iter(range(start, 10**12))

    async def add() -> None:
        await memory.add_turn(_turn(next(counter)))  # type: ignore[attr-defined]

    return add


def run(sizes: Sizes) -> Result:
    result = Result()
    rounds = 3 if sizes.smoke else 7
    with tempfile.TemporaryDirectory(prefix="convmem-bench-dropin-") as data:
        convmem.penguiflow.configure(data_dir=data)
        loop = asyncio.new_event_loop()
        try:
            for window in sizes.ctx_windows:
                ours = convmem.penguiflow.DefaultShortTermMemory(config=_config(window))
                theirs = pf.DefaultShortTermMemory(config=_config(window))

                async def fill(ours: object = ours, theirs: object = theirs, window: int = window) -> None:
                    for n in range(window):
                        await ours.add_turn(_turn(n))  # type: ignore[attr-defined]
                        await theirs.add_turn(_turn(n))  # type: ignore[attr-defined]

                loop.run_until_complete(fill())
                shown = loop.run_until_complete(ours.get_llm_context())
                if shown != loop.run_until_complete(theirs.get_llm_context()):
                    raise AssertionError(f"the two memories show different contexts at {window} turns")
                best = compare(
                    {
                        "penguiflow": async_batch(loop, theirs.get_llm_context),
                        "dropin": async_batch(loop, ours.get_llm_context),
                    },
                    seconds=sizes.ctx_seconds,
                    rounds=rounds,
                )
                result.add(
                    Figure(
                        f"drop-in get_llm_context @ {window} turns",
                        best["dropin"] * 1e6,
                        "us/call",
                        reference=best["penguiflow"] * 1e6,
                        reference_label="PenguiFlow DefaultShortTermMemory.get_llm_context",
                        ratio_is="reference/value",
                        target={
                            min(sizes.ctx_windows): Target("ratio", ">=", 1.0),
                            max(sizes.ctx_windows): Target("ratio", ">=", 10.0),
                        }.get(window),
                    )
                )
            ours = convmem.penguiflow.DefaultShortTermMemory(config=_config(5))
            theirs = pf.DefaultShortTermMemory(config=_config(5))
            best = compare(
                {
                    "penguiflow": async_batch(loop, _adder(theirs, 0)),  # type: ignore[arg-type]
                    "dropin": async_batch(loop, _adder(ours, 0)),  # type: ignore[arg-type]
                },
                seconds=sizes.ctx_seconds,
                rounds=rounds,
            )
            result.add(
                Figure(
                    "drop-in add_turn (durable, embedded server, fsync) @ window 5",
                    best["dropin"] * 1e6,
                    "us/call",
                    reference=best["penguiflow"] * 1e6,
                    reference_label="PenguiFlow DefaultShortTermMemory.add_turn (in process, not durable)",
                    ratio_is="reference/value",
                )
            )
        finally:
            loop.close()
            convmem.penguiflow.close()
            convmem.penguiflow.configure()
    result.notes.append(
        "ratio = PenguiFlow time / drop-in time (> 1: the drop-in is faster); both awaited on one loop; "
        "the drop-in's add_turn returns after the embedded server fsynced the event"
    )
    return result
