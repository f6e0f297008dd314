"""7. Memory quality on LoCoMo: are the facts a question needs still in the context?

Each LoCoMo dialogue is played through convmem's pure core (`decide` and
`evolve`, the summarizer called synchronously whenever `summary_due` says a
summary is due), which gives exactly the states the runtime would reach with
`flush()` after every turn, without threads or a server. ``speaker_a`` is the
user, ``speaker_b`` the assistant; consecutive utterances of one speaker are
joined, and a user run with the assistant run after it make one turn (a
session opening with ``speaker_b`` opens with an assistant-only turn). An
utterance's text is its ``text`` plus ``[image: <blip_caption>]`` when it
shared a photo. Every LoCoMo session is its own convmem session (same tenant
and user).

At the end of each LoCoMo session, for every QA item with evidence
(``dia_id``) in that session, each such evidence utterance is checked against
the context (`llm_context`), read as units (each summary line, each pending
or recent turn's user text and assistant text): it is **visible** when its
text appears verbatim (case and whitespace folded) in the context, or when at
least 60% of its distinct content words (lowercase ``[a-z0-9]`` words with
apostrophes, stopwords and one-letter words removed) occur in one unit. (Over
the whole context as one bag of words, 60% of an utterance's words turn up by
chance: checked against *another* dialogue's 4,000-token context, 16% of
utterances passed; within one unit, 0.2% do. The run reports that chance
rate.) The figure is the fraction of (QA item,
evidence utterance) pairs visible, with the mean tokens of the context at
the end of the sessions (`estimate_tokens`, the default estimator).

Strategies, each at each `total_max_tokens`:

* ``truncation``: the newest turns that fit the budget (``full_zone_turns``
  unbounded): the reference, "plain truncation at the same budget";
* ``rolling_summary`` with `ExtractiveSummarizer`: full zone 5 turns,
  ``summary_max_tokens`` half the budget, overflow ``truncate_oldest``;
* ``truncation`` with PenguiFlow's default ``full_zone_turns=5``.

Beside that per-session figure (what the task asks), the first two
strategies also play each whole dialogue (19 to 32 LoCoMo sessions) as one
convmem session and check every QA item's evidence at the dialogue's end:
long-horizon retention, where a summary has something to win.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench import _locomo as locomo
from bench._common import Figure, Result, Sizes
from bench._locomo import VISIBLE_SHARE, Context
from convmem.adapters import ExtractiveSummarizer
from convmem.events import ConversationTurn, MemoryBudget, MemoryKey, ShortTermMemoryConfig
from convmem.projections import (
    AddTurn,
    SessionState,
    SummarySucceeded,
    decide,
    estimate_tokens,
    evolve,
    llm_context,
    summary_due,
)

__all__ = ["run"]


@dataclass
class _Tally:
    pairs: int = 0
    visible: int = 0
    tokens: int = 0
    contexts: int = 0
    max_tokens: int = 0
    summaries: int = 0
    failures: int = 0


def _play(
    turns: list[ConversationTurn],
    state: SessionState,
    key: MemoryKey,
    config: ShortTermMemoryConfig,
    summarizer: ExtractiveSummarizer | None,
    tally: _Tally,
) -> SessionState:
    for turn in turns:
        n = state.next_index
        now = 1_700_000_000.0 + 60.0 * n
        for event in decide(state, AddTurn(turn=turn), now=now, command_id=f"t{n}", key=key, config=config):
            state = evolve(state, event)
        for attempt in range(4):  # a summary per evicted turn, bounded
            request = summary_due(state, now)
            if request is None or summarizer is None:
                break
            summary = summarizer(request.payload())["summary"]
            outcome = SummarySucceeded(request=request, summary=summary)
            events = decide(state, outcome, now=now, command_id=f"s{n}.{attempt}", key=key, config=config)
            tally.summaries += 1
            tally.failures += sum(1 for e in events if type(e).__name__ == "HealthChanged")
            for event in events:
                state = evolve(state, event)
    return state


def _measure(state: SessionState, dia_ids: list[str], texts: dict[str, str], tally: _Tally) -> Context:
    context = Context(llm_context(state))
    tokens = estimate_tokens(state)
    tally.tokens += tokens
    tally.contexts += 1
    tally.max_tokens = max(tally.max_tokens, tokens)
    for dia_id in dia_ids:
        if dia_id in texts:
            tally.pairs += 1
            tally.visible += context.shows(texts[dia_id])
    return context


def _evidence(dialogue: dict[str, Any]) -> tuple[dict[int, list[str]], int]:
    """Per session number, the evidence dia_ids of every QA item (one entry per item and id)."""
    out: dict[int, list[str]] = {}
    unparsed = 0
    for qa in dialogue.get("qa", []):
        ids = {m.group(0) for e in qa.get("evidence", []) for m in locomo.DIA.finditer(str(e))}
        unparsed += sum(1 for e in qa.get("evidence", []) if not locomo.DIA.search(str(e)))
        for dia_id in sorted(ids):
            out.setdefault(int(dia_id[1:].split(":")[0]), []).append(dia_id)
    return out, unparsed


def _configs(budget: int) -> Iterator[tuple[str, ShortTermMemoryConfig, bool]]:
    yield (
        "truncation",
        ShortTermMemoryConfig(
            strategy="truncation",
            budget=MemoryBudget(
                full_zone_turns=100_000, summary_max_tokens=min(1000, budget), total_max_tokens=budget
            ),
        ),
        False,
    )
    yield (
        "rolling_summary",
        ShortTermMemoryConfig(
            strategy="rolling_summary",
            budget=MemoryBudget(full_zone_turns=5, summary_max_tokens=budget // 2, total_max_tokens=budget),
        ),
        True,
    )
    yield (
        "truncation, full_zone_turns=5",
        ShortTermMemoryConfig(
            strategy="truncation",
            budget=MemoryBudget(
                full_zone_turns=5, summary_max_tokens=min(1000, budget), total_max_tokens=budget
            ),
        ),
        False,
    )


def _chance(finals: list[tuple[Context, list[str]]]) -> float:
    """Share of each dialogue's evidence that the *next* dialogue's final context shows (false positives)."""
    shown = asked = 0
    for i, (_, utterances) in enumerate(finals):
        other = finals[(i + 1) % len(finals)][0]
        shown += sum(other.shows(u) for u in utterances)
        asked += len(utterances)
    return shown / max(asked, 1)


def run(sizes: Sizes) -> Result:
    result = Result()
    folder = locomo.locomo_dir()
    if folder is None:
        result.skipped = "no LoCoMo data (set CONVMEM_LOCOMO or put it in ../shared/data/locomo)"
        return result
    files = sorted(folder.glob("*.json"))[: sizes.q_dialogues]
    dialogues = [(f.stem, json.loads(f.read_text(encoding="utf-8"))) for f in files]
    tallies: dict[tuple[str, int], _Tally] = {}
    finals: dict[tuple[str, int], list[tuple[Context, list[str]]]] = {}
    unparsed = 0
    for name, dialogue in dialogues:
        evidence, bad = _evidence(dialogue)
        unparsed += bad
        sessions = locomo.sessions(dialogue)[: sizes.q_sessions]
        texts = {u.dia_id: u.text for s in sessions for u in s.utterances}
        for budget in sizes.q_budgets:
            for label, config, summarizes in _configs(budget):
                tally = tallies.setdefault((label, budget), _Tally())
                summarizer = (
                    ExtractiveSummarizer(max_tokens=config.budget.summary_max_tokens) if summarizes else None
                )
                for session in sessions:
                    key = MemoryKey("locomo", f"dialogue-{name}", f"session-{session.number}")
                    turns = locomo.turns(session, dialogue["speaker_a"])
                    state = _play(turns, SessionState(), key, config, summarizer, tally)
                    _measure(state, evidence.get(session.number, []), texts, tally)
                if label == "truncation, full_zone_turns=5":
                    continue
                # The whole dialogue as one convmem session, every QA item checked at its end.
                whole = tallies.setdefault((f"{label}, whole dialogue", budget), _Tally())
                summarizer = (
                    ExtractiveSummarizer(max_tokens=config.budget.summary_max_tokens) if summarizes else None
                )
                key = MemoryKey("locomo", f"dialogue-{name}", "whole")
                state = SessionState()
                for session in sessions:
                    state = _play(
                        locomo.turns(session, dialogue["speaker_a"]), state, key, config, summarizer, whole
                    )
                asked = [texts[d] for ids in evidence.values() for d in ids if d in texts]
                context = _measure(state, [d for ids in evidence.values() for d in ids], texts, whole)
                finals.setdefault((label, budget), []).append((context, asked))
    for budget in sizes.q_budgets:
        for scope in ("", ", whole dialogue"):
            reference = tallies[(f"truncation{scope}", budget)]
            ref_share = reference.visible / max(reference.pairs, 1)
            ref_tokens = reference.tokens / max(reference.contexts, 1)
            labels = [label for label, _, _ in _configs(budget)]
            for label in labels if not scope else labels[:2]:
                tally = tallies[(f"{label}{scope}", budget)]
                compared = label != "truncation"
                where = "at each session's end" if not scope else "at the end of the dialogue (one session)"
                result.add(
                    Figure(
                        f"{label}: evidence visible {where} @ {budget} tokens",
                        tally.visible / max(tally.pairs, 1),
                        "share",
                        reference=ref_share if compared else None,
                        reference_label="truncation to the same budget" if compared else "",
                    )
                )
                result.add(
                    Figure(
                        f"{label}: context tokens {where} @ {budget}",
                        tally.tokens / max(tally.contexts, 1),
                        "tokens",
                        reference=ref_tokens if compared else None,
                        reference_label="truncation to the same budget" if compared else "",
                    )
                )
    chance = {
        f"{label} @ {budget}": _chance(contexts)
        for (label, budget), contexts in finals.items()
        if len(contexts) > 1
    }
    result.details = {
        "chance_visible_whole_dialogue": chance,
        "dialogues": [name for name, _ in dialogues],
        "sessions_played": tallies[("truncation", sizes.q_budgets[0])].contexts,
        "evidence_pairs": tallies[("truncation", sizes.q_budgets[0])].pairs,
        "evidence_pairs_whole_dialogue": tallies[("truncation, whole dialogue", sizes.q_budgets[0])].pairs,
        "unparsed_evidence_ids": unparsed,
        "visible_share": VISIBLE_SHARE,
        "tallies": {f"{label} @ {budget}": vars(t) for (label, budget), t in tallies.items()},
    }
    worst = f"{max(chance.values()):.1%}" if chance else "n/a (one dialogue)"
    result.notes.append(
        "pure core (decide/evolve, summarizer called synchronously when a summary is due); 'visible' = "
        f"verbatim, or >= {VISIBLE_SHARE:.0%} of the utterance's content words in one unit of the context "
        f"(a summary line, a turn's user or assistant text); "
        "chance rate (another dialogue's context) at most "
        f"{worst}; "
        f"{result.details['evidence_pairs']} (QA item, evidence utterance) pairs over "
        f"{result.details['sessions_played']} sessions of {len(dialogues)} dialogues"
    )
    return result
