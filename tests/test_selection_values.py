"""The extractive summary's pool: what a fact is worth when it shares its subject with others."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from convmem.adapters.backends.summarizers._selection import _SCALE, SHARED_CREDIT, Pool
from convmem.adapters.backends.summarizers._summary import Fact, make_fact


def fact(text: str, day: int | None = None) -> Fact:
    return make_fact("key_facts", text, day)


CORGI = fact("Alice: Biscuit is a corgi puppy.")  # biscuit, corgi, puppi: full weight each
BEACH = fact("Alice: Biscuit digs at the beach.")  # biscuit, dig, beach
MURAL = fact("Alice: My sister paints murals.")  # sister, paint, mural: its own terms only


def test_a_term_two_facts_share_counts_fully_for_each() -> None:
    """Two facts about Biscuit are each worth as much as a fact whose terms no other fact holds: a
    subject the conversation comes back to is not worth less for it (unique coverage alone made
    each Biscuit fact worth two thirds of the mural one, the first to go)."""
    pool = Pool([CORGI, BEACH, MURAL])
    assert pool.value[CORGI.key] == pool.value[BEACH.key] == pool.value[MURAL.key] == 12 * _SCALE
    assert SHARED_CREDIT == 2


def test_a_term_many_facts_share_is_divided_among_them() -> None:
    """The fourth fact about Biscuit adds little to each: the term's credit, 2 x 4, is split four ways."""
    biscuits = [fact(f"Alice: Biscuit {word}.") for word in ("sleeps", "barks", "swims", "eats")]
    pool = Pool(biscuits)
    for one in biscuits:
        (own,) = [weight for stem, weight in one.terms if stem != "biscuit"]
        assert pool.value[one.key] == own * _SCALE + 4 * _SCALE * SHARED_CREDIT // 4
    pool.remove(biscuits[0].key)
    for one in biscuits[1:]:
        (own,) = [weight for stem, weight in one.terms if stem != "biscuit"]
        assert pool.value[one.key] == own * _SCALE + 4 * _SCALE * SHARED_CREDIT // 3


def test_removing_the_other_holder_gives_the_term_back_whole() -> None:
    pool = Pool([CORGI, BEACH])
    pool.remove(BEACH.key)
    assert pool.value[CORGI.key] == 12 * _SCALE
    assert pool.value == Pool([CORGI]).value


WORDS = ("biscuit", "corgi", "beach", "sister", "mural", "kiln", "lisbon", "violin", "garden", "train")
TEXT = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4, unique=True).map(
    lambda words: fact("Alice: " + " ".join(words) + ".")
)


@given(
    facts=st.lists(TEXT, min_size=1, max_size=12, unique_by=lambda f: f.key),
    removals=st.lists(st.integers(min_value=0, max_value=11), max_size=8),
)
def test_values_kept_up_to_date_equal_values_computed_afresh(facts: list[Fact], removals: list[int]) -> None:
    """Whatever order facts come and go in, every value, rank and the cheapest fact are those of a pool
    built from the facts that remain (so a pool rebuilt from a summary's text chooses the same)."""
    pool = Pool(facts)
    for index in removals:
        keys = list(pool.facts)
        if len(keys) > 1:
            pool.remove(keys[index % len(keys)])
    fresh = Pool(reversed(list(pool.facts.values())))
    assert pool.value == fresh.value
    assert pool.cheapest() == fresh.cheapest()
    assert pool.chars == fresh.chars


@given(
    facts=st.lists(TEXT, min_size=1, max_size=12, unique_by=lambda f: f.key),
    removals=st.lists(st.integers(min_value=0, max_value=11), max_size=8),
)
def test_a_pool_built_at_once_equals_one_grown_fact_by_fact(facts: list[Fact], removals: list[int]) -> None:
    """`Pool(facts)` values every fact in one pass (a rebuild from a summary's text is linear); facts
    added one by one, with some taken out on the way, reach exactly the same values, ranks and text."""
    grown = Pool([])
    for index, one in enumerate(facts):
        grown.add(one)
        if index < len(removals) and len(grown) > 1:
            keys = list(grown.facts)
            grown.remove(keys[removals[index] % len(keys)])
    built = Pool(list(grown.facts.values()))
    assert built.value == grown.value
    assert built._rank == grown._rank
    assert built.cheapest() == grown.cheapest()
    assert built.chars == grown.chars
    assert built.render("prose") == grown.render("prose")
