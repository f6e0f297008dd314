"""How far the default estimate (``len // 4 + 1``) is from a real tokenizer, and `token_counter` closing it.

Plays LoCoMo dialogues through ``recommended(budget)`` twice: with the default estimate, and with
``token_counter="cl100k_base"``; at the end of each dialogue session it counts the context with
cl100k. Prints JSON: per budget and configuration, the checkpoints over budget, the worst overshoot,
and the ratio of cl100k tokens to the estimate over the contexts.

    TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python -m bench.token_counter [dialogues]
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from bench import _locomo as locomo
from convmem.actors import MemorySystem, encoding_counter
from convmem.adapters import InMemoryEventLog, recommended
from convmem.events import MemoryKey
from convmem.projections import default_token_estimator, render


def main(dialogues: int = 3, budgets: tuple[int, ...] = (1000, 2000, 4000)) -> dict[str, Any]:
    folder = locomo.locomo_dir()
    if folder is None:
        return {"skipped": "no LoCoMo data"}
    cl100k = encoding_counter("cl100k_base")
    out: dict[str, Any] = {}
    for budget in budgets:
        for label, counter in (("estimate", None), ("cl100k_base", "cl100k_base")):
            over, worst, ratios, checkpoints = 0, 0, [], 0
            for path in sorted(folder.glob("*.json"))[:dialogues]:
                dialogue = locomo.load(path)
                setup = recommended(budget, token_counter=counter, worker_process=False)
                with MemorySystem(**setup, log=InMemoryEventLog()) as memory:
                    session = memory.session(MemoryKey("bench", "tokens", path.stem))
                    for part in locomo.sessions(dialogue):
                        for turn in locomo.turns(part, dialogue["speaker_a"]):
                            session.add_turn(turn, timeout=30)
                        session.flush(timeout=60)
                        text = render(session.get_llm_context()["conversation_memory"])
                        real = cl100k(text)
                        checkpoints += 1
                        over += real > budget
                        worst = max(worst, real - budget)
                        ratios.append(real / default_token_estimator(text))
            out[f"{budget}/{label}"] = {
                "checkpoints": checkpoints,
                "over_budget": over,
                "worst_overshoot_tokens": worst,
                "cl100k_per_estimate": {
                    "min": round(min(ratios), 3),
                    "median": round(statistics.median(ratios), 3),
                    "max": round(max(ratios), 3),
                },
            }
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3), indent=1))
