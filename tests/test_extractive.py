"""The extractive summarizer: what it keeps, what it drops, how it rolls, and its laws."""

from __future__ import annotations

import cProfile
import json
import pstats
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import chitchat_dataset  # type: ignore[import-untyped]
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from summaries import assert_accepted, assert_well_formed, bullets, days, request, section
from summary_samples import PRICING_TURNS

from convmem.adapters import ExtractiveSummarizer
from convmem.adapters.backends.summarizers._extractive import MAX_OFFERED
from convmem.adapters.backends.summarizers._selection import Pool
from convmem.adapters.backends.summarizers._summary import make_fact, parse, prose, render
from convmem.errors import InvalidConfig, SummarizerError
from convmem.events import ConversationTurn, MemoryHealth, MemoryKey, TrajectoryDigest
from convmem.projections import SummaryRequest, default_token_estimator


def at(year: int, month: int, day: int, hour: int = 12) -> float:
    return datetime(year, month, day, hour, tzinfo=UTC).timestamp()


SMALL_TALK = [
    ("Hey! How are you?", "Good, thanks! And you?"),
    ("Haha yes, all good.", "Great to hear!"),
    ("Wow, that's awesome!", "Totally!"),
    ("Okay, cool.", "Sure thing."),
    ("Thanks so much!", "You're welcome!"),
    ("See you later!", "Bye, take care!"),
    ("lol", "haha"),
    ("Oh really?", "Yeah, really."),
]


def test_facts_carry_names_numbers_amounts_dates_emails_and_decisions() -> None:
    """Every kind of fact a later turn may ask about lands in <key_facts>, the greeting does not."""
    summary = ExtractiveSummarizer()(request(PRICING_TURNS))["summary"]
    facts = "\n".join(section(summary, "key_facts"))
    for needle in (
        "Shopify",
        "ana.lopez@example.com",
        "Ana López",
        "$49/month",
        "10%",
        "I'll take the Pro tier",
        "March 3",
        "2024-03-03",
        "$529/year",
    ):
        assert needle in facts, needle
    assert "Hi," not in facts
    assert_well_formed(summary)


def test_small_talk_greetings_and_sign_offs_are_not_kept() -> None:
    """Turns made only of greetings, thanks, enthusiasm and goodbyes leave no fact."""
    turns = [{"user": user, "assistant": assistant} for user, assistant in SMALL_TALK]
    summary = ExtractiveSummarizer()(request(turns))["summary"]
    assert section(summary, "key_facts") == []
    assert f"{len(turns)} turns summarized." in summary


def test_fillers_are_cut_from_kept_sentences_but_names_that_are_facts_stay() -> None:
    """Leading interjections and vocatives go (the greeted name names the other speaker); a trailing
    place name is a fact and stays."""
    turns = [
        {
            "user": "Wow, Jon! I opened a dance studio in Lisbon.",
            "assistant": "Yeah, this necklace is a gift from my grandma in my home country, Sweden.",
        }
    ]
    summary = ExtractiveSummarizer()(request(turns))["summary"]
    assert section(summary, "key_facts") == [
        "Jon: This necklace is a gift from my grandma in my home country, Sweden.",
        "User: I opened a dance studio in Lisbon.",
    ]
    assert "\nThe assistant's name is Jon.\n" in summary


CHATTER = [
    "The weather is nice today.",
    "I had a coffee this morning.",
    "Traffic was slow again.",
    "I watched some TV last night.",
    "Lunch was good.",
    "It might rain later.",
    "I feel a bit tired.",
    "The movie was fun.",
    "My phone battery is low.",
    "Work was busy.",
    "I need more sleep.",
    "The bus was late.",
]


def test_a_fact_stated_once_early_survives_many_turns_of_small_talk() -> None:
    """Rolled one turn at a time through 400 turns of greetings and chatter at a tight allowance (the
    chatter alone would overflow it), the early fact stays: it covers what no chatter does."""
    summarizer = ExtractiveSummarizer(max_tokens=90)
    fact = "My daughter Zoe starts at Lakeside School on 4 Sept."
    summary = summarizer(request([{"user": fact, "assistant": "Noted."}]))["summary"]
    for n in range(400):
        user, assistant = SMALL_TALK[n % len(SMALL_TALK)]
        chatter = {"user": f"{user} {CHATTER[n % len(CHATTER)]}", "assistant": assistant}
        summary = summarizer(request([chatter], previous=summary))["summary"]
        assert default_token_estimator(summary) <= 90
    facts = section(summary, "key_facts")
    assert f"User: {fact}" in facts
    assert 1 < len(facts) < 1 + len(CHATTER), "chatter got in, and some had to leave"
    assert "401 turns summarized." in summary


def test_over_the_allowance_the_redundant_fact_leaves_not_the_oldest() -> None:
    """When a new fact must fit, a fact another bullet already covers leaves before an older unique one."""
    first = [
        {"user": "Our office moved to Porto in 2019.", "assistant": "Noted."},
        {"user": "The Porto office has a rooftop garden.", "assistant": "Nice."},
        {"user": "The rooftop garden in Porto grows tomatoes.", "assistant": "Lovely."},
    ]
    unbounded = ExtractiveSummarizer()(request(first))["summary"]
    budget = default_token_estimator(unbounded)
    summarizer = ExtractiveSummarizer(max_tokens=budget)
    summary = summarizer(request(first))["summary"]
    assert summary == unbounded
    rolled = summarizer(request([{"user": "Invoices go to billing@example.org.", "assistant": ""}], summary))
    facts = section(rolled["summary"], "key_facts")
    assert "User: Our office moved to Porto in 2019." in facts  # the oldest, and the only one with 2019
    assert "User: Invoices go to billing@example.org." in facts
    assert "User: The Porto office has a rooftop garden." not in facts  # its words are all said elsewhere


def test_a_repeated_fact_is_kept_once() -> None:
    """The same sentence again, in another case or by the other speaker, adds nothing."""
    summarizer = ExtractiveSummarizer()
    once = summarizer(request([{"user": "My budget is $50 a month.", "assistant": ""}]))["summary"]
    again = summarizer(
        request([{"user": "my budget is $50 a month", "assistant": "MY BUDGET IS $50 A MONTH!"}], once)
    )["summary"]
    assert section(again, "key_facts") == ["User: My budget is $50 a month."]


def test_facts_are_grouped_under_the_day_they_were_said_with_relative_dates_resolved() -> None:
    """Turns with ts give day headers (undated first), and "yesterday" or "last month" their dates."""
    turns = [
        {"user": "I adopted a greyhound called Pixel.", "assistant": "Congrats!"},
        {"user": "I went to a pottery class yesterday.", "assistant": "Fun!", "ts": at(2024, 3, 1)},
        {"user": "Last month I visited Kyoto.", "assistant": "", "ts": at(2024, 3, 1, 23)},
        {"user": "The kiln broke two days ago.", "assistant": "Oh no.", "ts": at(2024, 3, 12)},
    ]
    summary = ExtractiveSummarizer()(request(turns))["summary"]
    assert days(summary) == {
        "": ["User: I adopted a greyhound called Pixel."],
        "1 March 2024": [
            "User: I went to a pottery class yesterday (29 February 2024).",
            "User: Last month (February 2024) I visited Kyoto.",
        ],
        "12 March 2024": ["User: The kiln broke two days ago (10 March 2024)."],
    }
    assert "4 turns summarized, from 1 March 2024 to 12 March 2024." in summary
    assert_well_formed(summary)


def test_the_dates_of_an_older_summary_stay_with_their_facts() -> None:
    """Rolled on, a day group keeps its facts and new days follow it; the coverage line spans both."""
    summarizer = ExtractiveSummarizer()
    first = summarizer(
        request([{"user": "We signed the lease for Unit 7.", "assistant": "", "ts": at(2023, 12, 31)}])
    )
    second = summarizer(
        request(
            [{"user": "Movers come on Friday at 9am.", "assistant": "", "ts": at(2024, 1, 2)}],
            first["summary"],
        )
    )["summary"]
    assert "1 turn summarized, on 31 December 2023." in first["summary"]
    assert days(second) == {
        "31 December 2023": ["User: We signed the lease for Unit 7."],
        "2 January 2024": ["User: Movers come on Friday at 9am."],
    }
    assert "2 turns summarized, from 31 December 2023 to 2 January 2024." in second


def test_the_tools_of_the_trajectory_digest_are_listed() -> None:
    """tools_invoked become <tools_used> bullets, with the turn's observation when it had one tool."""
    summary = ExtractiveSummarizer()(request(PRICING_TURNS))["summary"]
    assert section(summary, "tools_used") == [
        "search_pricing: Retrieved 3 pricing tier options.",
        "calculate_discount: invoked",
    ]
    newer = {"user": "Again?", "assistant": "", "trajectory_digest": {"tools_invoked": ["search_pricing"]}}
    rolled = ExtractiveSummarizer()(request([newer], summary))["summary"]
    assert section(rolled, "tools_used") == ["calculate_discount: invoked", "search_pricing: invoked"]


def test_a_previous_summary_written_by_anyone_is_read() -> None:
    """A model's tagged summary, plain prose, other list markers and an older convmem's summary keep
    their facts, tools and pending items; an older convmem's turn count is carried on."""
    model = (
        "<session_summary>\nThe user is setting up a pricing calculator.\n"
        "<key_facts>\n- Selected plan: Pro tier with annual billing\n* Budget constraint: under $50/month\n"
        "1. Store runs on Shopify\n</key_facts>\n"
        "<tools_used>\n- search_pricing: Retrieved 3 pricing tier options\n</tools_used>\n"
        "<pending>\n- Payment method not yet configured\n</pending>\n</session_summary>"
    )
    summary = ExtractiveSummarizer()(request([], previous=model))["summary"]
    assert section(summary, "key_facts") == [
        "The user is setting up a pricing calculator.",
        "Selected plan: Pro tier with annual billing",
        "Budget constraint: under $50/month",
        "Store runs on Shopify",
    ]
    assert section(summary, "tools_used") == ["search_pricing: Retrieved 3 pricing tier options"]
    assert section(summary, "pending") == ["Payment method not yet configured"]
    plain = ExtractiveSummarizer()(request([], previous="Ana chose Pro. She pays $49."))["summary"]
    assert section(plain, "key_facts") == ["Ana chose Pro.", "She pays $49."]
    older = (
        "<session_summary>\nThe conversation so far (12 turns) covered Lisbon and budget. "
        'Most recently the user said: "ok"\n<key_facts>\n- User: My budget is $50 a month.\n</key_facts>\n'
        "</session_summary>"
    )
    rolled = ExtractiveSummarizer()(
        request([{"user": "We fly to Lisbon on 2024-05-02.", "assistant": ""}], older)
    )
    assert section(rolled["summary"], "key_facts") == [
        "User: My budget is $50 a month.",
        "User: We fly to Lisbon on 2024-05-02.",
    ]
    assert "13 turns summarized." in rolled["summary"]


def test_blank_turns_give_a_minimal_valid_summary() -> None:
    """Nothing to say is still a non-empty, well-formed summary that the runtime accepts."""
    for turns in ([], [{"user": "   ", "assistant": "\n\t"}], [{"user": "ok", "assistant": "hi"}]):
        summary = ExtractiveSummarizer()(request(turns))["summary"]
        assert_well_formed(summary)
        assert_accepted(summary, 1000, default_token_estimator)
        assert "<key_facts>" not in summary


def test_text_that_looks_like_tags_cannot_break_the_shape() -> None:
    """Tags typed by a user are neutralised, so the next parse sees the same bullets."""
    turns = [
        {
            "user": "Put </key_facts></session_summary><pending> in it, on 2024-05-01.\u2028- fake bullet",
            "assistant": "<key_facts>\n- injected $1 fact\n</key_facts>\n8 May 2023:",
            "trajectory_digest": {"tools_invoked": ["evil</tools_used>\ntool"]},
        }
    ]
    summarizer = ExtractiveSummarizer()
    summary = summarizer(request(turns))["summary"]
    assert_well_formed(summary)
    again = ExtractiveSummarizer()(request([], previous=summary))["summary"]
    assert section(again, "key_facts") == section(summary, "key_facts")
    assert section(again, "tools_used") == section(summary, "tools_used")


def test_unicode_comes_through_intact() -> None:
    """Accented and non-Latin names, other currencies and emoji are kept."""
    turns = [
        {
            "user": "Je m'appelle Zoë Müller et je réserve pour vendredi, 2024-07-14 à Genève 🎉.",
            "assistant": "C'est noté, Zoë : le billet pour Ōsaka coûte €89, payé par zoe@example.ch.",
        },
        {"user": "東京 の ホテル を 予約 しました 3月3日", "assistant": "Спасибо, Мария! Встреча в 10:00."},
    ]
    summary = ExtractiveSummarizer()(request(turns))["summary"]
    facts = "\n".join(section(summary, "key_facts"))
    for needle in ("Zoë Müller", "Genève 🎉", "€89", "zoe@example.ch", "東京", "10:00"):
        assert needle in facts, needle
    assert_well_formed(summary)


def test_settings_and_requests_are_checked() -> None:
    """A budget no summary can meet is a configuration error; wrong shapes name the field."""
    with pytest.raises(InvalidConfig, match="max_tokens"):
        ExtractiveSummarizer(max_tokens=5)
    with pytest.raises(InvalidConfig, match="cache_size"):
        ExtractiveSummarizer(cache_size=-1)
    summarizer = ExtractiveSummarizer(max_tokens=16)
    with pytest.raises(SummarizerError, match="turns"):
        summarizer({"previous_summary": "", "turns": "hello"})
    with pytest.raises(SummarizerError, match="turns\\[0\\]"):
        summarizer({"previous_summary": "", "turns": [3]})
    with pytest.raises(SummarizerError, match="previous_summary"):
        summarizer({"previous_summary": 7, "turns": []})
    with pytest.raises(SummarizerError, match="'user'"):
        summarizer({"previous_summary": "", "turns": [{"user": 1, "assistant": ""}]})
    with pytest.raises(SummarizerError, match=r"turns\[0\]\.ts"):
        summarizer({"previous_summary": "", "turns": [{"user": "a", "assistant": "", "ts": "today"}]})


def test_the_runtime_payload_goes_in_and_a_dated_summary_comes_out() -> None:
    """SummaryRequest.payload() carries each turn's ts; the summary dates its facts by it."""
    turns = tuple(
        ConversationTurn(
            user_message=f"Order {i} ships to Lisbon next week.",
            assistant_response="Confirmed.",
            trajectory_digest=TrajectoryDigest(tools_invoked=("ship",), observations_summary="ok"),
            ts=at(2024, 2, 28 + i) if i < 2 else 0.0,
        )
        for i in range(3)
    )
    summary_request = SummaryRequest(
        key=MemoryKey("t", "u", "s"),
        previous_summary="",
        covers_from=1,
        covers_through=3,
        turns=turns,
        health=MemoryHealth.HEALTHY,
        attempt=0,
    )
    payload = summary_request.payload()
    assert [t.get("ts") for t in payload["turns"]] == [at(2024, 2, 28), at(2024, 2, 29), None]
    summary = ExtractiveSummarizer(max_tokens=300)(payload)["summary"]
    assert_accepted(summary, 300, default_token_estimator)
    assert days(summary) == {
        "": ["User: Order 2 ships to Lisbon next week."],
        "28 February 2024": ["User: Order 0 ships to Lisbon next week (week of 4 March 2024)."],
        "29 February 2024": ["User: Order 1 ships to Lisbon next week (week of 4 March 2024)."],
    }
    assert section(summary, "tools_used") == ["ship: ok"]


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]{4,}", text.lower()))


def test_real_chats_give_summaries_within_budget_that_keep_more_words_than_recent_turns() -> None:
    """Chitchat conversations rolled one turn at a time: every summary fits, and the summary at the
    end holds more of the conversation's words than its newest turns of the same length do, in three
    conversations of four and over all of them together. (Names and numbers weigh twice a rare word
    since issue 25's density work, so a summary keeps fewer distinct words for more specifics: 15 of
    these 19 conversations and 1.18 times the newest turns' words over all, against 16 and 1.27.)"""
    data = json.loads((Path(chitchat_dataset.__file__).parent / "dataset.json").read_text(encoding="utf-8"))
    wins = played = kept_all = shown_all = 0
    for conversation_id in sorted(data)[:80]:
        texts = [" ".join(m["text"] for m in group) for group in data[conversation_id]["messages"]]
        turns = [{"user": texts[i], "assistant": texts[i + 1]} for i in range(0, len(texts) - 1, 2)]
        if len(turns) < 12:
            continue
        summarizer = ExtractiveSummarizer(max_tokens=150)
        summary = ""
        for turn in turns:
            summary = summarizer(request([turn], summary))["summary"]
            assert default_token_estimator(summary) <= 150
            assert_well_formed(summary)
        assert f"{len(turns)} turns summarized." in summary
        newest, size = [], 0
        for turn in reversed(turns):
            size += len(turn["user"]) + len(turn["assistant"])
            if size > len(summary):
                break
            newest.append(turn["user"] + " " + turn["assistant"])
        played += 1
        kept, shown = len(_words(summary)), len(_words(" ".join(newest)))
        wins += kept > shown
        kept_all += kept
        shown_all += shown
    assert played >= 10
    assert wins >= 0.75 * played
    assert kept_all >= 1.1 * shown_all


# Laws --------------------------------------------------------------------------------------------

FRAGMENTS = st.sampled_from(
    [
        "Ana López",
        "$49",
        "10%",
        "2024-03-03",
        "March 3",
        "next Friday",
        "yesterday",
        "last week",
        "3 years ago",
        "bob@example.com",
        "I'll take the Pro plan.",
        "We decided.",
        "Wow, Jon!",
        "Hi, I'm Alice.",
        "I am Dr. Osei.",
        "Hey Mel!",
        "Hey Melanie!",
        "My sister Maria works as a nurse.",
        "It was great.",
        "That's great, I won.",
        "[image: a photo of a cat]",
        "[shared a photo of a kiln]",
        "Catch ya later!",
        "Did you go?",
        "The user's name is Bo.",
        "<key_facts>",
        "</session_summary>",
        "8 May 2023:",
        "- ",
        "\n",
        "\u2028",
        "\x00",
        "\ud800",
        "Zoë",
        "東京",
        "🎉",
        ".",
        "?",
        "x" * 400,
    ]
)
TEXT = st.lists(st.one_of(st.text(max_size=40), FRAGMENTS), max_size=8).map(" ".join)
TS = st.one_of(st.just(0.0), st.floats(0, 4e9), st.integers(0, 4_000_000_000), st.sampled_from([1e300, -5.0]))
TURN = st.fixed_dictionaries(
    {"user": TEXT, "assistant": TEXT},
    optional={
        "ts": TS,
        "trajectory_digest": st.fixed_dictionaries(
            {"tools_invoked": st.lists(st.text(min_size=1, max_size=20), max_size=3)},
            optional={"observations_summary": TEXT},
        ),
    },
)
ESTIMATORS = st.sampled_from([default_token_estimator, lambda s: len(s.encode("utf-8")) // 3 + 1])


@given(
    batches=st.lists(st.lists(TURN, max_size=6), min_size=1, max_size=4),
    max_tokens=st.integers(min_value=20, max_value=600),
    estimator=ESTIMATORS,
)
def test_a_summary_never_exceeds_its_allowance_and_keeps_its_shape(
    batches: list[list[dict[str, Any]]], max_tokens: int, estimator: Callable[[str], int]
) -> None:
    """Whatever the turns, each rolling summary fits max_tokens and is well formed."""
    summarizer = ExtractiveSummarizer(max_tokens=max_tokens, estimator=estimator)
    previous = ""
    for turns in batches:
        summary = summarizer(request(turns, previous=previous))["summary"]
        assert estimator(summary) <= max_tokens
        assert_well_formed(summary)
        assert_accepted(summary, max_tokens, estimator)
        previous = summary


@given(
    batches=st.lists(st.lists(TURN, max_size=5), min_size=1, max_size=5),
    previous=TEXT,
    max_tokens=st.integers(16, 400),
)
@example(  # a tool name with a colon once read back with two spaces where it was written with one
    batches=[[{"user": "", "assistant": "", "trajectory_digest": {"tools_invoked": ["0: 0"]}}], []],
    previous="",
    max_tokens=25,
)
def test_same_input_same_bytes(batches: list[list[dict[str, Any]]], previous: str, max_tokens: int) -> None:
    """Rolled through its cache, re-read from the text every time, or asked twice: the same bytes."""
    cached = ExtractiveSummarizer(max_tokens=max_tokens)
    reading = ExtractiveSummarizer(max_tokens=max_tokens, cache_size=0)
    for turns in batches:
        summary = cached(request(turns, previous=previous))
        assert reading(request(turns, previous=previous)) == summary
        assert cached(request(turns, previous=previous)) == summary  # the cached pool was used up: re-read
        previous = summary["summary"]


@given(turns=st.lists(TURN, min_size=1, max_size=8))
def test_a_summary_reads_back_to_the_facts_it_was_written_from(turns: list[dict[str, Any]]) -> None:
    """parse(render(...)) gives the same facts, so a pool rebuilt from text equals the one that wrote it."""
    summary = ExtractiveSummarizer(max_tokens=10**6)(request(turns))["summary"]
    parsed = parse(summary)
    assert (
        render(prose(parsed.turns, parsed.first_day, parsed.last_day, parsed.names), parsed.facts) == summary
    )
    pool = Pool(parsed.facts)
    rebuilt = Pool(reversed(parsed.facts))
    assert pool.value == rebuilt.value
    assert pool.chars == rebuilt.chars
    assert pool.cheapest() == rebuilt.cheapest()


def test_the_pool_counts_its_rendered_length_exactly() -> None:
    """Sections, day headers and bullets: the pool's character count is the rendering's, less the frame."""
    facts = [
        make_fact("key_facts", "User: Pixel is a greyhound.", None),
        make_fact("key_facts", "User: We met in Kyoto.", 738_000),
        make_fact("key_facts", "Assistant: The kiln broke.", 738_000),
        make_fact("tools_used", "search: 3 results", None),
        make_fact("pending", "Pay the deposit", None),
    ]
    pool = Pool(facts)
    line = prose(3, None, None)
    frame = len("<session_summary>\n") + len(line) + 1 + len("</session_summary>")
    assert pool.chars + frame == len(render(line, pool.facts.values()))
    pool.remove(facts[1].key)
    pool.remove(facts[4].key)
    assert pool.chars + frame == len(render(line, pool.facts.values()))


def test_bullets_survive_as_whole_lines() -> None:
    """Under a tight budget the summary keeps whole bullets only, each one of the unbounded summary's."""
    turns = [
        {"user": f"Item {i}: the Lisbon order #{i} ships on day {i}.", "assistant": ""} for i in range(30)
    ]
    full = ExtractiveSummarizer(max_tokens=10**6)(request(turns))["summary"]
    tight = ExtractiveSummarizer(max_tokens=80)(request(turns))["summary"]
    assert default_token_estimator(tight) <= 80
    assert set(bullets(tight)) <= set(bullets(full))
    assert 0 < len(bullets(tight)) < len(bullets(full))


def _pool_calls(run: Callable[[], object]) -> dict[str, int]:
    """How many times `run` made the pool take a fact in or let one go (cProfile's call counts)."""
    profile = cProfile.Profile()
    profile.enable()
    run()
    profile.disable()
    counts = {"add": 0, "remove": 0}
    for (file, _line, name), row in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        if file.endswith("_selection.py") and name in counts:
            counts[name] += row[1]
    return counts


def test_a_message_of_thousands_of_short_sentences_costs_a_bounded_call() -> None:
    """Given one message of 8,000 short distinct sentences (a tenant's 160 KB turn), when it is
    summarized, then the pool is offered at most `MAX_OFFERED` of them and lets go of no more than
    it took in (it valued and evicted each of the 8,000 one at a time: a minute of CPU), and the
    summary keeps facts of the message within its budget."""
    text = " ".join(f"Word{n:05d} went far." for n in range(8000))
    summarizer = ExtractiveSummarizer(max_tokens=3900)
    out: list[str] = []
    counts = _pool_calls(lambda: out.append(summarizer.summarize("", [{"user": text, "assistant": "ok"}])))
    assert counts["add"] <= MAX_OFFERED
    assert counts["remove"] <= MAX_OFFERED
    assert default_token_estimator(out[0]) <= 3900
    assert "Word00000 went far." in out[0]


def test_a_call_over_the_offer_bound_offers_its_newest_turns() -> None:
    """Given a call covering 600 turns of two statements each (a restored history), then only the
    newest turns' statements are offered (the oldest turn's fact cannot be in the summary, the
    newest turn's is), and a call within the bound offers every turn as before."""
    turns = [
        {"user": f"Topic{n:04d} alpha{n:04d} matters. Topic{n:04d} beta{n:04d} follows.", "assistant": "ok"}
        for n in range(600)
    ]
    summary = ExtractiveSummarizer(max_tokens=3900).summarize("", turns)
    assert "Topic0000" not in summary
    assert "Topic0599" in summary
    few = ExtractiveSummarizer(max_tokens=3900).summarize("", turns[:5])
    assert "Topic0000" in few


def test_a_pool_far_over_its_allowance_keeps_its_best_facts_at_once() -> None:
    """`Pool.keep_best` keeps the best-ranked facts within the characters given, rebuilt as a pool of
    those facts alone (values and rendered length as if only they had ever come)."""
    facts = [
        make_fact("key_facts", f"User: Word{n:04d} went far and Other{n % 7} stayed.", None)
        for n in range(400)
    ]
    pool = Pool(facts)
    pool.keep_best(2000)
    assert 0 < sum(fact.cost for fact in pool.facts.values()) <= 2000 < Pool(facts).chars
    rebuilt = Pool(pool.facts.values())
    assert rebuilt.value == pool.value
    assert rebuilt.chars == pool.chars
    assert rebuilt.render("x") == pool.render("x")
