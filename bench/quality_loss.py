"""Where `recommended()` loses grounded recall against the ceiling on LoCoMo, per category and cause.

Plays every LoCoMo dialogue as the `quality` measure does (the pure core, the summarizer called
when a summary is due), with ``recommended(budget, worker_process=False)`` at each budget. At each
checkpoint, every question asked so far that the ceiling (the whole history as dated turns)
grounds and the configuration's context does not is counted under the first cause that fits,
read part by part of the answer (`bench._grounding`):

* ``not in the context``: some content word of a part is nowhere in the context;
* ``words scattered``: every word is there, but no one unit (line or sentence) holds them all;
* ``held, not beside the question``: a unit holds the part, but neither it nor the unit before it
  shares a word with the question (mostly another statement that happens to hold the words; or
  the fact's sentence without the sibling sentence, or the question before it, that named the
  subject);
* ``held and related, not attributed``: such a unit relates to the question but neither names
  the person asked about nor is their line.

Beside each count, the share of those whose grounding unit in the ceiling relates to the question
only through the unit before it (the other speaker's question, as a rule). Shares of the ceiling's
grounded questions, summed over checkpoints (every checkpoint weighs by its questions, unlike
`quality`'s mean of per-checkpoint shares).

    CONVMEM_LOCOMO=../shared/data/locomo python -m bench.quality_loss [1000,2000,4000]

Prints JSON. Nothing here knows a dialogue, its names or its questions beyond what `quality` reads.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

from bench import _locomo as locomo
from bench import quality
from bench._grounding import Grounding, Question, Unit, index_of
from convmem.adapters import recommended
from convmem.events import MemoryKey

CAUSES = (
    "not in the context",
    "words scattered",
    "held, not beside the question",
    "held and related, not attributed",
)


def _relates(unit: Unit, question: Question) -> bool:
    return bool(unit.stems & question.relate or unit.before & question.relate)


def _cause(
    grounding: Grounding, question: Question, units: list[Unit], index: dict[str, set[int]], words: set[str]
) -> str:
    """The first cause (`CAUSES`) that fits the first part of the answer the context does not ground."""
    for part in question.parts:
        if not part <= words:
            return CAUSES[0]
        holding = set.intersection(*(index.get(w, set()) for w in part))
        if not holding:
            return CAUSES[1]
        related = [i for i in holding if _relates(units[i], question)]
        if not related:
            return CAUSES[2]
        if question.named and not any(
            grounding.attributed(units[i], p) for i in related for p in question.named
        ):
            return CAUSES[3]
    raise AssertionError("every part is grounded: not a loss")


def _leans_on_before(
    grounding: Grounding, question: Question, units: list[Unit], index: dict[str, set[int]]
) -> bool:
    """The ceiling grounds some part only through the unit before its own (it shares no question word)."""
    for part in question.parts:
        holding = set.intersection(*(index.get(w, set()) for w in part))
        found = [
            i
            for i in holding
            if _relates(units[i], question)
            and (not question.named or any(grounding.attributed(units[i], p) for p in question.named))
        ]
        if found and not any(units[i].stems & question.relate for i in found):
            return True
    return False


def main(budgets: tuple[int, ...] = (1000, 2000, 4000)) -> dict[str, Any]:
    folder = locomo.locomo_dir()
    if folder is None:
        raise SystemExit("no LoCoMo data (set CONVMEM_LOCOMO)")
    counts: dict[tuple[int, str], Counter[str]] = {}
    for path in sorted(folder.glob("*.json")):
        dialogue = locomo.load(path)
        items, _ = locomo.qa_items(dialogue)
        user, assistant = str(dialogue["speaker_a"]), str(dialogue["speaker_b"])
        grounding = Grounding((user, assistant), {"user": user, "assistant": assistant})
        asked_all = [(item, grounding.question(item.question, item.answer)) for item in items]
        games = []
        for budget in budgets:
            setup = recommended(total_tokens=budget, worker_process=False)
            player = quality._Player(quality.RECOMMENDED, setup.config, setup.summarizer)
            games.append(
                (budget, quality._Game(player, MemoryKey("locomo", path.stem, "whole"), quality._Tally()))
            )
        played = []
        for session in locomo.sessions(dialogue):
            turns = locomo.turns(session, user)
            for turn in turns:
                for _, game in games:
                    game.play(turn)
            played.extend(turns)
            asked = [(item, q) for item, q in asked_all if item.needs <= session.number]
            if not asked:
                continue
            whole = {"recent_turns": [t.to_llm(include_digest=False, include_date=True) for t in played]}
            ceiling_units = grounding.units(whole)
            ceiling_index = index_of(ceiling_units)
            grounded = [(item, q) for item, q in asked if grounding.grounded(q, ceiling_units, ceiling_index)]
            for budget, game in games:
                context, _ = game.context()
                units = grounding.units(context)
                index = index_of(units)
                words = locomo.context_words(context)
                for item, q in grounded:
                    for group in ("all", str(item.category)):
                        tally = counts.setdefault((budget, group), Counter())
                        tally["ceiling"] += 1
                        if grounding.grounded(q, units, index):
                            tally["grounded"] += 1
                            continue
                        cause = _cause(grounding, q, units, index, words)
                        tally[cause] += 1
                        tally[cause + ", ceiling via the unit before"] += _leans_on_before(
                            grounding, q, ceiling_units, ceiling_index
                        )
    out: dict[str, Any] = {}
    for (budget, group), tally in sorted(counts.items()):
        total = tally["ceiling"]
        row: dict[str, Any] = {"ceiling_grounds": total, "grounded": round(tally["grounded"] / total, 3)}
        for cause in CAUSES:
            row[cause] = round(tally[cause] / total, 3)
            row[cause + ", ceiling via the unit before"] = tally[cause + ", ceiling via the unit before"]
        out[f"{budget} / {'all' if group == 'all' else locomo.CATEGORY_NAMES[int(group)]}"] = row
    return out


if __name__ == "__main__":
    chosen = tuple(int(b) for b in sys.argv[1].split(",")) if len(sys.argv) > 1 else (1000, 2000, 4000)
    print(json.dumps(main(chosen), indent=2))
