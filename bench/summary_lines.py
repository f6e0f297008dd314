"""What the lines of the extractive summary carry, and the summarizer's speed, on LoCoMo.

Plays every LoCoMo dialogue through the pure core with ``recommended(budget)``'s summarizer in this
process (a summary per evicted turn, as the `quality` measure does), and reads every summary it
writes. Per line (a bullet of ``<key_facts>``): the share that name one of the dialogue's two
speakers (as the line's label, the heading it stands under, "8 May 2023, Caroline:", or anywhere
in it), that are a photo's caption, that open by pointing
back ("It was...", "That's...") with nothing before them in the line, that are bare
questions, and that are pleasantries. Speed: input turns per second of summarizer CPU time (process
time), best of `rounds` replays of the recorded requests. Issue 25, item 3.

    CONVMEM_LOCOMO=../shared/data/locomo python -m bench.summary_lines [budget] [rounds]

Prints JSON. The line tests are written here, independent of the summarizer's own rules, so the
same script measures an older convmem (run it with that tree first on ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

from bench import _locomo as locomo
from convmem.adapters import ExtractiveSummarizer, recommended
from convmem.events import MemoryKey
from convmem.projections import AddTurn, SessionState, SummarySucceeded, decide, evolve, summary_due

_BULLET = re.compile(r"^- (?:([^:\n]{1,40}): )?(.*)$")
_SPEAKER_HEADING = re.compile(r"^\d{1,2} [A-Z][a-z]+ \d{1,4}(?:, ([^:\n]{1,40}))?:$")
"""A day's heading; one that names a speaker ("8 May 2023, Caroline:") stands over their lines."""
_POINTS_BACK = re.compile(
    r"^(?:It|It's|They|They're|He|He's|She|She's|That's|That was|This is|This was|These are|Those are)\b"
)
_PLEASANTRY = re.compile(
    r"^(?:catch|see|talk to) (?:you|ya)\b|^(?:take care|bye|good night|have a (?:good|great|nice))"
    r"|^(?:that|this|it)(?:'s| is| was| sounds) (?:so |really )?(?:great|awesome|amazing|cool|nice)[!.]*$",
    re.IGNORECASE,
)


def _requests(budget: int) -> list[tuple[str, dict[str, Any]]]:
    """Every summary request `recommended(budget)` makes over the dialogues, with the dialogue's name."""
    folder = locomo.locomo_dir()
    if folder is None:
        return []
    setup = recommended(total_tokens=budget, worker_process=False)
    out: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(folder.glob("*.json")):
        dialogue, state, key = locomo.load(path), SessionState(), MemoryKey("bench", "lines", path.stem)
        for part in locomo.sessions(dialogue):
            for turn in locomo.turns(part, dialogue["speaker_a"]):
                n = state.next_index
                now = turn.ts + n
                command = AddTurn(turn=turn)
                for event in decide(
                    state, command, now=now, command_id=f"t{n}", key=key, config=setup.config
                ):
                    state = evolve(state, event)
                request = summary_due(state, now)
                if request is None:
                    continue
                payload = request.payload()
                out.append((path.stem, payload))
                outcome = SummarySucceeded(request=request, summary=setup.summarizer(payload)["summary"])
                for event in decide(
                    state, outcome, now=now, command_id=f"s{n}", key=key, config=setup.config
                ):
                    state = evolve(state, event)
    return out


def _lines(
    summaries: list[str], speakers: dict[str, tuple[str, str]], dialogues: list[str]
) -> dict[str, Any]:
    counts = {"lines": 0, "named": 0, "captions": 0, "points_back": 0, "questions": 0, "pleasantries": 0}
    for summary, name in zip(summaries, dialogues, strict=True):
        people = {full.lower() for full in speakers[name]}
        speaker = ""
        for line in summary.splitlines():
            heading = _SPEAKER_HEADING.match(line)
            if heading is not None:
                speaker = heading.group(1) or ""
                continue
            found = _BULLET.match(line)
            if found is None:
                continue
            label, body = found.group(1) or speaker, found.group(2)
            counts["lines"] += 1
            words = {w.lower() for w in re.findall(r"[A-Za-z]+", line)}
            counts["named"] += bool(label.lower() in people or words & people)
            counts["captions"] += "[image:" in body
            counts["points_back"] += bool(_POINTS_BACK.match(body))
            counts["questions"] += body.rstrip().endswith("?")
            counts["pleasantries"] += bool(_PLEASANTRY.match(body))
    total = max(counts["lines"], 1)
    return {**counts, **{f"{k}_share": round(v / total, 3) for k, v in counts.items() if k != "lines"}}


def main(budget: int = 2000, rounds: int = 3) -> dict[str, Any]:
    requests = _requests(budget)
    if not requests:
        return {"skipped": "no LoCoMo data"}
    folder = locomo.locomo_dir()
    assert folder is not None
    speakers = {}
    for path in sorted(folder.glob("*.json")):
        dialogue = locomo.load(path)
        speakers[path.stem] = (str(dialogue["speaker_a"]), str(dialogue["speaker_b"]))
    best, summaries, turns = float("inf"), [], 0
    for _ in range(rounds):
        summarizer = ExtractiveSummarizer(max_tokens=budget - 200)
        written, previous, turns, last = [], "", 0, None
        start = time.process_time()
        for name, payload in requests:
            if name != last:
                previous, last = "", name
            previous = summarizer({"previous_summary": previous, "turns": payload["turns"]})["summary"]
            written.append(previous)
            turns += len(payload["turns"])
        best = min(best, time.process_time() - start)
        summaries = written
    return {
        "budget": budget,
        "summaries": len(summaries),
        "input_turns": turns,
        "cpu_turns_per_second": round(turns / best),
        "lines": _lines(summaries, speakers, [name for name, _ in requests]),
    }


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    print(json.dumps(main(*args), indent=2))
