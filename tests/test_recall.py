"""Query-aware recall: the planner's current message brings back the session's most relevant lines.

The projection (pure): with a query and ``budget.recall_max_tokens``, ``conversation_memory.recalled``
holds the sentences of live turns not shown verbatim that score highest against the query, within
the whole budget as the session counts it (the default estimate and cl100k_base); with no query, or
recall not configured, the view is byte for byte the view without recall. Then the handles' and the
service's `get_llm_context(query=...)`, on a real nats-server, and erasure: an erased turn is never
recalled.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import History, histories

import convmem
from convmem.actors import MemorySystem, encoding_counter
from convmem.adapters import EmbeddedNatsServer, MalformedRequest, MemoryService, RemoteMemory
from convmem.adapters.frontends.service._protocol import decode_request
from convmem.errors import InvalidConfig, InvalidInput
from convmem.events import ConversationTurn, MemoryBudget, MemoryKey, MessageItem, ShortTermMemoryConfig
from convmem.projections import (
    MAX_QUERY_CHARS,
    AddTurn,
    Relevance,
    SessionState,
    SummarySucceeded,
    TokenEstimator,
    _recall,
    decide,
    default_token_estimator,
    estimate_tokens,
    evolve,
    llm_context,
    ranked_lines,
    render,
    select_context,
    summary_due,
    trim_by_relevance,
)

CL100K = encoding_counter("cl100k_base")
KEY = MemoryKey("acme", "alice", "recall-1")
DAY = datetime(2023, 5, 8, 9, tzinfo=UTC).timestamp()
WAIT = 10.0

CONFIG = ShortTermMemoryConfig(
    strategy="rolling_summary",
    budget=MemoryBudget(
        full_zone_turns=2,
        summary_max_tokens=200,
        total_max_tokens=400,
        overflow_policy="truncate_summary",
        recall_max_tokens=150,
    ),
    include_turn_dates=True,
    speaker_names={"user": "Alice", "assistant": "Bob"},
)

STORY = [
    ("I adopted a grey cat named Pixel last week.", "Lovely, cats are great company."),
    ("My sister lives in Lisbon and teaches piano.", "Piano lessons in Lisbon sound fun."),
    ("I ran a charity race for the animal shelter.", "Well done on the race!"),
    ("We painted the kitchen yellow on Sunday.", "Yellow kitchens look bright."),
    ("My favourite book is Dune by Frank Herbert.", "Dune is a classic."),
    ("The weather was rainy all day.", "Rain again, sorry."),
    ("I'm learning to bake sourdough bread.", "Sourdough takes patience."),
    ("Thanks for listening today.", "Any time, Alice."),
]


def play(
    turns: list[tuple[str, str]],
    config: ShortTermMemoryConfig = CONFIG,
    *,
    summary: str | None = "<session_summary>\nSome turns summarized.\n</session_summary>",
    estimator: TokenEstimator = default_token_estimator,
) -> SessionState:
    """The state after `turns`, each on its own day, a summary landing whenever one is due."""
    state = SessionState()
    for n, (user, answer) in enumerate(turns):
        now = DAY + n * 86400
        turn = ConversationTurn(user_message=user, assistant_response=answer, ts=now)
        for event in decide(
            state,
            AddTurn(turn=turn),
            now=now,
            command_id=f"t{n}",
            key=KEY,
            config=config,
            estimator=estimator,
        ):
            state = evolve(state, event)
        request = summary_due(state, now, estimator=estimator)
        if request is not None and summary is not None:
            outcome = SummarySucceeded(request=request, summary=summary)
            for event in decide(
                state, outcome, now=now, command_id=f"s{n}", key=KEY, config=config, estimator=estimator
            ):
                state = evolve(state, event)
    return state


def memory_of(context: dict[str, Any]) -> dict[str, Any]:
    memory: dict[str, Any] = context.get("conversation_memory", {})
    return memory


# The projection -------------------------------------------------------------------------------


def test_a_query_recalls_the_relevant_earlier_lines_dated_and_named() -> None:
    state = play(STORY)
    memory = memory_of(llm_context(state, query="What is the name of Alice's cat?"))
    assert memory["recalled"][0] == "8 May 2023 · Alice: I adopted a grey cat named Pixel last week."
    assert all(" · " in line for line in memory["recalled"])
    shown = {turn["user"] for turn in memory["recent_turns"]}
    assert not any(line.endswith(tuple(shown)) for line in memory["recalled"])  # never what shows verbatim
    # the view without a query is the view without recall, byte for byte
    assert render(llm_context(state)) == render(llm_context(state, query=None))
    assert "recalled" not in memory_of(llm_context(state))


def test_without_recall_configured_a_query_changes_nothing() -> None:
    config = msgspec.structs.replace(
        CONFIG, budget=msgspec.structs.replace(CONFIG.budget, recall_max_tokens=0)
    )
    state = play(STORY, config)
    assert render(llm_context(state, query="cat Pixel")) == render(llm_context(state))
    assert estimate_tokens(state, query="cat Pixel") == estimate_tokens(state)


def test_a_query_that_matches_nothing_changes_nothing() -> None:
    state = play(STORY)
    for query in ("", "   ", "the of and", "xylophone zeppelin"):
        assert render(llm_context(state, query=query)) == render(llm_context(state))


def test_relevance_ranks_rarer_and_repeated_terms_first_ties_to_the_newer() -> None:
    turns = [
        ("I bought a bike.", "Nice bike."),
        ("The bike has a red frame.", "Red suits it."),
        ("My bike needs air.", "Pump it."),
        ("Lunch was soup.", "Yum."),
        ("Lunch was soup.", "Yum."),
    ]
    config = msgspec.structs.replace(CONFIG, budget=msgspec.structs.replace(CONFIG.budget, full_zone_turns=1))
    state = play(turns, config, summary=None)
    ranked = [line.split(": ", 1)[1] for _, line in ranked_lines(state, "red bike")]
    # both terms; then the rarer term alone; then the common one: shorter first, equals newer first
    assert ranked == [
        "The bike has a red frame.",
        "Red suits it.",
        "Nice bike.",
        "I bought a bike.",
        "My bike needs air.",
    ]
    soup = [line for _, line in ranked_lines(state, "soup", frozenset({5}))]
    assert len(soup) == 1
    assert soup[0].startswith("11 May 2023")


def test_plurals_and_possessives_fold_and_stopwords_do_not_count() -> None:
    state = play(STORY)
    cats = sorted(line.split(": ", 1)[1] for _, line in ranked_lines(state, "cats"))
    assert cats == ["I adopted a grey cat named Pixel last week.", "Lovely, cats are great company."]
    assert next(line for _, line in ranked_lines(state, "Frank's books")).endswith("by Frank Herbert.")
    assert ranked_lines(state, "what was the that") == []


def test_the_room_comes_from_the_summary_never_from_the_turns_shown() -> None:
    summary = "<session_summary>\n" + "\n".join(f"- fact {n} about gardening" for n in range(28)) + "\n"
    summary += "</session_summary>"
    state = play(STORY, summary=summary)
    plain = select_context(state)
    assert "fact 27" in plain.summary
    recalled = select_context(state, query="sister Lisbon piano")
    assert recalled.recalled
    assert recalled.recent == plain.recent
    assert recalled.pending == plain.pending
    assert len(recalled.summary) < len(plain.summary)
    assert estimate_tokens(state, query="sister Lisbon piano") <= CONFIG.budget.total_max_tokens


def test_recall_reads_the_turns_texts_only_never_a_tool_call_or_its_output() -> None:
    """A turn with a tool call and its output: its texts may be recalled, the call and output never
    (a line is one sentence of the user's or the assistant's text)."""
    tooled = ConversationTurn(
        user_message="Find the price of the red kettle.",
        assistant_response="The red kettle costs 30 euros.",
        items=(
            MessageItem(kind="message", role="user", content="Find the price of the red kettle."),
            MessageItem(kind="function_call", call_id="c1", name="shop_search", arguments='{"q": "kettle"}'),
            MessageItem(kind="function_call_output", call_id="c1", output="kettle price table ZQ-OUTPUT"),
            MessageItem(kind="message", role="assistant", content="The red kettle costs 30 euros."),
        ),
        artifacts_shown={"kettle": "kettle artifact ZQ-ARTIFACT"},
        ts=DAY,
    )
    config = msgspec.structs.replace(
        CONFIG, strategy="truncation", budget=msgspec.structs.replace(CONFIG.budget, full_zone_turns=1)
    )
    state = SessionState()
    others = [ConversationTurn(user_message=f"next {n}", assistant_response="ok", ts=DAY + n) for n in (1, 2)]
    for n, one in enumerate([tooled, *others]):
        decided = decide(state, AddTurn(turn=one), now=DAY + n, command_id=f"t{n}", key=KEY, config=config)
        for event in decided:
            state = evolve(state, event)
    lines = [line for _, line in ranked_lines(state, "kettle price shop_search table")]
    assert lines == [
        "8 May 2023 · Alice: Find the price of the red kettle.",
        "8 May 2023 · Bob: The red kettle costs 30 euros.",
    ]
    recalled = memory_of(llm_context(state, query="kettle price"))["recalled"]
    assert not any("ZQ-" in line or "shop_search" in line for line in recalled)


@settings(max_examples=40)
@given(
    history=histories(max_size=30),
    query=st.text(max_size=60) | st.sampled_from(["turn 1", "answer", "what did they say about 3?"]),
    room=st.integers(1, 400),
)
def test_within_the_budget_deterministic_and_unchanged_without_a_query(
    history: History, query: str, room: int
) -> None:
    """Every state of random histories: with recall on, the view with a query stays within the budget
    (as the estimate counts), is the same bytes twice, and the view with no query is the one without
    recall."""
    for state in history.states[-6:]:
        budget = state.config.budget
        if budget.total_max_tokens and room > budget.total_max_tokens:
            continue
        on = msgspec.structs.replace(
            state,
            config=msgspec.structs.replace(
                state.config, budget=msgspec.structs.replace(budget, recall_max_tokens=room)
            ),
        )
        assert render(llm_context(on)) == render(llm_context(state))
        with_query = llm_context(on, query=query)
        assert render(with_query) == render(llm_context(on, query=query))
        memory = with_query.get("conversation_memory")
        if memory is None:
            continue
        tokens = default_token_estimator(render(memory))
        assert tokens == estimate_tokens(on, query=query)
        if budget.total_max_tokens and estimate_tokens(state) <= budget.total_max_tokens:
            assert tokens <= budget.total_max_tokens


_PIECES = st.sampled_from(
    [
        "hello",
        " world",
        "Porto",
        "1234567",
        "!!!",
        ". ",
        "\u4f60\u597d",
        "\U0001f600",
        '"',
        "\\",
        "\n",
        "naïve",
        " cat",
        " piano",
    ]
)
TEXTS = st.lists(_PIECES, min_size=1, max_size=60).map("".join)


@settings(max_examples=25)
@given(
    turns=st.lists(st.tuples(TEXTS, TEXTS), min_size=3, max_size=12),
    query=TEXTS,
    total=st.sampled_from([250, 400, 600]),
)
def test_within_the_budget_in_real_tokens(turns: list[tuple[str, str]], query: str, total: int) -> None:
    """With the real cl100k_base tokenizer as the session's counter, the view with a query never
    exceeds the budget by a single token."""
    config = msgspec.structs.replace(
        CONFIG,
        token_counter="cl100k_base",
        budget=MemoryBudget(
            full_zone_turns=2,
            summary_max_tokens=total - 100,
            total_max_tokens=total,
            overflow_policy="truncate_summary",
            recall_max_tokens=total // 3,
        ),
    )
    summary = "<session_summary>\n" + "\n".join(f"- {u[:80]}" for u, _ in turns) + "\n</session_summary>"
    state = play(turns, config, summary=summary, estimator=CL100K)
    context = llm_context(state, CL100K, query=query)
    assert CL100K(render(memory_of(context))) <= total
    assert estimate_tokens(state, CL100K, query=query) == CL100K(render(memory_of(context)))


# The setting ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"recall_max_tokens": -1}, "must be an integer >= 0"),
        ({"recall_max_tokens": True}, "must be an integer >= 0"),
        ({"recall_max_tokens": 1.5}, "must be an integer >= 0"),
        ({"recall_max_tokens": 5000, "total_max_tokens": 4000}, "exceeds total_max_tokens=4000"),
    ],
)
def test_a_bad_recall_setting_is_refused_naming_it(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidConfig) as refused:
        MemoryBudget(**fields)
    assert refused.value.field == "budget.recall_max_tokens"
    assert problem in refused.value.problem


def test_the_setting_is_recorded_with_the_session() -> None:
    encoded = msgspec.json.encode(CONFIG)
    assert b'"recall_max_tokens":150' in encoded
    assert msgspec.json.decode(encoded, type=ShortTermMemoryConfig) == CONFIG
    old = msgspec.json.decode(encoded.replace(b',"recall_max_tokens":150', b""), type=ShortTermMemoryConfig)
    assert old.budget.recall_max_tokens == 0  # a session recorded before the setting: no recall


HOSTILE = [
    (7, "must be a string or None, got int"),
    (["cat"], "must be a string or None, got list"),
    ("x" * (MAX_QUERY_CHARS + 1), f"over the limit of {MAX_QUERY_CHARS}"),
    ("cat\x00", "contains a NUL character"),
    ("cat\ud800", "contains a lone surrogate"),
]


@pytest.mark.parametrize(("query", "problem"), HOSTILE)
def test_a_hostile_query_is_refused_naming_the_field(query: Any, problem: str) -> None:
    state = play(STORY[:3])
    with pytest.raises(InvalidInput) as refused:
        llm_context(state, query=query)
    assert refused.value.field == "query"
    assert problem in refused.value.problem


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b'{"query": 7}', "Expected `str | null`, got `int`"),
        (b'{"query": ["cat"]}', "Expected `str | null`, got `array`"),
        (b'{"query": "' + b"x" * (MAX_QUERY_CHARS + 1) + b'"}', "over the limit"),
        (b'{"query": "cat\\u0000"}', "contains a NUL character"),
    ],
)
def test_the_service_refuses_a_hostile_query_field(payload: bytes, problem: str) -> None:
    with pytest.raises(MalformedRequest) as refused:
        decode_request("context", payload)
    assert refused.value.field == "query"
    assert problem in refused.value.problem
    assert decode_request("context", b'{"query": "cat"}').query == "cat"  # type: ignore[union-attr]
    assert decode_request("context", b"{}").query is None  # type: ignore[union-attr]


# Handles, erasure and the service, on a real nats-server ------------------------------------


@pytest.fixture
def system(nats_server_shared: EmbeddedNatsServer, jetstream_names: Any) -> Iterator[MemorySystem]:
    memory = convmem.connect(
        nats_server_shared.url,
        config=SERVED,
        stream=jetstream_names.stream,
        prefix=jetstream_names.prefix,
        bucket=jetstream_names.bucket,
    )
    try:
        yield memory
    finally:
        memory.close()


SERVED = msgspec.structs.replace(CONFIG, strategy="truncation")
"""No summarizer runs in these tests: truncation, so that no summary attempt changes the state meanwhile."""


def _tell(system: MemorySystem, key: MemoryKey, turns: list[tuple[str, str]]) -> None:
    session = system.session(key)
    for n, (user, answer) in enumerate(turns):
        session.add_turn(ConversationTurn(user_message=user, assistant_response=answer, ts=DAY + n * 86400))


def test_the_handles_pass_the_query_and_keep_the_cached_view_without_one(system: MemorySystem) -> None:
    key = MemoryKey("acme", "alice", f"h-{uuid.uuid4().hex[:8]}")
    _tell(system, key, STORY)
    session = system.session(key)
    state = session.snapshot_state()
    plain = session.get_llm_context()
    assert plain == llm_context(state, session.estimator_of(state))
    asked = session.get_llm_context(query="Where does Alice's sister live?")
    assert asked == llm_context(state, session.estimator_of(state), query="Where does Alice's sister live?")
    assert any("Lisbon" in line for line in memory_of(asked)["recalled"])
    assert session.get_llm_context() == plain
    assert asyncio.run(session.aio.get_llm_context(query="Where does Alice's sister live?")) == asked
    with pytest.raises(InvalidInput) as refused:
        session.get_llm_context(query=42)  # type: ignore[arg-type]
    assert refused.value.field == "query"


def test_an_erased_turn_is_never_recalled(system: MemorySystem) -> None:
    key = MemoryKey("acme", "alice", f"e-{uuid.uuid4().hex[:8]}")
    _tell(system, key, [("My locker code is ZQXJ7 remember it.", "Noted."), *STORY])
    session = system.session(key)
    assert any(
        "ZQXJ7" in line for line in memory_of(session.get_llm_context(query="locker code"))["recalled"]
    )
    system.erase(key)
    _tell(system, key, STORY)
    recalled = memory_of(system.session(key).get_llm_context(query="locker code ZQXJ7")).get("recalled", [])
    assert not any("ZQXJ7" in line for line in recalled)


def test_a_remote_planner_passes_its_message_and_a_bad_one_is_refused(
    system: MemorySystem, nats_server_shared: EmbeddedNatsServer
) -> None:
    api_prefix = f"t{uuid.uuid4().hex[:10]}.api"
    key = MemoryKey("acme", "alice", f"r-{uuid.uuid4().hex[:8]}")
    _tell(system, key, STORY)
    with (
        MemoryService(system, nats_server_shared.url, api_prefix=api_prefix),
        RemoteMemory(nats_server_shared.url, api_prefix=api_prefix, timeout=WAIT) as remote,
    ):
        far = remote.session(key)
        near = system.session(key)
        assert far.get_llm_context() == near.get_llm_context()
        query = "What book does Alice love?"
        asked = far.get_llm_context(query=query)
        assert asked == near.get_llm_context(query=query)
        assert any("Dune" in line for line in memory_of(asked)["recalled"])
        with pytest.raises(InvalidInput) as refused:
            far.get_llm_context(query="x" * (MAX_QUERY_CHARS + 1))  # refused before it travels
        assert refused.value.field == "query"


def test_the_service_answers_a_hostile_query_with_a_typed_error(
    system: MemorySystem, nats_server_shared: EmbeddedNatsServer
) -> None:
    api_prefix = f"t{uuid.uuid4().hex[:10]}.api"
    key = MemoryKey("acme", "alice", f"s-{uuid.uuid4().hex[:8]}")
    _tell(system, key, STORY[:3])
    with (
        MemoryService(system, nats_server_shared.url, api_prefix=api_prefix),
        RemoteMemory(nats_server_shared.url, api_prefix=api_prefix, timeout=WAIT) as remote,
    ):
        far = remote.session(key)
        for bad in (7, "cat\x00"):
            with pytest.raises(MalformedRequest) as refused:
                far.memory.run(
                    lambda bad=bad: far.on_connection._call("context", query=bad), wait=WAIT, what="hostile"
                )
            assert refused.value.field == "query"
        assert far.get_llm_context(query="cat") == system.session(key).get_llm_context(query="cat")


def test_the_summary_lines_least_relevant_to_the_query_give_way_first() -> None:
    summary = "\n".join(
        [
            "<session_summary>",
            "12 turns summarized.",
            "<key_facts>",
            "8 May 2023, Alice:",
            "- I grow tomatoes on the balcony.",
            "- My sister teaches piano in Lisbon.",
            "9 May 2023, Bob:",
            "- The train strike ended.",
            "</key_facts>",
            "</session_summary>",
        ]
    )
    state = play(STORY[:3])
    relevance = Relevance(state, "Where does the sister teach piano?")
    kept = trim_by_relevance(summary, relevance, lambda s: len(s) <= len(summary) - 60)
    assert "My sister teaches piano in Lisbon." in kept
    assert "tomatoes" not in kept
    assert "train" not in kept
    assert "9 May 2023, Bob:" not in kept  # its one line gone, the heading goes too
    assert "8 May 2023, Alice:" in kept
    assert kept.startswith("<session_summary>")
    assert kept.endswith("</session_summary>")
    assert trim_by_relevance(summary, relevance, lambda s: False) == ""


def test_suffixes_fold_and_a_line_the_summary_holds_is_not_repeated() -> None:
    state = play(STORY)
    painted = [line for _, line in ranked_lines(state, "Who was painting?")]
    assert painted == ["11 May 2023 · Alice: We painted the kitchen yellow on Sunday."]
    held = "<session_summary>\n- Alice: We painted the kitchen yellow on Sunday.\n</session_summary>"
    assert ranked_lines(state, "Who was painting?", known=held) == []


def test_recommended_turns_recall_on_and_keeps_more_turns_live() -> None:
    on = convmem.recommended(2000, worker_process=False).config
    assert on.budget.recall_max_tokens == 700
    assert on.live_turns == 1000
    off = convmem.recommended(2000, worker_process=False, recall=False).config
    assert off.budget.recall_max_tokens == 0
    assert off.live_turns == 100
    state = play(STORY, on)
    assert render(llm_context(state)) == render(llm_context(msgspec.structs.replace(state, config=off)))
    assert "recalled" in memory_of(llm_context(state, query="cat Pixel"))


def test_the_texts_read_for_recall_are_kept_up_to_a_bound_in_characters_whatever_their_length() -> None:
    """Texts are every tenant's turns in one process: what recall keeps of them is bounded by their
    characters, not their number (16,384 texts of 100,000 characters and their terms held about 28 GB
    under the lru_cache), a text longer than the longest kept is read each time, and a text read
    again soon is found without reading it again."""
    read = _recall.TextMemo(_recall._read_text, chars=200_000, longest=20_000)
    texts = [f"Text {n} says something about item{n}. " * 200 for n in range(100)]  # ~8,000 characters
    for text in texts:
        read(text)
    assert read.held_chars() <= read.chars
    assert read.held_chars() >= read.chars // 4  # (it keeps what it may)
    long = "word " * 10_000
    read(long)
    assert read.held_chars() <= read.chars
    assert long not in read._tenants[""].young
    assert long not in read._tenants[""].old
    calls: list[str] = []

    def reading(text: str) -> Any:
        calls.append(text)
        return _recall._read_text(text)

    counted = _recall.TextMemo(reading, chars=200_000, longest=20_000)
    for _ in range(3):
        counted(texts[0])
    assert calls == [texts[0]]
    assert _recall._read.chars <= 8_000_000
    assert _recall._terms_of.chars <= 4_000_000


def test_a_tenant_reading_many_texts_pushes_out_its_own_not_another_tenants() -> None:
    """Given globex's session texts read for recall, when acme reads far more texts than are kept,
    then globex's texts are still kept (its next recall reads none of them again: before, all of
    them, 0.25 s of CPU or more for 1,000 live turns), acme gave up its own, and the bound holds."""
    calls: list[str] = []

    def reading(text: str) -> Any:
        calls.append(text)
        return _recall._read_text(text)

    read = _recall.TextMemo(reading, chars=100_000, longest=20_000)
    globex = [f"Globex note {n}: the plan is item{n}. " * 50 for n in range(5)]  # ~2,000 characters
    for text in globex:
        read(text, "globex")
    for n in range(100):
        read(f"Acme text {n} names thing{n}. " * 200, "acme")  # ~5,000 characters each
    calls.clear()
    for text in globex:
        read(text, "globex")
    assert calls == []
    assert read.held_chars("globex") == sum(map(len, globex))
    assert read.held_chars() <= read.chars + read.longest
    assert read.held_chars("acme") < read.chars
