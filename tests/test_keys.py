"""MemoryKey: id validation, the seeds' composite, and subject tokens no id can escape."""

from __future__ import annotations

import re

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import NASTY_IDS, ids, keys

from convmem.errors import InvalidInput, InvalidKey
from convmem.events import MAX_ID_LENGTH, MemoryKey, decode_token, encode_token

# A NATS subject token: no separator, no wildcard, no whitespace, not empty.
_SUBJECT_TOKEN = re.compile(r"[^\s.*>]+")


def subject(key: MemoryKey) -> str:
    """How a log would address the key: one subject token per id."""
    return "convmem.session." + ".".join(key.tokens())


def test_composite_is_the_seeds_tenant_user_session() -> None:
    """composite() of plain ids is the seeds' ``tenant:user:session``."""
    key = MemoryKey(tenant_id="acme_corp", user_id="user_123", session_id="session_abc")
    assert key.composite() == "acme_corp:user_123:session_abc"
    assert str(key) == "acme_corp:user_123:session_abc"


def test_composite_escapes_the_separator_so_keys_never_collide() -> None:
    """A ':' inside an id is escaped, so shifting it between ids gives another composite."""
    left = MemoryKey("a:b", "c", "d")
    right = MemoryKey("a", "b:c", "d")
    assert left.composite() != right.composite()
    assert left.composite() == "a\\:b:c:d"
    assert MemoryKey("a\\", "b", "c").composite() != MemoryKey("a", "\\b", "c").composite()


def test_plain_ids_read_as_themselves_in_tokens() -> None:
    """Letters, digits, '_' and '-' stand for themselves in subject tokens."""
    assert MemoryKey("acme_corp", "user-123", "S1").tokens() == ("acme_corp", "user-123", "S1")


@pytest.mark.parametrize("value", NASTY_IDS)
def test_no_id_puts_a_separator_wildcard_or_space_in_its_token(value: str) -> None:
    """encode_token never emits '.', '*', '>', ':' or whitespace, and decodes back."""
    token = encode_token(value)
    assert _SUBJECT_TOKEN.fullmatch(token), token
    assert ":" not in token
    assert decode_token(token) == value


def test_dots_and_wildcards_are_escaped_byte_by_byte() -> None:
    """'.', '*', '>', '=' and non-ASCII become =XX per UTF-8 byte."""
    assert encode_token("a.b") == "a=2Eb"
    assert encode_token("*") == "=2A"
    assert encode_token(">") == "=3E"
    assert encode_token("=") == "=3D"
    assert encode_token("ü") == "=C3=BC"


@given(keys)
def test_every_key_has_three_valid_subject_tokens(key: MemoryKey) -> None:
    """tokens() are three non-empty subject tokens that rebuild the key."""
    tokens = key.tokens()
    assert len(tokens) == 3
    for token in tokens:
        assert _SUBJECT_TOKEN.fullmatch(token), token
    assert subject(key).count(".") == 4
    assert MemoryKey.from_tokens(*tokens) == key


@given(keys, keys)
def test_distinct_keys_never_share_a_subject_or_a_composite(a: MemoryKey, b: MemoryKey) -> None:
    """The subject and composite encodings are injective over keys."""
    if a != b:
        assert subject(a) != subject(b)
        assert a.composite() != b.composite()
    else:
        assert subject(a) == subject(b)


@given(ids, ids)
def test_token_encoding_is_injective(a: str, b: str) -> None:
    """Two ids share a token only when they are the same id."""
    assert (encode_token(a) == encode_token(b)) == (a == b)


@given(keys)
def test_composite_round_trips(key: MemoryKey) -> None:
    """from_composite(composite()) gives the key back."""
    assert MemoryKey.from_composite(key.composite()) == key


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("a.b", "never produced"),
        ("a b", "never produced"),
        ("=4", "bad escape"),
        ("=zz", "bad escape"),
        ("=41", "canonical"),
        ("=FF", "UTF-8"),
        ("=C3", "UTF-8"),
    ],
)
def test_decode_token_refuses_tokens_the_encoder_never_makes(token: str, problem: str) -> None:
    """decode_token rejects bad escapes, stray characters, non-UTF-8 and non-canonical forms."""
    with pytest.raises(InvalidKey, match=problem) as info:
        decode_token(token)
    assert info.value.field == "token"


@pytest.mark.parametrize(
    ("composite", "problem"),
    [("a:b", "2 parts"), ("a:b:c:d", "4 parts"), ("a\\b:c:d", "bad escape"), ("a:b:c\\", "bad escape")],
)
def test_from_composite_refuses_malformed_composites(composite: str, problem: str) -> None:
    """from_composite needs exactly three parts and valid escapes."""
    with pytest.raises(InvalidKey, match=problem):
        MemoryKey.from_composite(composite)


@pytest.mark.parametrize("field", ["tenant_id", "user_id", "session_id"])
@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "must not be empty"),
        ("x" * (MAX_ID_LENGTH + 1), "over the limit"),
        ("a\nb", "control"),
        ("a\x00b", "control"),
        ("a\x7fb", "control"),
        ("a\x85b", "control"),
        ("a\ud800b", "surrogate"),
        (42, "must be a string"),
    ],
)
def test_bad_ids_raise_an_error_naming_the_field(field: str, value: object, problem: str) -> None:
    """An empty, overlong, control-character or non-string id raises InvalidKey naming its field."""
    ids_ = {"tenant_id": "t", "user_id": "u", "session_id": "s", field: value}
    with pytest.raises(InvalidKey, match=problem) as info:
        MemoryKey(**ids_)  # type: ignore[arg-type]
    assert info.value.field == field
    assert field in str(info.value)
    assert isinstance(info.value, InvalidInput)
    assert isinstance(info.value, ValueError)


def test_the_longest_id_is_accepted() -> None:
    """An id of exactly MAX_ID_LENGTH characters is valid."""
    assert MemoryKey("x" * MAX_ID_LENGTH, "u", "s").tenant_id == "x" * MAX_ID_LENGTH


def test_decoding_a_key_validates_its_ids() -> None:
    """A key read from bytes is checked like a constructed one."""
    data = msgspec.json.encode({"tenant_id": "", "user_id": "u", "session_id": "s"})
    with pytest.raises(msgspec.ValidationError, match="tenant_id"):
        msgspec.json.decode(data, type=MemoryKey)


@given(st.sampled_from(NASTY_IDS), st.sampled_from(NASTY_IDS))
def test_a_wildcard_id_never_addresses_another_key(a: str, b: str) -> None:
    """A subject built from ids with '*' or '>' matches only its own key, not a neighbour's."""
    mine, theirs = MemoryKey("t", a, "s"), MemoryKey("t", b, "s")
    if a != b:
        assert not _matches(subject(mine), subject(theirs))


def _matches(pattern: str, subject_: str) -> bool:
    """NATS wildcard matching, to show an encoded id carries no wildcard."""
    p, s = pattern.split("."), subject_.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)
