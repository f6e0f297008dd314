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

**Grounded recall** (issue 25, item 4; `bench._grounding`): the bag of words above
can be gamed, so every context is also scored the strict way: an answer counts only
where each part of it sits in one sentence or line of the context that shares a word
with the question and, where the question names one of the two speakers, is
attributed to them. Its ceiling is the whole history as dated turns (the turns
convmem would show with no budget). Reported beside the bag-of-words figure, for
all questions, those not about time, and each LoCoMo category (1 multi-hop,
2 temporal, 3 open-domain, 4 single-hop). Two controls that must score near zero
under it: ``word list``, the history's distinct words rarest first up to the budget,
and ``word list, months first``, the session dates' words first. With tiktoken and
its cl100k_base files installed, every context is also counted in cl100k tokens
(beside the estimate), and ``recommended, cl100k_base`` plays
``recommended(budget, token_counter="cl100k_base")``.

**Recall** (issue 25): a planner that passes its current message as the query gets, beside the
summary, the session's earlier lines most relevant to it (`llm_context(state, query=...)`).
``recommended + recall`` (and ``recommended + recall, cl100k_base``) is the same game as
``recommended`` read once per question, with the question as the query: each question is scored
on the view read for it (the state is computed once per checkpoint, then one view per question);
a checkpoint's tokens are the most any of its views took. The query-less rows are the views a
planner that passes no query gets (the PenguiFlow and Agents drop-ins).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bench import _locomo as locomo
from bench._common import Figure, Result, Sizes, Target
from bench._grounding import Grounding, Question, index_of
from convmem.actors import encoding_counter
from convmem.adapters import ExtractiveSummarizer, recommended
from convmem.errors import InvalidConfig
from convmem.events import ConversationTurn, MemoryBudget, MemoryKey, ShortTermMemoryConfig, date_text
from convmem.projections import (
    AddTurn,
    SessionState,
    SummarySucceeded,
    TokenEstimator,
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
RECOMMENDED_REAL = "recommended, cl100k_base"
RECALL = "recommended + recall"
RECALL_REAL = "recommended + recall, cl100k_base"
QUERIED = (RECALL, RECALL_REAL)
"""Configurations whose view is read once per question, with the question as the planner's query."""
WORD_LIST = "word list"
WORD_LIST_MONTHS = "word list, months first"
CONTROLS = (WORD_LIST, WORD_LIST_MONTHS)
REAL_ENCODING = "cl100k_base"
GROUPS = ("all", "not about time", *(str(c) for c in locomo.CATEGORIES))
"""What each share is taken over: every question, those not about time, each category."""
CONTROL_BOUND = 0.05
"""A control's grounded recall / ceiling at most this: near zero."""
STRICT_TARGET = 0.85
"""recommended() at 2,000 tokens, grounded recall / ceiling, at least this."""
UNDATED_MARGIN = 0.15
"""recommended() above written summaries on questions not about time by at least this (2,000 tokens)."""
TARGET_BUDGET = 2000
MIN_CEILING = 0.05
"""A group's grounded ratio is shown only where the whole history grounds at least this share of
it (LoCoMo's open-domain answers are inferences, "Likely no": the history grounds almost none)."""
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
    shares: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    """(metric, group) -> the share at each checkpoint that asked a question of the group;
    metric ``words`` (the bag of words) or ``grounded``; groups `GROUPS`."""
    grounded_by_dialogue: dict[str, list[float]] = field(default_factory=dict)
    real_tokens: list[int] = field(default_factory=list)

    def checkpoint(self, dialogue: str, share: tuple[float, float], tokens: int) -> None:
        self.recall.append(share[0])
        self.undated.append(share[1])
        self.by_dialogue.setdefault(dialogue, []).append(share[0])
        self.tokens.append(tokens)

    def score(self, dialogue: str, scores: dict[tuple[str, str], float], real: int | None) -> None:
        for key, value in scores.items():
            self.shares.setdefault(key, []).append(value)
        self.grounded_by_dialogue.setdefault(dialogue, []).append(scores.get(("grounded", "all"), 0.0))
        if real is not None:
            self.real_tokens.append(real)

    def share(self, metric: str, group: str) -> float:
        values = self.shares.get((metric, group), [])
        return sum(values) / max(len(values), 1)

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
    estimator: TokenEstimator = default_token_estimator
    queried: str | None = None
    """Also scored as this configuration: the view read with each question as its query
    (`llm_context(..., query=...)`), one view per question."""


def _real_counter() -> TokenEstimator | None:
    """cl100k_base's counter, or None when tiktoken or its files are not installed."""
    try:
        return encoding_counter(REAL_ENCODING)
    except InvalidConfig:
        return None


def _players(budget: int, real: TokenEstimator | None = None) -> Iterator[_Player]:
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
    # The summarizer's own speed, in process. One game gives two rows: the view with no query
    # (``recommended``) and the view read with each question (``recommended + recall``).
    setup = recommended(total_tokens=budget, worker_process=False)
    yield _Player(RECOMMENDED, setup.config, setup.summarizer, queried=RECALL)
    if real is not None:
        setup = recommended(total_tokens=budget, token_counter=REAL_ENCODING, worker_process=False)
        yield _Player(RECOMMENDED_REAL, setup.config, setup.summarizer, real, queried=RECALL_REAL)


class _Game:
    """One configuration playing one dialogue, turn by turn."""

    def __init__(self, player: _Player, key: MemoryKey, tally: _Tally, budget: int = 0) -> None:
        self.player = player
        self.budget = budget
        self.key = key
        self.tally = tally
        self.state = SessionState()

    def play(self, turn: ConversationTurn) -> None:
        state, config, key, estimator = self.state, self.player.config, self.key, self.player.estimator
        n = state.next_index
        now = turn.ts + n
        command = AddTurn(turn=turn)
        for event in decide(
            state, command, now=now, command_id=f"t{n}", key=key, config=config, estimator=estimator
        ):
            state = evolve(state, event)
        summarizer = self.player.summarizer
        for attempt in range(4):  # a summary per evicted turn, bounded
            request = summary_due(state, now, estimator=estimator) if summarizer is not None else None
            if request is None or summarizer is None:
                break
            payload = request.payload()
            wall, cpu = time.perf_counter(), time.thread_time()
            summary = summarizer(payload)["summary"]
            self.tally.summarizer_cpu += time.thread_time() - cpu
            self.tally.summarizer_seconds += time.perf_counter() - wall
            self.tally.summarized_turns += len(payload["turns"])
            outcome = SummarySucceeded(request=request, summary=summary)
            command_id = f"s{n}.{attempt}"
            events = decide(
                state, outcome, now=now, command_id=command_id, key=key, config=config, estimator=estimator
            )
            self.tally.summaries += 1
            self.tally.rejected += sum(1 for e in events if type(e).__name__ == "HealthChanged")
            for event in events:
                state = evolve(state, event)
        self.state = state

    def context(self, query: str | None = None) -> tuple[dict[str, Any], int]:
        estimator = self.player.estimator
        if query is None:
            return llm_context(self.state, estimator), estimate_tokens(self.state, estimator)
        # One view per question: its tokens counted on its rendering (what `estimate_tokens` counts).
        context = llm_context(self.state, estimator, query=query)
        return context, estimator(render(context["conversation_memory"])) if context else 0


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


def _word_list(
    played: list[ConversationTurn], budget: int, *, months_first: bool
) -> tuple[dict[str, Any], int]:
    """The control: the history's distinct words, rarest first (ties: first seen), up to the budget.

    With `months_first`, the words of the played sessions' dates come first, newest first.
    One line of words separated by spaces, as the summary of an otherwise empty context.
    """
    counts: Counter[str] = Counter()
    for turn in played:
        counts.update(locomo.words_of(turn.user_message))
        counts.update(locomo.words_of(turn.assistant_response))
    order = {word: i for i, word in enumerate(counts)}
    words = sorted(counts, key=lambda w: (counts[w], order[w]))
    if months_first:
        dated: list[str] = []
        for turn in reversed(played):
            for word in locomo.words_of(date_text(turn.ts)) if turn.ts > 0 else []:
                if word not in dated:
                    dated.append(word)
        words = dated + [w for w in words if w not in set(dated)]

    def memory(n: int) -> dict[str, Any]:
        return {"recent_turns": [], "summary": " ".join(words[:n])}

    low, high = 0, len(words)  # the most words that fit: binary search on the count
    while low < high:
        middle = (low + high + 1) // 2
        if _tokens(memory(middle)) <= budget:
            low = middle
        else:
            high = middle - 1
    chosen = memory(low)
    return {"conversation_memory": chosen}, _tokens(chosen)


@dataclass(frozen=True)
class _Asked:
    """A QA item with its question read for grounding."""

    item: locomo.QAItem
    question: Question


def _groups(item: locomo.QAItem) -> tuple[str, ...]:
    dated = () if item.category == locomo.TEMPORAL else ("not about time",)
    return ("all", *dated, str(item.category))


def _scores(
    asked: list[_Asked], words: set[str], grounding: Grounding, context: dict[str, Any]
) -> dict[tuple[str, str], float]:
    """The share of the questions asked by now that the context answers: per metric and group."""
    units = grounding.units(context)
    index = index_of(units)
    hits: dict[tuple[str, str], int] = {}
    totals: dict[str, int] = {}
    for one in asked:
        found = {"words": one.item.words <= words, "grounded": grounding.grounded(one.question, units, index)}
        for group in _groups(one.item):
            totals[group] = totals.get(group, 0) + 1
            for metric, hit in found.items():
                hits[(metric, group)] = hits.get((metric, group), 0) + hit
    return {
        (metric, group): hits.get((metric, group), 0) / totals[group]
        for metric in ("words", "grounded")
        for group in totals
    }


@dataclass(frozen=True)
class _Checkpoint:
    """The end of one LoCoMo session of one dialogue: what scoring a context there needs."""

    dialogue: str
    session: int
    items: list[locomo.QAItem]
    asked: list[_Asked]
    grounding: Grounding
    real: TokenEstimator | None

    def score(self, tally: _Tally, context: dict[str, Any], tokens: int) -> None:
        """Both metrics of `context` into `tally`, with its tokens (estimated, and real when counted)."""
        words = locomo.context_words(context)
        share = _recall(self.items, self.session, words)
        tally.checkpoint(self.dialogue, share or (0.0, 0.0), tokens)
        memory = context.get("conversation_memory", {})
        counted = self.real(render(memory)) if self.real is not None else None
        tally.score(self.dialogue, _scores(self.asked, words, self.grounding, context), counted)

    def score_each(self, tally: _Tally, view: Callable[[str], tuple[dict[str, Any], int]]) -> None:
        """Both metrics into `tally`, each question scored on the view read with it as the query:
        the checkpoint's share is the share of its questions so answered; its tokens the most any
        of its views took."""
        hits: dict[tuple[str, str], int] = {}
        totals: dict[str, int] = {}
        most, most_real = 0, 0
        for one in self.asked:
            context, tokens = view(one.item.question)
            most = max(most, tokens)
            if self.real is not None:
                most_real = max(most_real, self.real(render(context.get("conversation_memory", {}))))
            units = self.grounding.units(context)
            found = {
                "words": one.item.words <= locomo.context_words(context),
                "grounded": self.grounding.grounded(one.question, units, index_of(units)),
            }
            for group in _groups(one.item):
                totals[group] = totals.get(group, 0) + 1
                for metric, hit in found.items():
                    hits[(metric, group)] = hits.get((metric, group), 0) + hit
        undated = totals.get("not about time", 0)
        share = (
            hits.get(("words", "all"), 0) / max(totals.get("all", 0), 1),
            hits.get(("words", "not about time"), 0) / max(undated, 1),
        )
        tally.checkpoint(self.dialogue, share, most)
        scores = {
            (metric, group): hits.get((metric, group), 0) / totals[group]
            for metric in ("words", "grounded")
            for group in totals
        }
        tally.score(self.dialogue, scores, most_real if self.real is not None else None)


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
    real = _real_counter()
    unrelatable = 0
    for path in files:
        name, dialogue = path.stem, locomo.load(path)
        items, skipped = locomo.qa_items(dialogue)
        for reason, count in skipped.items():
            left_out[reason] = left_out.get(reason, 0) + count
        user, assistant = str(dialogue["speaker_a"]), str(dialogue["speaker_b"])
        grounding = Grounding((user, assistant), {"user": user, "assistant": assistant})
        questions = [_Asked(item, grounding.question(item.question, item.answer)) for item in items]
        unrelatable += sum(1 for q in questions if not q.question.relate)
        sessions = locomo.sessions(dialogue)[: sizes.q_sessions]
        key = MemoryKey("locomo", f"dialogue-{name}", "whole")
        games = [
            _Game(player, key, tallies.setdefault((player.label, budget), _Tally()), budget)
            for budget in sizes.q_budgets
            for player in _players(budget, real)
        ]
        played: list[ConversationTurn] = []
        summaries: list[str] = []
        for session in sessions:
            turns = locomo.turns(session, user)
            for turn in turns:
                for game in games:
                    game.play(turn)
            played.extend(turns)
            summaries.append(locomo.written_summary(dialogue, session.number))
            ceiling = _recall(items, session.number, locomo.history_words(played))
            if ceiling is None:
                continue
            checkpoints += 1
            asked = [q for q in questions if q.item.needs <= session.number]

            point = _Checkpoint(name, session.number, items, asked, grounding, real)
            whole = [t.to_llm(include_digest=False, include_date=True) for t in played]
            ceiling_tally = tallies.setdefault((CEILING, 0), _Tally())
            ceiling_tally.checkpoint(name, ceiling, 0)
            words = locomo.history_words(played)
            ceiling_tally.score(name, _scores(asked, words, grounding, {"recent_turns": whole}), None)
            for game in games:
                point.score(game.tally, *game.context())
                if game.player.queried is not None:
                    queried = tallies.setdefault((game.player.queried, game.budget), _Tally())
                    point.score_each(queried, game.context)
            for budget in sizes.q_budgets:
                point.score(
                    tallies.setdefault((WRITTEN, budget), _Tally()), *_written(summaries, played, budget)
                )
                for label, months in ((WORD_LIST, False), (WORD_LIST_MONTHS, True)):
                    context, tokens = _word_list(played, budget, months_first=months)
                    point.score(tallies.setdefault((label, budget), _Tally()), context, tokens)
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
            "grounded": _grounded_details(tallies),
            "grounded_by_half": _by_half(tallies, sizes.q_budgets, grounded=True),
            "questions_with_no_word_to_relate": unrelatable,
            "real_tokens": REAL_ENCODING if real is not None else None,
        }
    )
    _report_grounded(result, tallies, sizes.q_budgets, counted=real is not None)
    result.notes.append(
        f"pure core (decide/evolve, summarizer called synchronously when a summary is due); {len(files)} "
        f"dialogues each played as one conversation, {checkpoints} checkpoints (one per LoCoMo session); "
        "recall = share of QA items (categories 1-4, evidence already played) whose answer's content "
        "words all appear in json.dumps(llm_context); figures are ratios to the full history's recall"
    )
    result.notes.append(
        "grounded recall (bench._grounding): each part of an answer in one sentence or line of the context "
        "that shares a word with the question and, where the question names a speaker, is attributed to "
        "them; its ceiling is the whole history as dated turns"
    )
    return result


def _half_ratio(
    tallies: dict[tuple[str, int], _Tally],
    label: str,
    budget: int,
    names: set[str],
    *,
    grounded: bool = False,
) -> float:
    def mean(tally: _Tally) -> float:
        by_dialogue = tally.grounded_by_dialogue if grounded else tally.by_dialogue
        shares = [s for d, values in by_dialogue.items() if d in names for s in values]
        return sum(shares) / max(len(shares), 1)

    ceiling = mean(tallies[(CEILING, 0)])
    return mean(tallies[(label, budget)]) / ceiling if ceiling else 0.0


def _by_half(
    tallies: dict[tuple[str, int], _Tally], budgets: tuple[int, ...], *, grounded: bool = False
) -> dict[str, Any]:
    """Share of the ceiling on the dialogues tuned on and on the others, per configuration."""
    if (CEILING, 0) not in tallies:
        return {}
    names = set(tallies[(CEILING, 0)].by_dialogue)
    halves = {"tuned": names & set(TUNED), "held out": names - set(TUNED)}
    return {
        f"{label} @ {budget}": {
            half: _half_ratio(tallies, label, budget, group, grounded=grounded)
            for half, group in halves.items()
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
        for label in (TRUNCATION, WRITTEN, OLD_ROLLING, RECOMMENDED, RECALL):
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


def _ratio(tallies: dict[tuple[str, int], _Tally], label: str, budget: int, metric: str, group: str) -> float:
    """A configuration's mean share of `group` under `metric`, over the ceiling's."""
    ceiling = tallies[(CEILING, 0)].share(metric, group)
    return tallies[(label, budget)].share(metric, group) / ceiling if ceiling else 0.0


def _grounded_details(tallies: dict[tuple[str, int], _Tally]) -> dict[str, Any]:
    """Per configuration and budget, per group: both metrics' shares and ratios, and real tokens."""
    if (CEILING, 0) not in tallies:
        return {}
    out: dict[str, Any] = {}
    for (label, budget), tally in tallies.items():
        row: dict[str, Any] = {}
        for group in GROUPS:
            row[group] = {
                "words_share": tally.share("words", group),
                "grounded_share": tally.share("grounded", group),
                "checkpoints": len(tally.shares.get(("grounded", group), [])),
            }
            if label != CEILING:
                row[group]["words_ratio"] = _ratio(tallies, label, budget, "words", group)
                ceiling = tallies[(CEILING, 0)].share("grounded", group)
                grounded = _ratio(tallies, label, budget, "grounded", group)
                row[group]["grounded_ratio"] = grounded if ceiling >= MIN_CEILING else None
        if tally.real_tokens:
            row["real_tokens"] = {
                "max": max(tally.real_tokens),
                "mean": sum(tally.real_tokens) / len(tally.real_tokens),
                "over_budget": sum(1 for t in tally.real_tokens if t > budget),
                "checkpoints": len(tally.real_tokens),
            }
        out[f"{label} @ {budget}"] = row
    return out


def _report_grounded(
    result: Result, tallies: dict[tuple[str, int], _Tally], budgets: tuple[int, ...], *, counted: bool
) -> None:
    if (CEILING, 0) not in tallies:
        return
    ceiling = tallies[(CEILING, 0)]
    for group in GROUPS:
        result.add(
            Figure(
                f"grounded recall of the full history (dated turns, the ceiling), {_group_name(group)}",
                ceiling.share("grounded", group),
                "share",
                reference=ceiling.share("words", group),
                reference_label="bag-of-words recall of the plain history",
            )
        )
    labels = (
        TRUNCATION,
        DATED_TRUNCATION,
        WRITTEN,
        OLD_ROLLING,
        RECOMMENDED,
        RECOMMENDED_REAL,
        *QUERIED,
        *CONTROLS,
    )
    for budget in budgets:
        for label in labels:
            if (label, budget) not in tallies:
                continue
            for group in GROUPS:
                if ceiling.share("grounded", group) < MIN_CEILING:
                    continue  # the whole history grounds (almost) none of them: no ratio to show
                target, note = None, ""
                if label in CONTROLS and group == "all":
                    target, note = Target("value", "<=", CONTROL_BOUND), "a control: near zero"
                if label in (RECOMMENDED, RECALL) and group == "all" and budget == TARGET_BUDGET:
                    target = Target("value", ">=", STRICT_TARGET)
                result.add(
                    Figure(
                        f"{label}: grounded recall / ceiling @ {budget} tokens, {_group_name(group)}",
                        _ratio(tallies, label, budget, "grounded", group),
                        "ratio",
                        reference=_ratio(tallies, label, budget, "words", group),
                        reference_label="bag-of-words recall / ceiling (the earlier figure)",
                        target=target,
                        note=note,
                    )
                )
        for label in (RECOMMENDED, RECOMMENDED_REAL, *QUERIED):
            if (label, budget) not in tallies:
                continue
            ours = _ratio(tallies, label, budget, "grounded", "not about time")
            theirs = _ratio(tallies, WRITTEN, budget, "grounded", "not about time")
            result.add(
                Figure(
                    f"{label} minus written summaries, grounded recall / ceiling @ {budget}, not about time",
                    ours - theirs,
                    "ratio",
                    target=Target("value", ">=", UNDATED_MARGIN) if budget == TARGET_BUDGET else None,
                )
            )
            result.add(
                Figure(
                    f"{label}: grounded recall / ceiling @ {budget}, multi-hop, vs written summaries",
                    _ratio(tallies, label, budget, "grounded", "1"),
                    "ratio",
                    reference=_ratio(tallies, WRITTEN, budget, "grounded", "1"),
                    reference_label="written summaries + newest turns, multi-hop",
                    target=Target("ratio", ">=", 1.0),
                )
            )
        if not counted:
            continue
        for label in (TRUNCATION, WRITTEN, OLD_ROLLING, RECOMMENDED, RECOMMENDED_REAL, *QUERIED, *CONTROLS):
            tally = tallies.get((label, budget))
            if tally is None or not tally.real_tokens:
                continue
            over = sum(1 for t in tally.real_tokens if t > budget)
            result.add(
                Figure(
                    f"{label}: max context {REAL_ENCODING} tokens @ {budget}",
                    float(max(tally.real_tokens)),
                    "tokens",
                    reference=float(max(tally.tokens, default=0)),
                    reference_label="max context tokens as the configuration counts them",
                    target=Target("value", "<=", budget)
                    if label in (RECOMMENDED, RECOMMENDED_REAL, *QUERIED)
                    else None,
                    note=f"{over} of {len(tally.real_tokens)} checkpoints over the budget",
                )
            )


def _group_name(group: str) -> str:
    if group in ("all", "not about time"):
        return "all questions" if group == "all" else "questions not about time"
    return f"category {group} ({locomo.CATEGORY_NAMES[int(group)]})"
