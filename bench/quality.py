"""7. Memory quality on LoCoMo: how many answers does a planner's context still hold?

Each LoCoMo dialogue is played as ONE conversation (see `bench._locomo` for
how utterances become turns and dates) through convmem's pure core:
`decide` and `evolve`, with the summarizer called synchronously whenever
`summary_due` says a summary is due. That gives exactly the states the
runtime reaches with ``flush()`` after every turn, without threads or a server.

**Answer recall.** After each LoCoMo session (a checkpoint), the context a
planner would be shown is taken as ``json.dumps(llm_context(state))`` and
read as content words (`bench._locomo.context_words`). The checkpoint's recall
is the share of the QA items of categories 1-4 whose evidence sessions have
all been played and whose answer's content words all appear among the
context's. A configuration's figure is the mean over every checkpoint of every
dialogue, as a ratio to the same mean for the **ceiling**: the whole history so
far as plain ``user: ...\\nassistant: ...`` lines, with no budget.

Compared at each budget (1,000, 2,000 and 4,000 tokens, ``len // 4 + 1`` of
the rendering convmem measures, `estimate_tokens`):

* ``truncation``: the newest turns that fit (convmem's `truncation` strategy);
* ``written summaries``: LoCoMo's own ``session_N_summary`` texts of the sessions
  played, newest first while they fit half the budget, then the newest turns
  that fit the rest;
* convmem's configurations: `rolling_summary` as it was first benchmarked (full
  zone 5 turns, summary allowance half the budget, the `ExtractiveSummarizer`
  sized to it), and `convmem.recommended(total_tokens=budget)`.

Also reported: the mean and maximum context tokens of each (the maximum must
stay within the budget), and the summarizer's speed in the recommended
configuration: input turns per second of summarizer time on one thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bench import _locomo as locomo
from bench._common import Figure, Result, Sizes, Target
from convmem.adapters import ExtractiveSummarizer, recommended
from convmem.events import ConversationTurn, MemoryBudget, MemoryKey, ShortTermMemoryConfig
from convmem.projections import (
    AddTurn,
    SessionState,
    SummarySucceeded,
    decide,
    default_token_estimator,
    estimate_tokens,
    evolve,
    llm_context,
    render,
    summary_due,
)

__all__ = ["run"]

TRUNCATION = "truncation"
DATED_TRUNCATION = "truncation, dated turns"
WRITTEN = "written summaries"
CEILING = "full history"
OLD_ROLLING = "rolling_summary, 5 turns + half the budget"
RECOMMENDED = "recommended"
SPEED_TARGET = 2000.0
TUNED = ("26", "30", "41", "42")
"""The dialogues the summarizer was tuned on; the others only check it (`details.by_half`)."""


@dataclass
class _Tally:
    """Per configuration and budget: recall at each checkpoint, tokens, summarizer work."""

    recall: list[float] = field(default_factory=list)
    undated: list[float] = field(default_factory=list)
    """Recall over the questions that are not about time (categories 1, 3 and 4)."""
    by_dialogue: dict[str, list[float]] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    summaries: int = 0
    rejected: int = 0
    summarized_turns: int = 0
    summarizer_seconds: float = 0.0
    summarizer_cpu: float = 0.0

    def checkpoint(self, dialogue: str, share: tuple[float, float], tokens: int) -> None:
        self.recall.append(share[0])
        self.undated.append(share[1])
        self.by_dialogue.setdefault(dialogue, []).append(share[0])
        self.tokens.append(tokens)

    @property
    def mean(self) -> float:
        return sum(self.recall) / max(len(self.recall), 1)

    @property
    def mean_undated(self) -> float:
        return sum(self.undated) / max(len(self.undated), 1)


Summarizer = Callable[[dict[str, Any]], dict[str, str]]


@dataclass(frozen=True)
class _Player:
    """One convmem configuration: its session config and the summarizer it runs with."""

    label: str
    config: ShortTermMemoryConfig
    summarizer: Summarizer | None


def _players(budget: int) -> Iterator[_Player]:
    yield _Player(
        TRUNCATION,
        ShortTermMemoryConfig(
            strategy="truncation",
            budget=MemoryBudget(
                full_zone_turns=100_000, summary_max_tokens=min(1000, budget), total_max_tokens=budget
            ),
        ),
        None,
    )
    yield _Player(
        DATED_TRUNCATION,
        ShortTermMemoryConfig(
            strategy="truncation",
            budget=MemoryBudget(
                full_zone_turns=100_000, summary_max_tokens=min(1000, budget), total_max_tokens=budget
            ),
            include_turn_dates=True,
        ),
        None,
    )
    old = ShortTermMemoryConfig(
        strategy="rolling_summary",
        budget=MemoryBudget(full_zone_turns=5, summary_max_tokens=budget // 2, total_max_tokens=budget),
    )
    yield _Player(OLD_ROLLING, old, ExtractiveSummarizer(max_tokens=budget // 2))
    setup = recommended(total_tokens=budget, worker_process=False)  # the summarizer's own speed, in process
    yield _Player(RECOMMENDED, setup.config, setup.summarizer)


class _Game:
    """One configuration playing one dialogue, turn by turn."""

    def __init__(self, player: _Player, key: MemoryKey, tally: _Tally) -> None:
        self.player = player
        self.key = key
        self.tally = tally
        self.state = SessionState()

    def play(self, turn: ConversationTurn) -> None:
        state, config, key = self.state, self.player.config, self.key
        n = state.next_index
        now = turn.ts + n
        for event in decide(state, AddTurn(turn=turn), now=now, command_id=f"t{n}", key=key, config=config):
            state = evolve(state, event)
        summarizer = self.player.summarizer
        for attempt in range(4):  # a summary per evicted turn, bounded
            request = summary_due(state, now) if summarizer is not None else None
            if request is None or summarizer is None:
                break
            payload = request.payload()
            wall, cpu = time.perf_counter(), time.thread_time()
            summary = summarizer(payload)["summary"]
            self.tally.summarizer_cpu += time.thread_time() - cpu
            self.tally.summarizer_seconds += time.perf_counter() - wall
            self.tally.summarized_turns += len(payload["turns"])
            outcome = SummarySucceeded(request=request, summary=summary)
            events = decide(state, outcome, now=now, command_id=f"s{n}.{attempt}", key=key, config=config)
            self.tally.summaries += 1
            self.tally.rejected += sum(1 for e in events if type(e).__name__ == "HealthChanged")
            for event in events:
                state = evolve(state, event)
        self.state = state

    def context(self) -> tuple[dict[str, Any], int]:
        return llm_context(self.state), estimate_tokens(self.state)


def _tokens(memory: dict[str, Any]) -> int:
    return default_token_estimator(render(memory))


def _written(summaries: list[str], played: list[ConversationTurn], budget: int) -> tuple[dict[str, Any], int]:
    """LoCoMo's summaries newest first within half the budget, then the newest turns that fit."""
    chosen: list[str] = []
    for text in reversed(summaries):
        if text and _tokens({"recent_turns": [], "summary": "\n".join([text, *chosen])}) <= budget // 2:
            chosen.insert(0, text)
        elif text:
            break
    memory: dict[str, Any] = {"recent_turns": []}
    if chosen:
        memory["summary"] = "\n".join(chosen)
    recent: list[dict[str, Any]] = []
    for turn in reversed(played):
        candidate = [turn.to_llm(include_digest=True), *recent]
        if _tokens({**memory, "recent_turns": candidate}) > budget:
            break
        recent = candidate
    memory["recent_turns"] = recent
    return {"conversation_memory": memory}, _tokens(memory)


def _recall(items: list[locomo.QAItem], session: int, words: set[str]) -> tuple[float, float] | None:
    """Share of the questions asked by now whose answer `words` hold: all, and those not about time."""
    asked = [item for item in items if item.needs <= session]
    if not asked:
        return None
    undated = [item for item in asked if item.category != locomo.TEMPORAL]
    return (
        sum(1 for item in asked if item.words <= words) / len(asked),
        sum(1 for item in undated if item.words <= words) / max(len(undated), 1),
    )


def run(sizes: Sizes) -> Result:
    result = Result()
    folder = locomo.locomo_dir()
    if folder is None:
        result.skipped = "no LoCoMo data (set CONVMEM_LOCOMO or put it in ../shared/data/locomo)"
        return result
    files = sorted(folder.glob("*.json"))[: sizes.q_dialogues]
    tallies: dict[tuple[str, int], _Tally] = {}
    left_out: dict[str, int] = {}
    checkpoints = 0
    for path in files:
        name, dialogue = path.stem, locomo.load(path)
        items, skipped = locomo.qa_items(dialogue)
        for reason, count in skipped.items():
            left_out[reason] = left_out.get(reason, 0) + count
        sessions = locomo.sessions(dialogue)[: sizes.q_sessions]
        key = MemoryKey("locomo", f"dialogue-{name}", "whole")
        games = [
            _Game(player, key, tallies.setdefault((player.label, budget), _Tally()))
            for budget in sizes.q_budgets
            for player in _players(budget)
        ]
        played: list[ConversationTurn] = []
        summaries: list[str] = []
        for session in sessions:
            turns = locomo.turns(session, dialogue["speaker_a"])
            for turn in turns:
                for game in games:
                    game.play(turn)
            played.extend(turns)
            summaries.append(locomo.written_summary(dialogue, session.number))
            ceiling = _recall(items, session.number, locomo.history_words(played))
            if ceiling is None:
                continue
            checkpoints += 1
            tallies.setdefault((CEILING, 0), _Tally()).checkpoint(name, ceiling, 0)
            for game in games:
                context, tokens = game.context()
                share = _recall(items, session.number, locomo.context_words(context))
                game.tally.checkpoint(name, share or (0.0, 0.0), tokens)
            for budget in sizes.q_budgets:
                context, tokens = _written(summaries, played, budget)
                share = _recall(items, session.number, locomo.context_words(context))
                tallies.setdefault((WRITTEN, budget), _Tally()).checkpoint(name, share or (0.0, 0.0), tokens)
    _report(result, tallies, sizes.q_budgets)
    result.details.update(
        {
            "dialogues": [f.stem for f in files],
            "checkpoints": checkpoints,
            "qa_items_left_out": left_out,
            "tallies": {
                f"{label} @ {budget}": {
                    "mean_recall": t.mean,
                    "mean_recall_not_about_time": t.mean_undated,
                    "checkpoints": len(t.recall),
                    "max_tokens": max(t.tokens, default=0),
                    "summaries": t.summaries,
                    "summaries_rejected": t.rejected,
                    "summarized_turns": t.summarized_turns,
                    "summarizer_seconds": t.summarizer_seconds,
                    "summarizer_cpu_seconds": t.summarizer_cpu,
                }
                for (label, budget), t in tallies.items()
            },
            "by_half": _by_half(tallies, sizes.q_budgets),
        }
    )
    result.notes.append(
        f"pure core (decide/evolve, summarizer called synchronously when a summary is due); {len(files)} "
        f"dialogues each played as one conversation, {checkpoints} checkpoints (one per LoCoMo session); "
        "recall = share of QA items (categories 1-4, evidence already played) whose answer's content "
        "words all appear in json.dumps(llm_context); figures are ratios to the full history's recall"
    )
    return result


def _half_ratio(tallies: dict[tuple[str, int], _Tally], label: str, budget: int, names: set[str]) -> float:
    def mean(tally: _Tally) -> float:
        shares = [s for d, values in tally.by_dialogue.items() if d in names for s in values]
        return sum(shares) / max(len(shares), 1)

    ceiling = mean(tallies[(CEILING, 0)])
    return mean(tallies[(label, budget)]) / ceiling if ceiling else 0.0


def _by_half(tallies: dict[tuple[str, int], _Tally], budgets: tuple[int, ...]) -> dict[str, Any]:
    """Share of the ceiling on the dialogues tuned on and on the others, per configuration."""
    if (CEILING, 0) not in tallies:
        return {}
    names = set(tallies[(CEILING, 0)].by_dialogue)
    halves = {"tuned": names & set(TUNED), "held out": names - set(TUNED)}
    return {
        f"{label} @ {budget}": {
            half: _half_ratio(tallies, label, budget, group) for half, group in halves.items()
        }
        for (label, budget) in tallies
        if label != CEILING
    }


def _report(result: Result, tallies: dict[tuple[str, int], _Tally], budgets: tuple[int, ...]) -> None:
    ceiling_tally = tallies.get((CEILING, 0))
    if ceiling_tally is None:
        result.skipped = "no checkpoint had a QA item to ask"
        return
    ceiling, ceiling_undated = ceiling_tally.mean, ceiling_tally.mean_undated
    result.add(Figure("answer recall of the full history (the ceiling)", ceiling, "share"))
    result.add(
        Figure("answer recall of the full history, questions not about time", ceiling_undated, "share")
    )
    for budget in budgets:
        ratio = {label: tallies[(label, b)].mean / ceiling for (label, b) in tallies if b == budget}
        for label in (TRUNCATION, WRITTEN):
            result.add(Figure(f"{label}: answer recall / ceiling @ {budget} tokens", ratio[label], "ratio"))
        for label in (DATED_TRUNCATION, OLD_ROLLING, RECOMMENDED):
            best = label == RECOMMENDED
            for other, what in ((WRITTEN, "written summaries + newest turns"), (TRUNCATION, "truncation")):
                result.add(
                    Figure(
                        f"{label}: answer recall / ceiling @ {budget} tokens, vs {other}",
                        ratio[label],
                        "ratio",
                        reference=ratio[other],
                        reference_label=f"{what}, same budget",
                        target=Target("ratio", ">=", 1.0) if best else None,
                        note="target: above truncation" if best and other == TRUNCATION else "",
                    )
                )
        undated = {
            label: tallies[(label, b)].mean_undated / ceiling_undated for (label, b) in tallies if b == budget
        }
        for label in (TRUNCATION, DATED_TRUNCATION, OLD_ROLLING, RECOMMENDED):
            result.add(
                Figure(
                    f"{label}: answer recall / ceiling @ {budget} tokens, questions not about time",
                    undated[label],
                    "ratio",
                    reference=undated[WRITTEN],
                    reference_label="written summaries + newest turns, same questions",
                )
            )
        for label in (TRUNCATION, WRITTEN, OLD_ROLLING, RECOMMENDED):
            tokens = tallies[(label, budget)].tokens
            result.add(
                Figure(
                    f"{label}: max context tokens @ {budget}",
                    float(max(tokens, default=0)),
                    "tokens",
                    reference=sum(tokens) / max(len(tokens), 1),
                    reference_label="mean context tokens",
                    target=Target("value", "<=", budget),
                )
            )
    for budget in budgets:
        tally = tallies[(RECOMMENDED, budget)]
        if tally.summarizer_seconds > 0:
            result.add(
                Figure(
                    f"summarizer input turns/s, recommended @ {budget} (one call per evicted turn)",
                    tally.summarized_turns / tally.summarizer_seconds,
                    "turns/s",
                    target=Target("value", ">=", SPEED_TARGET),
                    note=f"cpu: {tally.summarized_turns / max(tally.summarizer_cpu, 1e-9):,.0f} turns/s",
                )
            )
