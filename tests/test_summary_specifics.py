"""The extractive summary's weights: names and numbers, the specifics a later question asks after."""

from __future__ import annotations

from summaries import request, section

from convmem.adapters import ExtractiveSummarizer
from convmem.adapters.backends.summarizers._text import FULL_WEIGHT, SPECIFIC_WEIGHT, body_terms
from convmem.projections import default_token_estimator


def weights(body: str) -> dict[str, int]:
    return dict(body_terms(body))


def test_names_and_numbers_inside_a_sentence_weigh_twice_a_rare_word() -> None:
    """A word capitalised inside a sentence (a name, a title, an acronym) and a number of two digits or
    more weigh `SPECIFIC_WEIGHT`; the same words in lower case, or opening the sentence, and a single
    digit, weigh as any rare word; common and function words are not raised."""
    assert SPECIFIC_WEIGHT == 2 * FULL_WEIGHT
    said = weights('We read "Becoming Nicole" in Lisbon with the LGBTQ group in 2019, my 18th trip, 3 days.')
    assert said["lisbon"] == said["nicol"] == said["lgbtq"] == said["2019"] == said["18th"] == SPECIFIC_WEIGHT
    assert said["read"] == said["group"] == said["trip"] == said["3"] == FULL_WEIGHT
    assert weights("Lisbon has trams.")["lisbon"] == FULL_WEIGHT  # the sentence's first word: any word
    assert weights("we went to lisbon.")["lisbon"] == FULL_WEIGHT
    assert weights("We went to Lisbon. Trams were fun.")["tram"] == FULL_WEIGHT
    bridge = weights("I liked The Bridge.")
    assert "the" not in bridge
    assert bridge["bridg"] == SPECIFIC_WEIGHT
    assert weights("I Love It, said Ana.")["love"] == 1  # an everyday word stays everyday, however written


def test_over_the_allowance_the_fact_with_a_name_and_a_year_outlasts_one_with_more_plain_words() -> None:
    """Two facts about the shop, room for one: the one with a place and a year (shop, opened, Kyoto,
    1998: 4 + 4 + 8 + 8) stays, and the one with more rare words but no specifics (shop, sold, warm,
    rugs, online: 5 x 4), a little shorter too, leaves. With names and numbers weighed as any rare
    word it would be the other way round."""
    specific = "The shop opened in Kyoto in 1998."
    plain = "The shop sold warm rugs online."
    turns = [{"user": specific, "assistant": ""}, {"user": plain, "assistant": ""}]
    both = ExtractiveSummarizer()(request(turns))["summary"]
    assert section(both, "key_facts") == [f"User: {specific}", f"User: {plain}"]
    one = default_token_estimator(both) - 9  # room for one of the two bullets
    summary = ExtractiveSummarizer(max_tokens=one)(request(turns))["summary"]
    assert section(summary, "key_facts") == [f"User: {specific}"]
