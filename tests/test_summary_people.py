"""The extractive summarizer keeps who people are, names the speakers, and prefers statements.

Issue 25, item 3: each rule given / when / then, on the smallest conversation that shows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from summaries import assert_well_formed, days, request, section

from convmem.adapters import ExtractiveSummarizer, recommended
from convmem.adapters.backends.summarizers._text import label_of
from convmem.adapters.frontends.cli._common import CliError
from convmem.adapters.frontends.cli._serve import load_config
from convmem.errors import InvalidConfig, SummarizerError
from convmem.events import ConversationTurn, MemoryBudget, MemoryKey, ShortTermMemoryConfig
from convmem.projections import AddTurn, SessionState, decide, evolve, summary_due


def summarize(turns: list[dict[str, Any]], **settings: Any) -> str:
    summary: str = ExtractiveSummarizer(**settings)(request(turns))["summary"]
    assert_well_formed(summary)
    return summary


# Who people are -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("said", "name", "fact"),
    [
        ("Hi, I'm Alice.", "Alice", "Alice: I'm Alice."),
        ("I'm Alice.", "Alice", "Alice: I'm Alice."),
        ("I am Ada.", "Ada", "Ada: I am Ada."),
        ("I am Dr. Osei.", "Dr. Osei", "Dr. Osei: I am Dr. Osei."),
        ("My name is Kofi Mensah.", "Kofi Mensah", "Kofi Mensah: My name is Kofi Mensah."),
    ],
)
def test_a_self_introduction_is_kept_and_names_its_speaker(said: str, name: str, fact: str) -> None:
    """Given a user who introduces themself (one short sentence, one content word), when summarized,
    then the introduction is a fact, written under their name, and the summary says who the user is."""
    summary = summarize([{"user": said, "assistant": "Noted."}])
    assert section(summary, "key_facts") == [fact]
    assert f"\nThe user's name is {name}.\n" in summary


@pytest.mark.parametrize(
    "said",
    ["I work as a nurse.", "My sister Maria.", "I'm a welder.", "I am from Accra.", "I'm 34 years old."],
)
def test_roles_relationships_origins_and_ages_are_facts_however_short(said: str) -> None:
    """Given a sentence that says who someone is with a single content word, then it is kept (any other
    one-word sentence, "Confirmed.", is not)."""
    summary = summarize([{"user": said, "assistant": "Confirmed."}])
    assert section(summary, "key_facts") == [f"User: {said}"]


def test_who_someone_is_outlasts_a_richer_sentence_of_the_same_value() -> None:
    """Given a tight allowance and a role beside a longer statement, when one must go, the statement
    goes: who someone is stays before facts of equal value."""
    turns = [{"user": "I work as a welder in Tema. Parcels ship via Kumasi depots weekly.", "assistant": ""}]
    full = section(summarize(turns, max_tokens=1000), "key_facts")
    assert len(full) == 2
    tight = section(summarize(turns, max_tokens=30), "key_facts")
    assert tight == ["User: I work as a welder in Tema."]


# Speakers named ------------------------------------------------------------------------------


def test_the_speaker_names_setting_labels_every_fact() -> None:
    """Given speaker_names, then every fact is written under its speaker's name, never "User:"."""
    turns = [
        {"user": "I adopted a greyhound named Pixel.", "assistant": "I booked the Lisbon flight for Friday."}
    ]
    summary = summarize(turns, speaker_names={"user": "Ana", "assistant": "Bo"})
    assert section(summary, "key_facts") == [
        "Ana: I adopted a greyhound named Pixel.",
        "Bo: I booked the Lisbon flight for Friday.",
    ]
    assert "The user's name is Ana.\nThe assistant's name is Bo.\n" in summary


def test_the_request_names_win_over_the_summarizer_setting_and_a_learned_name() -> None:
    """Given a name in the summarizer, another learned from the talk, and one in the request (the
    session's config), then the request's name is used."""
    summarizer = ExtractiveSummarizer(speaker_names={"user": "Ana"})
    turns = [{"user": "I'm Carla. I restore old kilns.", "assistant": ""}]
    asked = {**request(turns), "speaker_names": {"user": "Dora"}}
    assert section(summarizer(asked)["summary"], "key_facts") == [
        "Dora: I'm Carla.",
        "Dora: I restore old kilns.",
    ]
    assert section(summarizer(request(turns))["summary"], "key_facts")[1] == "Ana: I restore old kilns."


def test_the_session_config_carries_speaker_names_to_the_summarizer() -> None:
    """Given a session configured with speaker_names (here through recommended()), when its summary is
    due, then the request's payload carries them and the summary names the speakers."""
    setup = recommended(300, worker_process=False, speaker_names={"user": "Ana", "assistant": "Bo"})
    config = setup.config
    state, key = SessionState(), MemoryKey("t", "u", "s")
    for n in range(5):
        turn = ConversationTurn(
            user_message=f"I planted {n + 2} lemon trees in Faro.", assistant_response="Noted."
        )
        for event in decide(
            state, AddTurn(turn=turn), now=1.0 + n, command_id=f"t{n}", key=key, config=config
        ):
            state = evolve(state, event)
    due = summary_due(state, 10.0)
    assert due is not None
    payload = due.payload()
    assert payload["speaker_names"] == {"user": "Ana", "assistant": "Bo"}
    assert section(setup.summarizer(payload)["summary"], "key_facts")[0].startswith("Ana: I planted")
    plain = ShortTermMemoryConfig(strategy="rolling_summary", budget=MemoryBudget(full_zone_turns=1))
    assert "speaker_names" not in _due(plain).payload()  # unset: the payload is PenguiFlow's own


def test_a_serve_config_file_sets_speaker_names_and_a_bad_one_names_the_field(tmp_path: Path) -> None:
    """Given a `convmem serve --config` file with speaker_names, then the session config has them; given
    a bad role, then the error names the file and the field."""
    good = tmp_path / "good.json"
    good.write_text('{"strategy": "rolling_summary", "speaker_names": {"user": "Ana"}}', encoding="utf-8")
    assert load_config(good).speaker_names == {"user": "Ana"}
    bad = tmp_path / "bad.json"
    bad.write_text('{"speaker_names": {"bot": "Ana"}}', encoding="utf-8")
    with pytest.raises(CliError, match="speaker_names"):
        load_config(bad)


def _due(config: ShortTermMemoryConfig) -> Any:
    state, key = SessionState(), MemoryKey("t", "u", "s")
    for n in range(3):
        turn = ConversationTurn(user_message=f"turn {n}", assistant_response="ok")
        for event in decide(
            state, AddTurn(turn=turn), now=1.0 + n, command_id=f"t{n}", key=key, config=config
        ):
            state = evolve(state, event)
    return summary_due(state, 10.0)


@pytest.mark.parametrize(
    "names",
    [{"bot": "X"}, {"user": ""}, {"user": "a:b"}, {"user": "x" * 41}, {"user": 7}, {"user": "two\nlines"}],
)
def test_bad_speaker_names_are_refused_where_they_are_given(names: dict[str, Any]) -> None:
    """Given a malformed speaker_names, then the config and the summarizer refuse it with a typed error
    naming the setting, and a request carrying it fails as a summarizer error."""
    with pytest.raises(InvalidConfig, match="speaker_names"):
        ShortTermMemoryConfig(speaker_names=names)
    if names not in ({"user": "a:b"}, {"user": "two\nlines"}):  # the summarizer cleans those
        with pytest.raises(InvalidConfig, match="speaker_names"):
            ExtractiveSummarizer(speaker_names=names)
        with pytest.raises(SummarizerError, match="speaker_names"):
            ExtractiveSummarizer()({**request([]), "speaker_names": names})


def test_a_greeting_names_the_other_speaker_and_a_fuller_form_replaces_a_short_one() -> None:
    """Given "Hey Mel!" from the user, then the assistant is Mel; given "Hi Melanie!" later, Melanie."""
    summarizer = ExtractiveSummarizer()
    first = summarizer(
        request([{"user": "Hey Mel! I painted a lake at dawn.", "assistant": "I ran a 5k race."}])
    )
    assert section(first["summary"], "key_facts") == [
        "Mel: I ran a 5k race.",
        "User: I painted a lake at dawn.",
    ]
    second = summarizer(
        request([{"user": "Hi Melanie! My pottery class starts in June.", "assistant": ""}], first["summary"])
    )
    assert "The assistant's name is Melanie." in second["summary"]
    assert "Melanie: I ran a 5k race." in section(second["summary"], "key_facts")


def test_facts_written_before_a_name_was_known_take_the_name() -> None:
    """Given a summary of "User:" facts, when the user introduces themself, then the older facts are
    relabelled: no line says "User:" once the name is known."""
    summarizer = ExtractiveSummarizer(cache_size=0)  # the older summary is read back from its text
    before = summarizer(request([{"user": "I restore kilns in Porto.", "assistant": ""}]))["summary"]
    assert section(before, "key_facts") == ["User: I restore kilns in Porto."]
    after = summarizer(request([{"user": "By the way, I'm Ines.", "assistant": ""}], before))["summary"]
    assert section(after, "key_facts") == ["Ines: I restore kilns in Porto.", "Ines: By the way, I'm Ines."]


def test_a_name_is_not_read_from_what_only_looks_like_one() -> None:
    """Given "I'm Sure", "I'm Canadian", "I am Dr. Osei's patient" and "Hello World", then no name."""
    summary = summarize(
        [
            {
                "user": "I'm Sure. I'm Canadian. I am Dr. Osei's patient.",
                "assistant": "Hello World! Kiln fired.",
            },
        ]
    )
    assert "name is" not in summary


# Statements first ----------------------------------------------------------------------------


def test_a_photo_caption_is_taken_out_of_the_sentence_and_gives_way_to_statements() -> None:
    """Given a message with a shared photo, then its statement is kept without the caption, and the
    caption is its own, marked fact; under a tight allowance the statement stays and the caption goes."""
    turns = [
        {
            "user": "I finished the mural on Elm Street. [image: a photo of a mural with sunflowers]",
            "assistant": "",
        }
    ]
    full = section(summarize(turns), "key_facts")
    assert full == [
        "User: I finished the mural on Elm Street.",
        "User: [image: a mural with sunflowers]",
    ]
    assert section(summarize(turns, max_tokens=35), "key_facts") == [
        "User: I finished the mural on Elm Street."
    ]
    shared = summarize([{"user": "[shared a photo of a blue kayak] Ready for Sunday.", "assistant": ""}])
    assert section(shared, "key_facts") == ["User: Ready for Sunday.", "User: [image: a blue kayak]"]


@pytest.mark.parametrize(
    "said",
    [
        "Catch ya later!",
        "Woo, Dave!",
        "Have a great weekend!",
        "That's awesome!",
        "Take care, Mel!",
        "See you soon!",
    ],
)
def test_pleasantries_and_sign_offs_leave_no_fact(said: str) -> None:
    """Given only a pleasantry or a sign-off, then there is no fact."""
    assert section(summarize([{"user": said, "assistant": said}]), "key_facts") == []


def test_a_bare_question_gives_way_to_a_statement() -> None:
    """Given a question and a statement of equal content, when only one fits, then the statement stays."""
    turns = [
        {
            "user": "Did the Porto ferry leave from Ribeira pier?",
            "assistant": "The Lagos ferry left from Bensafrim pier.",
        }
    ]
    assert len(section(summarize(turns), "key_facts")) == 2
    assert section(summarize(turns, max_tokens=35), "key_facts") == [
        "Assistant: The Lagos ferry left from Bensafrim pier."
    ]


# Sentences that point back -------------------------------------------------------------------


def test_a_sentence_that_points_back_is_kept_with_its_predecessor() -> None:
    """Given "I adopted a puppy. She is a corgi named Biscuit.", then both make one fact."""
    summary = summarize(
        [
            {
                "user": "I adopted a puppy. She is a corgi named Biscuit. Tomorrow I fly to Oslo.",
                "assistant": "",
            }
        ]
    )
    assert section(summary, "key_facts") == [
        "User: I adopted a puppy. She is a corgi named Biscuit.",
        "User: Tomorrow I fly to Oslo.",
    ]


def test_a_sentence_that_points_back_at_nothing_kept_is_dropped() -> None:
    """Given a message that opens with "It was..." (its antecedent was the other speaker's), then it is
    not a fact; "That's great, I won..." keeps what follows the reaction."""
    summary = summarize(
        [
            {
                "user": "It was a huge gala at the Ritz.",
                "assistant": "That's great, I won the chess cup in Riga.",
            }
        ]
    )
    assert section(summary, "key_facts") == ["Assistant: I won the chess cup in Riga."]


# Grouped by person ---------------------------------------------------------------------------


def test_facts_of_a_day_are_grouped_by_speaker() -> None:
    """Given two speakers taking turns on one day, then each speaker's facts of that day sit together."""
    turns = [
        {"user": "I paint murals in Lyon.", "assistant": "I teach cello in Graz.", "ts": 1_683_540_000},
        {"user": "I volunteer at a shelter.", "assistant": "I run trail marathons.", "ts": 1_683_540_000},
    ]
    by_day = days(summarize(turns, speaker_names={"user": "Ana", "assistant": "Bo"}))
    assert by_day == {
        "8 May 2023": [
            "Ana: I paint murals in Lyon.",
            "Ana: I volunteer at a shelter.",
            "Bo: I teach cello in Graz.",
            "Bo: I run trail marathons.",
        ]
    }


# Laws ----------------------------------------------------------------------------------------

PIECES = st.sampled_from(
    [
        "Hi, I'm Alice.",
        "I am Dr. Osei.",
        "Hey Mel!",
        "Hi Melanie!",
        "My sister Maria works as a nurse in Accra.",
        "I adopted a puppy.",
        "She is a corgi named Biscuit.",
        "It was a huge gala at the Ritz.",
        "That's great, I won the chess cup in Riga.",
        "[image: a photo of a cat on a red sofa]",
        "[shared a photo of a kiln]",
        "Catch ya later!",
        "Did the Porto ferry leave from Ribeira pier?",
        "I restore kilns in Porto.",
        "The user's name is Bo.",
    ]
)
SAID = st.lists(PIECES, max_size=4).map(" ".join)
PEOPLE_TURN = st.fixed_dictionaries(
    {"user": SAID, "assistant": SAID}, optional={"ts": st.sampled_from([1_683_540_000, 1_684_540_000])}
)


@given(
    batches=st.lists(st.lists(PEOPLE_TURN, max_size=4), min_size=1, max_size=4),
    max_tokens=st.integers(40, 400),
    names=st.sampled_from([None, {"user": "Ana"}, {"assistant": "Bo", "user": "Ana"}]),
)
def test_names_and_groups_are_the_same_bytes_however_the_summary_is_reached(
    batches: list[list[dict[str, Any]]], max_tokens: int, names: dict[str, str] | None
) -> None:
    """Given any conversation of introductions, greetings, captions and leaning sentences, rolled in
    batches: the cached pool and one read back from the text give the same bytes, each speaker's facts
    of a day sit together, and once a speaker is named no fact of theirs says "User:"/"Assistant:"."""
    cached = ExtractiveSummarizer(max_tokens=max_tokens)
    reading = ExtractiveSummarizer(max_tokens=max_tokens, cache_size=0)
    previous = ""
    for turns in batches:
        asked = {**request(turns, previous), **({"speaker_names": names} if names else {})}
        summary = cached(asked)
        assert reading(asked) == summary
        previous = summary["summary"]
        assert_well_formed(previous)
        for facts in days(previous).values():
            labels = [label_of(fact) for fact in facts]
            runs = [label for i, label in enumerate(labels) if i == 0 or labels[i - 1] != label]
            assert len(runs) == len(set(runs)), labels  # each speaker's facts of a day: one run
        prose = previous.split("\n<", 1)[0]  # the lines before the first section
        for role, default in (("user", "User"), ("assistant", "Assistant")):
            if f"\nThe {role}'s name is " in prose:
                assert not any(fact.startswith(f"{default}: ") for fact in section(previous, "key_facts"))


def test_two_speakers_given_one_name_keep_one_order_however_the_summary_is_reached() -> None:
    """Given facts of both speakers written under "User"/"Assistant", when both introduce themselves
    with one name, then the relabelled facts come out in the same order from the cache and the text."""
    first = [{"user": "0\t1", "assistant": "0 00"}]
    second = [{"user": "", "assistant": "I'm Ab"}, {"user": "I'm Ab", "assistant": ""}]
    cached = ExtractiveSummarizer(max_tokens=42)
    reading = ExtractiveSummarizer(max_tokens=42, cache_size=0)
    previous = cached(request(first))["summary"]
    assert reading(request(first)) == {"summary": previous}
    assert cached(request(second, previous)) == reading(request(second, previous))
